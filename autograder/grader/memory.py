"""How much memory a student's function uses: measured from outside its kernel where it can be, else watched inside.

What the student's process cannot fool is measured outside it: :func:`measured_memory_call` calls
the function once, with no watch, in a fresh kernel that holds only what the graded kernel holds,
while the grader reads that kernel's memory from its control group, as a total above what it held
before the answer cells were loaded (:meth:`autograder.grader.remote.Remote.measured_attempt`); where there
is none (the checks run in the student's own kernel, a grader without a control group), it says so
and the watches of :mod:`autograder.kernel.watches`, run where the student's code runs, are all there is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..kernel.guard import Forbidden
from ..kernel.watches import watch_allocations
from ..shared.errors import fail
from .student import describe_error, probe


def tiled_budget(inputs: Sequence[torch.Tensor], block: int) -> int:
    """The bytes a blocked attention may hold at once: four times its input tensors (its outputs, and any copy of
    the inputs it makes, are no bigger) and sixteen ``block`` x ``block`` tiles of float64."""
    return 4 * sum(t.numel() * t.element_size() for t in inputs) + 16 * block * block * 8


def watched_call(fn: Callable[..., Any], args: tuple, kwargs: dict, *, exercise: str, rows: int, cols: int,
                 max_elements: int, forbid: Sequence[Forbidden] = ()) -> tuple[Any, dict]:
    """The student's ``fn`` run under ``forbid`` and :func:`watch_allocations`, where the student's code runs.

    Returns the value and what the watch saw; fails the check when a tensor was converted to
    NumPy, where the watch cannot follow it.
    """
    value, seen = probe(watch_allocations, fn, args, kwargs, rows, cols, max_elements, what=f"{exercise}(...)",
                        forbid=forbid)
    if seen.get("numpy"):
        fail(f"{exercise} converted a tensor to NumPy. Write it with torch operations only: the check watches "
             "every tensor your function allocates, to make sure it never holds the n x m scores.")
    return value, seen


def measured_memory_call(fn: Callable[..., Any], args: tuple, kwargs: dict, *, exercise: str,
                         forbid: Sequence[Forbidden] = ()) -> tuple[Any, int] | None:
    """The student's ``fn`` called once, and the bytes the memory of the kernel it ran in reached above its base.

    The call is made in a fresh kernel loaded as the graded one; the grader reads its control group's
    peak during the call, outside the kernel, above what the kernel held before the answer cells were
    loaded (:meth:`autograder.grader.remote.Remote.measured_attempt`): no watch runs in the kernel during the
    call, and memory an answer cell holds, or frees during the call and takes again, counts. Returns
    None, without calling ``fn``, where that cannot be measured: ``fn`` is not in a kernel with a
    control group. An error ``fn`` raises fails the check.
    """
    measure = getattr(type(fn), "measured_attempt", None)  # a Remote's (autograder.grader.remote): the grader's side
    if measure is None or not fn.measures_memory():
        return None
    outcome, error, rise = measure(fn, args, kwargs, exercise=exercise, forbid=forbid)
    if error is not None:
        fail(describe_error(f"{exercise}(...)", error))
    if outcome is None or rise is None:
        return None
    return outcome.value, rise


#: The case whose memory notebooks 07 and 08 measure (their exercises' text states it): n = m = 4096 queries
#: and keys of d = 8 in float32, blocks of 256. One 4096 x 4096 float32 matrix is 64 MiB.
MEMORY_CASE_N, MEMORY_CASE_D, MEMORY_CASE_BLOCK, MEMORY_CASE_DTYPE = 4096, 8, 256, torch.float32
#: How far the memory may reach during that call above the kernel's before the answer cells were loaded: half of
#: one n x n float32 matrix, above what a tiled pass needs in a fresh kernel (its tiles, its outputs, the wire's
#: buffers, PyTorch's first use of its operations: 5 to 10 MiB measured, with the kernel's allocator giving freed
#: blocks back, autograder.kernel.allocator) and far below the scores and their softmax (132 MiB measured), or the
#: scores kept as Python floats (650 MiB; bench/results/kernel_memory_bench.md).
MEMORY_RISE_BOUND = 32 * 2**20


@dataclass(frozen=True)
class MemoryRise:
    """What a student's function returned, and how far memory rose while it ran."""

    value: Any
    bytes: int
    outside: bool  # True: the kernel's memory, read from its control group; False: tensors the watch saw


def memory_rise(fn: Callable[..., Any], args: tuple, kwargs: dict, *, exercise: str, rows: int, cols: int,
                forbid: Sequence[Forbidden] = ()) -> MemoryRise:
    """The memory ``fn`` uses on ``args``: measured from outside its kernel where it can be, else watched inside.

    Outside (:func:`measured_memory_call`): the rise of the kernel's whole memory, whatever holds it.
    Inside (no control group, or the checks run in the student's own kernel): the peak of the bytes of
    the tensors a :class:`TensorWatch` saw alive at once, which code written to fool it can hide.
    """
    measured = measured_memory_call(fn, args, kwargs, exercise=exercise, forbid=forbid)
    if measured is not None:
        return MemoryRise(measured[0], measured[1], True)
    value, seen = watched_call(fn, args, kwargs, exercise=exercise, rows=rows, cols=cols, max_elements=rows * cols,
                               forbid=forbid)
    return MemoryRise(value, int(seen["peak"]), False)


def memory_message(rise: MemoryRise, exercise: str, case: str, bound: int, hint: str | None = None) -> str:
    """Why ``rise`` is too much, saying how it was measured (outside the kernel, or by the watch inside it), and
    what to keep instead (``hint``; by default what FlashAttention keeps)."""
    mib = rise.bytes / 2**20
    if rise.outside:
        how = (f"the memory of your kernel's process, measured by the grader from outside it, reached {mib:.0f} MiB "
               f"above what it held before your answer cells were loaded (memory they hold counts) while {exercise} "
               "ran")
    else:
        how = f"{exercise} had {mib:.0f} MiB of tensors alive at once"
    hint = hint or ("FlashAttention never holds it, in any form (a tensor, a list of blocks, Python numbers). Keep "
                    "only the current block and the per-query running values.")
    return (f"With {case}: {how}, more than the {bound // 2**20} MiB allowed. One n x m matrix of scores is "
            f"{MEMORY_CASE_N * MEMORY_CASE_N * 4 // 2**20} MiB here: {hint}")
