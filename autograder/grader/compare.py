"""Comparisons that explain themselves: shape, dtype and values with the largest error, and how they differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..shared.errors import CheckFailed, fail
from ..shared.wire import Proxy
from .diagnoses import explain_device, explain_shape, explain_values


class Mismatch(CheckFailed):
    """A result that differs from the expected one: ``problem`` says what differs, ``notes`` how (may be empty)."""

    def __init__(self, problem: str, notes: Sequence[str] = ()) -> None:
        self.problem, self.notes = problem, tuple(notes)
        super().__init__("\n".join([problem, *self.notes]))


def describe(x: Any) -> str:
    """A short description of a value: a tensor's shape and dtype (and device when not the CPU), or its type."""
    if isinstance(x, torch.Tensor):
        where = "" if x.device.type == "cpu" else f" on the device '{x.device.type}'"
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}{where}"
    if isinstance(x, Proxy):
        return x.description
    if isinstance(x, tuple):
        return f"a tuple of {len(x)} values ({', '.join(describe(v) for v in x)})"
    return f"a {type(x).__name__}"


#: What a tensor the grader cannot read is called: one on a device other than the CPU or meta.
UNREADABLE_TENSOR = "a Tensor"


def assert_tensor(x: Any, what: str) -> torch.Tensor:
    """Fail unless ``x`` is a tensor."""
    if isinstance(x, Proxy) and x.description == UNREADABLE_TENSOR:
        fail(f"{what} should be a torch.Tensor on the device of the inputs, but it is a tensor the grader cannot "
             "read, on another device (a GPU?): keep the result on the inputs' device (device=x.device), or "
             "call .cpu() on it.")
    if not isinstance(x, torch.Tensor):
        fail(f"{what} should be a torch.Tensor, but it is {describe(x)}.")
    return x


def assert_device(x: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Fail unless ``x`` is on the device type of ``expected`` (the inputs' device, or the one asked for)."""
    if x.device.type != expected.device.type:
        raise Mismatch(f"{what} should be on the device '{expected.device.type}', but it is on "
                       f"'{x.device.type}'.", explain_device(x, expected))


def assert_pair(result: Any, what: str, names: tuple[str, str] = ("output", "weights")) -> tuple:
    """Fail unless ``result`` is a pair of tensors (for example ``(output, weights)``)."""
    if not isinstance(result, tuple) or len(result) != 2:
        fail(f"{what} should return a tuple ({names[0]}, {names[1]}), but it returned {describe(result)}.")
    for name, value in zip(names, result):
        assert_tensor(value, f"The {name} returned by {what}")
    return result


def assert_shape(x: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    """Fail unless ``x`` has shape ``expected``."""
    if tuple(x.shape) != tuple(expected):
        fail(f"{what} should have shape {tuple(expected)}, but it has shape {tuple(x.shape)}.")


def assert_dtype(x: torch.Tensor, expected: torch.dtype, what: str) -> None:
    """Fail unless ``x`` has dtype ``expected``; the advice depends on the kind of dtype expected."""
    if x.dtype == expected:
        return
    if expected == torch.bool:
        fail(f"{what} should be a boolean tensor (dtype torch.bool), but it has dtype {x.dtype}: a comparison "
             "(<, >=, ==) or a logical operation (&, |, ~) gives one; keep it boolean, without .int() or .float().")
    if expected.is_floating_point and x.dtype.is_floating_point:
        fail(f"{what} should have dtype {expected}, but it has dtype {x.dtype}. A tensor made with a fixed dtype "
             "(torch.tensor(...), torch.zeros(...), .float(), .double()) is the usual cause: where the result "
             "follows the inputs' dtype, make new tensors with dtype=x.dtype.")
    fail(f"{what} should have dtype {expected}, but it has dtype {x.dtype}.")


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """Largest absolute difference and the index where it occurs (an unexpected NaN counts as infinite)."""
    a, e = actual.detach().double(), expected.detach().double()
    diff = (a - e).abs()
    # Equal infinities give NaN differences, and NaN where NaN is expected is right: neither is an error.
    same = (a == e) | (a.isnan() & e.isnan())
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf"))  # a finite number for -inf is inf away
    if diff.numel() == 0:
        return 0.0, ()
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return float(diff.reshape(-1)[flat]), index


def _flat_index(index: tuple[int, ...], shape: torch.Size) -> int:
    flat = 0
    for i, size in zip(index, shape):
        flat = flat * size + i
    return flat


def is_close(actual: Any, expected: Any, rtol: float, atol: float) -> bool:
    """True when tensors (or tuples of tensors) agree in shape and value, NaNs included.

    A ``meta`` tensor holds no values: it agrees with one of the same shape, dtype and device.
    """
    if isinstance(expected, tuple):
        return (
            isinstance(actual, tuple)
            and len(actual) == len(expected)
            and all(is_close(a, e, rtol, atol) for a, e in zip(actual, expected))
        )
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return False
    if actual.shape != expected.shape:
        return False
    if actual.device.type == "meta" or expected.device.type == "meta":
        return actual.device.type == expected.device.type and actual.dtype == expected.dtype
    return bool(
        torch.allclose(actual.detach().double(), expected.detach().double(), rtol=rtol, atol=atol, equal_nan=True)
    )


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    *,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    hint: str = "",
) -> None:
    """Fail unless ``actual`` matches ``expected``; the message gives the largest error and where, and how it differs.

    A ``meta`` expected tensor (no values) is matched by device and shape only.
    """
    assert_tensor(actual, what)
    assert_device(actual, expected, what)
    if tuple(actual.shape) != tuple(expected.shape):
        raise Mismatch(f"{what} should have shape {tuple(expected.shape)}, but it has shape {tuple(actual.shape)}.",
                       explain_shape(actual, expected, rtol, atol))
    if expected.device.type == "meta" or is_close(actual, expected, rtol, atol):
        return
    err, where = max_error(actual, expected)
    # The largest error may be within its tolerance (rtol scales with the expected value): then the
    # entry shown is the worst of those outside it, where the answer really fails.
    largest = "the largest error"
    outside = ~torch.isclose(actual.detach().double(), expected.detach().double(), rtol=rtol, atol=atol, equal_nan=True)
    if not bool(outside.reshape(-1)[_flat_index(where, actual.shape)]):
        err, where = max_error(torch.where(outside, actual.detach().double(), expected.detach().double()), expected)
        largest = "the largest error beyond the tolerance"
    got = actual.detach()[where].item() if where or actual.dim() == 0 else actual.detach().item()
    want = expected.detach()[where].item() if where or expected.dim() == 0 else expected.detach().item()
    shown_got, shown_want = distinct_digits(got, want)
    message = (
        f"{what} is not what it should be: {largest} is {err:.3g} at index {list(where)}, "
        f"where you return {shown_got} and the expected value is {shown_want} "
        f"(tolerance: rtol={rtol:g}, atol={atol:g})."
    )
    if hint:
        message += "\n" + hint
    raise Mismatch(message, explain_values(actual, expected, rtol, atol))


def distinct_digits(got: float, want: float) -> tuple[str, str]:
    """Two numbers with 6 significant digits, or as many more as it takes to show that they differ."""
    for digits in range(6, 18):
        shown = f"{got:.{digits}g}", f"{want:.{digits}g}"
        if shown[0] != shown[1]:
            break
    return shown


def assert_matches(actual: Any, expected: torch.Tensor, what: str, *, rtol: float, atol: float) -> None:
    """Fail unless ``actual`` is a tensor of ``expected``'s device, shape, dtype and values (within the tolerance)."""
    assert_tensor(actual, what)
    assert_device(actual, expected, what)
    if tuple(actual.shape) != tuple(expected.shape):
        raise Mismatch(f"{what} should have shape {tuple(expected.shape)}, but it has shape {tuple(actual.shape)}.",
                       explain_shape(actual, expected, rtol, atol))
    assert_dtype(actual, expected.dtype, what)
    assert_close(actual, expected, what, rtol=rtol, atol=atol)
