"""Hidden checks and mistake catalogue for notebook 02, why divide by sqrt(d_k) (instructor-only).

Two of the exercises are random experiments (``empirical_score_variance`` and
``saturation_curve``): their checks compare with theory, or with a table of the
experiment's mean and spread, within a tolerance of several standard errors; then, since
their texts fix the generator, the shapes and the order of the draws, with the experiment
drawn exactly as prescribed, up to rounding (another estimator or another order of the draws
agrees with the theory but not with those numbers). A wrong answer is diagnosed by running
every catalogued mistake on the same input and naming the first one whose result agrees with
the student's within the tolerance that failed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ..grader.cases import case, needs
from ..grader.compare import describe
from ..grader.diagnoses import explain_number
from ..grader.diagnosis import Mistake, MistakeFound, by_id, read_mistakes
from ..grader.inputs import generator, randn
from ..grader.student import attempt, call_student, describe_error, expect_error
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..references.scaling import (
    ENTROPY_BUILTINS,
    JACOBIAN_BUILTINS,
    KEYS,
    SATURATION_DRAW,
    SCORE_VARIANCE_DRAW,
    answer_value,
    autograd_softmax_jacobian,
    entropy_reference,
    reproduces,
    score_variance_standard_error,
)
from ..shared.errors import fail
from . import hidden

MEAN_VARIANCE = "2. The mean and variance of a dot product"
GRADIENT = "5. The gradient of softmax"

# --- the references: the experiments drawn as the texts prescribe (the answers: never in the student's bundle),
# each with the decisions its catalogued mistakes get wrong -------------------------------------------------


@decisions("scaled_by", "scale_applied_to", "summed", "key", "draw", "draws_from", "statistic")
def score_variance_reference(d_k, num_samples, scaled, generator, *, scaled_by="sqrt(d_k)", scale_applied_to="the scores",
                             summed=True, key="drawn", draw="torch.randn", draws_from="the generator",
                             statistic="unbiased var"):
    """empirical_score_variance as its text prescribes: queries, then keys, (num_samples, d_k) float64
    standard normal from ``generator``; the unbiased sample variance (``Tensor.var``) of the row-wise dot products."""
    if d_k < 1 or num_samples < 2:
        raise ValueError(f"need d_k >= 1 and num_samples >= 2, got d_k={d_k}, num_samples={num_samples}")
    if draws_from == "the global generator":
        generator = None
    elif draws_from == "a generator seeded 0":
        generator = torch.Generator().manual_seed(0)
    sample = torch.rand if draw == "torch.rand" else torch.randn
    q = sample(num_samples, d_k, generator=generator, dtype=torch.float64)
    k = sample(num_samples, d_k, generator=generator, dtype=torch.float64) if key == "drawn" else q
    scores = (q * k).sum(dim=-1) if summed else q * k
    if scaled and scaled_by is not None and scale_applied_to == "the scores":
        scores = scores / (d_k if scaled_by == "d_k" else math.sqrt(d_k))
    if statistic == "std":
        value = scores.std().item()
    else:
        value = scores.var(correction=0 if statistic == "biased var" else 1).item()
    return value / math.sqrt(d_k) if scaled and scale_applied_to == "the variance" else value


@decisions("scaled_by", "softmax_dim", "max_dim", "entropy_unit", "entropy_of", "jacobian", "norm", "drawn_first",
           "draws")
def saturation_curve_reference(d_ks, scaled, num_keys, num_queries, generator, *, scaled_by="sqrt(d_k)", softmax_dim=-1,
                               max_dim=-1, entropy_unit="nats", entropy_of="each row", jacobian="diag(p) - p p^T",
                               norm="Frobenius, per row", drawn_first="Q", draws="for each d_k"):
    """saturation_curve as its text prescribes: for each d_k in order, Q (num_queries, d_k) then K (num_keys, d_k),
    float64 standard normal from ``generator``; the means over the rows of the largest weight, the entropy in nats
    and the Frobenius norm of the softmax Jacobian."""
    if min(d_ks) < 1 or num_keys < 1 or num_queries < 1:
        raise ValueError(f"need d_ks, num_keys and num_queries >= 1, got {list(d_ks)}, {num_keys}, {num_queries}")
    if draws == "one wide draw, sliced":  # the same numbers for every d_k
        Q_all = torch.randn(num_queries, max(d_ks), generator=generator, dtype=torch.float64)
        K_all = torch.randn(num_keys, max(d_ks), generator=generator, dtype=torch.float64)
    curves = {"max_weight": [], "entropy": [], "jacobian_norm": []}
    for d_k in d_ks:
        if draws == "one wide draw, sliced":
            Q, K = Q_all[:, :d_k], K_all[:, :d_k]
        elif drawn_first == "K":
            K = torch.randn(num_keys, d_k, generator=generator, dtype=torch.float64)
            Q = torch.randn(num_queries, d_k, generator=generator, dtype=torch.float64)
        else:
            Q = torch.randn(num_queries, d_k, generator=generator, dtype=torch.float64)
            K = torch.randn(num_keys, d_k, generator=generator, dtype=torch.float64)
        scores = Q @ K.T
        if scaled and scaled_by is not None:
            scores = scores / (d_k if scaled_by == "d_k" else math.sqrt(d_k))
        weights = torch.softmax(scores, dim=softmax_dim)
        rows = weights.mean(dim=0) if entropy_of == "the mean row" else weights
        entropy = -torch.xlogy(rows, rows).sum(dim=-1)
        J = torch.diag_embed(weights)
        if jacobian == "diag(p) - p p^T":
            J = J - weights.unsqueeze(-1) * weights.unsqueeze(-2)
        if norm == "one for all rows":
            norms = torch.linalg.norm(J)
        else:
            norms = torch.linalg.matrix_norm(J, ord=2 if norm == "spectral, per row" else "fro")
        curves["max_weight"].append(weights.amax(dim=max_dim).mean())
        curves["entropy"].append((entropy / math.log(2) if entropy_unit == "bits" else entropy).mean())
        curves["jacobian_norm"].append(norms.mean())
    return {key: torch.stack(values) for key, values in curves.items()}


@decisions("diagonal", "product", "sign_reversed")
def softmax_jacobian(p, *, diagonal="diag(p)", product="p p^T", sign_reversed=False):
    """softmax_jacobian, diag(p) - p p^T, with the decisions its mistakes get wrong."""
    if p.dim() == 0:
        raise ValueError(f"p must have at least one dimension (..., m), got shape {tuple(p.shape)}")
    if diagonal == "identity":
        first = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    else:
        first = torch.diag_embed(p)
    if product is None:  # the off-diagonal terms missing
        return first
    if product == "p^T p":  # an inner product: one number per row
        second = p.unsqueeze(-2) @ p.unsqueeze(-1)
    elif product == "diag(p p^T)":  # its diagonal only
        second = torch.diag_embed(p * p)
    else:
        second = p.unsqueeze(-1) * p.unsqueeze(-2)
    if diagonal is None:
        return -second
    return second - first if sign_reversed else first - second


# Its own function: the check's message shows the line of the pasted code that raises.
def jacobian_one_dimensional(p):
    if p.dim() == 0:
        raise ValueError(f"p must have at least one dimension (..., m), got shape {tuple(p.shape)}")
    return torch.diag(p) - torch.outer(p, p)


@decisions("log", "zero_terms", "epsilon", "minus", "reduction", "dim", "keepdim", "normalised")
def attention_entropy(weights, *, log="torch.log", zero_terms="left out", epsilon=0.0, minus=True, reduction="sum",
                      dim=-1, keepdim=False, normalised=False):
    """attention_entropy, -sum p log p with 0 log 0 = 0, with the decisions its mistakes get wrong."""
    if weights.dim() == 0:
        raise ValueError(f"weights must have shape (..., m), got shape {tuple(weights.shape)}")
    log_of = torch.log2 if log == "torch.log2" else torch.log
    if zero_terms == "left out":
        terms = torch.where(weights > 0, weights * log_of(weights.clamp_min(1e-300)), torch.zeros_like(weights))
    else:  # 0 * log 0 = 0 * -inf = NaN, unless epsilon moves it
        terms = weights * log_of(weights + epsilon)
    entropy = terms.mean(dim=dim, keepdim=keepdim) if reduction == "mean" else terms.sum(dim=dim, keepdim=keepdim)
    entropy = -entropy if minus else entropy
    return entropy / math.log(weights.shape[-1]) if normalised else entropy


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/scaling.toml


# --- diagnosis of random experiments ---------------------------------------------------------


def _diagnose_random(exercise: str, make_args: Callable[[], tuple], agrees: Callable[[Any], bool]) -> Mistake | None:
    """The first catalogued mistake whose result on fresh ``make_args()`` satisfies ``agrees``."""
    for mistake in MISTAKES[exercise]:
        try:
            value = mistake.fn(*make_args())
        except Exception:  # noqa: BLE001 - a mistake that fails here simply does not match
            continue
        try:
            if agrees(value):
                return mistake
        except Exception:  # noqa: BLE001
            continue
    return None


def _fail_named(message: str, mistake: Mistake | None) -> None:
    raise MistakeFound(message, [mistake] if mistake else [])


# --- empirical_score_variance ---------------------------------------------------------------


def _as_number(value: Any, what: str) -> float:
    """A real number from a Python number or a one-element tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    fail(f"{what} should return a number (a Python float), but it returned {describe(value)}.")


def _esv_pair(fn, d_k: int, num_samples: int, seed: int, *, student: bool) -> tuple[float, float]:
    """(unscaled, scaled) variances, each from a fresh generator seeded with ``seed``."""
    values = []
    for scaled in (False, True):
        args = (d_k, num_samples, scaled, generator(seed))
        what = f"empirical_score_variance(d_k={d_k}, num_samples={num_samples}, scaled={scaled}, generator)"
        if student:
            values.append(_as_number(call_student(fn, *args, what=what), what))
        else:
            values.append(float(fn(*args)))
    return values[0], values[1]


#: The mistakes that draw from the wrong generator give the right values: the reproducibility checks name them.
GENERATOR_IGNORED = "scaling/empirical_score_variance/the-generator-ignored"
OWN_SEED = "scaling/empirical_score_variance/a-fixed-seed-of-your-own-instead-of-the"


#: What each catalogued mistake gives on a case (None: it fails there): its seeded draws are the same every time,
#: and each case draws millions of numbers per mistake.
_MISTAKE_PAIRS: dict[tuple[str, int, int, int], tuple[float, float] | None] = {}


def _mistake_pair(candidate: Mistake, d_k: int, n: int, seed: int) -> tuple[float, float] | None:
    key = (candidate.id, d_k, n, seed)
    if key not in _MISTAKE_PAIRS:
        try:
            _MISTAKE_PAIRS[key] = _esv_pair(candidate.fn, d_k, n, seed, student=False)
        except Exception:  # noqa: BLE001 - a mistake that fails here simply does not match
            _MISTAKE_PAIRS[key] = None
    return _MISTAKE_PAIRS[key]


def _diagnose_variance(got: tuple[float, float], d_k: int, n: int, seed: int) -> Mistake | None:
    """The first mistake whose (unscaled, scaled) results agree with the student's within 15%."""
    for candidate in MISTAKES["empirical_score_variance"]:
        if candidate.id in (GENERATOR_IGNORED, OWN_SEED):  # they draw from another generator: not the same each time
            continue
        pair = _mistake_pair(candidate, d_k, n, seed)
        if pair is not None and all(abs(g - m) <= 0.15 * abs(m) for g, m in zip(got, pair, strict=True)):
            return candidate
    return None


#: (d_k, num_samples, seed): the most telling case first, so that a wrong answer is diagnosed on it.
ESV_CASES = [(64, 20000, 201), (512, 5000, 202), (4, 20000, 203), (1, 20000, 204), (16, 2000, 205)]
#: Standard errors a correct estimate may be off by (a normal variable exceeds 6 with probability 2e-9).
SIGMAS = 6.0


def _near_theory(d_k: int, n: int) -> str:
    return f"d_k = {d_k}, {n} samples: within {SIGMAS:g} standard errors of the theory"


@hidden
def check_empirical_score_variance(empirical_score_variance) -> None:
    """Theory within 6 standard errors for several d_k and sample sizes; the generator is used."""
    exercise = "empirical_score_variance"
    results = []
    for d_k, n, seed in ESV_CASES:
        got = None
        with case(_near_theory(d_k, n)):
            values = _esv_pair(empirical_score_variance, d_k, n, seed, student=True)
            for value, scaled in zip(values, (False, True), strict=True):
                theory = 1.0 if scaled else float(d_k)
                error = score_variance_standard_error(d_k, n, scaled)
                if abs(value - theory) <= SIGMAS * error:
                    continue
                mistake = _diagnose_variance(values, d_k, n, seed)
                _fail_named(
                    f"empirical_score_variance(d_k={d_k}, num_samples={n}, scaled={scaled}, generator) returned "
                    f"{value:.6g}, but theory says {theory:g}{' (scores divided by sqrt(d_k))' if scaled else ''}. "
                    f"With {n} samples the estimate has a standard error of {error:.3g}, and yours is off by "
                    f"{abs(value - theory) / error:.1f} standard errors (at most {SIGMAS:g} are accepted).",
                    mistake,
                )
            got = values  # near the theory: the draws are compared below
        results.append(got)
    for scaled in (False, True):
        what = f"empirical_score_variance(d_k=8, num_samples=1000, scaled={scaled}, generator)"
        with case(f"the generator it is given decides the result, scaled={scaled}"):
            first = _as_number(call_student(empirical_score_variance, 8, 1000, scaled, generator(7), what=what), what)
            again = _as_number(call_student(empirical_score_variance, 8, 1000, scaled, generator(7), what=what), what)
            if first != again:
                _fail_named(
                    f"Called twice with generators seeded alike, {what} returned {first!r} and then {again!r}: "
                    "the same seed must give the same result.",
                    by_id(MISTAKES[exercise], GENERATOR_IGNORED),
                )
            other = _as_number(call_student(empirical_score_variance, 8, 1000, scaled, generator(8), what=what), what)
            if other == first:
                _fail_named(
                    f"{what} returned {first!r} both with a generator seeded 7 and with one seeded 8: "
                    "the result must depend on the generator it is given.",
                    by_id(MISTAKES[exercise], OWN_SEED),
                )
    for (d_k, n, seed), got in zip(ESV_CASES, results, strict=True):
        with case(f"d_k = {d_k}, {n} samples: the draws the text prescribes"):
            needs(got, _near_theory(d_k, n))
            want = _esv_pair(score_variance_reference, d_k, n, seed, student=False)
            for value, expected, scaled in zip(got, want, (False, True), strict=True):
                if not reproduces(value, expected):
                    _fail_named(
                        f"empirical_score_variance(d_k={d_k}, num_samples={n}, scaled={scaled}, generator seeded {seed}) "
                        f"returned {value!r}, which agrees with the theory, but the draws the text prescribes give "
                        f"{expected!r}.\n{SCORE_VARIANCE_DRAW}",
                        _diagnose_random(exercise,
                                         lambda d_k=d_k, n=n, seed=seed, scaled=scaled: (d_k, n, scaled, generator(seed)),
                                         lambda other, value=value: reproduces(value, other)),
                    )
    for d_k, n, why in [(64, 1, "a variance needs at least 2 samples"), (0, 100, "d_k must be at least 1")]:
        expect_error(empirical_score_variance, d_k, n, False, generator(0), error=ValueError,
                     what=f"empirical_score_variance(d_k={d_k}, num_samples={n}, ...)", why=why)


# --- softmax_jacobian ------------------------------------------------------------------------


def _softmax_rows(*shape: int, seed: int, spread: float = 1.0, dtype=torch.float64):
    logits = randn(*shape, gen=generator(seed)) * spread
    return logits.to(dtype)


@hidden
def check_softmax_jacobian(softmax_jacobian) -> None:
    """Against torch.autograd.functional.jacobian in float64 on many shapes; exact zeros at one-hot rows."""
    exercise = "softmax_jacobian"
    cases = []
    for i, (shape, spread, label) in enumerate([
        ((5,), 1.0, "one row"),
        ((3, 4), 1.0, "a batch of rows"),
        ((2, 3, 6), 2.0, "two batch dimensions"),
        ((2, 1, 2, 3), 0.5, "three batch dimensions"),
        ((7,), 8.0, "a peaked row"),
        ((4, 2), 1.0, "two keys"),
        ((3, 1), 1.0, "a single key (the Jacobian is [[0]])"),  # almost any answer of this shape: a small share
        ((1, 5), 1.0, "a batch of one row: the result has shape (1, 5, 5)"),
    ]):
        cases.append(Case((torch.softmax(_softmax_rows(*shape, seed=300 + i, spread=spread), dim=-1),), label=label,
                          weight=0.25 if shape[-1] == 1 else 1.0))
    against = partial(verify, softmax_jacobian, exercise=exercise, arg_names=("p",), outputs=None,
                      forbid=JACOBIAN_BUILTINS, mistakes=MISTAKES[exercise])
    against(cases, autograd_softmax_jacobian, rtol=1e-10, atol=1e-13)
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    against([Case((one_hot,), label="one-hot rows: the Jacobian is exactly zero")],
            lambda p: torch.zeros(2, 4, 4, dtype=torch.float64), rtol=0.0, atol=0.0)
    p32 = torch.softmax(_softmax_rows(2, 3, 5, seed=310, dtype=torch.float32), dim=-1)
    against([Case((p32,), label="float32 input: float32 output")],
            lambda p: autograd_softmax_jacobian(p.double()).float(), rtol=1e-5, atol=1e-7)
    expect_error(softmax_jacobian, torch.tensor(1.0, dtype=torch.float64), error=ValueError,
                 what="softmax_jacobian(p of shape ())", why="p must have a last axis of probabilities (..., m)")


# --- attention_entropy -----------------------------------------------------------------------


@hidden
def check_attention_entropy(attention_entropy) -> None:
    """Against -sum p log p with 0 log 0 = 0: random rows, one-hot rows, zeros, uniform rows, float32."""
    exercise = "attention_entropy"
    gen = generator(400)
    random_rows = torch.softmax(randn(2, 3, 5, gen=gen), dim=-1)
    with_zeros = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.25, 0.75, 0.0], [0.1, 0.2, 0.3, 0.4]],
                              dtype=torch.float64)
    one_hot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    mixed = torch.stack([torch.eye(4, dtype=torch.float64)[1], torch.full((4,), 0.25, dtype=torch.float64),
                         torch.tensor([0.0, 0.3, 0.0, 0.7], dtype=torch.float64)]).reshape(3, 1, 4)
    square = torch.softmax(randn(4, 4, gen=gen) * 3, dim=-1)
    cases = [
        Case((random_rows,), label="random rows, two batch dimensions"),
        Case((square,), label="a square (4, 4) batch of rows"),
        Case((with_zeros,), label="rows with exact zeros"),
        Case((mixed,), label="a one-hot row, a uniform row and a row with zeros"),
        Case((torch.softmax(randn(6, gen=gen), dim=-1),), label="a single row: the result has shape ()"),
    ]
    against = partial(verify, attention_entropy, exercise=exercise, arg_names=("weights",), outputs=None,
                      forbid=ENTROPY_BUILTINS, mistakes=MISTAKES[exercise])
    against(cases, entropy_reference, rtol=1e-10, atol=1e-13)
    against([Case((one_hot,), label="one-hot rows: the entropy is exactly 0")],
            lambda w: torch.zeros(2, dtype=torch.float64), rtol=0.0, atol=0.0)
    for m in (1, 2, 7, 1000):
        uniform = torch.full((2, m), 1.0 / m, dtype=torch.float64)
        against([Case((uniform,), label=f"uniform rows over {m} keys: the entropy is log {m}")],
                lambda w, m=m: torch.full((2,), math.log(m), dtype=torch.float64), rtol=1e-12, atol=1e-14)
    rows32 = torch.cat([torch.softmax(randn(3, 8, gen=gen), dim=-1), torch.eye(8, dtype=torch.float64)[:2]]).float()
    against([Case((rows32,), label="float32 input, two of its rows one-hot")],
            lambda w: entropy_reference(w.double()).float(), rtol=1e-5, atol=1e-7)
    with case("one-hot float32 rows: the entropy is exactly 0"):
        result = call_student(attention_entropy, rows32, what="attention_entropy(float32 rows)",
                              forbid=ENTROPY_BUILTINS)
        if bool((result[-2:] != 0).any()):
            fail(f"attention_entropy returns {result[-2:].tolist()} for one-hot float32 rows; it should be exactly 0.")
    expect_error(attention_entropy, torch.tensor(1.0, dtype=torch.float64), error=ValueError,
                 what="attention_entropy(weights of shape ())", why="weights must have a last axis (..., m)")


# --- saturation_curve ------------------------------------------------------------------------

#: The hidden experiment: d_ks, num_keys, num_queries.
TABLE_D_KS = (16, 64, 256, 1024)
TABLE_NUM_KEYS = 16
TABLE_NUM_QUERIES = 1000
#: Mean and standard deviation of each output of the reference over 400 seeds of this experiment
#: (tests/checks/test_notebook_02_scaling.py recomputes them from fewer seeds and checks they agree).
#: {scaled: {key: (means per d_k, standard deviations per d_k)}}
TABLE: dict[bool, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    False: {
        "max_weight": ((0.6839, 0.844, 0.9225, 0.9616), (0.0168, 0.007, 0.0046, 0.0031)),
        "entropy": ((0.9061, 0.4109, 0.1938, 0.0935), (0.0509, 0.017, 0.0095, 0.0064)),
        "jacobian_norm": ((0.2781, 0.1765, 0.0991, 0.0521), (0.0095, 0.0065, 0.005, 0.0037)),
    },
    True: {
        "max_weight": ((0.2423, 0.2455, 0.2463, 0.2467), (0.0119, 0.0066, 0.0039, 0.0031)),
        "entropy": ((2.3666, 2.3595, 2.3577, 2.3569), (0.0334, 0.0183, 0.01, 0.0069)),
        "jacobian_norm": ((0.3026, 0.3045, 0.305, 0.3052), (0.0034, 0.0019, 0.0011, 0.0008)),
    },
}


@dataclass
class _Step:
    """One call of the student's saturation_curve and what its result must satisfy."""

    d_ks: Sequence[int]
    scaled: bool
    num_keys: int
    num_queries: int
    seed: int

    def args(self) -> tuple:
        return (list(self.d_ks), self.scaled, self.num_keys, self.num_queries, generator(self.seed))

    def describe(self) -> str:
        return (f"saturation_curve(d_ks={list(self.d_ks)}, scaled={self.scaled}, num_keys={self.num_keys}, "
                f"num_queries={self.num_queries}, generator)")


def curve_structure(result: Any, d_ks: Sequence[int], what: str) -> dict[str, torch.Tensor]:
    """Fail unless ``result`` is a dict of three float64 tensors of shape (len(d_ks),)."""
    if not isinstance(result, dict):
        fail(f"{what} should return a dict with the keys {list(KEYS)}, but it returned {describe(result)}.")
    if set(result) != set(KEYS):
        fail(f"{what} should return a dict with exactly the keys {list(KEYS)}, but its keys are {list(result)}.")
    for key in KEYS:
        value = result[key]
        if not isinstance(value, torch.Tensor):
            fail(f"result[{key!r}] of {what} should be a torch.Tensor, but it is {describe(value)}.")
        if tuple(value.shape) != (len(d_ks),):
            fail(f"result[{key!r}] of {what} should have shape ({len(d_ks)},), one number per d_k, "
                 f"but it has shape {tuple(value.shape)}.")
        if value.dtype != torch.float64:
            fail(f"result[{key!r}] of {what} should have dtype torch.float64 (draw q and k in float64), "
                 f"but it has dtype {value.dtype}.")
        if not bool(torch.isfinite(value).all()):
            fail(f"result[{key!r}] of {what} contains NaN or infinity: {value.tolist()}.")
    return result


def _run_step(saturation_curve, step: _Step) -> dict[str, torch.Tensor]:
    outcome, error = attempt(saturation_curve, step.args(), exercise="saturation_curve")
    if error is not None:
        fail(describe_error(step.describe(), error))
    return curve_structure(outcome.value, step.d_ks, step.describe())


def _tolerance(scaled: bool, key: str) -> torch.Tensor:
    _, sds = TABLE[scaled][key]
    return SIGMAS * torch.tensor(sds, dtype=torch.float64) + 2e-3


def _close_to(result: dict, expected: dict[str, torch.Tensor], tolerance: dict[str, torch.Tensor]) -> bool:
    return all(
        isinstance(result.get(key), torch.Tensor)
        and result[key].shape == expected[key].shape
        and bool(((result[key].double() - expected[key]).abs() <= tolerance[key]).all())
        for key in KEYS
    )


def _diagnose_curve(step: _Step, result: dict, tolerance: dict[str, torch.Tensor]) -> Mistake | None:
    return _diagnose_random("saturation_curve", step.args, lambda value: _close_to(value, result, tolerance))


def _within_spread(scaled: bool) -> str:
    return f"the curves within the experiment's spread, scaled={scaled}"


@hidden
def check_saturation_curve(saturation_curve) -> None:
    """Edge cases that are exact, then the curves against a table of the experiment (6 standard deviations)."""
    exact = {key: torch.full((2,), 1e-9, dtype=torch.float64) for key in KEYS}

    # One key: every weight is 1, so max weight 1, entropy 0, Jacobian 0, whatever d_k.
    step = _Step((3, 200), False, 1, 50, 500)
    with case("one key: max weight 1, entropy 0, Jacobian norm 0"):
        result = _run_step(saturation_curve, step)
        expected = {"max_weight": torch.ones(2, dtype=torch.float64), "entropy": torch.zeros(2, dtype=torch.float64),
                    "jacobian_norm": torch.zeros(2, dtype=torch.float64)}
        if not _close_to(result, expected, exact):
            _fail_named(f"With a single key every weight is 1, so {step.describe()} should return max_weight 1, "
                        f"entropy 0 and jacobian_norm 0 for each d_k, but it returned "
                        f"{ {k: v.tolist() for k, v in result.items()} }.", _diagnose_curve(step, result, exact))

    # d_k = 1: dividing by sqrt(1) changes nothing, so the same seed gives the same curves.
    with case("d_k = 1: scaled and unscaled curves are the same"):
        plain = _run_step(saturation_curve, _Step((1, 1), False, 8, 100, 501))
        step = _Step((1, 1), True, 8, 100, 501)
        scaled = _run_step(saturation_curve, step)
        if not _close_to(scaled, plain, exact):
            _fail_named(f"With d_k = 1 the scale 1/sqrt(d_k) is 1, so with generators seeded alike scaled=True and "
                        f"scaled=False should give the same curves; they give {scaled} and {plain}.",
                        _diagnose_curve(step, scaled, exact))

    table_runs = []
    for is_scaled in (False, True):
        step = _Step(TABLE_D_KS, is_scaled, TABLE_NUM_KEYS, TABLE_NUM_QUERIES, 502 + is_scaled)
        within = None
        with case(_within_spread(is_scaled)):
            result = _run_step(saturation_curve, step)
            tolerance = {key: _tolerance(is_scaled, key) for key in KEYS}
            for key in KEYS:
                means, sds = TABLE[is_scaled][key]
                mean = torch.tensor(means, dtype=torch.float64)
                off = (result[key] - mean).abs() > tolerance[key]
                if bool(off.any()):
                    i = int(off.nonzero()[0])
                    trend = ("stays flat as d_k grows" if is_scaled else
                             "saturates as d_k grows: max weight towards 1, entropy and Jacobian norm towards 0")
                    _fail_named(
                        f"{step.describe()}: result[{key!r}] is {[round(v, 4) for v in result[key].tolist()]}. At "
                        f"d_k = {TABLE_D_KS[i]} it is {result[key][i].item():.4f}, but this experiment gives "
                        f"{means[i]:.4f} on average with a spread (standard deviation) of {sds[i]:.4f} from one "
                        f"seed to the next; yours is further than {SIGMAS:g} of those away. With scaled={is_scaled} "
                        f"the curve {trend}.",
                        _diagnose_curve(step, result, tolerance),
                    )
            within = result  # within the spread: the draws are compared below
        table_runs.append((step, within))
    for step, result in table_runs:
        with case(f"the draws the text prescribes, scaled={step.scaled}"):
            needs(result, _within_spread(step.scaled))
            want = saturation_curve_reference(*step.args())
            if not reproduces(result, want):
                key = next(k for k in KEYS if not reproduces({k: result[k]}, {k: want[k]}))
                _fail_named(
                    f"{step.describe()} with a generator seeded {step.seed}: result[{key!r}] is "
                    f"{[round(v, 6) for v in result[key].tolist()]}, within the experiment's spread, but the draws "
                    f"the text prescribes give {[round(v, 6) for v in want[key].tolist()]}.\n{SATURATION_DRAW}",
                    _diagnose_random("saturation_curve", step.args,
                                     lambda other, result=result: reproduces(other, result)),
                )
    for bad, why in [(dict(d_ks=[4, 0]), "every d_k must be at least 1"),
                     (dict(num_keys=0), "num_keys must be at least 1"),
                     (dict(num_queries=0), "num_queries must be at least 1")]:
        kwargs = {**dict(d_ks=[4], scaled=True, num_keys=4, num_queries=4, generator=generator(0)), **bad}
        expect_error(saturation_curve, error=ValueError,
                     what=f"saturation_curve({', '.join(f'{k}={v}' for k, v in bad.items())}, ...)", why=why,
                     **kwargs)


# --- numeric answers --------------------------------------------------------------------------


@dataclass(frozen=True)
class WrongAnswer(Mistake):
    """A known wrong value of a numeric answer and the reasoning that leads to it (``fn`` returns it)."""

    value: float = math.nan


def wrong_answer(name: str, explanation: str, section: str, value: float, id: str) -> WrongAnswer:
    """The wrong answer ``value`` of a numeric question, as a mistake."""
    return WrongAnswer(name, explanation, section, lambda: value, id, value=value)


#: The exact value of each numeric answer.
ANSWERS = {
    "std_unscaled_512": math.sqrt(512),
    "scale_for_unit_variance": 1 / math.sqrt(64 * 2.0 * 0.5),
    "jacobian_norm_uniform_16": math.sqrt(15) / 16,
}
#: Relative tolerance of a numeric answer: four significant digits.
ANSWER_RTOL = 5e-4

WRONG_ANSWERS: dict[str, list[WrongAnswer]] = {
    "std_unscaled_512": [
        wrong_answer("the variance instead of the standard deviation", "Var(q.k) = d_k; the standard deviation is "
                    "its square root.", MEAN_VARIANCE, 512.0,
                    id="scaling/std_unscaled_512/the-variance-instead-of-the-standard-deviation"),
        wrong_answer("the standard deviation of the scaled scores", "the question is about the unscaled scores "
                    "q.k; dividing by sqrt(d_k) is what brings their standard deviation down to 1.",
                    MEAN_VARIANCE, 1.0, id="scaling/std_unscaled_512/the-standard-deviation-of-the-scaled-scores"),
        wrong_answer("the scale instead of the standard deviation", "1/sqrt(d_k) is the factor that rescales the "
                    "scores; their standard deviation is sqrt(d_k).", MEAN_VARIANCE, 1 / math.sqrt(512),
                    id="scaling/std_unscaled_512/the-scale-instead-of-the-standard-deviation"),
    ],
    "scale_for_unit_variance": [
        wrong_answer("the divisor instead of the multiplier", "the scale multiplies the scores, as the `scale` "
                    "argument of F.scaled_dot_product_attention does; dividing by sqrt(Var(q.k)) is multiplying "
                    "by its inverse.", MEAN_VARIANCE, math.sqrt(64.0),
                    id="scaling/scale_for_unit_variance/the-divisor-instead-of-the-multiplier"),
        wrong_answer("one over the variance instead of one over the standard deviation", "Var(c X) = c^2 Var(X), "
                    "so the scale is 1 / sqrt(Var(q.k)), not 1 / Var(q.k).", MEAN_VARIANCE, 1 / 64.0,
                    id="scaling/scale_for_unit_variance/one-over-the-variance-instead-of-one-over-the"),
        wrong_answer("the variances added instead of multiplied", "E[q_i^2 k_i^2] = E[q_i^2] E[k_i^2] = "
                    "var_q * var_k: the variances multiply.", MEAN_VARIANCE, 1 / math.sqrt(64 * 2.5),
                    id="scaling/scale_for_unit_variance/the-variances-added-instead-of-multiplied"),
        wrong_answer("only the variance of the queries used", "Var(q.k) = d_k var_q var_k involves both "
                    "variances.", MEAN_VARIANCE, 1 / math.sqrt(128.0),
                    id="scaling/scale_for_unit_variance/only-the-variance-of-the-queries-used"),
        wrong_answer("only the variance of the keys used", "Var(q.k) = d_k var_q var_k involves both variances.",
                    MEAN_VARIANCE, 1 / math.sqrt(32.0),
                    id="scaling/scale_for_unit_variance/only-the-variance-of-the-keys-used"),
    ],
    "jacobian_norm_uniform_16": [
        wrong_answer("the squared norm", "the Frobenius norm is the square ROOT of the sum of the squared "
                    "entries.", GRADIENT, 15 / 256, id="scaling/jacobian_norm_uniform_16/the-squared-norm"),
        wrong_answer("the off-diagonal terms left out", "every entry of p p^T is 1/m^2, the off-diagonal ones "
                    "too: they add m (m - 1) squared terms of 1/m^4.", GRADIENT, math.sqrt(16) * (1 / 16 - 1 / 256),
                    id="scaling/jacobian_norm_uniform_16/the-off-diagonal-terms-left-out"),
        wrong_answer("the Jacobian taken as diag(p)", "the Jacobian is diag(p) - p p^T, not diag(p).", GRADIENT,
                    math.sqrt(16) / 16, id="scaling/jacobian_norm_uniform_16/the-jacobian-taken-as-diag-p"),
    ],
}


def _check_answer(value: Any, name: str, simulated: str = "") -> None:
    with case(f"{name}, to four significant digits"):
        value = answer_value(value, name)
        exact = ANSWERS[name]
        if math.isclose(value, exact, rel_tol=ANSWER_RTOL):
            return
        message = f"{name} = {value:.6g} is not the exact value asked for (to four significant digits)."
        for wrong in WRONG_ANSWERS[name]:
            if math.isclose(value, wrong.value, rel_tol=ANSWER_RTOL):
                raise MistakeFound(message, [wrong])
        for note in explain_number(value, exact):
            message += " " + note
        if simulated and math.isclose(value, exact, rel_tol=0.05):
            message += " " + simulated
        fail(message)


@hidden
def check_std_unscaled_512(std_unscaled_512) -> None:
    """The exact standard deviation of q.k at d_k = 512."""
    _check_answer(std_unscaled_512, "std_unscaled_512",
                  "It is close: is it a measured value? The question asks for the exact one, from the formula.")


@hidden
def check_scale_for_unit_variance(scale_for_unit_variance) -> None:
    """The factor that gives q.k unit variance when var_q = 2, var_k = 0.5, d_k = 64."""
    _check_answer(scale_for_unit_variance, "scale_for_unit_variance",
                  "It is close: is it a measured value? The question asks for the exact one, from the formula.")


@hidden
def check_jacobian_norm_uniform_16(jacobian_norm_uniform_16) -> None:
    """The Frobenius norm of the softmax Jacobian at the uniform distribution over 16 keys."""
    _check_answer(jacobian_norm_uniform_16, "jacobian_norm_uniform_16")
