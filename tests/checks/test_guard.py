"""The guard forbids built-ins however they are reached, and only while the student's code runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autograder.grader.student import call_student
from autograder.kernel.guard import ATTENTION_BUILTINS, SOFTMAX, SOFTMAX_BUILTINS, Guard
from autograder.shared.errors import CheckFailed

x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))


def renamed_import(q):
    from torch.nn.functional import scaled_dot_product_attention as f

    return f(q, q, q)


def aten_op(q):
    return torch.ops.aten.scaled_dot_product_attention(q, q, q)


def module_call(q):
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    return mha(q, q, q)[0]


def functional_mha(q):
    return F.multi_head_attention_forward  # looked up, not called: allowed


def swallowed(q):
    try:
        return F.scaled_dot_product_attention(q, q, q)
    except Exception:
        return q


def transformer_layer(q):
    layer = torch.nn.TransformerEncoderLayer(4, 1, dim_feedforward=8, dropout=0.0, batch_first=True).eval()
    with torch.no_grad():  # the conditions of its fused path
        return layer(q)


ATTENTION_CALLS = {
    "F.scaled_dot_product_attention": lambda q: F.scaled_dot_product_attention(q, q, q),
    "nn.TransformerEncoderLayer in eval mode": transformer_layer,
    "renamed import": renamed_import,
    "torch.ops.aten": aten_op,
    "nn.MultiheadAttention": module_call,
    "caught and swallowed": swallowed,
}

SOFTMAX_CALLS = {
    "torch.softmax": lambda t: torch.softmax(t, -1),
    "Tensor.softmax": lambda t: t.softmax(-1),
    "F.softmax": lambda t: F.softmax(t, dim=-1),
    "torch.special.softmax": lambda t: torch.special.softmax(t, -1),
    "torch.nn.Softmax": lambda t: torch.nn.Softmax(dim=-1)(t),
    "Tensor.log_softmax": lambda t: t.log_softmax(-1),
    "F.log_softmax": lambda t: F.log_softmax(t, dim=-1),
    "torch.logsumexp": lambda t: torch.logsumexp(t, -1),
    "Tensor.logsumexp": lambda t: t.logsumexp(-1),
}


@pytest.mark.parametrize("how", list(ATTENTION_CALLS))
def test_attention_builtins_are_forbidden(how):
    with pytest.raises(CheckFailed, match="which this exercise asks you to write yourself"):
        call_student(ATTENTION_CALLS[how], x, what="my_attention(Q)", forbid=ATTENTION_BUILTINS)


@pytest.mark.parametrize("how", list(SOFTMAX_CALLS))
def test_softmax_builtins_are_forbidden(how):
    with pytest.raises(CheckFailed, match="my_softmax called"):
        call_student(SOFTMAX_CALLS[how], x, what="my_softmax(x)", forbid=SOFTMAX_BUILTINS)


def test_allowed_operations_pass_and_the_guard_ends_with_the_call():
    def by_hand(t):
        e = torch.exp(t - t.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    out = call_student(by_hand, x, what="my_softmax(x)", forbid=SOFTMAX_BUILTINS)
    torch.testing.assert_close(out, torch.softmax(x, -1))  # the referee works again outside
    assert call_student(functional_mha, x, what="f(x)", forbid=ATTENTION_BUILTINS) is F.multi_head_attention_forward


def test_softmax_is_allowed_where_not_forbidden():
    out = call_student(lambda t: t.softmax(-1), x, what="f(x)", forbid=ATTENTION_BUILTINS)
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_the_transformer_layers_fused_entries_are_attention_s_family():
    """``torch._transformer_encoder_layer_fwd`` (the layers' fused path) is forbidden with attention, by its name's
    shape: no list of PyTorch's entries is complete."""
    assert all(any(rule.matches(name) for rule in ATTENTION_BUILTINS)
               for name in ("_transformer_encoder_layer_fwd", "TransformerDecoderLayer", "_native_multi_head_attention"))
    assert not any(rule.matches(name) for rule in ATTENTION_BUILTINS for name in ("linear", "layer_norm", "softmax"))


def test_a_forbidden_call_is_caught_every_time_and_an_allowed_one_never():
    """The guard remembers its verdict on each name it has seen: the second call of a name is judged as the first."""
    guard = Guard((SOFTMAX,), "my_softmax")
    for _ in range(2):
        with guard:
            torch.exp(x)
            with pytest.raises(CheckFailed, match="my_softmax called torch.softmax"):
                torch.softmax(x, -1)
    assert guard.violations == ["torch.softmax", "torch.softmax"]
    assert guard.verdicts["softmax"] is SOFTMAX and guard.verdicts["exp"] is None
