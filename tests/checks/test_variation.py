"""A mistake as a declared variation of a reference (:mod:`autograder.grader.variation`), and pairs of them named at once."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from autograder.engine.judge import MISTAKES_KEY, mistakes_record
from autograder.grader import diagnosis
from autograder.grader.cases import case, checking, judging
from autograder.grader.diagnosis import Mistake, matching, run
from autograder.grader.variation import combined, decisions, source_of, variant, wrapping
from autograder.shared.errors import CheckFailed, fail


@decisions("scale", "axis", "start")
def weighted(x, w, *, scale=1.0, axis=-1, start=float("-inf")):
    """A reference with three decisions."""
    top = torch.maximum(torch.full_like(x.sum(dim=axis, keepdim=True), start), x.amax(dim=axis, keepdim=True))
    e = torch.exp((x - top) * scale)
    return (e / e.sum(dim=axis, keepdim=True) * w).sum(dim=-1)


@decisions("heads")
class Splitter:
    heads = 2

    def split(self, x):
        return x.reshape(*x.shape[:-1], self.heads, -1)


X = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
W = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_a_variant_has_the_references_signature_without_its_decisions():
    made = variant(weighted, scale=2.0)
    assert str(inspect.signature(made)) == "(x, w)"
    assert made.__name__ == "weighted"
    assert made.__variation__.reference is weighted and made.__variation__.changed == {"scale": 2.0}


def test_the_reference_with_no_decision_changed_is_the_reference():
    assert torch.equal(variant(weighted)(X, W), weighted(X, W))


def test_a_changed_decision_changes_what_it_computes_as_the_reference_does():
    assert torch.equal(variant(weighted, scale=2.0)(X, W), weighted(X, W, scale=2.0))
    assert not torch.allclose(variant(weighted, scale=2.0)(X, W), weighted(X, W))


def test_its_source_is_the_reference_with_each_decision_written_as_a_constant():
    source = source_of(variant(weighted, scale=2.0, start=-math.inf))
    assert source == inspect.getsource(variant(weighted, scale=2.0, start=-math.inf))
    head = source.splitlines()[:4]
    assert head == ["def weighted(x, w):", "    scale = 2.0", "    axis = -1", "    start = float('-inf')"], head
    assert "A reference with three decisions" not in source  # the docstring speaks of decisions: dropped
    namespace = {"torch": torch}
    exec(source, namespace)  # pasted alone, as the end-to-end tests paste it
    assert torch.equal(namespace["weighted"](X, W), weighted(X, W, scale=2.0))


def test_a_class_variant_sets_its_class_attribute():
    made = variant(Splitter, heads=4)
    assert inspect.isclass(made) and made.heads == 4 and Splitter.heads == 2
    assert made().split(torch.zeros(2, 8)).shape == (2, 4, 2)
    assert "heads = 4" in source_of(made) and "heads = 2" not in source_of(made)


def test_an_undeclared_decision_is_refused_by_name():
    with pytest.raises(TypeError, match=r"no decision \['skale'\]"):
        variant(weighted, skale=2.0)
    with pytest.raises(TypeError, match="declares no decisions"):
        variant(lambda x: x, scale=2.0)
    with pytest.raises(TypeError, match="keyword-only"):
        decisions("w")(weighted)


def test_two_variants_of_other_decisions_combine_and_one_decision_twice_does_not():
    both = combined(variant(weighted, scale=2.0), variant(weighted, start=0.0))
    assert both.__variation__.changed == {"scale": 2.0, "start": 0.0}
    assert torch.equal(both(X, W), weighted(X, W, scale=2.0, start=0.0))
    assert combined(variant(weighted, scale=2.0), variant(weighted, scale=3.0)) is None
    assert combined(variant(weighted, scale=2.0), weighted) is None


# --- pairs in the diagnosis ---------------------------------------------------------------------------

SCALED = Mistake("scaled twice", "the scale is applied once.", "1. Scale", variant(weighted, scale=2.0), id="t/scaled")
STARTED = Mistake("the max started at 0", "start at -inf.", "2. Max", variant(weighted, start=0.0), id="t/started")
ALONE = Mistake("another algorithm", "not a variation.", "3. Other", lambda x, w: x.sum(dim=-1), id="t/alone")
CATALOGUE = [ALONE, SCALED, STARTED]
# Rows whose scores all lie about 400 below 0: a max started at 0 gives the right answer (exp(-400) is a float64),
# scaled twice too (other numbers); both at once underflow (exp(-800) is 0) to 0/0. Only the pair fits.
LOW = X - 400


def test_an_answer_with_two_declared_mistakes_is_named_with_both():
    student = run(combined(SCALED.fn, STARTED.fn), (LOW, W))
    found = matching(student, CATALOGUE, (LOW, W))
    assert [m.id for m in found] == ["t/scaled+t/started"]
    message = found[0].message()
    assert "two mistakes at once" in message and "'scaled twice'" in message and "'the max started at 0'" in message
    assert "Section '1. Scale'" in message and "Section '2. Max'" in message


def test_a_single_mistake_is_named_alone_and_no_pair_is_tried(monkeypatch):
    tried = []
    monkeypatch.setattr(diagnosis, "pairs", lambda *a, **k: tried.append(a) or [])
    found = matching(run(SCALED.fn, (LOW, W)), CATALOGUE, (LOW, W))
    assert [m.id for m in found] == ["t/scaled"] and not tried


def test_pairs_stop_at_the_budget(monkeypatch):
    student = run(combined(SCALED.fn, STARTED.fn), (LOW, W))
    monkeypatch.setattr(diagnosis, "PAIR_BUDGET", 0)
    assert matching(student, CATALOGUE, (LOW, W)) == []
    assert diagnosis.pairs(CATALOGUE, budget=5) and diagnosis.pairs(CATALOGUE, budget=0) == []


def test_a_wrong_answer_that_is_no_pair_names_nothing():
    assert matching(run(lambda x, w: x.mean(dim=-1), (LOW, W)), CATALOGUE, (LOW, W)) == []


def test_pairs_survive_a_checks_wrapper():
    """A check that runs each mistake through a wrapper (a scenario, a flattened result) still gets pairs named."""
    @wrapping
    def doubled(fn):
        return lambda x, w: fn(x, w) * 2

    wrapped = [Mistake(m.name, m.explanation, m.section, doubled(m.fn), m.id) for m in CATALOGUE]
    student = run(doubled(combined(SCALED.fn, STARTED.fn)), (LOW, W))
    assert [m.id for m in matching(student, wrapped, (LOW, W))] == ["t/scaled+t/started"]
    assert combined(doubled(SCALED.fn), STARTED.fn) is None  # one wrapped, one not: no pair


def test_a_pair_is_recorded_for_the_class_report_as_the_two_mistakes_it_is():
    pair = diagnosis.together(SCALED, STARTED)
    record = mistakes_record([pair])
    assert [m["id"] for m in record.metadata[MISTAKES_KEY]] == ["t/scaled", "t/started"]


def test_pairs_are_tried_once_a_judged_check_not_once_a_failing_case(monkeypatch):
    """A wrong answer that no mistake explains fails every case: the pairs cost one search a check, not one a case."""
    searched = []
    monkeypatch.setattr(diagnosis, "pairs", lambda mistakes, budget=None: searched.append(1) or [])
    wrong = run(lambda x, w: x.mean(dim=-1), (LOW, W))
    with pytest.raises(CheckFailed), judging(), checking("weighted"):
        for i in range(3):
            with case(f"input {i}"):
                assert matching(wrong, CATALOGUE, (LOW, W)) == []
                fail("wrong")
    assert len(searched) == 1
    for _ in range(2):  # not judged: the first failing case stops the check, and each search may try them
        matching(wrong, CATALOGUE, (LOW, W))
    assert len(searched) == 3
