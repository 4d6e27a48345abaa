"""Watches on what a student's function does inside PyTorch, run where the student's code runs.

Each watch is a PyTorch mode that records while the student's function runs; the probes here
(:func:`autograder.student.probe`) return what was recorded as plain data, so that the checks,
in the grader's process, can judge it. A student's code can fool a watch in its own process
(as it can fool the guard); the checks judge the values it returns in any case.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
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
