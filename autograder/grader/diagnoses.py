"""Say *how* an answer is wrong, without knowing which mistake made it.

A failing answer is compared with the catalogued mistakes of its exercise when the grader
has the catalogue. These diagnoses need no catalogue: they look at the answer next to the
expected result and recognise the shapes that wrong answers take - the right numbers
computed in float32, right up to a constant factor or to an order of the axes, wrong only
on some rows or batch elements, NaN where a number was expected, a size-1 dimension
dropped, the wrong device, a rounded number. Each returns sentences for the student (an
empty list when nothing is recognised); when several fit, all are said.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

#: Lower precisions whose rounding error a float64 (or float32) answer may show: (dtype, smallest and
#: largest error relative to the largest expected value that we attribute to it).
LOWER_PRECISIONS = (
    (torch.float32, 1e-9, 1e-3),  # float32 rounding of large intermediates (angles, sums) reaches 1e-4 and more
    (torch.float16, 1e-5, 2e-2),
    (torch.bfloat16, 1e-4, 1e-1),
)
#: The most entries of a list of indices a message writes out.
SHOWN = 6


# --- small helpers ----------------------------------------------------------------------------------


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.is_complex() else t.detach().to(torch.float64)


def _bad_entries(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """True where ``actual`` differs from ``expected`` beyond the tolerance (NaN equals NaN, inf equals inf)."""
    a, e = _plain(actual), _plain(expected)
    same = (a == e) | (a.isnan() & e.isnan())
    with torch.no_grad():  # an infinite expected value is matched by itself only (rtol * inf would take anything)
        close = ((a - e).abs() <= atol + rtol * e.abs()) & e.isfinite()
    return ~(same | close)


def _indices(mask: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in row) for row in mask.nonzero()[:SHOWN]]


def _list(items: Sequence[Any], total: int) -> str:
    shown = ", ".join(str(list(i)) if isinstance(i, tuple) else str(i) for i in items[:SHOWN])
    return shown + (f" and {total - SHOWN} more" if total > SHOWN else "")


def simple_number(c: float) -> str | None:
    """``c`` written as a simple expression (2, 1/3, sqrt(8), 1/sqrt(64), 1/ln 2, -1, ...), or None."""
    if not math.isfinite(c) or c == 0:
        return None
    sign, x = ("-" if c < 0 else ""), abs(c)
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-6)  # noqa: E731 - a one-line predicate
    named = {"ln 2": math.log(2), "1/ln 2": 1 / math.log(2), "e": math.e, "pi": math.pi}
    for name, value in named.items():
        if close(x, value):
            return sign + name
    for k in range(1, 4097):
        if close(x, k):
            return f"{sign}{k}"
        if close(x, 1 / k):
            return f"{sign}1/{k}"
        root = math.sqrt(k)
        if root != int(root) and close(x, root):
            return f"{sign}sqrt({k})"
        if root != int(root) and close(x, 1 / root):
            return f"{sign}1/sqrt({k})"
    return None


def _factor(c: float) -> str:
    name = simple_number(c)
    return f"{c:.6g}" + (f" (= {name})" if name and name != f"{c:.6g}" else "")


# --- shapes -----------------------------------------------------------------------------------------


def _squeezed(shape: Sequence[int]) -> list[int]:
    return [s for s in shape if s != 1]


def _permutations_to(expected: torch.Tensor, shape: Sequence[int]) -> list[tuple[int, ...]]:
    """The non-trivial orders of ``expected``'s axes that give ``shape`` (at most 6 axes)."""
    if expected.dim() != len(shape) or expected.dim() > 6 or sorted(expected.shape) != sorted(shape):
        return []
    identity = tuple(range(expected.dim()))
    return [p for p in itertools.permutations(identity)
            if p != identity and tuple(expected.shape[i] for i in p) == tuple(shape)]


def _order_in_words(p: Sequence[int]) -> str:
    moved = [i for i, j in enumerate(p) if i != j]
    n = len(p)
    if len(moved) == 2:
        a, b = moved
        if (a, b) == (n - 2, n - 1):
            return "the last two axes swapped (a transpose)"
        return f"axes {a} and {b} swapped"
    return f"its axes in the order {tuple(p)} of the expected ones (.permute{tuple(p)})"


def _same_values(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> bool:
    return actual.shape == expected.shape and not bool(_bad_entries(actual, expected, rtol, atol).any())


def explain_shape(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> list[str]:
    """Why a tensor of the wrong shape has it: a size-1 dimension, an order of axes, a reshape."""
    got, want = tuple(actual.shape), tuple(expected.shape)
    notes: list[str] = []
    if got != want and _squeezed(got) == _squeezed(want):
        right = actual.numel() == expected.numel() and _same_values(actual.reshape(want), expected, rtol, atol)
        values = " Its values are right: only the shape is wrong." if right else ""
        if len(got) < len(want):
            missing = [i for i in range(len(want)) if want[i] == 1]
            notes.append(
                f"A dimension of size 1 is missing: the expected shape {want} has size 1 at position(s) "
                f"{missing}. A reduction without keepdim=True, a .squeeze(), or an index such as [..., 0] "
                f"removes it; dimensions of size 1 count.{values}"
            )
        elif len(got) > len(want):
            notes.append(
                f"Your result has an extra dimension of size 1: shape {got} where {want} is expected. Is it a "
                f"keepdim=True, an unsqueeze or a [:, None] that should not be there?{values}"
            )
        else:
            notes.append(f"The dimensions of size 1 are in the wrong places: shape {got} where {want} is "
                         f"expected.{values}")
    for p in _permutations_to(expected, got):
        if _same_values(actual, expected.permute(p), rtol, atol):
            notes.append(f"Your result is the expected one with {_order_in_words(p)}: the numbers are right, the "
                         "order of the axes is not.")
            return notes
    if not notes and actual.numel() == expected.numel() and actual.numel() > 1:
        if _same_values(actual.reshape(want), expected, rtol, atol):
            notes.append(f"Your result holds the expected numbers in the expected order, but with shape {got} "
                         f"instead of {want}: reshape it.")
        elif _same_values(_plain(actual).reshape(-1).sort().values, _plain(expected).reshape(-1).sort().values,
                          rtol, atol):
            notes.append("Your result holds the expected numbers, but arranged differently: a reshape or view "
                         "where a transpose (or permute) was needed?")
    return notes


# --- values -----------------------------------------------------------------------------------------


def explain_nonfinite(actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """NaN or infinity where the expected value is a number, and finite numbers where it is -inf."""
    if not (actual.is_floating_point() and expected.is_floating_point()):
        return []
    a, e = _plain(actual), _plain(expected)
    nan_number = a.isnan() & e.isfinite() & (e != 0)
    # NaN in whole rows, the rest right: the signature of a softmax over a row of scores all -inf.
    whole_rows = a.dim() >= 1 and a.shape[-1] > 1 and bool(nan_number.any()) and bool(
        (a.isnan().all(dim=-1) == a.isnan().any(dim=-1)).all())
    kinds = [
        (a.isnan() & (e == 0), "NaN where the expected value is 0",
         "0/0 or 0 * inf? A softmax over a row whose scores are all -inf gives 0/0."),
        (a.isnan() & (e == -math.inf), "NaN where the expected value is -inf",
         "-inf - (-inf) is NaN: was a maximum of -inf subtracted?"),
        (nan_number, "NaN where the expected value is a finite number",
         "Whole rows are NaN: a softmax over a row of scores that are all -inf (a query that may attend to "
         "nothing) gives 0/0, and one that overflows gives inf / inf. A mask applied along the wrong axis (to the "
         "queries instead of the keys), or no maximum subtracted?"
         if whole_rows else "inf / inf, inf - inf or 0 * inf: did an exponential overflow?"),
        (a.isinf() & e.isfinite(), "an infinity where the expected value is finite",
         "An overflow (exp of a large number: subtract the maximum first) or a division by 0?"),
        (a.isfinite() & (e == -math.inf), "a finite number where the expected value is -inf",
         "A large negative number such as -1e9 or torch.finfo(dtype).min is not -inf."),
        (a.isfinite() & (e == math.inf), "a finite number where the expected value is +inf", ""),
    ]
    notes = []
    for where, what, why in kinds:
        count = int(where.sum())
        if count:
            first = _indices(where)
            notes.append(f"Your result has {what} at {count} entr{'y' if count == 1 else 'ies'} "
                         f"({_list(first, count)}). {why}".rstrip())
    return notes


def explain_precision(actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """The error has the size of the rounding of a lower precision than the expected dtype."""
    if not (actual.is_floating_point() and expected.is_floating_point()) or actual.dtype != expected.dtype:
        return []
    a, e = _plain(actual), _plain(expected)
    finite = a.isfinite() & e.isfinite()
    if not bool(finite.any()) or not bool(((a.isfinite() == e.isfinite()) & ((a == e) | finite)).all()):
        return []
    scale = float(e[finite].abs().max())
    if scale == 0:
        return []
    diff = (a[finite] - e[finite]).abs()
    error = float(diff.max()) / scale
    own = torch.finfo(expected.dtype).eps
    # Rounding touches nearly every entry, each by a few units of the lower precision: an answer wrong on
    # some entries only (one batch element, one row) is not a precision problem, whatever its size.
    beyond = diff > 100 * own * scale
    touched = float(beyond.double().mean())
    candidates = [dtype for dtype, low, high in LOWER_PRECISIONS
                  if torch.finfo(dtype).eps > 10 * own and low <= error <= high]
    for dtype in sorted(candidates, key=lambda d: -torch.finfo(d).eps):  # a float16 number is a float32 one too
        if bool((a[finite].to(dtype).to(torch.float64) == a[finite]).all()):
            return [f"Your computation loses precision: every entry of your result is a {dtype} number, so it was "
                    f"computed in {dtype} and converted, while the result should be {expected.dtype}. "
                    + _LOWER_PRECISION_CAUSES.format(dtype=dtype)]
    # Short of that proof, only float32 is suggested, and only for an error that looks like rounding: its
    # sign relative to the expected value changes from entry to entry. A wrong constant (a scale, a base, an
    # epsilon, a maximum for a log-sum-exp) moves the entries together, and can have any size, a bfloat16
    # rounding's included.
    signed = ((a[finite] - e[finite]) * e[finite].sign())[beyond]
    upward = float((signed > 0).double().mean()) if signed.numel() else 0.0
    if torch.float32 not in candidates or touched < 0.75 or not 0.2 <= upward <= 0.8:
        return []
    return [f"Your computation loses precision: the largest error, {error:.2g} relative to the largest expected "
            f"value, is far above {expected.dtype} rounding and the size of torch.float32 rounding (of the result, "
            f"or of large intermediate values such as angles or sums). Was part of it computed in torch.float32? "
            + _LOWER_PRECISION_CAUSES.format(dtype=torch.float32)]


_LOWER_PRECISION_CAUSES = (
    "A tensor made without the inputs' dtype (torch.tensor(...), torch.zeros(...), torch.arange(...).float()), a "
    ".float() or a .to({dtype}) does it: make new tensors with dtype=x.dtype."
)


def _least_squares_factor(a: torch.Tensor, e: torch.Tensor, dim: int | None) -> torch.Tensor:
    keep = dim is not None
    num = (a * e).sum(dim=dim, keepdim=keep) if keep else (a * e).sum()
    den = (e * e).sum(dim=dim, keepdim=keep) if keep else (e * e).sum()
    return num / den


def explain_factor(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> list[str]:
    """Right up to a constant factor, a factor per row, or a constant added (per row)."""
    if not (actual.is_floating_point() and expected.is_floating_point()) or actual.shape != expected.shape:
        return []
    a, e = _plain(actual), _plain(expected)
    if not (bool(a.isfinite().all()) and bool(e.isfinite().all())) or e.numel() < 2:
        return []
    tol = max(10 * rtol, 1e-9) * float(a.abs().max().clamp(min=1e-300)) + atol
    if float(e.abs().max()) > 0:
        c = float(_least_squares_factor(a, e, None))
        if abs(c + 1) <= 1e-6 and float((a + e).abs().max()) <= tol:
            return ["Your result is the expected one with the opposite sign, everywhere: a subtraction the wrong way "
                    "round, or a minus sign missing or added?"]
        if abs(c - 1) > 1e-6 and c != 0 and float((a - c * e).abs().max()) <= tol:
            return [f"Your result is the expected one multiplied by {_factor(c)}, everywhere: the computation is "
                    "right but for a constant factor (a scale applied twice, missing, or the wrong one?)."]
    shift = (a - e).mean()
    if abs(float(shift)) > tol and float((a - e - shift).abs().max()) <= tol:
        return [f"Your result is the expected one plus {float(shift):.6g}, everywhere: a constant is added or "
                "missing."]
    every_row_wrong = bool(_bad_entries(a, e, rtol, atol).any(dim=-1).all()) if e.dim() else False
    if every_row_wrong and e.dim() >= 2 and e.shape[-1] > 1 and bool((e.abs().sum(dim=-1) > 0).all()):
        rows = _least_squares_factor(a, e, -1)
        varies = float(rows.max() - rows.min()) > 1e-6
        if varies and float((a - rows * e).abs().max()) <= tol:
            seen = ", ".join(f"{float(c):.4g}" for c in rows.reshape(-1)[:3])
            return [f"Each row (along the last axis) of your result is the expected row times a number that "
                    f"changes from row to row ({seen}, ...): a normalisation is missing or wrong (should each row "
                    "sum to 1?)."]
        offsets = (a - e).mean(dim=-1, keepdim=True)
        if float(offsets.max() - offsets.min()) > tol and float((a - e - offsets).abs().max()) <= tol:
            return ["Each row (along the last axis) of your result is the expected row plus a number that changes "
                    "from row to row: a term computed per row (an offset, a normaliser, an epsilon) is missing, added where "
                    "it does not belong, or wrong."]
    return []


def explain_order(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> list[str]:
    """Same shape, but the expected values with axes swapped, or flipped along an axis."""
    if actual.shape != expected.shape:
        return []
    for p in _permutations_to(expected, tuple(actual.shape)):
        if _same_values(actual, expected.permute(p), rtol, atol):
            return [f"Your result is the expected one with {_order_in_words(p)}."]
    for d in range(expected.dim()):
        if expected.shape[d] > 1 and _same_values(actual, expected.flip(d), rtol, atol):
            return [f"Your result is the expected one in reverse order along axis {d}."]
    flat_a, flat_e = _plain(actual).reshape(-1), _plain(expected).reshape(-1)
    if actual.numel() > 1 and _same_values(flat_a.sort().values, flat_e.sort().values, rtol, atol):
        return ["Your result holds the expected numbers, but arranged differently: a reshape or view where a "
                "transpose (or permute) was needed, or indices in the wrong order?"]
    return []


def explain_rounding(actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """Every entry is the expected one rounded to a few decimals."""
    if not (actual.is_floating_point() and expected.is_floating_point()) or actual.shape != expected.shape:
        return []
    a, e = _plain(actual), _plain(expected)
    for decimals in range(0, 7):
        rounded = torch.round(e, decimals=decimals)
        if not torch.equal(rounded, e) and _same_values(a, rounded, 1e-12, 1e-12):
            return [f"Your result is the expected one rounded to {decimals} decimal place(s): do not round."]
    return []


def _axis_name(d: int, ndim: int, size: int) -> str:
    if ndim >= 2 and d == ndim - 2:
        return f"axis {d} (size {size}, the rows)"
    return f"axis {d} (size {size})"


def explain_where(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> list[str]:
    """Only some batch elements, heads or rows are wrong: which, and what is special about them."""
    if actual.shape != expected.shape or expected.dim() == 0:
        return []
    bad = _bad_entries(actual, expected, rtol, atol)
    total = int(bad.sum())
    if total == 0 or total == bad.numel():
        return []
    notes = []
    best = None
    for d in range(bad.dim() - 1):  # a leading axis: batch elements, heads, queries
        if bad.shape[d] < 2:
            continue
        wrong = bad.transpose(0, d).reshape(bad.shape[d], -1).any(dim=1)
        count = int(wrong.sum())
        if 0 < count <= bad.shape[d] // 2 and (best is None or count / bad.shape[d] < best[0]):
            best = (count / bad.shape[d], d, wrong.nonzero().flatten().tolist())
    if best is not None:
        _, d, which = best
        notes.append(f"Only part of your result is wrong: along {_axis_name(d, bad.dim(), bad.shape[d])} only the "
                     f"index(es) {_list(which, len(which))} differ; the rest is right.")
    if expected.dim() >= 1 and expected.shape[-1] >= 1:
        rows = bad.any(dim=-1)
        wrong_rows = int(rows.sum())
        if 0 < wrong_rows <= rows.numel() // 2:
            e = _plain(expected)
            for special, what in ((e == 0).all(dim=-1), "whose expected values are all 0 (in attention: the queries "
                                  "with no allowed key)"), ((e == -math.inf).all(dim=-1), "whose expected values "
                                                             "are all -inf"):
                if bool(special.any()) and torch.equal(rows, special):
                    notes.append(f"The wrong rows are exactly the rows {what}: {_list(_indices(rows), wrong_rows)}.")
                    break
            else:
                if best is None or best[1] != bad.dim() - 2:
                    notes.append(f"{wrong_rows} of the {rows.numel()} rows (along the last axis) are wrong: "
                                 f"{_list(_indices(rows), wrong_rows)}.")
    return notes


def explain_values(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> list[str]:
    """How a tensor of the right shape, dtype and device differs from the expected one."""
    if actual.device.type == "meta" or expected.device.type == "meta" or actual.is_complex():
        return []
    if actual.dtype == torch.bool and expected.dtype == torch.bool and torch.equal(actual, ~expected):
        return ["Your result is the expected one inverted: True exactly where False is expected. In this course, as "
                "in F.scaled_dot_product_attention, True means may attend (nn.MultiheadAttention uses the opposite)."]
    notes = explain_nonfinite(actual, expected)
    # Exact patterns first (a factor, an order of axes, a rounding): rounding noise never fits one of them.
    found = explain_factor(actual, expected, rtol, atol) or explain_order(actual, expected, rtol, atol)
    found = found or explain_rounding(actual, expected) or explain_precision(actual, expected)
    notes += found
    if not found:
        notes += explain_where(actual, expected, rtol, atol)
    return notes


def explain_device(actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """A result on another device than the inputs'."""
    if actual.device.type == expected.device.type:
        return []
    return [
        f"Your result is on the device '{actual.device.type}', but it should be on '{expected.device.type}', the "
        "device of the inputs (or the one asked for): create new tensors with device=... (torch.zeros(..., "
        "device=x.device), torch.arange(n, device=device)) or from the inputs (torch.zeros_like(x))."
    ]


# --- numbers ----------------------------------------------------------------------------------------


def _rounded(x: float, digits: int) -> float:
    return float(f"{x:.{digits - 1}e}")


def explain_number(value: float, exact: float) -> list[str]:
    """A number that is the exact one rounded, or that agrees with it to a few significant figures only."""
    if not (math.isfinite(value) and math.isfinite(exact)) or exact == 0 or value == exact:
        return []
    for digits in range(1, 7):
        if value == _rounded(exact, digits) or math.isclose(value, _rounded(exact, digits), rel_tol=1e-12):
            return [f"{value!r} is the exact value rounded to {digits} significant figure(s): give the value as "
                    "computed (from the formula, with math.sqrt(...) or float(...)), not a rounding of it."]
    for decimals in range(0, 7):
        if math.isclose(value, round(exact, decimals), rel_tol=1e-12):
            return [f"{value!r} is the exact value rounded to {decimals} decimal place(s): give the exact value, "
                    "not a rounding."]
    agree = -math.log10(abs(value - exact) / abs(exact))
    if agree >= 2:
        return [f"{value!r} agrees with the exact value to about {int(agree)} significant figures only: give the "
                "exact value, not an approximation."]
    return []
