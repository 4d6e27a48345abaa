"""Hidden checks and mistake catalogue for notebook 08, FlashAttention's backward pass (instructor-only).

Gradients are compared with autograd through ``F.scaled_dot_product_attention`` (math backend,
float64) on many shapes; the two flash functions are also watched (:mod:`autograder.kernel.watches`,
where the student's code runs): no n x m tensor, the keys and the queries both tiled, and little
memory alive at once; on n = m = 4096 their memory is measured from outside the kernel where grading
has a control group (:func:`autograder.grader.memory.memory_rise`), which code written to fool a watch
cannot change. ``FlashAttention`` is run through autograd where the student's code runs
(the probes of :mod:`autograder.checks.flash_backward`): its output, its gradients, what it saves
for backward, ``torch.autograd.gradcheck``, and its backward under the guard.

The catalogue: the mistakes of each function, and of ``FlashAttention``, are variations of one
reference with its decisions named (:mod:`autograder.grader.variation`; the class's static methods read its
decisions through the class's own name); written out are those that are another algorithm (autograd
instead of the formulas) and those whose recorded message quotes a line of their own source.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from ..grader.cases import case
from ..grader.compare import assert_close
from ..grader.diagnosis import MistakeFound, by_id, read_mistakes
from ..grader.inputs import generator, randn
from ..grader.memory import (
    MEMORY_CASE_BLOCK,
    MEMORY_CASE_D,
    MEMORY_CASE_DTYPE,
    MEMORY_CASE_N,
    MEMORY_RISE_BOUND,
    memory_message,
    memory_rise,
    tiled_budget,
    watched_call,
)
from ..grader.student import call_student, expect_error
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..kernel.guard import ForbiddenCall
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
from ..shared.errors import fail
from . import hidden

# --- the mistake catalogue: each reference names its decisions, each mistake changes some ------------


@decisions("jacobian", "rowsum_weighted", "subtract_rowsum", "rowsum_over_last_axis")
def softmax_gradient(p, grad_p, dim=-1, *, jacobian="diag(p) - p p^T", rowsum_weighted=True, subtract_rowsum=True,
                     rowsum_over_last_axis=False):
    """The gradient of softmax along dim, with the decisions its mistakes get wrong."""
    if p.shape != grad_p.shape:
        raise ValueError(f"p {tuple(p.shape)} and grad_p {tuple(grad_p.shape)} have different shapes")
    if jacobian == "diag(p)":
        return p * grad_p
    if jacobian == "its diagonal":
        return p * (1 - p) * grad_p
    rowsum = (grad_p * p if rowsum_weighted else grad_p).sum(dim=-1 if rowsum_over_last_axis else dim, keepdim=True)
    return p * (grad_p - rowsum if subtract_rowsum else grad_p + rowsum)


# A copy, not a variant: its recorded message quotes the line of its own source that fails (line 2).
def softmax_backward_no_keepdim(p, grad_p, dim=-1):
    return p * (grad_p - (grad_p * p).sum(dim=dim))


# Another algorithm: autograd instead of the formula.
def softmax_backward_by_autograd(p, grad_p, dim=-1):
    scores = p.log().detach().requires_grad_(True)
    with torch.enable_grad():
        return torch.autograd.grad(torch.softmax(scores, dim=dim), scores, grad_p)[0]


@decisions("rowsum", "mask_again", "alignment", "scale_dq", "scale_dk", "transpose_ds", "transpose_p")
def attention_gradients(Q, K, V, dO, is_causal=False, *, rowsum="dP * P", mask_again=True, alignment="top-left",
                        scale_dq=True, scale_dk=True, transpose_ds=True, transpose_p=True):
    """The backward pass of attention from its formulas, with the decisions its mistakes get wrong."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or dO.shape != (*Q.shape[:-1], V.shape[-1]):
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, dO {tuple(dO.shape)}")
    n, m = Q.shape[-2], K.shape[-2]
    scale = 1 / math.sqrt(Q.shape[-1])
    S = Q @ K.transpose(-2, -1) * scale
    if is_causal and mask_again:
        visible = torch.ones(n, m, dtype=torch.bool).tril(m - n if alignment == "bottom-right" else 0)
        S = S.masked_fill(visible.logical_not(), float("-inf"))
    P = torch.softmax(S, dim=-1)
    dP = dO @ V.transpose(-2, -1)
    if rowsum is None:
        dS = P * dP
    else:
        dS = P * (dP - (dP * P if rowsum == "dP * P" else dP).sum(dim=-1, keepdim=True))
    dQ = dS @ K
    dK = (dS.transpose(-2, -1) if transpose_ds else dS) @ Q
    return (dQ * scale if scale_dq else dQ, dK * scale if scale_dk else dK,
            (P.transpose(-2, -1) if transpose_p else P) @ dO)


# Another algorithm: autograd instead of the formulas.
def attention_backward_by_autograd(Q, K, V, dO, is_causal=False):
    leaves = [t.detach().requires_grad_(True) for t in (Q, K, V)]
    with torch.enable_grad():
        S = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
        O = torch.softmax(S, dim=-1) @ leaves[2]
        return torch.autograd.grad(O, leaves, dO)


@decisions("start_max", "alignment", "keep_last_block", "lse_form", "lse_as_column", "lse_of_unscaled_scores")
def flash_forward(Q, K, V, block_size, is_causal=False, *, start_max=float("-inf"), alignment="top-left",
                  keep_last_block=True, lse_form="m + log(l)", lse_as_column=False, lse_of_unscaled_scores=False):
    """The forward pass that keeps the logsumexp, with the decisions its mistakes get wrong."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or block_size < 1:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} or block_size {block_size}")
    n, m = Q.shape[-2], K.shape[-2]
    scale = 1 / math.sqrt(Q.shape[-1])
    if not lse_of_unscaled_scores:
        Q = Q / math.sqrt(Q.shape[-1])
    outputs, lses = [], []
    for q0 in range(0, n, block_size):
        q = Q[..., q0:q0 + block_size, :]
        top = torch.full((*q.shape[:-1], 1), start_max, dtype=Q.dtype)
        total = torch.zeros((*q.shape[:-1], 1), dtype=Q.dtype)
        acc = torch.zeros((*q.shape[:-1], V.shape[-1]), dtype=Q.dtype)
        raw_top = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=Q.dtype)
        raw_total = torch.zeros((*q.shape[:-1], 1), dtype=Q.dtype)
        for k0 in range(0, m if keep_last_block else m - m % block_size, block_size):
            s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
            if is_causal:
                i = torch.arange(q0, q0 + s.shape[-2])[:, None] + (m - n if alignment == "bottom-right" else 0)
                j = torch.arange(k0, k0 + s.shape[-1])
                if alignment == "block-local":
                    i, j = i - q0, j - k0
                s = s.masked_fill(j > i, float("-inf"))
            if lse_of_unscaled_scores:  # the logsumexp of the scores before the scale, beside the right softmax
                raw, s = s, s * scale
                new_raw_top = torch.maximum(raw_top, raw.amax(dim=-1, keepdim=True))
                raw_total = torch.exp(raw_top - new_raw_top) * raw_total + torch.exp(raw - new_raw_top).sum(-1, keepdim=True)
                raw_top = new_raw_top
            new_top = torch.maximum(top, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - new_top)
            total = torch.exp(top - new_top) * total + p.sum(dim=-1, keepdim=True)
            acc = torch.exp(top - new_top) * acc + p @ V[..., k0:k0 + block_size, :]
            top = new_top
        outputs.append(acc / total)
        if lse_of_unscaled_scores:
            top, total = raw_top, raw_total
        lse = {"m + log(l)": top + torch.log(total), "m": top, "log(l)": torch.log(total)}[lse_form]
        lses.append(lse if lse_as_column else lse.squeeze(-1))
    return torch.cat(outputs, dim=-2), torch.cat(lses, dim=-2 if lse_as_column else -1)

@decisions("D_of", "keep_last_block", "skip_blocks_above_diagonal", "mask_again", "alignment", "scale_scores",
           "weights", "scale_dq", "scale_dk", "transpose_ds")
def flash_backward(Q, K, V, O, dO, lse, block_size, is_causal=False, *, D_of="dO * O", keep_last_block=True,
                   skip_blocks_above_diagonal=False, mask_again=True, alignment="top-left", scale_scores=True,
                   weights="exp(s - lse)", scale_dq=True, scale_dk=True, transpose_ds=True):
    """FlashAttention's backward pass, block by block, with the decisions its mistakes get wrong.

    Skipping the blocks above the diagonal is right; skipping them instead of masking is not.
    """
    if dO.shape != O.shape or lse.shape != Q.shape[:-1] or block_size < 1:
        raise ValueError(f"O {tuple(O.shape)}, dO {tuple(dO.shape)}, lse {tuple(lse.shape)} or block_size {block_size}")
    n, m = Q.shape[-2], K.shape[-2]
    scale = 1 / math.sqrt(Q.shape[-1])
    D = (dO * O if D_of == "dO * O" else dO).sum(dim=-1, keepdim=True)
    L = lse.unsqueeze(-1)
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    for k0 in range(0, m if keep_last_block else m - m % block_size, block_size):
        k, v = K[..., k0:k0 + block_size, :], V[..., k0:k0 + block_size, :]
        for q0 in range(k0 if is_causal and skip_blocks_above_diagonal else 0, n, block_size):
            q, do = Q[..., q0:q0 + block_size, :], dO[..., q0:q0 + block_size, :]
            s = q @ k.transpose(-2, -1) * scale if scale_scores else q @ k.transpose(-2, -1)
            if is_causal and mask_again:
                i = torch.arange(q0, q0 + s.shape[-2])[:, None] + (m - n if alignment == "bottom-right" else 0)
                s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1]) > i, float("-inf"))
            if weights == "exp(s - lse)":
                p = torch.exp(s - L[..., q0:q0 + block_size, :])
            else:  # a softmax over this block of keys alone
                p = torch.softmax(s, dim=-1)
            dV[..., k0:k0 + block_size, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ v.transpose(-2, -1) - D[..., q0:q0 + block_size, :])
            dq, dk = ds @ k, (ds.transpose(-2, -1) if transpose_ds else ds) @ q
            dQ[..., q0:q0 + block_size, :] += dq * scale if scale_dq else dq
            dK[..., k0:k0 + block_size, :] += dk * scale if scale_dk else dk
    return dQ, dK, dV


# A copy, not a variant: its recorded message quotes the line of its own source that fails (line 14).
def flash_backward_lse_as_row(Q, K, V, O, dO, lse, block_size, is_causal=False):
    n, m = Q.shape[-2], K.shape[-2]
    scale = 1 / math.sqrt(Q.shape[-1])
    D = (dO * O).sum(dim=-1, keepdim=True)
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    for k0 in range(0, m, block_size):
        k, v = K[..., k0:k0 + block_size, :], V[..., k0:k0 + block_size, :]
        for q0 in range(0, n, block_size):
            q, do = Q[..., q0:q0 + block_size, :], dO[..., q0:q0 + block_size, :]
            s = q @ k.transpose(-2, -1) * scale
            if is_causal:
                i = torch.arange(q0, q0 + s.shape[-2])[:, None]
                s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1]) > i, float("-inf"))
            p = torch.exp(s - lse[..., q0:q0 + block_size])
            dV[..., k0:k0 + block_size, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ v.transpose(-2, -1) - D[..., q0:q0 + block_size, :])
            dQ[..., q0:q0 + block_size, :] += ds @ k * scale
            dK[..., k0:k0 + block_size, :] += ds.transpose(-2, -1) @ q * scale
    return dQ, dK, dV


# Its static methods have no self: they read the decisions through the class's own name, which a variant keeps.
@decisions("saves_weights", "is_causal_on_ctx", "tensors_on_ctx", "returns_lse", "gradients_returned")
class FlashAttention(torch.autograd.Function):
    """Attention as an autograd.Function that keeps the logsumexp, with the decisions its mistakes get wrong."""

    saves_weights = False
    is_causal_on_ctx = True
    tensors_on_ctx = False
    returns_lse = False
    gradients_returned = 5

    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
        if FlashAttention.saves_weights:  # P itself, n x m, instead of its logsumexp
            saved = torch.softmax(S, dim=-1)
            O = saved @ V
        else:
            saved = torch.logsumexp(S, dim=-1)
            O = torch.exp(S - saved.unsqueeze(-1)) @ V
        if FlashAttention.tensors_on_ctx:
            ctx.Q, ctx.K, ctx.V, ctx.O, ctx.lse = Q, K, V, O, saved
        else:
            ctx.save_for_backward(Q, K, V, O, saved)
        if FlashAttention.is_causal_on_ctx:
            ctx.is_causal = is_causal
        return (O, saved) if FlashAttention.returns_lse else O

    @staticmethod
    def backward(ctx, dO, *unused):
        Q, K, V, O, saved = (ctx.Q, ctx.K, ctx.V, ctx.O, ctx.lse) if FlashAttention.tensors_on_ctx else ctx.saved_tensors
        scale = 1 / math.sqrt(Q.shape[-1])
        P = saved
        if not FlashAttention.saves_weights:
            S = Q @ K.transpose(-2, -1) * scale
            if FlashAttention.is_causal_on_ctx and ctx.is_causal:
                S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
            P = torch.exp(S - saved.unsqueeze(-1))
        dS = P * (dO @ V.transpose(-2, -1) - (dO * O).sum(dim=-1, keepdim=True))
        gradients = (dS @ K * scale, dS.transpose(-2, -1) @ Q * scale, P.transpose(-2, -1) @ dO, None, None)
        return gradients[:FlashAttention.gradients_returned]


# Another algorithm: autograd through the forward formula instead of its derivation.
class FlashBackwardByAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
        lse = torch.logsumexp(S, dim=-1)
        O = torch.exp(S - lse.unsqueeze(-1)) @ V
        ctx.save_for_backward(Q, K, V, O, lse)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, lse = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in (Q, K, V)]
        with torch.enable_grad():
            S = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(Q.shape[-1])
            if ctx.is_causal:
                S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
            out = torch.softmax(S, dim=-1) @ leaves[2]
            return (*torch.autograd.grad(out, leaves, dO), None, None)


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/flash_backward.toml

_GUARD_MISTAKES = {
    "softmax_backward": "flash_backward/softmax_backward/the-gradient-by-autograd",
    "attention_backward": "flash_backward/attention_backward/the-gradients-by-autograd",
    "FlashAttention": "flash_backward/FlashAttention/backward-by-autograd-through-the-forward-formula",
}


#: The forbidden built-ins that are automatic differentiation.
_AUTOGRAD_USED = ("torch.autograd.grad", "Tensor.backward")


@contextlib.contextmanager
def _autograd_named(exercise: str) -> Iterator[None]:
    """When the guard or the source reading stopped automatic differentiation, add the catalogue's explanation."""
    try:
        yield
    except ForbiddenCall as error:
        if error.builtin not in _AUTOGRAD_USED:
            raise
        raise MistakeFound(str(error), [by_id(MISTAKES[exercise], _GUARD_MISTAKES[exercise])]) from None


# --- hidden checks ------------------------------------------------------------------------------


@hidden
def check_softmax_backward(softmax_backward) -> None:
    """Against autograd of torch.softmax: rows of every length, every dim, one-hot rows, float32; errors."""
    gen = generator(800)
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    cases = [
        Case((softmax_rows(gen, 4, 4), randn(4, 4, gen=gen)), label="4 rows of 4"),
        Case((softmax_rows(gen, 7), randn(7, gen=gen)), label="one row of 7"),
        Case((softmax_rows(gen, 2, 3, 5), randn(2, 3, 5, gen=gen)), label="a batch of 3 x 5 weights"),
        Case((softmax_rows(gen, 2, 64, scale=4.0), randn(2, 64, gen=gen)), label="rows of 64, peaked"),
        Case((softmax_rows(gen, 5, 3, dim=0), randn(5, 3, gen=gen)), {"dim": 0}, label="dim=0"),
        Case((softmax_rows(gen, 2, 4, 3, dim=1), randn(2, 4, 3, gen=gen)), {"dim": 1}, label="dim=1 of three"),
        Case((softmax_rows(gen, 3, 4, 2, dim=-2), randn(3, 4, 2, gen=gen)), {"dim": -2}, label="dim=-2"),
        Case((one_hot, randn(3, 4, gen=gen)), label="one-hot rows and a uniform row"),
        # One key: the gradient is 0 whatever grad_p is, so most wrong formulas pass; a small share.
        Case((softmax_rows(gen, 1, 1), randn(1, 1, gen=gen)), label="a row of one key: the gradient is 0", weight=0.25),
    ]
    float32 = [Case((softmax_rows(gen, 3, 6).float(), randn(3, 6, gen=gen, dtype=torch.float32)), label="float32")]
    with _autograd_named("softmax_backward"):
        for listed, rtol, atol in [(cases, 1e-10, 1e-12), (float32, 1e-5, 1e-6)]:
            verify(softmax_backward, listed, autograd_softmax_backward, exercise="softmax_backward",
                   arg_names=("p", "grad_p"), outputs=None, forbid=AUTOGRAD_BUILTINS,
                   mistakes=MISTAKES["softmax_backward"], rtol=rtol, atol=atol)
    for p_shape, g_shape in [((2, 3), (2, 4)), ((3,), (2, 3))]:
        expect_error(softmax_backward, softmax_rows(gen, *p_shape), randn(*g_shape, gen=gen), error=ValueError,
                     what=f"softmax_backward(p {p_shape}, grad_p {g_shape})", why="p and grad_p have different shapes")


ATTENTION_SHAPES = [
    # (batch dims, n, m, d_k, d_v, is_causal, label); the first case is square, so that a transposition
    # mistake gives a wrong value (and is named) rather than a shape error.
    ((2,), 6, 6, 4, 4, False, "n = m = 6"),
    ((2,), 5, 8, 3, 4, False, "n = 5 < m = 8, d_v = 4 != d_k = 3"),
    ((2,), 9, 4, 4, 2, False, "n = 9 > m = 4"),
    ((2, 3), 5, 5, 4, 4, False, "two batch dimensions"),
    ((), 6, 7, 3, 5, False, "no batch dimension"),
    ((1,), 1, 1, 2, 3, False, "one query, one key"),
    ((2,), 7, 7, 4, 3, True, "causal, n = m = 7"),
    ((2,), 5, 9, 4, 4, True, "causal, n = 5 < m = 9 (top-left)"),
    ((2,), 9, 5, 3, 2, True, "causal, n = 9 > m = 5"),
    ((), 8, 8, 4, 4, True, "causal, no batch dimension"),
]


def _attention_cases(seed: int) -> list[Case]:
    gen = generator(seed)
    # One query, one key: its one weight is 1, dQ and dK are 0 whatever the formula; a small share.
    return [Case(qkv(gen, batch, n, m, d_k, d_v), {"is_causal": True} if causal else {}, label,
                 0.25 if n == m == 1 else 1.0)
            for batch, n, m, d_k, d_v, causal, label in ATTENTION_SHAPES]


@hidden
def check_attention_backward(attention_backward) -> None:
    """Against autograd of SDPA (math backend, float64) on many shapes, causal included; float32; errors."""
    gen = generator(810)
    float32 = [Case(qkv(gen, (2, 2), 6, 9, 4, 4, dtype=torch.float32), {"is_causal": True}, "float32 inputs")]
    with _autograd_named("attention_backward"):
        for listed, rtol, atol in [(_attention_cases(811), 1e-9, 1e-11), (float32, 1e-4, 1e-5)]:
            verify(attention_backward, listed, attention_backward_reference, exercise="attention_backward",
                   arg_names=("Q", "K", "V", "dO"), outputs=GRADS, forbid=BACKWARD_BUILTINS,
                   mistakes=MISTAKES["attention_backward"], rtol=rtol, atol=atol)
    Q, K, V, dO = qkv(gen, (2,), 3, 5, 4, 2)
    for args, shapes, why in [
        ((Q, K, V, dO[..., :1]), "dO (2, 3, 1)", "dO must have the shape of the output, (2, 3, 2)"),
        ((Q, K[..., :3], V, dO), "K (2, 5, 3)", "Q and K have different d_k (4 and 3)"),
        ((Q, K, V[..., :4, :], dO), "V (2, 4, 2)", "K has 5 keys but V has 4 values"),
    ]:
        expect_error(attention_backward, *args, error=ValueError, why=why,
                     what=f"attention_backward(Q (2, 3, 4), K, V, dO) with {shapes}")


# --- the flash functions: values, and what they allocate -------------------------------------------

FLASH_SHAPES = [
    # (batch dims, n, m, d_k, d_v, block size, is_causal, label); the first case is square, blocks dividing.
    ((2,), 8, 8, 3, 3, 4, False, "n = m = 8, blocks of 4"),
    ((2,), 37, 45, 5, 7, 8, False, "n = 37 and m = 45 are not multiples of the block size 8"),
    ((2, 3), 12, 12, 4, 4, 4, False, "two batch dimensions"),
    ((), 9, 11, 3, 2, 4, False, "no batch dimension"),
    ((3,), 5, 5, 4, 6, 16, False, "a block larger than n"),
    ((1,), 1, 1, 1, 1, 1, False, "one query, one key"),
    ((2,), 6, 10, 4, 3, 1, False, "blocks of 1"),
    ((2,), 7, 11, 4, 5, 3, True, "causal, n = 7 < m = 11"),
    ((2, 2), 13, 13, 4, 4, 5, True, "causal, n = m = 13"),
    ((2,), 11, 6, 3, 3, 4, True, "causal, n = 11 > m = 6"),
    ((), 10, 16, 4, 4, 3, True, "causal, no batch dimension"),
]


def _flash_shapes(seed: int, scale: float = 1.0):
    gen = generator(seed)
    for batch, n, m, d_k, d_v, size, causal, label in FLASH_SHAPES:
        yield qkv(gen, batch, n, m, d_k, d_v, scale=scale), size, causal, label


def _shapes(args: tuple, names: tuple) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(names, args) if isinstance(t, torch.Tensor))


def _forward_args(Q, K, V, dO, size, causal) -> tuple[tuple, dict]:
    return (Q, K, V, size), {"is_causal": causal}


def _backward_args(Q, K, V, dO, size, causal) -> tuple[tuple, dict]:
    case = backward_case(Q, K, V, dO, size, causal, "")
    return case.args, {"is_causal": causal}


_KINDS = {
    "flash_attention_forward": (_forward_args, forward_reference, ("O", "lse"), FORWARD_ARGS, FORWARD_BUILTINS),
    "flash_attention_backward": (_backward_args, backward_reference, GRADS, BACKWARD_ARGS, BACKWARD_BUILTINS),
}


def _check_value(value, args, kwargs, exercise: str) -> None:
    _, reference, outputs, names, _ = _KINDS[exercise]
    verify(lambda *a, **k: value, [Case(args, kwargs)], reference, exercise=exercise, arg_names=names,
           outputs=outputs, rtol=1e-9, atol=1e-11)


def _check_no_n_by_m(fn, exercise: str, *, is_causal: bool) -> None:
    """n = 40 and m = 45 are both longer than the block: no n x m tensor may appear, not even a mask."""
    make, _, _, names, forbid = _KINDS[exercise]
    gen = generator(820 + is_causal)
    args, kwargs = make(*qkv(gen, (2,), 40, 45, 3, 4), 8, is_causal)
    value, seen = watched_call(fn, args, kwargs, exercise=exercise, forbid=forbid, rows=40, cols=45,
                               max_elements=40 * 45)
    if seen["offender"] is not None:
        op, shape = seen["offender"]
        fail(f"With {_shapes(args, names)}, block_size=8, is_causal={is_causal}: {exercise} allocated a tensor of "
             f"shape {tuple(shape)} (in {op}), as big as the n x m = 40 x 45 score matrix of a head. FlashAttention "
             "never builds it, in the backward pass no more than in the forward pass, not even as a mask: work on "
             "blocks of block_size queries and keys, and recompute each block of P from the scores and lse.")
    _check_value(value, args, kwargs, exercise)


def _check_tiled(fn, exercise: str, n: int, m: int) -> None:
    """Blocks of 6, d = 2: a block of queries against all keys (or of keys against all queries) is caught."""
    make, _, _, names, forbid = _KINDS[exercise]
    gen = generator(830 + n)
    args, kwargs = make(*qkv(gen, (2,), n, m, 2, 2), 6, False)
    longest = max(n, m)
    value, seen = watched_call(fn, args, kwargs, exercise=exercise, forbid=forbid, rows=6, cols=longest,
                               max_elements=2 * 6 * longest)
    if seen["offender"] is not None:
        op, shape = seen["offender"]
        fail(f"With {_shapes(args, names)}, block_size=6: {exercise} allocated a tensor of shape {tuple(shape)} "
             f"(in {op}): a block of 6 against all {longest} {'keys' if m > n else 'queries'}. That is chunking "
             "(notebook 07, section 4), not FlashAttention: tile both the queries and the keys in blocks of "
             "block_size.")
    _check_value(value, args, kwargs, exercise)


def _check_peak(fn, exercise: str) -> None:
    """The bytes alive at once stay below half of one n x m matrix: no list of every block of P."""
    make, _, _, names, forbid = _KINDS[exercise]
    gen = generator(840)
    args, kwargs = make(*qkv(gen, (1,), 96, 96, 2, 2), 8, True)
    matrix = 96 * 96 * 8
    value, seen = watched_call(fn, args, kwargs, exercise=exercise, forbid=forbid, rows=96, cols=96,
                               max_elements=96 * 96)
    if seen["offender"] is not None or seen["peak"] > matrix // 2:
        fail(f"With {_shapes(args, names)}, block_size=8, is_causal=True: {exercise} had {seen['peak']} bytes of "
             f"tensors alive at once, while one 96 x 96 score matrix in float64 is {matrix} bytes. Keep only the "
             "current block of scores (and of P, dP, dS): do not keep every block, in a list or in a preallocated "
             "matrix.")
    _check_value(value, args, kwargs, exercise)


def _check_long_rows(fn, exercise: str, n: int, m: int) -> None:
    """n x m with one side 4096 long, blocks of 32, d = 1: the blocks along the long side are not all kept.

    Keeping them (a list of the blocks of S or P of one block of queries, or of one block of keys) holds
    32 x 4096 numbers, several times the inputs here; a tiled pass holds a few 32 x 32 tiles at once.
    """
    make, _, _, names, forbid = _KINDS[exercise]
    gen = generator(870 + (n > m))
    args, kwargs = make(*qkv(gen, (1,), n, m, 1, 1), 32, False)
    longest = max(n, m)
    value, seen = watched_call(fn, args, kwargs, exercise=exercise, forbid=forbid, rows=min(n, m), cols=longest,
                               max_elements=n * m)
    budget = tiled_budget([a for a in args if isinstance(a, torch.Tensor)], 32)
    if seen["offender"] is not None or seen["peak"] > budget:
        side = "key block of a block of queries" if m > n else "query block of a block of keys"
        fail(f"With {_shapes(args, names)}, block_size=32: {exercise} had {seen['peak']} bytes of tensors alive at "
             f"once, more than {budget} (four times its inputs and sixteen 32 x 32 blocks). Did it keep every "
             f"{side} (in a list)? That is 32 x {longest} numbers; use each block as it comes and then "
             "forget it.")
    _check_value(value, args, kwargs, exercise)


def _sampled_gradients(Q, K, V, O, dO, lse, rows: slice, cols: slice) -> tuple[torch.Tensor, ...]:
    """dQ of the queries ``rows``, dK and dV of the keys ``cols`` (not causal), by section 5's formulas in float64.

    Exact for the O and lse given (the student's function gets the same), and only ``rows`` x m and
    n x ``cols`` blocks of P are made: the grader never pays for a whole n x m matrix.
    """
    Q, K, V, O, dO, lse = (t.double() for t in (Q, K, V, O, dO, lse))
    scale = Q.shape[-1] ** -0.5
    D = (dO * O).sum(dim=-1, keepdim=True)
    P = torch.exp(Q[..., rows, :] @ K.mT * scale - lse[..., rows, None])
    dQ = (P * (dO[..., rows, :] @ V.mT - D[..., rows, :])) @ K * scale
    Pc = torch.exp(Q @ K[..., cols, :].mT * scale - lse[..., None])
    dV = Pc.mT @ dO
    dK = (Pc * (dO @ V[..., cols, :].mT - D)).mT @ Q * scale
    return dQ, dK, dV


def _output_and_lse(Q, K, V, rows: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """O and lse of (non-causal) attention, ``rows`` queries at a time: what forward_reference gives, for less."""
    scale = Q.shape[-1] ** -0.5
    outputs, sums = [], []
    for q0 in range(0, Q.shape[-2], rows):
        scores = Q[..., q0:q0 + rows, :] @ K.mT * scale
        lse = torch.logsumexp(scores, dim=-1)
        outputs.append(torch.exp(scores - lse[..., None]) @ V)
        sums.append(lse)
    return torch.cat(outputs, dim=-2), torch.cat(sums, dim=-1)


def measured_memory_check(fn, exercise: str) -> None:
    """n = m = 4096 in float32: the memory may rise by at most MEMORY_RISE_BOUND while ``fn`` runs.

    Measured from outside the kernel where grading has a control group, else by the watch. A call on
    a quarter of the size comes first, unmeasured (code PyTorch loads the first time an operation runs
    at these sizes is not the student's). Values are compared on every 64th query and key: a reference
    of the whole would cost the grader more than the student's call.
    """
    make, _, outputs, names, forbid = _KINDS[exercise]
    gen = generator(880)
    n, d, block, dtype = MEMORY_CASE_N, MEMORY_CASE_D, MEMORY_CASE_BLOCK, MEMORY_CASE_DTYPE
    sample = slice(None, None, 64)
    built = []
    for size in (n // 4, n):
        Q, K, V, dO = qkv(gen, (1,), size, size, d, d, dtype=dtype)
        if exercise == "flash_attention_forward":
            built.append(((Q, K, V, block), {}))
        else:
            O, lse = _output_and_lse(Q, K, V)  # in float32, as the inputs
            built.append(((Q, K, V, O, dO, lse, block), {}))
    (warm, _), (args, kwargs) = built
    call_student(fn, *warm, what=f"{exercise}({_shapes(warm, names)}, block_size={block})", forbid=forbid)
    case = f"{_shapes(args, names)} in float32, block_size={block}"
    rise = memory_rise(fn, args, kwargs, exercise=exercise, forbid=forbid, rows=n, cols=n)
    if rise.bytes > MEMORY_RISE_BOUND:
        fail(memory_message(rise, exercise, case, MEMORY_RISE_BOUND))
    value = rise.value
    shapes = [(1, n, d), (1, n)] if exercise == "flash_attention_forward" else [(1, n, d)] * 3
    if not (isinstance(value, tuple) and len(value) == len(shapes)
            and all(isinstance(v, torch.Tensor) and tuple(v.shape) == s for v, s in zip(value, shapes))):
        fail(f"With {case}: {exercise} should return {len(shapes)} tensors of shapes {shapes}.")
    if exercise == "flash_attention_forward":
        Q, K, V = (t.double() for t in args[:3])
        expected = forward_reference(Q[:, sample], K, V, block)
        got = (value[0][:, sample], value[1][:, sample])
    else:
        expected = _sampled_gradients(*args[:6], sample, sample)
        got = (value[0][:, sample], value[1][:, sample], value[2][:, sample])
    for name, g, e in zip(outputs, got, expected):
        assert_close(g, e, f"With {case}, {name} (every 64th row)", rtol=1e-4, atol=1e-5)


def _check_flash_values(fn, exercise: str, seed: int) -> None:
    make, reference, outputs, names, forbid = _KINDS[exercise]
    cases = []
    for (Q, K, V, dO), size, causal, label in _flash_shapes(seed):
        args, kwargs = make(Q, K, V, dO, size, causal)
        # One query, one key: its one weight is 1 whatever the scores; almost any answer passes, a small share.
        cases.append(Case(args, kwargs if causal else {}, label, 0.25 if label == "one query, one key" else 1.0))
    huge, scale = [], 40.0
    for (Q, K, V, dO), size, causal, label in list(_flash_shapes(seed + 1, scale=scale))[7:9]:
        args, kwargs = make(Q, K, V, dO, size, causal)
        huge.append(Case(args, kwargs, label + ", scores in the thousands: exp of a raw score overflows"))
    args, kwargs = make(*qkv(generator(seed + 2), (2, 3), 19, 23, 8, 8, dtype=torch.float32), 4, True)
    # Q and K are 40 times larger in `huge`: a score's rounding, and with it that of P and dS, is 40^2 times larger,
    # and a gradient that is 0 in exact arithmetic (a one-hot row of P) comes out as rounding of that size whichever
    # correct formula computes it (D = rowsum(dO * O) or rowsum(P * dP)).
    for listed, rtol, atol in [(cases, 1e-9, 1e-11), (huge, 1e-9, 1e-11 * scale**2),
                               ([Case(args, kwargs, "float32 inputs")], 1e-4, 1e-5)]:
        verify(fn, listed, reference, exercise=exercise, arg_names=names, outputs=outputs, forbid=forbid,
               mistakes=MISTAKES[exercise], rtol=rtol, atol=atol)


def _check_very_negative_rows(fn, exercise: str, seed: int) -> None:
    """Rows whose every score is about -1e4, then -1e3: an online softmax must start its running max at -inf.

    Both lie far below 0 (exp(-1000) underflows to 0 in float64), so a running max started at 0 makes every row
    0/0; and both are far enough above the rounding of float64 that a correct answer in another form (each key
    block normalised on its own and the blocks merged by their logsumexp, as FlashDecoding does) gets them right.
    Scores about -1e300 would not be: there the block sizes' log(count) is lost in the lse's rounding.
    """
    make, reference, outputs, names, forbid = _KINDS[exercise]
    gen = generator(seed)
    # One verify per magnitude: each names the mistake on its own.
    for runs in ([(1e4, False, 3), (1e4, True, 4)], [(1e3, False, 4), (1e3, True, 3)]):
        cases = []
        for magnitude, causal, size in runs:
            Q, K, V = very_negative_scores(gen, (2,), 7, 9, 4, 3, magnitude)
            args, kwargs = make(Q, K, V, randn(2, 7, 3, gen=gen), size, causal)
            cases.append(Case(args, kwargs if causal else {}, f"every score about -{magnitude:g}"
                              + (", causal" if causal else "")))
        verify(fn, cases, reference, exercise=exercise, arg_names=names, outputs=outputs, forbid=forbid,
               mistakes=MISTAKES[exercise], rtol=1e-9, atol=1e-11)


def _allocation_cases(fn, exercise: str, tiled: list[tuple[int, int]], long_rows: list[tuple[int, int]]) -> None:
    """What ``fn`` allocates, a case each: no n x m tensor, both axes tiled, the bytes alive, the memory rise."""
    for causal in (False, True):
        with case(f"no n x m tensor: n = 40, m = 45, is_causal={causal}"):
            _check_no_n_by_m(fn, exercise, is_causal=causal)
    for n, m in tiled:
        with case(f"tiled in blocks of 6: n = {n}, m = {m}"):
            _check_tiled(fn, exercise, n, m)
    with case("the bytes alive at once: n = m = 96, causal"):
        _check_peak(fn, exercise)
    for n, m in long_rows:
        with case(f"long rows in blocks of 32: n = {n}, m = {m}"):
            _check_long_rows(fn, exercise, n, m)
    with case(f"the memory rise with n = m = {MEMORY_CASE_N} in float32"):
        measured_memory_check(fn, exercise)


@hidden
def check_flash_attention_forward(flash_attention_forward) -> None:
    """(O, lse) against SDPA and torch.logsumexp on many shapes and huge scores; no n x m tensor; tiles; memory."""
    exercise = "flash_attention_forward"
    _check_flash_values(flash_attention_forward, exercise, 850)
    _check_very_negative_rows(flash_attention_forward, exercise, 856)
    _allocation_cases(flash_attention_forward, exercise, [(20, 70)], [(32, 4096)])
    gen = generator(855)
    Q, K, V, _ = qkv(gen, (2,), 3, 5, 4, 2)
    for args, shapes, why in [((Q, K[..., :3], V, 2), "K (2, 5, 3)", "Q and K have different d_k (4 and 3)"),
                              ((Q, K, V[..., :4, :], 2), "V (2, 4, 2)", "K has 5 keys but V has 4 values"),
                              ((Q, K, V, 0), "block_size=0", "block_size must be at least 1")]:
        expect_error(flash_attention_forward, *args, error=ValueError, why=why,
                     what=f"flash_attention_forward(Q (2, 3, 4), K, V, ...) with {shapes}")


@hidden
def check_flash_attention_backward(flash_attention_backward) -> None:
    """Against autograd of SDPA on many shapes and huge scores; no n x m tensor; both axes tiled; memory."""
    exercise = "flash_attention_backward"
    _check_flash_values(flash_attention_backward, exercise, 860)
    _allocation_cases(flash_attention_backward, exercise, [(20, 70), (70, 20)], [(32, 4096), (4096, 32)])
    gen = generator(865)
    (Q, K, V, O, dO, lse, _), _ = _backward_args(*qkv(gen, (2,), 3, 5, 4, 2), 2, False)
    for args, shapes, why in [((Q, K, V, O, dO[..., :1], lse, 2), "dO (2, 3, 1)",
                               "dO must have the shape of O, (2, 3, 2)"),
                              ((Q, K, V, O, dO, lse[..., :2], 2), "lse (2, 2)", "lse must have one entry per query, (2, 3)"),
                              ((Q, K, V, O, dO, lse, 0), "block_size=0", "block_size must be at least 1")]:
        expect_error(flash_attention_backward, *args, error=ValueError, why=why,
                     what=f"flash_attention_backward(Q (2, 3, 4), K (2, 5, 4), V (2, 5, 2), O, dO, lse, ...) with "
                          f"{shapes}")


# --- FlashAttention -------------------------------------------------------------------------------


@hidden
def check_FlashAttention(FlashAttention) -> None:  # noqa: N802 - named after the class it checks
    """Output and gradients against SDPA on many shapes; only Q, K, V, O and lse saved; gradcheck; guard."""
    gen = generator(870)
    cases = [
        Case(qkv(gen, (2,), 8, 8, 4, 4) + (4,), label="n = m = 8, blocks of 4"),
        Case(qkv(gen, (2,), 7, 11, 4, 3) + (3,), {"is_causal": True}, label="causal, n = 7 < m = 11"),
        Case(qkv(gen, (2, 2), 13, 13, 3, 3) + (5,), {"is_causal": True}, label="causal, n = m = 13"),
        Case(qkv(gen, (2,), 11, 6, 3, 2) + (4,), {"is_causal": True}, label="causal, n = 11 > m = 6"),
        Case(qkv(gen, (), 10, 14, 4, 5) + (3,), label="no batch dimension, n = 10, m = 14"),
        Case(qkv(gen, (1, 2), 24, 24, 2, 2) + (8,), {"is_causal": True}, label="n = m = 24, d = 2"),
        Case(qkv(gen, (2,), 9, 12, 8, 8, dtype=torch.float32) + (4,), {"is_causal": True}, label="float32 inputs"),
    ]
    with _autograd_named("FlashAttention"):
        check_function_cases(FlashAttention, cases, MISTAKES["FlashAttention"])
        for (Q, K, V, dO), size, causal in [(qkv(gen, (1,), 5, 7, 3, 2), 3, True), (qkv(gen, (2,), 6, 4, 2, 3), 4, False),
                                            (qkv(gen, (1,), 7, 5, 3, 3), 2, True)]:
            with case(f"gradcheck, and a backward without autograd: n = {Q.shape[-2]}, m = {K.shape[-2]}, "
                      f"blocks of {size}, is_causal={causal}"):
                check_gradcheck(FlashAttention, Q, K, V, size, causal)
                check_backward_guard(FlashAttention, Q, K, V, dO, size, causal)
