"""Notebook 06: the reference solution passes every check; every catalogued mistake is caught and named."""

from __future__ import annotations

import pytest
import torch

from autograder.checks import positional_encoding as visible
from autograder.hidden import positional_encoding as hidden
from autograder.shared.errors import CheckFailed
from tests.notebook_code import solution_namespace

ASSIGNMENT = "06_positional_encoding"
EXERCISES = ("sinusoidal_encoding", "relative_shift_matrix", "apply_rope")


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


def test_issue_mistakes_are_catalogued():
    names = {m.name for ms in hidden.MISTAKES.values() for m in ms}
    for required in (
        "exponent i/d instead of 2i/d",
        "sin and cos concatenated in halves instead of interleaved",
        "sin and cos swapped",
        "RoPE in the rotate-half convention",
        "M_k transposed (a rotation by -k)",
    ):
        assert required in names


def test_float32_accuracy_is_named(solution):
    def in_float32(max_len, d_model, base=10000.0, *, dtype=torch.float32):
        return solution.sinusoidal_encoding(max_len, d_model, base).to(dtype)

    with pytest.raises(CheckFailed, match="float32 accuracy"):
        hidden.check_sinusoidal_encoding(in_float32)

    def rope_float32_angles(x, positions, base=10000.0):
        d = x.shape[-1]
        inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
        angles = positions[:, None] * inv_freq
        x1, x2 = x[..., 0::2], x[..., 1::2]
        cos, sin = angles.cos(), angles.sin()
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    with pytest.raises(CheckFailed, match="float32 accuracy"):
        hidden.check_apply_rope(rope_float32_angles)


def test_unwritten_exercise_says_so():
    def unwritten(*args, **kwargs):
        raise NotImplementedError()

    for exercise in EXERCISES:
        for module in (visible, hidden):
            with pytest.raises(CheckFailed, match="not written yet"):
                getattr(module, f"check_{exercise}")(unwritten)


def test_missing_value_error(solution):
    def no_check(x, positions, base=10000.0):
        if x.shape[-1] % 2:
            return x
        return solution.apply_rope(x, positions, base)

    with pytest.raises(CheckFailed, match="ValueError"):
        visible.check_apply_rope(no_check)
