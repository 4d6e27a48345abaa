"""Identity by type, not by text: mistakes by a stable id, forbidden calls by their exception's type.

The class report counts mistakes by the id the grader records (never by the words of a message a
student's code could print), and checks recognise a forbidden call by catching ``ForbiddenCall``,
in the grader's process as in the student's kernel.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

from autograder.course.repository import assignments, module_name
from autograder.engine import judge
from autograder.grader.diagnosis import Mistake, MistakeFound, by_id
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import Remote, lookup
from autograder.grader.student import call_student
from autograder.kernel.guard import SOFTMAX, SOFTMAX_BUILTINS, ForbiddenCall
from autograder.shared.errors import CheckFailed, NotWritten

NOTEBOOKS = [module_name(a) for a in assignments()]
SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def catalogues(notebook: str):
    """Every (exercise, mistake) of a notebook's hidden module, wrong numeric answers included."""
    module = importlib.import_module(f"autograder.hidden.{notebook}")
    for catalogue in (module.MISTAKES, getattr(module, "WRONG_ANSWERS", {})):
        for exercise, mistakes in catalogue.items():
            for mistake in mistakes:
                yield exercise, mistake


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_mistake_has_a_stable_id_of_its_notebook_and_exercise(notebook):
    module = importlib.import_module(f"autograder.hidden.{notebook}")
    data = Path(module.__file__).parent / "mistakes" / f"{notebook}.toml"  # the catalogue's entries
    source = inspect.getsource(module) + (data.read_text() if data.exists() else "")
    for exercise, mistake in catalogues(notebook):
        prefix = f"{notebook}/{exercise}/"
        assert mistake.id.startswith(prefix), (mistake.name, mistake.id)
        assert SLUG.fullmatch(mistake.id.removeprefix(prefix)), mistake.id
        # Written out in the catalogue, not made from the name: rewording a mistake keeps its id.
        assert f'"{mistake.id}"' in source, mistake.id


def test_one_id_per_mistake_across_the_course():
    by_ident: dict[str, tuple[str, str, str]] = {}
    by_name: dict[tuple[str, str], str] = {}
    for notebook in NOTEBOOKS:
        for exercise, mistake in catalogues(notebook):
            words = (mistake.name, mistake.explanation, mistake.section)
            # Several implementations of one mistake share its id and its words ...
            assert by_ident.setdefault(mistake.id, words) == words, mistake.id
            # ... and two mistakes of an exercise never share an id.
            assert by_name.setdefault((exercise, mistake.name), mistake.id) == mistake.id, mistake.name
    assert len(by_ident) == len(by_name) > 250


def test_mistakes_with_one_id_are_named_once_whatever_their_names():
    def wrong(x):
        return -x

    one = [Mistake("sign", "...", "1", wrong, id="nb/f/sign"), Mistake("sign, said otherwise", "...", "1",
                                                                         lambda x: x * -1, id="nb/f/sign")]
    with pytest.raises(MistakeFound) as caught:
        from autograder.grader.verify import Case, verify

        verify(wrong, [Case((torch.ones(2),))], lambda x: x, exercise="f", arg_names=("x",), outputs=None,
               mistakes=one)
    assert [m.id for m in caught.value.mistakes] == ["nb/f/sign"]
    assert by_id(one, "nb/f/sign") is one[0]
    with pytest.raises(KeyError, match="nb/f/other"):
        by_id(one, "nb/f/other")


# -- the judge records what it named; the report reads the record ----------------------------------


def run_cell(source: str, namespace: dict) -> list:
    streams: list = []
    failure, records = judge.run_test_cell(source, LocalChannel(namespace), streams)
    return judge.stream_outputs(streams) + judge.scored_outputs(records, failure, 1.0, False)


def test_the_judge_records_the_ids_of_the_mistakes_a_failure_names():
    from autograder.hidden.soft_lookup import MISTAKES, sdpa_no_scaling

    source = ("from autograder.checks.soft_lookup import check_scaled_dot_product_attention\n"
              "check_scaled_dot_product_attention(scaled_dot_product_attention)")
    outputs = run_cell(source, {"scaled_dot_product_attention": sdpa_no_scaling})
    record, error = outputs[-2:]
    assert error.output_type == "error" and error.ename == "CheckFailed"  # a named mistake reads as a failed check
    no_scaling = by_id(MISTAKES["scaled_dot_product_attention"], "soft_lookup/scaled_dot_product_attention/no-scaling")
    assert no_scaling.message() in error.evalue
    cell = {"outputs": outputs}
    assert judge.named_mistakes(cell) == [{"id": no_scaling.id, "name": "no scaling", "section": no_scaling.section}]
    assert record.data == {"text/plain": ""}  # nothing shows


def test_printed_words_of_a_mistake_are_not_a_record():
    def prints_a_mistake(Q, K, V):
        print("This looks like the mistake 'no scaling': ... Section '6. Scaled dot-product attention' ...")
        return Q

    source = ("from autograder.checks.soft_lookup import check_scaled_dot_product_attention\n"
              "check_scaled_dot_product_attention(scaled_dot_product_attention)")
    outputs = run_cell(source, {"scaled_dot_product_attention": prints_a_mistake})
    assert outputs[-1].output_type == "error"
    assert judge.named_mistakes({"outputs": outputs}) == []


# -- a forbidden call is a type, in the grader and through the kernel ------------------------------


def softmax_by_builtin(x):
    return torch.softmax(x, dim=-1)


def softmax_caught(x):
    try:
        return torch.softmax(x, dim=-1)
    except Exception:  # noqa: BLE001 - a student's code that hides the guard's error
        return x


@pytest.mark.parametrize("fn", [softmax_by_builtin, softmax_caught])
@pytest.mark.parametrize("where", ["grader", "kernel"])
def test_a_forbidden_call_raises_forbidden_call_naming_the_builtin(fn, where):
    if where == "kernel":
        found, fn = lookup(LocalChannel({"my_softmax": fn}), "my_softmax")
        assert found and isinstance(fn, Remote)
    with pytest.raises(ForbiddenCall) as caught:
        call_student(fn, torch.ones(2, 3), what="my_softmax(x)", forbid=SOFTMAX_BUILTINS)
    assert caught.value.builtin == SOFTMAX.shown_as
    assert "my_softmax called torch.softmax, which this exercise asks you to write yourself" in str(caught.value)


class SourceReading:
    """A channel whose reading of the student's source finds ``uses`` (a rule's word, or a way round the guard)."""

    def __init__(self, uses: str) -> None:
        self.uses, self.local = uses, LocalChannel({"f": softmax_by_builtin})

    def request(self, message: bytes) -> bytes:
        return self.local.request(message)

    def forbidden_use(self, name, rules, exercise):
        if self.uses == "threading" or any(self.uses in r.names for r in rules):
            return f"{exercise}'s code uses {self.uses}."
        return None


@pytest.mark.parametrize(("uses", "builtin"), [("logsumexp", "torch.logsumexp"), ("threading", None)])
def test_the_reading_of_the_source_raises_forbidden_call_with_the_rule_it_found(uses, builtin):
    found, fn = lookup(SourceReading(uses), "f")
    with pytest.raises(ForbiddenCall) as caught:
        call_student(fn, torch.ones(2), what="f(x)", forbid=SOFTMAX_BUILTINS)
    assert caught.value.builtin == builtin and str(caught.value) == f"f's code uses {uses}."


def test_a_kernel_failure_that_is_not_a_forbidden_call_is_not_read_as_one():
    def unwritten(x):
        raise NotImplementedError

    found, fn = lookup(LocalChannel({"f": unwritten}), "f")
    with pytest.raises(CheckFailed) as caught:
        call_student(fn, torch.ones(2), what="f(x)", forbid=SOFTMAX_BUILTINS)
    # an unwritten exercise crosses as what it is (it costs the whole cell, as a forbidden call does), never as a
    # forbidden call
    assert type(caught.value) is NotWritten and not isinstance(caught.value, ForbiddenCall)
