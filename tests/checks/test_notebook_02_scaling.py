"""Notebook 02 (why divide by sqrt(d_k)): the reference passes, every catalogued mistake is caught and named."""

from __future__ import annotations

import math

import pytest
import torch

from autograder.checks import scaling as visible
from autograder.hidden import scaling as hidden
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "02_scaling"
NUMBERS = ["std_unscaled_512", "scale_for_unit_variance", "jacobian_norm_uniform_16"]


@pytest.fixture(scope="module")
def reference():
    return solution_namespace(ASSIGNMENT)


# --- the reference ------------------------------------------------------------------------------


def test_numeric_answers_match_the_reference(reference):
    for name in NUMBERS:
        assert math.isclose(getattr(reference, name), hidden.ANSWERS[name], rel_tol=1e-12)
    assert math.isclose(hidden.ANSWERS["std_unscaled_512"], 22.627416997969522)
    assert math.isclose(hidden.ANSWERS["scale_for_unit_variance"], 0.125)
    # The Jacobian at the uniform row, from the formula of the notebook, computed numerically.
    p = torch.full((16,), 1 / 16, dtype=torch.float64)
    jac = torch.diag_embed(p) - torch.outer(p, p)
    assert math.isclose(torch.linalg.matrix_norm(jac).item(), hidden.ANSWERS["jacobian_norm_uniform_16"])


# --- every mistake is caught and named -------------------------------------------------------------


def _wrong_answers():
    for name, catalogue in hidden.WRONG_ANSWERS.items():
        for wrong in catalogue:
            yield pytest.param(name, wrong, id=f"{name}:{wrong.name}")


@pytest.mark.parametrize(("name", "wrong"), list(_wrong_answers()))
def test_wrong_answer_fails_hidden_check_and_is_named(name, wrong):
    with pytest.raises(CheckFailed) as caught:
        getattr(hidden, f"check_{name}")(wrong.value)
    assert f"'{wrong.name}'" in str(caught.value)


# The visible check of jacobian_norm_uniform_16 only checks that the answer is a positive number
# below 1 (a tighter visible check would give the answer away), so its wrong answers pass it.
VISIBLE_CANNOT_SEE = {"jacobian_norm_uniform_16"}


@pytest.mark.parametrize(("name", "wrong"), [p for p in _wrong_answers() if p.values[0] not in VISIBLE_CANNOT_SEE])
def test_wrong_answer_fails_visible_check(name, wrong):
    with pytest.raises(CheckFailed):
        getattr(visible, f"check_{name}")(wrong.value)


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("value", [None, "22.6", float("nan"), torch.ones(3)])
def test_answers_that_are_not_numbers(name, value):
    for check in (getattr(visible, f"check_{name}"), getattr(hidden, f"check_{name}")):
        with pytest.raises(CheckFailed):
            check(value)


def test_measured_instead_of_exact_answer():
    with pytest.raises(CheckFailed, match="measured value"):
        hidden.check_std_unscaled_512(22.41)


# --- correct answers written differently pass ------------------------------------------------------


def esv_einsum(d_k, num_samples, scaled, generator):
    """The prescribed draws; einsum, the queries scaled instead of the scores, the unbiased variance written out."""
    if d_k < 1 or num_samples < 2:
        raise ValueError("bad sizes")
    q = torch.randn(num_samples, d_k, generator=generator, dtype=torch.float64) / (d_k**0.5 if scaled else 1)
    k = torch.randn(num_samples, d_k, generator=generator, dtype=torch.float64)
    scores = torch.einsum("nd,nd->n", q, k)
    return float(((scores - scores.mean()) ** 2).sum() / (num_samples - 1))


def saturation_einsum(d_ks, scaled, num_keys, num_queries, generator):
    """The prescribed draws; einsum, amax, a clamped log, the norm from the squared entries."""
    if min(d_ks) < 1 or num_keys < 1 or num_queries < 1:
        raise ValueError("bad sizes")
    out = {"max_weight": [], "entropy": [], "jacobian_norm": []}
    for d_k in d_ks:
        q = torch.randn(num_queries, d_k, generator=generator, dtype=torch.float64)
        k = torch.randn(num_keys, d_k, generator=generator, dtype=torch.float64)
        w = torch.softmax(torch.einsum("qd,kd->qk", q, k) * (d_k**-0.5 if scaled else 1.0), dim=-1)
        out["max_weight"].append(w.amax(-1).mean().item())
        out["entropy"].append((-(w * w.clamp_min(1e-300).log()).sum(-1)).mean().item())
        jac = torch.diag_embed(w) - w[..., :, None] * w[..., None, :]
        out["jacobian_norm"].append(jac.pow(2).sum((-2, -1)).sqrt().mean().item())
    return {key: torch.tensor(v, dtype=torch.float64) for key, v in out.items()}


# Right in distribution, but not the draws or the statistic the text prescribes: the theory and the
# experiment's spread accept them, the comparison with the prescribed draws does not.
def esv_float32_mean_of_squares(d_k, num_samples, scaled, generator):
    if d_k < 1 or num_samples < 2:
        raise ValueError("bad sizes")
    k = torch.randn(num_samples, d_k, generator=generator)
    q = torch.randn(num_samples, d_k, generator=generator)
    scores = torch.einsum("nd,nd->n", q, k) / (d_k**0.5 if scaled else 1)
    return float((scores**2).mean())  # the mean is known to be 0


def esv_transposed_draws(d_k, num_samples, scaled, generator):
    if d_k < 1 or num_samples < 2:
        raise ValueError("bad sizes")
    q = torch.randn(d_k, num_samples, generator=generator, dtype=torch.float64)  # (d_k, num_samples)
    k = torch.randn(d_k, num_samples, generator=generator, dtype=torch.float64)
    return ((q * k).sum(dim=0) / (d_k**0.5 if scaled else 1)).var().item()


def saturation_keys_first_median(d_ks, scaled, num_keys, num_queries, generator):
    if min(d_ks) < 1 or num_keys < 1 or num_queries < 1:
        raise ValueError("bad sizes")
    out = {"max_weight": [], "entropy": [], "jacobian_norm": []}
    for d_k in d_ks:
        k = torch.randn(num_keys, d_k, generator=generator, dtype=torch.float64)
        q = torch.randn(num_queries, d_k, generator=generator, dtype=torch.float64)
        w = torch.softmax(q @ k.T * (d_k**-0.5 if scaled else 1.0), dim=-1)
        out["max_weight"].append(w.amax(-1).mean().item())
        out["entropy"].append((-torch.xlogy(w, w).sum(-1)).mean().item())
        jac = torch.diag_embed(w) - w[..., :, None] * w[..., None, :]
        out["jacobian_norm"].append(torch.linalg.matrix_norm(jac).mean().item())
    return {key: torch.tensor(v, dtype=torch.float64) for key, v in out.items()}


def entropy_clamped(weights):
    if weights.dim() == 0:
        raise ValueError("shape ()")
    return -(weights * weights.clamp_min(torch.finfo(weights.dtype).tiny).log()).sum(-1)


def jacobian_by_einsum(p):
    if p.dim() == 0:
        raise ValueError("shape ()")
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return torch.einsum("...i,ij->...ij", p, eye) - torch.einsum("...i,...j->...ij", p, p)


@pytest.mark.parametrize(
    ("exercise", "fn"),
    [("empirical_score_variance", esv_einsum), ("saturation_curve", saturation_einsum),
     ("attention_entropy", entropy_clamped), ("softmax_jacobian", jacobian_by_einsum)],
)
def test_other_correct_answers_pass(exercise, fn):
    getattr(visible, f"check_{exercise}")(fn)
    getattr(hidden, f"check_{exercise}")(fn)


@pytest.mark.parametrize(
    ("exercise", "fn"),
    [("empirical_score_variance", esv_float32_mean_of_squares), ("empirical_score_variance", esv_transposed_draws),
     ("saturation_curve", saturation_keys_first_median)],
)
def test_answers_off_the_prescribed_draws_fail(exercise, fn):
    """Each agrees with the theory (or the table), so only the prescribed draws tell it apart."""
    if exercise == "empirical_score_variance":
        for d_k, n, seed in hidden.ESV_CASES:
            for scaled in (False, True):
                error = hidden.score_variance_standard_error(d_k, n, scaled)
                assert abs(fn(d_k, n, scaled, torch.Generator().manual_seed(seed)) - (1 if scaled else d_k)) < 6 * error
    for check in (getattr(visible, f"check_{exercise}"), getattr(hidden, f"check_{exercise}")):
        with pytest.raises(CheckFailed, match="the draws the text prescribes give"):
            check(fn)


# --- the guard sees every forbidden built-in ----------------------------------------------------------


def jacobian_by_autograd_jacobian(p):
    return torch.autograd.functional.jacobian(lambda z: torch.softmax(z, dim=-1), p.log())


def jacobian_by_jacrev(p):
    return torch.vmap(torch.func.jacrev(lambda z: torch.softmax(z, dim=-1)))(p.log().reshape(-1, p.shape[-1]))


def jacobian_by_jacfwd(p):
    return torch.func.jacfwd(lambda z: torch.softmax(z, dim=-1))(p.log())


def jacobian_by_backward(p):
    rows = []
    for i in range(p.shape[-1]):
        z = p.log().detach().requires_grad_()
        torch.softmax(z, dim=-1)[..., i].sum().backward()
        rows.append(z.grad)
    return torch.stack(rows, dim=-2)


def jacobian_by_grad(p):
    z = p.log().detach().requires_grad_()
    out = torch.softmax(z, dim=-1)
    rows = [torch.autograd.grad(out[..., i].sum(), z, retain_graph=True)[0] for i in range(p.shape[-1])]
    return torch.stack(rows, dim=-2)


def jacobian_by_softmax_backward(p):
    m = p.shape[-1]
    eye = torch.eye(m, dtype=p.dtype).expand(*p.shape[:-1], m, m)
    return torch._softmax_backward_data(eye, p.unsqueeze(-2).expand_as(eye), -1, p.dtype)


def entropy_by_entr(weights):
    return torch.special.entr(weights).sum(-1)


def entropy_by_xlogy(weights):
    return -torch.xlogy(weights, weights).sum(-1)


def entropy_by_tensor_xlogy(weights):
    return -weights.xlogy(weights).sum(-1)


def entropy_by_special_xlogy(weights):
    return -torch.special.xlogy(weights, weights).sum(-1)


@pytest.mark.parametrize(
    ("exercise", "fn", "shown"),
    [
        ("softmax_jacobian", jacobian_by_autograd_jacobian, "torch.autograd.functional.jacobian"),
        ("softmax_jacobian", jacobian_by_jacrev, "torch.autograd.functional.jacobian"),
        ("softmax_jacobian", jacobian_by_grad, "torch.autograd.functional.jacobian"),
        ("softmax_jacobian", jacobian_by_jacfwd, "torch.func.jacfwd"),
        ("softmax_jacobian", jacobian_by_backward, "Tensor.backward"),
        ("softmax_jacobian", jacobian_by_softmax_backward, "torch._softmax_backward_data"),
        ("attention_entropy", entropy_by_entr, "torch.special.entr"),
        ("attention_entropy", entropy_by_xlogy, "torch.xlogy"),
        ("attention_entropy", entropy_by_tensor_xlogy, "torch.xlogy"),
        ("attention_entropy", entropy_by_special_xlogy, "torch.xlogy"),
    ],
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_guard_catches_forbidden_builtins(exercise, fn, shown):
    for module in (visible, hidden):
        with pytest.raises(CheckFailed) as caught:
            getattr(module, f"check_{exercise}")(fn)
        assert f"{exercise} called {shown}" in str(caught.value), str(caught.value)


def test_the_forbidden_builtins_would_otherwise_be_right():
    """The wrappers above compute the right answer: only the guard stops them."""
    logits = torch.randn(2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)
    expected = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    for fn in (jacobian_by_jacrev, jacobian_by_backward, jacobian_by_grad, jacobian_by_softmax_backward):
        assert torch.allclose(fn(p).reshape(expected.shape), expected)
    assert torch.allclose(entropy_by_entr(p), -(p * p.log()).sum(-1))


# --- the statistics behind the tolerances ------------------------------------------------------------


def test_standard_error_of_the_sample_variance():
    """Var(X^2) = 2 d^2 + 6 d: the spread of many measured variances matches the formula."""
    gen = torch.Generator().manual_seed(11)
    for d_k, n in [(1, 200), (4, 200), (32, 100)]:
        q = torch.randn(2000, n, d_k, generator=gen, dtype=torch.float64)
        k = torch.randn(2000, n, d_k, generator=gen, dtype=torch.float64)
        estimates = (q * k).sum(-1).var(dim=-1)
        predicted = hidden.score_variance_standard_error(d_k, n, scaled=False)
        assert estimates.std().item() == pytest.approx(predicted, rel=0.15)
        assert visible.standard_error_of_variance(d_k, n) == pytest.approx(predicted)


def test_saturation_table_agrees_with_the_reference():
    """A fresh estimate of the table's means from 12 new seeds lies within 5 standard errors."""
    seeds = range(20000, 20012)
    for scaled in (False, True):
        runs = [
            hidden.saturation_curve_reference(hidden.TABLE_D_KS, scaled, hidden.TABLE_NUM_KEYS, hidden.TABLE_NUM_QUERIES,
                                     torch.Generator().manual_seed(s))
            for s in seeds
        ]
        for key in hidden.KEYS:
            values = torch.stack([r[key] for r in runs])
            means, sds = (torch.tensor(x, dtype=torch.float64) for x in hidden.TABLE[scaled][key])
            assert ((values.mean(0) - means).abs() <= 5 * sds / math.sqrt(len(seeds)) + 1e-3).all(), (scaled, key)




def test_the_visible_checks_expected_draws_are_the_hidden_references():
    """The numbers the visible checks compare with are what the prescribed draws give (so they cannot go stale)."""
    from autograder.grader.inputs import generator
    from autograder.references.scaling import VISIBLE_SATURATION, VISIBLE_SCORE_VARIANCE

    for scaled, value in VISIBLE_SCORE_VARIANCE.items():
        assert value == pytest.approx(hidden.score_variance_reference(16, 20000, scaled, generator(1)), rel=1e-12)
    for scaled, seed in ((False, 5), (True, 6)):
        curves = hidden.saturation_curve_reference([16, 128, 1024], scaled, 16, 500, generator(seed))
        for key, values in VISIBLE_SATURATION[scaled].items():
            assert values == pytest.approx(curves[key].tolist(), rel=1e-12), (scaled, key)
