"""Visible checks for notebook 08, gradients through attention and FlashAttention's backward pass.

Every gradient is compared with PyTorch's automatic differentiation: of ``torch.softmax`` for
``softmax_backward`` and of ``F.scaled_dot_product_attention`` (math backend, float64) for the
attention exercises; the forward pass is compared with SDPA and ``torch.logsumexp``. Inside the
student's functions those built-ins, and automatic differentiation, are forbidden.

``FlashAttention`` is a ``torch.autograd.Function``: autograd must run through it, so the checks
examine it where the student's code runs (:func:`autograder.grader.student.probe`) with the probes of
:mod:`autograder.references.flash_backward` (``function_record``, ``backward_under_guard``), which return
plain data: the output, the gradients, what the function saved for backward. ``torch.autograd.gradcheck`` runs
in the checks' own process, on outputs and gradients fetched through ``function_record``.
"""

from __future__ import annotations

from ..grader.inputs import generator, randn
from ..grader.student import expect_error
from ..grader.verify import Case, verify
from ..references.complexity import very_negative_scores
from ..references.flash_backward import (
    AUTOGRAD_BUILTINS,
    BACKWARD_ARGS,
    BACKWARD_BUILTINS,
    FORWARD_ARGS,
    FORWARD_BUILTINS,
    GRADS,
    attention_backward_reference,
    autograd_softmax_backward,
    backward_case,
    backward_reference,
    check_backward_guard,
    check_function_cases,
    check_gradcheck,
    forward_reference,
    qkv,
    softmax_rows,
)
from ..references.flash_backward import function_record as function_record  # the tests import them from here
from ..references.flash_backward import saved_budget as saved_budget
from ..references.flash_backward import scaled_logsumexp as scaled_logsumexp

# --- softmax_backward --------------------------------------------------------------------------------


def check_softmax_backward(softmax_backward) -> None:
    """Against autograd of torch.softmax (float64): one row, a batch of rows, and dim=0."""
    gen = generator(80)
    cases = [
        Case((softmax_rows(gen, 5), randn(5, gen=gen)), label="one row of 5"),
        Case((softmax_rows(gen, 2, 4, 4), randn(2, 4, 4, gen=gen)), label="a batch of 4 x 4 weights"),
        Case((softmax_rows(gen, 3, 6), randn(3, 6, gen=gen)), label="rows of 6"),
        Case((softmax_rows(gen, 4, 3, dim=0), randn(4, 3, gen=gen)), {"dim": 0}, label="softmax along dim 0"),
    ]
    verify(softmax_backward, cases, autograd_softmax_backward, exercise="softmax_backward",
           arg_names=("p", "grad_p"), outputs=None, forbid=AUTOGRAD_BUILTINS, rtol=1e-10, atol=1e-12)
    expect_error(softmax_backward, softmax_rows(gen, 2, 3), randn(2, 4, gen=gen), error=ValueError,
                 what="softmax_backward(p (2, 3), grad_p (2, 4))", why="p and grad_p have different shapes")
    print("softmax_backward passes the visible checks.")


# --- attention_backward ------------------------------------------------------------------------------


def check_attention_backward(attention_backward) -> None:
    """Against autograd of SDPA (math backend, float64): n = m, n != m with d_v != d_k, causal with n < m."""
    gen = generator(81)
    cases = [
        Case(qkv(gen, (2,), 5, 5, 4, 4), label="n = m = 5"),
        Case(qkv(gen, (2,), 4, 7, 3, 5), label="n = 4 queries, m = 7 keys, d_v = 5 != d_k = 3"),
        Case(qkv(gen, (2,), 6, 6, 4, 3), {"is_causal": True}, label="causal, n = m = 6"),
        Case(qkv(gen, (2,), 4, 7, 3, 2), {"is_causal": True}, label="causal with n = 4 < m = 7 (top-left)"),
    ]
    verify(attention_backward, cases, attention_backward_reference, exercise="attention_backward",
           arg_names=("Q", "K", "V", "dO"), outputs=GRADS, forbid=BACKWARD_BUILTINS, rtol=1e-9, atol=1e-11)
    Q, K, V, dO = qkv(gen, (2,), 3, 5, 4, 2)
    expect_error(attention_backward, Q, K, V, dO[..., :1], error=ValueError,
                 what="attention_backward(Q (2, 3, 4), K (2, 5, 4), V (2, 5, 2), dO (2, 3, 1))",
                 why="dO must have the shape of the output, (2, 3, 2)")
    print("attention_backward passes the visible checks.")


# --- flash_attention_forward -------------------------------------------------------------------------


def check_flash_attention_forward(flash_attention_forward) -> None:
    """(O, lse) against SDPA and torch.logsumexp of the scaled scores: short last blocks, causal, huge scores,
    scores all far below 0."""
    gen = generator(82)
    cases = [
        Case(qkv(gen, (2,), 10, 10, 4, 3)[:3] + (4,), label="n = m = 10, blocks of 4: the last block has 2"),
        Case(qkv(gen, (2,), 7, 11, 4, 5)[:3] + (3,), {"is_causal": True}, label="causal with n = 7 < m = 11"),
        Case(qkv(gen, (1,), 9, 9, 4, 2, scale=30.0)[:3] + (4,),
             label="scores in the thousands: exp of a raw score overflows"),
        Case((*very_negative_scores(gen, (1,), 5, 9, 4, 2, 1e4), 4),
             label="every score about -1e4: a running max started at 0 underflows every exp"),
    ]
    verify(flash_attention_forward, cases, forward_reference, exercise="flash_attention_forward",
           arg_names=FORWARD_ARGS, outputs=("O", "lse"), forbid=FORWARD_BUILTINS, rtol=1e-9, atol=1e-11)
    Q, K, V, _ = qkv(gen, (2,), 3, 5, 4, 2)
    expect_error(flash_attention_forward, Q, K[..., :3], V, 2, error=ValueError,
                 what="flash_attention_forward(Q (2, 3, 4), K (2, 5, 3), V (2, 5, 2), 2)",
                 why="Q and K have different d_k (4 and 3)")
    print("flash_attention_forward passes the visible checks.")


# --- flash_attention_backward ------------------------------------------------------------------------


def check_flash_attention_backward(flash_attention_backward) -> None:
    """Against autograd of SDPA (float64): lengths that blocks do not divide, causal with n < m."""
    gen = generator(83)
    cases = [
        backward_case(*qkv(gen, (2,), 8, 8, 3, 3), 4, False, "n = m = 8, blocks of 4"),
        backward_case(*qkv(gen, (2,), 10, 7, 4, 3), 4, False, "n = 10, m = 7, blocks of 4: short last blocks"),
        backward_case(*qkv(gen, (2,), 7, 11, 4, 5), 3, True, "causal with n = 7 < m = 11, blocks of 3"),
    ]
    verify(flash_attention_backward, cases, backward_reference, exercise="flash_attention_backward",
           arg_names=BACKWARD_ARGS, outputs=GRADS, forbid=BACKWARD_BUILTINS, rtol=1e-9, atol=1e-11)
    print("flash_attention_backward passes the visible checks.")


# --- FlashAttention --------------------------------------------------------------------------------------


def check_FlashAttention(FlashAttention) -> None:  # noqa: N802 - named after the class it checks
    """Output and gradients against SDPA's, only Q, K, V, O and lse saved, and gradcheck (float64)."""
    gen = generator(84)
    cases = [
        Case(qkv(gen, (2,), 9, 9, 4, 3) + (4,), label="n = m = 9, blocks of 4"),
        Case(qkv(gen, (2,), 6, 10, 3, 2) + (4,), {"is_causal": True}, label="causal with n = 6 < m = 10"),
    ]
    check_function_cases(FlashAttention, cases)
    Q, K, V, dO = qkv(gen, (1,), 5, 7, 3, 2)
    check_gradcheck(FlashAttention, Q, K, V, 3, True)
    check_backward_guard(FlashAttention, Q, K, V, dO, 3, True)
    print("FlashAttention passes the visible checks.")
