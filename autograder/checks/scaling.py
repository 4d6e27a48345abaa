"""Visible checks for notebook 02, why divide by sqrt(d_k)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from ..grader.compare import assert_close, describe
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.verify import Case, verify
from ..references.scaling import (
    ENTROPY_BUILTINS,
    JACOBIAN_BUILTINS,
    KEYS,
    SATURATION_DRAW,
    SCORE_VARIANCE_DRAW,
    VISIBLE_SATURATION,
    VISIBLE_SCORE_VARIANCE,
    answer_value,
    autograd_softmax_jacobian,
    reproduces,
    score_variance_standard_error,
)
from ..shared.errors import fail

standard_error_of_variance = score_variance_standard_error  # the tests call it by this name

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "scaling"


def _number(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    fail(f"{what} should be a number (a Python float), but it is {describe(value)}.")


def check_empirical_score_variance(empirical_score_variance) -> None:
    """Theory (d_k, or 1 when scaled) within 6 standard errors; the same seed gives the same result, the one of
    the draws the text prescribes."""
    d_k, n = 16, 20000
    for scaled in (False, True):
        what = f"empirical_score_variance(d_k={d_k}, num_samples={n}, scaled={scaled}, generator)"
        value = _number(call_student(empirical_score_variance, d_k, n, scaled, generator(1), what=what),
                        f"The result of {what}")
        theory = 1.0 if scaled else float(d_k)
        error = score_variance_standard_error(d_k, n, scaled)
        if abs(value - theory) > 6 * error:
            fail(f"{what} returned {value:.6g}, but theory says {theory:g}. With {n} samples the estimate has a "
                 f"standard error of {error:.3g}; yours is {abs(value - theory) / error:.1f} standard errors away "
                 "(at most 6 are accepted).")
        again = _number(call_student(empirical_score_variance, d_k, n, scaled, generator(1), what=what), what)
        if again != value:
            fail(f"Called twice with generators seeded alike, {what} returned {value!r} and then {again!r}: "
                 "draw every random number from `generator`.")
        other = _number(call_student(empirical_score_variance, d_k, n, scaled, generator(2), what=what), what)
        if other == value:
            fail(f"{what} returned {value!r} both with a generator seeded 1 and with one seeded 2: the result must "
                 "depend on the generator it is given. Draw every random number from `generator`.")
        expected = VISIBLE_SCORE_VARIANCE[scaled]
        if not reproduces(value, expected):
            fail(f"{what} with a generator seeded 1 returned {value!r}, which agrees with the theory, but the "
                 f"draws the text prescribes give {expected!r}.\n{SCORE_VARIANCE_DRAW}")
    expect_error(empirical_score_variance, 16, 1, False, generator(0), error=ValueError,
                 what="empirical_score_variance(d_k=16, num_samples=1, ...)", why="a variance needs two samples")
    print("empirical_score_variance passes the visible checks.")


def check_softmax_jacobian(softmax_jacobian) -> None:
    """Against torch.autograd.functional.jacobian of torch.softmax, in float64, for one row and a batch."""
    gen = generator(2)
    cases = [
        Case((torch.softmax(randn(4, gen=gen), dim=-1),), label="one row"),
        Case((torch.softmax(randn(2, 3, gen=gen), dim=-1),), label="a batch of two rows"),
    ]
    verify(softmax_jacobian, cases, autograd_softmax_jacobian, exercise="softmax_jacobian", notebook=NOTEBOOK,
           arg_names=("p",), outputs=None, forbid=JACOBIAN_BUILTINS, rtol=1e-10, atol=1e-12)
    print("softmax_jacobian passes the visible checks.")


def check_attention_entropy(attention_entropy) -> None:
    """Against torch.distributions.Categorical(probs).entropy(); one-hot rows give exactly 0, uniform rows log m."""
    gen = generator(3)
    rows = torch.softmax(randn(2, 3, 5, gen=gen), dim=-1)
    verify(attention_entropy, [Case((rows,), label="random rows, two batch dimensions")],
           lambda w: torch.distributions.Categorical(probs=w, validate_args=False).entropy(),
           exercise="attention_entropy", notebook=NOTEBOOK, arg_names=("weights",), outputs=None,
           forbid=ENTROPY_BUILTINS, rtol=1e-9, atol=1e-12)
    one_hot = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    verify(attention_entropy, [Case((one_hot,), label="one-hot rows: the entropy is exactly 0, not NaN")],
           lambda w: torch.zeros(2, dtype=torch.float64), exercise="attention_entropy", notebook=NOTEBOOK,
           arg_names=("weights",), outputs=None, forbid=ENTROPY_BUILTINS, rtol=0.0, atol=0.0)
    uniform = torch.full((3, 8), 1 / 8, dtype=torch.float64)
    verify(attention_entropy, [Case((uniform,), label="uniform rows over 8 keys: the entropy is log 8")],
           lambda w: torch.full((3,), math.log(8), dtype=torch.float64), exercise="attention_entropy",
           notebook=NOTEBOOK, arg_names=("weights",), outputs=None, forbid=ENTROPY_BUILTINS, rtol=1e-12, atol=1e-14)
    print("attention_entropy passes the visible checks.")


def _curves(saturation_curve, d_ks, scaled, num_keys, num_queries, seed) -> dict[str, torch.Tensor]:
    what = (f"saturation_curve(d_ks={list(d_ks)}, scaled={scaled}, num_keys={num_keys}, "
            f"num_queries={num_queries}, generator)")
    result = call_student(saturation_curve, list(d_ks), scaled, num_keys, num_queries, generator(seed), what=what)
    if not isinstance(result, dict) or set(result) != set(KEYS):
        fail(f"{what} should return a dict with exactly the keys {list(KEYS)}, but it returned {describe(result)}"
             + (f" with the keys {list(result)}." if isinstance(result, dict) else "."))
    for key in KEYS:
        value = result[key]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (len(d_ks),) or value.dtype != torch.float64:
            fail(f"result[{key!r}] of {what} should be a float64 tensor of shape ({len(d_ks)},), one number per "
                 f"d_k, but it is {describe(value)}.")
    return result


def _binary_entropy(p: float) -> float:
    return -sum(x * math.log(x) for x in (p, 1 - p) if x > 0)


def _consistent(curves: dict[str, torch.Tensor], d_ks, m: int, scaled: bool) -> None:
    """Bounds every correct answer satisfies, whatever the random numbers.

    Each row's entropy is at most log m. And a row whose largest weight is P has entropy at
    most h(P) + (1 - P) log(m - 1) (Fano's inequality: the rest of the weight, 1 - P, is spread
    over m - 1 keys at best uniformly); that bound is concave in P, so it also holds for the
    means over the rows.
    """
    for i, d_k in enumerate(d_ks):
        p_max, entropy = curves["max_weight"][i].item(), curves["entropy"][i].item()
        where = f"saturation_curve(..., scaled={scaled}, num_keys={m}, ...) at d_k = {d_k}"
        if not 1 / m - 1e-9 <= p_max <= 1 + 1e-9:
            fail(f"{where}: the mean largest weight {p_max:.4f} should lie between 1/{m} and 1.")
        if not -1e-9 <= entropy <= math.log(m) + 1e-9:
            fail(f"{where}: the mean entropy {entropy:.4f} should lie between 0 and log {m} = {math.log(m):.4f} "
                 "(in nats).")
        bound = _binary_entropy(min(p_max, 1.0)) + (1 - min(p_max, 1.0)) * math.log(m - 1)
        if entropy > bound + 1e-6:
            fail(f"{where}: the mean largest weight {p_max:.4f} and the mean entropy {entropy:.4f} cannot both be "
                 f"right: rows whose largest weight is {p_max:.4f} have an entropy of at most {bound:.4f} (the rest "
                 "of each row's weight spread evenly over the other keys). Is the largest weight taken over each "
                 "row (over the keys)?")


def check_saturation_curve(saturation_curve) -> None:
    """The return type; exact values with one key; unscaled curves saturate as d_k grows, scaled ones stay flat;
    the curves are those of the draws the text prescribes."""
    one_key = _curves(saturation_curve, [2, 64], False, 1, 20, 4)
    for key, want in zip(KEYS, (1.0, 0.0, 0.0), strict=True):
        assert_close(one_key[key], torch.full((2,), want, dtype=torch.float64),
                     f"result[{key!r}] with a single key", atol=1e-9,
                     hint="With one key its weight is 1: the max weight is 1, the entropy 0 and the Jacobian 0.")
    d_ks = [16, 128, 1024]
    log_m = math.log(16)
    unscaled = _curves(saturation_curve, d_ks, False, 16, 500, 5)
    scaled = _curves(saturation_curve, d_ks, True, 16, 500, 6)
    for curves, is_scaled in ((unscaled, False), (scaled, True)):
        _consistent(curves, d_ks, 16, is_scaled)
    for key, grows in zip(KEYS, (True, False, False), strict=True):
        v = unscaled[key].tolist()
        if not all((b > a) if grows else (b < a) for a, b in zip(v, v[1:], strict=False)):
            fail(f"Without scaling, result[{key!r}] should {'grow' if grows else 'shrink'} as d_k grows "
                 f"({d_ks}), but it is {[round(x, 4) for x in v]}.")
    last = {key: unscaled[key][-1].item() for key in KEYS}
    if last["max_weight"] < 0.9 or last["entropy"] > 0.25 or last["jacobian_norm"] > 0.1:
        fail(f"Without scaling, at d_k = 1024 the rows should be nearly one-hot (max weight above 0.9, entropy and "
             f"Jacobian norm near 0), but the curves end at {last}.")
    for key in KEYS:
        v = scaled[key]
        if (v.max() - v.min()).item() > 0.15 * v.mean().abs().item():
            fail(f"With scaling, result[{key!r}] should stay nearly flat as d_k grows ({d_ks}), but it is "
                 f"{[round(x, 4) for x in v.tolist()]}.")
    if scaled["max_weight"].max().item() > 0.5 or scaled["entropy"].min().item() < 0.5 * log_m:
        fail(f"With scaling the rows should stay far from one-hot, but the curves are "
             f"{ {k: [round(x, 4) for x in v.tolist()] for k, v in scaled.items()} }.")
    for curves, is_scaled, seed in ((unscaled, False, 5), (scaled, True, 6)):
        expected = {key: torch.tensor(values, dtype=torch.float64) for key, values in VISIBLE_SATURATION[is_scaled].items()}
        for key in KEYS:
            if not reproduces({key: curves[key]}, {key: expected[key]}):
                fail(f"saturation_curve(d_ks={d_ks}, scaled={is_scaled}, num_keys=16, num_queries=500, generator "
                     f"seeded {seed}): result[{key!r}] is {[round(x, 6) for x in curves[key].tolist()]}, but the "
                     f"draws the text prescribes give {[round(x, 6) for x in expected[key].tolist()]}.\n"
                     f"{SATURATION_DRAW}")
    print("saturation_curve passes the visible checks.")


# --- numeric answers -----------------------------------------------------------------------------


def check_std_unscaled_512(std_unscaled_512) -> None:
    """Plausible: within 10% of a simulation (the exact value is checked when the notebook is graded)."""
    value = answer_value(std_unscaled_512, "std_unscaled_512", positive=True)
    gen = generator(7)
    q, k = randn(4000, 512, gen=gen), randn(4000, 512, gen=gen)
    measured = (q * k).sum(dim=-1).std().item()
    if abs(value - measured) > 0.1 * measured:
        fail(f"std_unscaled_512 = {value:.6g} is more than 10% away from the standard deviation a simulation of "
             "4000 pairs (q, k) with d_k = 512 measures. Work it out from Var(q.k).")
    print("std_unscaled_512 is plausible: it agrees with a simulation to 10%. Its exact value is checked when "
          "your notebook is graded.")


def check_scale_for_unit_variance(scale_for_unit_variance) -> None:
    """Plausible: scaling simulated scores by it gives variance 1 within 10%."""
    value = answer_value(scale_for_unit_variance, "scale_for_unit_variance", positive=True)
    gen = generator(8)
    q = randn(20000, 64, gen=gen) * math.sqrt(2.0)
    k = randn(20000, 64, gen=gen) * math.sqrt(0.5)
    variance = (value * (q * k).sum(dim=-1)).var().item()
    if abs(variance - 1.0) > 0.1:
        fail(f"Scores q.k of a simulation (d_k = 64, var_q = 2, var_k = 0.5) multiplied by "
             f"scale_for_unit_variance = {value:.6g} have variance {variance:.4g}, not 1.")
    print("scale_for_unit_variance is plausible: it gives simulated scores variance 1 to 10%. Its exact value is "
          "checked when your notebook is graded.")


def check_jacobian_norm_uniform_16(jacobian_norm_uniform_16) -> None:
    """A positive number below 1 (every entry of the Jacobian is below 1/16 in size)."""
    value = answer_value(jacobian_norm_uniform_16, "jacobian_norm_uniform_16", positive=True)
    if value >= 1.0:
        fail(f"jacobian_norm_uniform_16 = {value:.6g} is too large: at the uniform distribution every entry of the "
             "Jacobian is at most 1/16 in size, and there are 256 of them.")
    print("jacobian_norm_uniform_16 is plausible. Its exact value is checked when your notebook is graded.")
