"""Watches on what a student's function does inside PyTorch, run where the student's code runs.

Each watch is a PyTorch mode that records while the student's function runs (the tensors it
allocates, their bytes, its conversions to NumPy, the reductions it makes and over how many entries); the probes here
(:func:`autograder.student.probe`) return what was recorded as plain data, so that the checks,
in the grader's process, can judge it. A student's code can fool a watch in its own process
(as it can fool the guard); the checks judge the values it returns in any case.

What the student's process cannot fool is measured outside it: :func:`measured_memory_call` calls
the function once, with no watch, in a fresh kernel that holds only what the graded kernel holds,
while the grader reads that kernel's memory from its control group, as a total above what it held
before the answer cells were loaded (:meth:`autograder.remote.Remote.measured_attempt`); where there
is none (the checks run in the student's own kernel, a grader without a control group), it says so
and the watches are all there is.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .errors import fail
from .guard import Forbidden
from .student import describe_error, probe


class TensorWatch(TorchDispatchMode):
    """Sees every tensor PyTorch operations allocate while active.

    It records the first newly allocated tensor that is too big (two different axes of
    at least ``rows`` and ``cols``, or at least ``max_elements`` elements in its storage,
    whatever its shape) and the peak of the bytes alive at once. Views and in-place
    results share storage that is already known and are not counted again.
    """

    def __init__(self, inputs, rows: int, cols: int, max_elements: int) -> None:
        super().__init__()
        self.rows, self.cols, self.max_elements = rows, cols, max_elements
        self.alive = {t.untyped_storage().data_ptr() for t in inputs}
        self.current = 0
        self.peak = 0
        self.offender: tuple[str, tuple[int, ...]] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in tree_flatten(result)[0]:
            if isinstance(t, torch.Tensor):
                self._allocated(func, t)
        return result

    def _allocated(self, func, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or address in self.alive:
            return
        self.alive.add(address)
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._freed, address, size)
        shape = tuple(t.shape)
        two_long_axes = any(
            a >= self.rows and b >= self.cols for i, a in enumerate(shape) for j, b in enumerate(shape) if i != j
        )
        if self.offender is None and (two_long_axes or size // t.element_size() >= self.max_elements):
            self.offender = (str(func), shape)

    def _freed(self, address: int, size: int) -> None:
        self.alive.discard(address)
        self.current -= size


class AllocationMeter(TorchDispatchMode):
    """Adds up the bytes of the new tensors PyTorch operations return while it is active.

    Views and in-place results (``slice``, ``copy_``, ...) alias memory that exists already and
    are not counted: the schema of such an operation marks its result as an alias. ``by_op``
    splits the total by operation (``aten.cat.default``, ``aten.clone.default``, ...).
    """

    def __init__(self) -> None:
        super().__init__()
        self.allocated = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_flatten(result)[0]:
                if isinstance(t, torch.Tensor):
                    size = t.untyped_storage().nbytes()
                    self.allocated += size
                    self.by_op[str(func)] = self.by_op.get(str(func), 0) + size
        return result


class NumpyWatch(TorchFunctionMode):
    """Notes a conversion of a tensor to NumPy, where TensorWatch could not follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.used = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("numpy", "__array__"):
            self.used = True
        return func(*args, **(kwargs or {}))


def watch_allocations(fn: Callable[..., Any], args: tuple, kwargs: dict, rows: int, cols: int,
                      max_elements: int) -> tuple[Any, dict]:
    """A probe: ``fn(*args, **kwargs)`` under a :class:`TensorWatch` and a :class:`NumpyWatch`.

    Returns the value and ``{"offender": (op, shape) or None, "peak": bytes alive at once,
    "numpy": whether a tensor was converted to NumPy}``. The inputs are copied first, so the
    function cannot change the caller's tensors.
    """
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    tensors = TensorWatch([a for a in args[:3] if isinstance(a, torch.Tensor)], rows, cols, max_elements)
    arrays = NumpyWatch()
    with arrays, tensors:
        value = fn(*args, **kwargs)
    offender = None if tensors.offender is None else (tensors.offender[0], list(tensors.offender[1]))
    return value, {"offender": offender, "peak": tensors.peak, "numpy": arrays.used}


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
    loaded (:meth:`autograder.remote.Remote.measured_attempt`): no watch runs in the kernel during the
    call, and memory an answer cell holds, or frees during the call and takes again, counts. Returns
    None, without calling ``fn``, where that cannot be measured: ``fn`` is not in a kernel with a
    control group. An error ``fn`` raises fails the check.
    """
    measure = getattr(type(fn), "measured_attempt", None)  # a Remote's (autograder.remote): the grader's side
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
#: buffers, PyTorch's first use of its operations: 6 to 18 MiB measured) and far below the scores and their
#: softmax (133 MiB measured), or the scores kept as Python floats (650 MiB; bench/results/kernel_memory_bench.md).
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


#: Reductions whose size the streaming check records: "max" ones and "sum" ones.
MAX_REDUCTIONS = frozenset({"max", "amax", "min", "amin", "aminmax", "argmax", "argmin", "cummax", "cummin",
                            "sort", "topk", "kthvalue", "median", "nanmedian", "mode"})
SUM_REDUCTIONS = frozenset({"sum", "nansum", "mean", "nanmean", "prod", "cumsum", "cumprod", "logcumsumexp",
                            "logsumexp", "norm", "std", "var", "count_nonzero"})
MATMULS = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "inner", "vdot"})
#: Contractions whose size is not read off their arguments (recorded as sums of unknown size).
CONTRACTIONS = frozenset({"einsum", "tensordot"})


@dataclass
class Reduction:
    """One reduction the student's code made: its kind ("max" or "sum"), name and size."""

    kind: str
    name: str
    size: int | None


def _size_of(t: torch.Tensor, dim: Any) -> int:
    if t.dim() == 0:
        return 1
    if dim is None:
        return t.numel()
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return math.prod(int(t.shape[d]) for d in dims)


def _reduction(name: str, args: tuple, kwargs: dict) -> Reduction | None:
    if name in CONTRACTIONS:
        return Reduction("sum", name, None)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in MATMULS:
        if len(tensors) < 2:
            return None
        a = tensors[0] if name != "__rmatmul__" else tensors[1]
        return Reduction("sum", name, int(a.shape[-1]) if a.dim() else 1)
    kind = "max" if name in MAX_REDUCTIONS else "sum" if name in SUM_REDUCTIONS else None
    if kind is None:
        return None
    t = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
    if not isinstance(t, torch.Tensor):
        return None
    if not (t.is_floating_point() or t.is_complex()):  # counting (a check for NaN, a length) is not softmax's work
        return None
    if name in ("topk", "kthvalue"):
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
    elif name == "norm":
        dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
    elif name in ("sort", "cummax", "cummin", "cumsum", "cumprod", "logcumsumexp"):
        dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
    else:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(dim, torch.Tensor):  # torch.max(a, b): an elementwise maximum, not a reduction
        return None
    if isinstance(dim, bool) or not (dim is None or isinstance(dim, (int, tuple, list))):
        return None
    return Reduction(kind, name, _size_of(t, dim))


@dataclass
class ReductionRecorder(TorchFunctionMode):
    """A torch function mode that records every max-like and sum-like reduction, in order."""

    reductions: list[Reduction] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            found = _reduction(getattr(func, "__name__", ""), tuple(args), kwargs)
        except Exception:  # noqa: BLE001 - recording must never change what the student's code does
            found = None
        if found is not None:
            self.reductions.append(found)
        return func(*args, **kwargs)


def reductions_of(fn: Callable[..., Any], *args: Any) -> list[tuple]:
    """A probe: ``fn(*args)`` run under a :class:`ReductionRecorder`; its reductions as (kind, name, size) tuples."""
    recorder = ReductionRecorder()
    with recorder:
        fn(*args)
    return [(r.kind, r.name, r.size) for r in recorder.reductions]
