"""The C allocator of a kernel whose memory is measured: what a freed tensor held goes back to the system at once.

A kernel's control group counts the pages its processes hold, and glibc's ``malloc`` keeps pages it
was given back for later. Its threshold above which a block gets pages of its own (``mmap``, returned
by ``free``) starts at 128 KiB and rises to the size of the largest such block freed (up to 32 MiB);
from then on blocks of that size come from its heap, which it trims only at the top. A loop that makes
and frees a 2 MiB tensor per step while keeping a small one (chunked attention's scores and outputs on
n = m = 4096, chunks of 128) then leaves each step's 2 MiB behind: the heap grew by about 70 MiB in
3 runs of 8 of that call in a fresh process, with a few MiB of tensors alive at once (a loop of a fixed
order of blocks grows it every time). Measured, the call would be charged for memory it had freed.

:func:`return_freed_memory` fixes the threshold at its start value, which also stops it rising: every
block of 128 KiB or more has pages of its own and gives them back when freed, so a measured peak counts
what was alive at once, plus the heap of smaller blocks.

What this does NOT protect: the student's code runs after it and can set the allocator back, or keep
freed pages any other way; that raises its own figure, never lowers it (the control group counts every
page held, whoever holds it).
"""

from __future__ import annotations

import ctypes

#: ``mallopt``'s parameter of the size from which a block gets pages of its own (glibc's ``M_MMAP_THRESHOLD``).
M_MMAP_THRESHOLD = -3
#: glibc's start value of that threshold, in bytes.
MMAP_THRESHOLD = 128 * 1024


def return_freed_memory() -> bool:
    """Fix the C allocator's threshold at its start value (see the module); False where the C library has no
    ``mallopt`` or refused (a C library other than glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
