"""Watches on what a student's function does inside PyTorch, run where the student's code runs.

Each watch is a PyTorch mode that records while the student's function runs (the tensors it
allocates, their bytes, its conversions to NumPy, the reductions it makes and over how many entries); the probes here
(:func:`autograder.grader.student.probe`) return what was recorded as plain data, so that the checks,
in the grader's process, can judge it (:mod:`autograder.grader.memory` judges the memory). A student's
code can fool a watch in its own process (as it can fool the guard); the checks judge the values it
returns in any case, and measure a call's memory from outside its kernel where they can.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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
        if isinstance(result, torch.Tensor):  # most operations: one tensor, no need to walk a structure
            self._allocated(func, result)
            return result
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
        if self.offender is not None:  # the first offender is the one reported
            return
        shape = tuple(t.shape)
        two_long_axes = any(
            a >= self.rows and b >= self.cols for i, a in enumerate(shape) for j, b in enumerate(shape) if i != j
        )
        if two_long_axes or size // t.element_size() >= self.max_elements:
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
