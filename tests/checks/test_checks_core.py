"""The check helpers: messages that say what is wrong, where, and which mistake it is."""

from __future__ import annotations

import math

import pytest
import torch

from autograder.grader.compare import Mismatch, assert_close, assert_dtype, assert_shape, is_close, max_error
from autograder.grader.diagnosis import Mistake, diagnose, matching, run
from autograder.grader.student import call_student, expect_error
from autograder.grader.verify import Case, naming_mistakes, verify
from autograder.kernel.call import Outcome
from autograder.shared.errors import CheckFailed


def test_assert_close_reports_the_largest_error_and_where():
    expected = torch.zeros(2, 3, dtype=torch.float64)
    actual = expected.clone()
    actual[1, 2] = 0.5
    expected_message = r"largest error is 0.5 at index \[1, 2\], where you return 0.5 and the expected value is 0"
    with pytest.raises(CheckFailed, match=expected_message):
        assert_close(actual, expected, "The output")


def test_assert_close_treats_nan_as_an_error_and_equal_infinities_as_equal():
    assert max_error(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))[0] == float("inf")
    assert max_error(torch.tensor([float("-inf")]), torch.tensor([float("-inf")])) == (0.0, (0,))
    with pytest.raises(CheckFailed, match="largest error is inf"):
        assert_close(torch.tensor([float("nan")]), torch.tensor([0.0]), "x")
    nan = float("nan")  # NaN where NaN is expected is right: the error shown is elsewhere
    assert max_error(torch.tensor([nan, 5.001]), torch.tensor([nan, 5.0]))[1] == (1,)


def test_a_finite_number_for_minus_infinity_is_infinitely_wrong_and_not_rearranged():
    expected = torch.tensor([[0.0, -math.inf], [-1.0, 0.0]])
    actual = torch.nan_to_num(expected, neginf=-1e4)
    with pytest.raises(CheckFailed, match=r"the largest error is inf at index \[0, 1\]") as failure:
        assert_close(actual, expected, "The bias", rtol=1e-6, atol=0)
    assert "A large negative number such as -1e9" in str(failure.value)
    assert "arranged differently" not in str(failure.value)  # rtol * inf once made -1e4 "close" to -inf


def test_the_entry_shown_is_outside_the_tolerance():
    """rtol scales with the expected value: the largest error can be right, and is then not the one shown."""
    expected = torch.tensor([1000.0, 0.001], dtype=torch.float64)
    actual = expected + torch.tensor([1e-6, 1e-9], dtype=torch.float64)  # 1e-6 is within rtol * 1000
    with pytest.raises(CheckFailed, match=r"the largest error beyond the tolerance is 1e-09 at index \[1\]"):
        assert_close(actual, expected, "x", rtol=1e-8, atol=1e-12)


def test_the_dtype_advice_fits_the_dtype_expected():
    with pytest.raises(CheckFailed, match="should be a boolean tensor") as failure:
        assert_dtype(torch.ones(2, dtype=torch.int32), torch.bool, "The mask")
    assert "dtype=x.dtype" not in str(failure.value)
    with pytest.raises(CheckFailed, match="make new tensors with dtype=x.dtype"):
        assert_dtype(torch.ones(2, dtype=torch.float32), torch.float64, "The output")
    with pytest.raises(CheckFailed, match=r"should have dtype torch.int64, but it has dtype torch.float32\.$"):
        assert_dtype(torch.ones(2), torch.int64, "The index")


def test_shape_and_dtype_messages():
    with pytest.raises(CheckFailed, match=r"should have shape \(2, 3\), but it has shape \(3, 2\)"):
        assert_shape(torch.zeros(3, 2), (2, 3), "The weights")
    with pytest.raises(CheckFailed, match="should have dtype torch.float64"):
        assert_dtype(torch.zeros(1), torch.float64, "The output")


def test_is_close_compares_tuples_and_shapes():
    a = torch.ones(2)
    assert is_close((a, a), (a, a.clone()), 0, 0)
    assert not is_close((a,), (a, a), 0, 0)
    assert not is_close(torch.ones(1, 2), a, 0, 0)


def wrong_sign(x):
    return -x


def fails_like_this(x):
    raise RuntimeError("size mismatch")


def test_diagnose_finds_the_mistake_by_value_and_by_error():
    mistakes = [Mistake("wrong sign", "...", "1. Intro", wrong_sign), Mistake("crash", "...", "2", fails_like_this)]
    x = torch.arange(3.0)
    assert diagnose(Outcome(value=-x), mistakes, (x,)).name == "wrong sign"
    assert diagnose(Outcome(error=("RuntimeError", "size mismatch")), mistakes, (x,)).name == "crash"
    assert diagnose(Outcome(value=x * 2), mistakes, (x,)) is None


def test_verify_names_the_input_and_the_mistake():
    mistakes = [Mistake("wrong sign", "the sign is flipped.", "1. Intro", wrong_sign)]
    cases = [Case((torch.arange(3.0),), label="three numbers")]
    with pytest.raises(CheckFailed) as info:
        verify(wrong_sign, cases, lambda x: x, exercise="identity", arg_names=("x",), outputs=None, mistakes=mistakes)
    message = str(info.value)
    assert "With the input x = tensor([0.0, 1.0, 2.0]" in message and "(three numbers)" in message
    assert "the mistake 'wrong sign'" in message and "Section '1. Intro'" in message


def test_student_errors_become_messages_with_their_own_lines():
    def broken(x):
        return x @ torch.ones(5)

    with pytest.raises(CheckFailed, match=r"(?s)f\(x\) raised RuntimeError.*In your code:.*return x @ torch.ones\(5\)"):
        call_student(broken, torch.ones(3), what="f(x)")


def test_unwritten_exercise_says_so():
    def todo(x):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="is not written yet"):
        call_student(todo, 1, what="todo(x)")


def test_expect_error():
    def silent(x):
        return x

    def strict(x):
        raise ValueError("bad shape")

    assert isinstance(expect_error(strict, 1, error=ValueError, what="f", why="it is bad"), ValueError)
    with pytest.raises(CheckFailed, match="should raise ValueError because it is bad, but it returned"):
        expect_error(silent, 1, error=ValueError, what="f", why="it is bad")


def test_a_mistake_runs_on_copies_and_reports_what_it_changed():
    def in_place(x, y=None):
        x.add_(1)
        return x

    x = torch.zeros(2)
    outcome = run(in_place, (x,), {"y": torch.ones(1)})
    assert torch.equal(x, torch.zeros(2)) and outcome.mutated == (0,)
    assert torch.equal(outcome.value, torch.ones(2))


def test_every_fitting_mistake_is_found_once_and_a_right_one_never():
    x = torch.arange(3.0)
    mistakes = [Mistake("sign", "...", "1", wrong_sign), Mistake("sign", "...", "1", lambda x: -x),
                Mistake("times minus one", "...", "1", lambda x: x * -1), Mistake("right", "...", "1", lambda x: x)]
    assert [m.name for m in matching(Outcome(value=-x), mistakes, (x,))] == ["sign", "times minus one"]
    assert matching(Outcome(value=x), mistakes, (x,), right=lambda v: torch.equal(v, x)) == []


def test_meta_tensors_compare_by_device_shape_and_dtype():
    meta = torch.empty(2, 3, device="meta")
    assert is_close(torch.empty(2, 3, device="meta"), meta, 0, 0)
    assert not is_close(torch.zeros(2, 3), meta, 0, 0)
    with pytest.raises(CheckFailed, match="should be on the device 'meta', but it is on 'cpu'"):
        assert_close(torch.zeros(2, 3), meta, "The mask")
    assert "on the device 'meta'" in Case((meta,)).describe(("x",))


def test_a_mismatch_keeps_the_problem_and_the_notes_apart():
    with pytest.raises(Mismatch) as info:
        assert_close(2 * torch.arange(1.0, 4.0), torch.arange(1.0, 4.0), "y")
    assert info.value.problem.startswith("y is not what it should be")
    assert info.value.notes == ("Your result is the expected one multiplied by 2, everywhere: the computation is "
                                "right but for a constant factor (a scale applied twice, missing, or the wrong one?).",)
    assert str(info.value) == info.value.problem + "\n" + info.value.notes[0]


def test_naming_mistakes_adds_the_catalogue_to_a_failed_property(monkeypatch):
    import autograder.grader.verify as verify_module

    mistakes = (Mistake("wrong sign", "the sign is flipped.", "1. Intro", wrong_sign),)
    monkeypatch.setattr(verify_module, "catalogue", lambda notebook, exercise: mistakes)
    x = torch.arange(1.0, 4.0)
    with pytest.raises(CheckFailed) as info:
        with naming_mistakes(wrong_sign, Case((x,)), x, exercise="f", notebook="nb"):
            raise CheckFailed("the norm is kept but the sum is not")
    assert str(info.value) == "the norm is kept but the sum is not\n" + mistakes[0].message()
    monkeypatch.setattr(verify_module, "catalogue", lambda notebook, exercise: ())
    with pytest.raises(CheckFailed, match=r"^the sum is not$"):
        with naming_mistakes(wrong_sign, Case((x,)), x, exercise="f", notebook="nb"):
            raise CheckFailed("the sum is not")
