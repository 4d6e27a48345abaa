"""Notebook 04: the reference passes every check, every catalogued mistake is caught and named."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autograder.checks.numerical_stability import (
    ReductionRecorder,
    check_stable_softmax,
    record_reductions,
    streaming_problem,
)
from autograder.hidden import numerical_stability as hidden
from autograder.hidden.numerical_stability import MISTAKES
from autograder.references.numerical_stability import softmax_tolerance_of
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "04_numerical_stability"


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


REQUIRED = {
    "stable_softmax": {"no max shift", "one global max instead of one per row", "NaN on rows that are entirely -inf",
                       "a built-in softmax"},
    "logsumexp": {"the max not added back"},
    "online_softmax": {"the running sum not rescaled", "the last block dropped"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


def wrapper(call):
    def fn(x, dim=-1):
        return call(x, dim)

    return fn


@pytest.mark.parametrize(
    ("shown", "call"),
    [
        ("torch.softmax", lambda x, d: torch.softmax(x, dim=d)),
        ("torch.softmax", lambda x, d: F.softmax(x, dim=d)),
        ("torch.softmax", lambda x, d: x.softmax(d)),
        ("torch.softmax", lambda x, d: torch.special.softmax(x, d)),
        ("torch.logsumexp", lambda x, d: torch.logsumexp(x, d).unsqueeze(d) * 0 + x),
        ("torch.logsumexp", lambda x, d: x.logsumexp(d).unsqueeze(d) * 0 + x),
        ("torch.nn.functional.log_softmax", lambda x, d: F.log_softmax(x, dim=d)),
        ("torch.nn.functional.log_softmax", lambda x, d: x.log_softmax(d)),
    ],
)
@pytest.mark.parametrize("exercise", ["stable_softmax", "log_softmax"])
def test_guard_catches_builtins(shown, call, exercise):
    with pytest.raises(CheckFailed) as failure:
        getattr(hidden, f"check_{exercise}")(wrapper(call))
    message = str(failure.value)
    assert f"{exercise} called {shown}" in message, message
    assert "a built-in" in message


def test_guard_catches_builtins_in_logsumexp_and_online():
    with pytest.raises(CheckFailed, match="logsumexp called torch.logsumexp"):
        hidden.check_logsumexp(lambda x, dim=-1: torch.special.logsumexp(x, dim))
    with pytest.raises(CheckFailed, match="online_softmax called torch.softmax"):
        hidden.check_online_softmax(lambda x, block_size: F.softmax(x, -1))


def test_recorder_sees_reductions():
    x = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0))
    recorder = ReductionRecorder()
    with recorder:
        x[..., :3].amax(dim=-1, keepdim=True)
        torch.max(x[..., :3], dim=-1)
        torch.max(x, x)  # elementwise: not a reduction
        torch.maximum(x, x)
        x.sum()
        x @ torch.ones(10)
        x.exp().sum(-1)
    assert [(r.kind, r.size) for r in recorder.reductions] == [
        ("max", 3), ("max", 3), ("sum", 60), ("sum", 10), ("sum", 10)]


def test_streaming_rules(solution):
    x = torch.randn(2, 3, 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert streaming_problem(record_reductions(solution.online_softmax, x, 3), 20, 3) is None
    assert streaming_problem(record_reductions(solution.online_softmax, x, 25), 20, 25) is None

    def parallel_blocks(x, block_size):  # all blocks reduced at once, then combined in a scan: allowed
        length = x.shape[-1]
        pad = (-length) % block_size
        padded = F.pad(x, (0, pad), value=-math.inf).unflatten(-1, (-1, block_size))
        bm = padded.amax(dim=-1)
        bs = torch.exp(padded - bm.unsqueeze(-1)).sum(dim=-1)
        m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)
        s = torch.zeros(x.shape[:-1], dtype=x.dtype)
        for k in range(bm.shape[-1]):
            m_new = torch.maximum(m, bm[..., k])
            s = s * torch.exp(m - m_new) + bs[..., k] * torch.exp(bm[..., k] - m_new)
            m = m_new
        return torch.exp(x - m.unsqueeze(-1)) / s.unsqueeze(-1)

    assert streaming_problem(record_reductions(parallel_blocks, x, 3), 20, 3) is None
    whole = hidden.online_softmax_whole_row
    assert streaming_problem(record_reductions(whole, x, 3), 20, 3)[1] == "whole row"
    two = hidden.online_softmax_two_passes
    assert streaming_problem(record_reductions(two, x, 3), 20, 3)[1] == "two passes"


def test_bad_shapes_raise_value_error(solution):
    x = torch.zeros(3, 4)
    for name in ["stable_softmax", "logsumexp", "log_softmax"]:
        with pytest.raises(ValueError, match=r"\(3, 4\)"):
            getattr(solution, name)(x, dim=2)
    with pytest.raises(ValueError):
        solution.online_softmax(x, 0)
    with pytest.raises(ValueError):
        solution.online_softmax(torch.tensor(1.0), 2)


def test_half_precision_sum_really_stalls():
    x = torch.cat([torch.zeros(1), torch.full((300,), -8.0)]).half()[None]
    wrong = hidden.online_softmax_half_precision_sum(x, 1)
    right = torch.softmax(x.double(), dim=-1)
    assert abs(wrong[0, 0].item() - 1.0) < 1e-3 and right[0, 0].item() < 0.95


def own_logsumexp(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    return m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))


def softmax_through_lse(x, dim=-1):
    """Right and stable: exp(x - logsumexp(x)), rows entirely -inf giving zeros; in float32 near 1e4 its
    probabilities carry the rounding of x - lse (relative 4e-4); in float16 near 1000 they are wrong."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"x has no dimension {dim}")
    lse = own_logsumexp(x, dim)
    return torch.where(lse == -math.inf, 0.0, torch.exp(x - lse))


def test_softmax_through_logsumexp_is_right_until_half_precision():
    """Every float64 and float32 case passes (the hidden cases are in that order, the float16 ones last but one),
    and the first float16 case where lse rounds away is named as the half-precision mistake in both checks."""
    x = hidden._rows(torch.Generator().manual_seed(0), [1e4, -1e4, 0.0], 8).float()
    error = (softmax_through_lse(x) - torch.softmax(x.double(), -1)).abs() / torch.softmax(x.double(), -1)
    assert 1e-5 < float(error.max()) <= softmax_tolerance_of(x, torch.softmax(x, -1))[0]
    for check, case in [(check_stable_softmax, "float16 near 1000"), (hidden.check_stable_softmax, "float16, rows near 1e4")]:
        with pytest.raises(CheckFailed, match=rf"(?s){case}.*'exp\(x - logsumexp\(x\)\) in half precision'"):
            check(softmax_through_lse)
