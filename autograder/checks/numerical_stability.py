"""Visible checks for notebook 04, a softmax that never overflows.

PyTorch is the referee (:mod:`autograder.references.numerical_stability`): ``torch.softmax``,
``torch.logsumexp`` and ``F.log_softmax``, computed in float64 and rounded to the input's dtype.
Inside the student's functions those built-ins are forbidden.
"""

from __future__ import annotations

import torch

from ..grader.diagnosis import Mistake, MistakeFound, catalogue
from ..grader.inputs import generator, randn
from ..grader.student import expect_error
from ..grader.verify import Case, verify_each
from ..kernel.guard import SOFTMAX_BUILTINS
from ..kernel.watches import ReductionRecorder as ReductionRecorder  # imported from here by the tests
from ..references.numerical_stability import (
    INF,
    gradcheck_problem,
    input_changed_message,
    leaves_input_untouched,
    log_softmax_reference,
    log_tolerance,
    logsumexp_reference,
    online_reference,
    record_reductions,
    softmax_reference,
    softmax_tolerance_of,
    streaming_problem,
    with_minus_inf,
)
from ..shared.errors import fail

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "numerical_stability"


# --- what online_softmax reduces over -------------------------------------------------------------


#: The id of the catalogued mistake each broken streaming rule is (when the grader has the catalogue).
RULE_MISTAKE_IDS = {"whole row": "numerical_stability/online_softmax/the-whole-row-reduced-at-once",
                 "two passes": "numerical_stability/online_softmax/two-passes-over-the-row"}


def rule_mistakes(rule: str, notebook: str) -> list[Mistake]:
    """The catalogued mistake that breaks ``rule`` (none without the catalogue)."""
    return [m for m in catalogue(notebook, "online_softmax") if m.id == RULE_MISTAKE_IDS.get(rule)]


# --- the checks -----------------------------------------------------------------------------------


def _softmax_cases() -> list[Case]:
    gen = generator(40)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    return [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((with_minus_inf(randn(3, 4, gen=gen), gen),), label="some entries are -inf"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect zeros"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="softmax over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
        Case(((randn(2, 6, gen=gen) * 4).half(),), label="float16"),
        Case(((randn(2, 6, gen=gen) * 2 + 1000).half(),), label="float16 near 1000"),
    ]


def check_stable_softmax(stable_softmax) -> None:
    """Against torch.softmax on large, -inf and batched inputs, dims, float32 and float16; gradcheck."""
    verify_each(stable_softmax, _softmax_cases(), softmax_reference, softmax_tolerance_of,
                forbid=SOFTMAX_BUILTINS, exercise="stable_softmax", notebook=NOTEBOOK, arg_names=("x",))
    gen = generator(41)
    if not leaves_input_untouched(stable_softmax, randn(3, 4, gen=gen), "stable_softmax"):
        fail(input_changed_message("stable_softmax"))
    problem = gradcheck_problem(stable_softmax, randn(3, 4, gen=gen), "stable_softmax", dim=-1)
    if problem:
        fail(problem)
    expect_error(stable_softmax, randn(3, 4, gen=gen), dim=2, error=ValueError,
                 what="stable_softmax(x of shape (3, 4), dim=2)", why="x has no dimension 2")
    print("stable_softmax passes the visible checks.")


def check_logsumexp(logsumexp) -> None:
    """Against torch.logsumexp on large, -inf and batched inputs, dims and float32."""
    gen = generator(42)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    cases = [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect -inf"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
    ]
    verify_each(logsumexp, cases, logsumexp_reference, log_tolerance, forbid=SOFTMAX_BUILTINS, exercise="logsumexp",
                notebook=NOTEBOOK, arg_names=("x",))
    expect_error(logsumexp, randn(3, 4, gen=gen), dim=-3, error=ValueError,
                 what="logsumexp(x of shape (3, 4), dim=-3)", why="x has no dimension -3")
    print("logsumexp passes the visible checks.")


def check_log_softmax(log_softmax) -> None:
    """Against F.log_softmax on large, far-apart, -inf and batched inputs, dims and float32; gradcheck."""
    gen = generator(43)
    big = randn(3, 5, gen=gen) + torch.tensor([[1e4], [-1e4], [0.0]], dtype=torch.float64)
    cases = [
        Case((randn(2, 5, gen=gen),), label="ordinary entries"),
        Case((big,), label="rows near 1e4, near -1e4 and near 0"),
        Case((torch.tensor([[0.0, -1000.0, 3.0]], dtype=torch.float64),),
             label="an entry 1000 below the max: its softmax underflows to 0, its log-softmax is finite"),
        Case((torch.tensor([[0.0, 1.0, -INF], [-INF, -INF, -INF]], dtype=torch.float64),),
             label="the second row is entirely -inf: expect -inf"),
        Case((randn(4, 3, gen=gen),), {"dim": 0}, label="over dim 0"),
        Case(((randn(2, 3, 4, gen=gen) * 30).float(),), label="float32 with a leading batch dimension"),
    ]
    verify_each(log_softmax, cases, log_softmax_reference, log_tolerance, forbid=SOFTMAX_BUILTINS, exercise="log_softmax",
                notebook=NOTEBOOK, arg_names=("x",))
    problem = gradcheck_problem(log_softmax, randn(3, 4, gen=gen), "log_softmax", dim=-1)
    if problem:
        fail(problem)
    print("log_softmax passes the visible checks.")


def check_online_softmax(online_softmax) -> None:
    """Against torch.softmax for several block sizes; every max and sum covers at most one block."""
    gen = generator(44)
    x = randn(2, 10, gen=gen) * 3
    cases = [Case((x, b), label=f"rows of 10, block_size {b}") for b in (1, 3, 5, 10, 16)]
    masked = randn(2, 7, gen=gen)
    masked[0, :4] = -INF
    masked[1] = -INF
    cases += [
        Case((masked, 2), label="the first two blocks of row 0 are entirely -inf, row 1 is entirely -inf"),
        Case(((randn(2, 3, 9, gen=gen) * 30).float(), 4), label="float32 with two leading batch dimensions"),
        Case((torch.cat([torch.zeros(1), torch.full((300,), -8.0)]).half()[None], 1),
             label="float16: one entry 0, then 300 entries -8 (a float16 running sum would stay at 1)"),
    ]
    verify_each(online_softmax, cases, online_reference, softmax_tolerance_of, forbid=SOFTMAX_BUILTINS, exercise="online_softmax",
                notebook=NOTEBOOK, arg_names=("x", "block_size"))
    problem = streaming_problem(record_reductions(online_softmax, x, 3), x.shape[-1], 3)
    if problem:
        raise MistakeFound(problem[0], rule_mistakes(problem[1], NOTEBOOK))
    expect_error(online_softmax, x, 0, error=ValueError, what="online_softmax(x, block_size=0)",
                 why="a block must hold at least one entry")
    print("online_softmax passes the visible checks.")

