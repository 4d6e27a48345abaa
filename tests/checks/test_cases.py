"""Every hidden check as the grader judges it (:func:`autograder.grader.cases.judging`): a list of named cases.

For every notebook, in-process and through the proxies grading uses: the reference passes every
case, and its check calls the student's code only inside a case (a call outside one would stop the
check and score the whole cell zero); an answer right on every input but one earns exactly the
other cases' share of the cell's points. That every catalogued mistake fails a case that names it
while the check goes on (only a forbidden call stops it) is asserted where every mistake is judged
anyway, through nbgrader, on the records the judge writes (``tests/grading/test_grading_end_to_end.py``):
judging each one here too paid the same checks twice.
"""

from __future__ import annotations

import signal
import traceback
import warnings
from pathlib import Path

import pytest
import torch

from autograder.engine.judge import case_record, error_output, scored_outputs
from autograder.grader import cases
from autograder.grader.cases import CheckRecord
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import lookup
from autograder.shared.errors import CheckFailed

from ..notebook_code import cell_arguments
from .pasted_answers import module, solution
from .test_catalogue import exercises

_CHECKS = str(Path(__file__).resolve().parents[2] / "autograder")
#: Seconds one call of the student's code may take here before it counts as never returning (the grader's cell
#: time limit, which scores the whole cell zero). Far above what any call of a check takes.
CALL_LIMIT = 30


class NeverReturned(BaseException):
    """A call of the student's code ran past :data:`CALL_LIMIT` (a BaseException: no check may catch it)."""


def _never_returned(signum, frame):
    raise NeverReturned


class WatchedChannel(LocalChannel):
    """A channel to the student's namespace that notes every request a check makes outside its cases."""

    def __init__(self, namespace: dict) -> None:
        super().__init__(namespace)
        self.outside: list[str] = []

    def request(self, message: bytes) -> bytes:
        if cases.recording():  # inside a judged check, in no case
            ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                    if f.filename.startswith(_CHECKS)]
            self.outside.append(" <- ".join(reversed(ours[-3:])))
        previous = signal.signal(signal.SIGALRM, _never_returned)
        signal.alarm(CALL_LIMIT)
        try:
            return super().request(message)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def judged(assignment: str, exercise: str, answer) -> tuple[CheckRecord, BaseException | None, list[str]]:
    """Run the hidden check of ``exercise`` on ``answer`` as the judge does: its record, its failure (or
    :class:`NeverReturned`), and the requests it made to the student's namespace outside every case."""
    channel = WatchedChannel(dict(vars(solution(assignment)), **{exercise: answer}))
    arguments = [lookup(channel, name)[1] for name in cell_arguments(assignment, True)[exercise]]
    check = getattr(module(assignment), f"check_{exercise}")
    failure = None
    with warnings.catch_warnings(), cases.judging() as records:
        warnings.simplefilter("ignore")
        try:
            check(*arguments)
        except (CheckFailed, NeverReturned) as error:
            failure = error
    assert len(records) == 1, records
    return records[0], failure, channel.outside


@pytest.mark.parametrize(("assignment", "exercise"), list(exercises()))
def test_reference_passes_every_case_and_calls_only_inside_cases(assignment, exercise, capsys):
    record, failure, outside = judged(assignment, exercise, getattr(solution(assignment), exercise))
    assert failure is None, failure
    assert record.results, f"check_{exercise} ran no case"
    assert record.stopped == "" and not record.failed, record
    assert outside == [], f"check_{exercise} called the student's code outside every case: {outside}"
    names = [r.name for r in record.results]
    assert len(set(names)) == len(names), f"two cases of check_{exercise} have the same name: {names}"
    assert f"{exercise} passes the hidden checks." in capsys.readouterr().out


def _right_but_float32(assignment: str, exercise: str):
    """The reference of ``exercise``, wrong (its output moved by 1) on float32 inputs only."""
    reference = getattr(solution(assignment), exercise)

    def answer(Q, K, V, *args, **kwargs):
        output, weights = reference(Q, K, V, *args, **kwargs)
        return (output + 1 if Q.dtype == torch.float32 else output), weights

    return answer


def _right_but_default_m(assignment: str, exercise: str):
    """The reference of causal_mask, wrong (transposed) when m is left out."""
    reference = getattr(solution(assignment), exercise)

    def causal_mask(n, m=None, align="top_left", device=None):
        mask = reference(n, m, align=align, device=device)
        return mask.T.contiguous() if m is None else mask

    return causal_mask


@pytest.mark.parametrize(("assignment", "exercise", "answer", "wrong_case"), [
    ("01_soft_lookup", "scaled_dot_product_attention", _right_but_float32, "float32 inputs"),
    ("05_multi_head", "grouped_query_attention", _right_but_float32, "float32"),
    ("03_masking", "causal_mask", _right_but_default_m, "m left out: m = n"),
])
def test_an_answer_wrong_on_one_input_earns_the_other_cases_share(assignment, exercise, answer, wrong_case):
    record, failure, _ = judged(assignment, exercise, answer(assignment, exercise))
    assert [r.name for r in record.failed] == [wrong_case], [(r.name, r.message) for r in record.failed]
    assert record.stopped == ""
    total = sum(r.weight for r in record.results)
    wrong = next(r.weight for r in record.results if r.name == wrong_case)
    assert len(record.results) > 2 and record.fraction() == pytest.approx((total - wrong) / total)
    # The cell's score, as the judge writes it for nbgrader: the other cases' share of its points.
    outputs = scored_outputs([record], error_output("CheckFailed", str(failure)), 3.0, all_or_nothing=False)
    score = next(o for o in outputs if o.output_type == "execute_result")
    assert float(score.data["text/plain"]) == pytest.approx(round(3.0 * (total - wrong) / total, 2))
    assert case_record({"outputs": outputs})["score"] == pytest.approx(float(score.data["text/plain"]))


def test_a_case_that_needs_what_a_failed_case_builds_fails_saying_it_could_not_run():
    """MultiHeadAttention whose from_torch raises: the cases that use the module it builds are counted as failed,
    each saying so; the cases that build their own module still pass."""
    reference = solution("05_multi_head").MultiHeadAttention

    class MultiHeadAttention(reference):
        @classmethod
        def from_torch(cls, mha):
            raise RuntimeError("from_torch is not written")

    record, failure, outside = judged("05_multi_head", "MultiHeadAttention", MultiHeadAttention)
    assert record.stopped == "" and outside == [] and failure is not None
    built = "MultiHeadAttention.from_torch(mha) registers the copied weights as parameters"
    could_not_run = [r for r in record.failed if r.message.startswith("This case could not run")]
    assert [r.name for r in could_not_run] == [
        "output.sum().backward() reaches every parameter of the module of from_torch(mha)",
        "module(query (2, 3, 8), key (2, 4, 6), value (2, 4, 6)) with d_model = 8 raises ValueError",
        "module(x, x, x, attn_mask of shape (3, 4)) with 3 queries and 3 keys raises ValueError",
        "module(x, x, x, key_padding_mask of shape (3, 3)) with a batch of 2 raises ValueError",
    ]
    assert all(f'"{built}"' in r.message for r in could_not_run)
    assert "RuntimeError: from_torch is not written" in next(r.message for r in record.failed if r.name == built)
    # The cases that build their own module without from_torch still pass.
    assert {r.name for r in record.results if r.passed} >= {"the parameters of MultiHeadAttention(12, 3, bias=True)",
                                                             "MultiHeadAttention(12, 5) raises ValueError"}
