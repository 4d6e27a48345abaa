"""Hidden checks and mistake catalogue for notebook 05, multi-head attention (instructor-only)."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from ..grader.cases import case, needs
from ..grader.diagnosis import read_mistakes, through
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error, probe
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.multi_head import (
    TorchMHA,
    check_parameters,
    count_parameters,
    gqa_reference,
    graph_attention_reference,
    merge_reference,
    module_summary,
    parameters_without_grad,
    random_graph,
    run_module,
    split_reference,
    torch_mha_reference,
)
from ..shared.errors import fail
from . import hidden

# --- the mistake catalogue: each reference names the decisions its mistakes get wrong -------------


@decisions("layout")
def split_heads(x, num_heads, *, layout="(B, T, h, d) transposed"):
    """split_heads, with the layout of the features as a decision: (B, T, h, d) transposed to (B, h, T, d)."""
    if x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, D), got shape {tuple(x.shape)}")
    B, T, D = x.shape
    if num_heads <= 0 or D % num_heads != 0:
        raise ValueError(f"D = {D} is not divisible by num_heads = {num_heads}")
    if layout == "(B, h, T, d)":  # a plain view: the memory order is token by token
        return x.reshape(B, num_heads, T, D // num_heads)
    if layout == "(B, T, d, h)":  # every h-th feature to one head
        return x.reshape(B, T, D // num_heads, num_heads).permute(0, 3, 1, 2)
    return x.reshape(B, T, num_heads, D // num_heads).transpose(1, 2)


@decisions("layout")
def merge_heads(x, *, layout="transposed to (B, T, h, d)"):
    """merge_heads, with the layout the heads are put back in as a decision."""
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects x of shape (B, h, T, d), got shape {tuple(x.shape)}")
    B, h, T, d = x.shape
    if layout == "(B, h, T, d)":  # a plain view back: heads mix tokens
        return x.reshape(B, T, h * d)
    if layout == "(B, T, d, h)":  # heads merged feature by feature
        return x.permute(0, 2, 3, 1).reshape(B, T, h * d)
    return x.transpose(1, 2).reshape(B, T, h * d)


# Its own function: the check's message shows the line of the pasted code that raises.
def merge_heads_view_non_contiguous(x):
    B, h, T, d = x.shape
    return x.transpose(1, 2).view(B, T, h * d)


@decisions("split_transposed", "merge_transposed", "scaled_by", "mask_true_means", "output_projection",
           "weights_averaged", "weights_copied_transposed")
class MultiHeadAttention(nn.Module):
    """The module, with the decisions its mistakes get wrong as class attributes (read through self)."""

    split_transposed = True  # False: a plain view to (B, h, T, d)
    merge_transposed = True  # False: a plain view back to (B, T, D)
    scaled_by = "d_head"  # or "d_model"
    mask_true_means = "may attend"  # or "masked", nn.MultiheadAttention's convention
    output_projection = True
    weights_averaged = False  # over the heads, as nn.MultiheadAttention does by default
    weights_copied_transposed = False  # nn.Linear's (out, in) weights copied as (in, out): x @ W instead of x @ W.T

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        if num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_torch(cls, mha):
        if not mha.batch_first:
            raise ValueError("from_torch needs an nn.MultiheadAttention built with batch_first=True")
        if mha.kdim != mha.embed_dim or mha.vdim != mha.embed_dim:
            raise ValueError(f"from_torch needs kdim == vdim == embed_dim, got kdim = {mha.kdim}, vdim = {mha.vdim}")
        bias = mha.in_proj_bias is not None
        module = cls(mha.embed_dim, mha.num_heads, bias=bias).to(mha.in_proj_weight.dtype)
        projections = (module.q_proj, module.k_proj, module.v_proj, module.out_proj)
        with torch.no_grad():
            for proj, w in zip(projections, (*mha.in_proj_weight.chunk(3), mha.out_proj.weight), strict=True):
                proj.weight.copy_(w.T if cls.weights_copied_transposed else w)
            if bias:
                for proj, b in zip(projections, (*mha.in_proj_bias.chunk(3), mha.out_proj.bias), strict=True):
                    proj.bias.copy_(b)
        return module

    def split(self, x):
        B, h, d = x.shape[0], self.num_heads, self.d_head
        return x.reshape(B, -1, h, d).transpose(1, 2) if self.split_transposed else x.reshape(B, h, -1, d)

    def masked(self, mask):
        return mask if self.mask_true_means == "masked" else ~mask

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        B, n, m, h, d = query.shape[0], query.shape[1], key.shape[1], self.num_heads, self.d_head
        if query.shape[-1] != self.d_model or key.shape[-1] != self.d_model or value.shape[-1] != self.d_model:
            raise ValueError(f"query, key and value must have d_model = {self.d_model} features")
        if attn_mask is not None and tuple(attn_mask.shape) != (n, m):
            raise ValueError(f"attn_mask should have shape (n, m) = {(n, m)}, got {tuple(attn_mask.shape)}")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, m):
            raise ValueError(f"key_padding_mask should have shape (B, m) = {(B, m)}")
        q, k, v = self.split(self.q_proj(query)), self.split(self.k_proj(key)), self.split(self.v_proj(value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(h * d if self.scaled_by == "d_model" else d)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(self.masked(attn_mask), float("-inf"))
        elif attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(self.masked(key_padding_mask[:, None, None, :]), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = weights @ v
        merged = (heads.transpose(1, 2) if self.merge_transposed else heads).reshape(B, -1, h * d)
        output = self.out_proj(merged) if self.output_projection else merged
        return output, (weights.mean(dim=1) if self.weights_averaged else weights)


# Its own class: the check's message shows the line of the pasted code that raises.
class MHAParametersStayFloat32(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        self.num_heads, self.d_head = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_torch(cls, mha):
        bias = mha.in_proj_bias is not None
        module = cls(mha.embed_dim, mha.num_heads, bias=bias)  # float32 parameters
        with torch.no_grad():
            for i, proj in enumerate((module.q_proj, module.k_proj, module.v_proj)):
                proj.weight.copy_(mha.in_proj_weight.chunk(3)[i])
                if bias:
                    proj.bias.copy_(mha.in_proj_bias.chunk(3)[i])
            module.out_proj.weight.copy_(mha.out_proj.weight)
            if bias:
                module.out_proj.bias.copy_(mha.out_proj.bias)
        return module

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        B, h, d = query.shape[0], self.num_heads, self.d_head
        q = self.q_proj(query).reshape(B, -1, h, d).transpose(1, 2)
        k = self.k_proj(key).reshape(B, -1, h, d).transpose(1, 2)
        v = self.v_proj(value).reshape(B, -1, h, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(B, -1, h * d)), weights


@decisions("heads_shared_by", "scaled_by", "mask_true_means", "masked_score", "zero_empty_rows")
def grouped_query_attention(Q, K, V, mask=None, *, heads_shared_by="repeat_interleave", scaled_by="d_head",
                            mask_true_means="may attend", masked_score="-inf", zero_empty_rows=True):
    """grouped_query_attention, with the decisions its mistakes get wrong."""
    if Q.dim() != 4 or K.dim() != 4 or V.dim() != 4:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} must be 4-D: (B, heads, T, d)")
    B, h, n, d = Q.shape
    g, m = K.shape[1], K.shape[2]
    if K.shape[0] != B or V.shape[0] != B or V.shape[1] != g or V.shape[2] != m or K.shape[3] != d:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} do not fit")
    if h % g != 0:
        raise ValueError(f"Q has {h} heads, K has {g}: h must be divisible by g")
    r = h // g
    if heads_shared_by == "repeat":  # the whole group tiled: query head i gets key/value head i % g
        K, V = K.repeat(1, r, 1, 1), V.repeat(1, r, 1, 1)
    else:
        K, V = K.repeat_interleave(r, dim=1), V.repeat_interleave(r, dim=1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(h * d if scaled_by == "d_model" else d)
    if mask is not None and mask.dtype == torch.bool:
        fill = torch.finfo(scores.dtype).min if masked_score == "torch.finfo(dtype).min" else float("-inf")
        scores = scores.masked_fill(mask if mask_true_means == "masked" else ~mask, fill)
    elif mask is not None:
        scores = scores + mask
    if not zero_empty_rows:  # a row of -inf scores: softmax computes 0 / 0
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
    has_key = scores.amax(dim=-1, keepdim=True) > float("-inf")
    weights = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    return weights @ V, weights





# --- hidden checks ------------------------------------------------------------------------


@hidden
def check_split_heads(split_heads) -> None:
    """Many shapes, h = 1 and h = D, float32, a non-contiguous x; ValueError for D % h and non-3-D x."""
    gen = generator(501)
    cases = [
        Case((randn(2, 5, 12, gen=gen), 3), label="3 heads of 4 features"),
        Case((randn(3, 4, 6, gen=gen), 1), label="one head"),
        Case((randn(1, 3, 8, gen=gen), 8), label="8 heads of 1 feature"),
        Case((randn(2, 7, 32, gen=gen, dtype=torch.float32), 4), label="float32"),
        Case((randn(1, 1, 6, gen=gen), 2), label="one token"),
        Case((randn(2, 12, 5, gen=gen).transpose(1, 2), 4), label="a non-contiguous x (a transposed tensor)"),
    ]
    verify(split_heads, cases, split_reference, exercise="split_heads", arg_names=("x", "num_heads"),
           outputs=None, mistakes=MISTAKES["split_heads"], rtol=0, atol=0)
    expect_error(split_heads, randn(1, 4, 12, gen=gen), 5, error=ValueError,
                 what="split_heads(x (1, 4, 12), num_heads=5)", why="12 features cannot be split into 5 equal heads")
    expect_error(split_heads, randn(4, 12, gen=gen), 3, error=ValueError,
                 what="split_heads(x (4, 12), num_heads=3)", why="x must have shape (B, T, D)")


@hidden
def check_merge_heads(merge_heads) -> None:
    """Many shapes, contiguous and split inputs; merge(split(x)) == x exactly; ValueError for non-4-D x."""
    gen = generator(502)
    cases = [
        Case((randn(2, 3, 5, 4, gen=gen),), label="3 heads of 4 features"),
        Case((randn(3, 1, 4, 6, gen=gen),), label="one head"),
        Case((randn(1, 8, 3, 1, gen=gen),), label="8 heads of 1 feature"),
        Case((randn(2, 4, 7, 8, gen=gen, dtype=torch.float32),), label="float32"),
        Case((split_reference(randn(2, 6, 12, gen=gen), 4),), label="the output of a split (not contiguous)"),
    ]
    verify(merge_heads, cases, merge_reference, exercise="merge_heads", arg_names=("x",), outputs=None,
           mistakes=MISTAKES["merge_heads"], rtol=0, atol=0)
    for B, T, D, h in [(2, 5, 12, 3), (1, 7, 16, 16), (3, 2, 10, 1)]:
        x = randn(B, T, D, gen=gen)
        with case(f"merge_heads undoes the split of x {(B, T, D)} into {h} heads"):
            merged = call_student(merge_heads, split_reference(x, h),
                                  what=f"merge_heads(split of x {(B, T, D)} into {h} heads)")
            if not isinstance(merged, torch.Tensor) or merged.shape != x.shape or not torch.equal(merged, x):
                fail(f"merge_heads should undo the split exactly: merging x {(B, T, D)} split into {h} heads does "
                     "not give x back.")
    expect_error(merge_heads, randn(2, 3, 4, gen=gen), error=ValueError, what="merge_heads(x (2, 3, 4))",
                 why="x must have shape (B, h, T, d)")


def _loop_reference(torch_mha, query, key, value, attn_mask=None, key_padding_mask=None):
    """Multi-head attention head by head, from the weights of nn.MultiheadAttention, with plain matmuls."""
    mha = torch_mha.mha
    D, h = mha.embed_dim, mha.num_heads
    d = D // h
    W_q, W_k, W_v = mha.in_proj_weight.detach().chunk(3)
    if mha.in_proj_bias is not None:
        b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
        b_o = mha.out_proj.bias.detach()
    else:
        b_q = b_k = b_v = b_o = torch.zeros(D, dtype=W_q.dtype)
    Q, K, V = query @ W_q.T + b_q, key @ W_k.T + b_k, value @ W_v.T + b_v
    heads, weights = [], []
    for i in range(h):
        cols = slice(i * d, (i + 1) * d)
        scores = Q[..., cols] @ K[..., cols].transpose(-2, -1) / math.sqrt(d)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, :], -math.inf)
        w = torch.softmax(scores, dim=-1)
        heads.append(w @ V[..., cols])
        weights.append(w)
    return torch.cat(heads, dim=-1) @ mha.out_proj.weight.detach().T + b_o, torch.stack(weights, dim=1)


def _mask_without_empty_rows(n: int, m: int, gen: torch.Generator) -> torch.Tensor:
    """A random bool (n, m) mask in which every row, and every row of its inverse, has a True."""
    mask = torch.rand(n, m, generator=gen) < 0.5
    rows = torch.arange(n)
    mask[rows, rows % m] = True
    mask[rows, (rows + 1) % m] = False
    return mask


def _padding(lengths: list[int], m: int) -> torch.Tensor:
    return torch.arange(m)[None, :] < torch.tensor(lengths)[:, None]


#: How the check runs a catalogued class, as it runs the student's: two variants run so are combined into one.


@hidden
def check_MultiHeadAttention(MultiHeadAttention) -> None:  # noqa: N802 - named after the class it checks
    """Against nn.MultiheadAttention (float64, 1e-10) and a loop over heads; masks; float32; errors."""
    # A catalogued mistake is a class: run it the way the student's class is run.
    mistakes = through(MISTAKES["MultiHeadAttention"], run_module)
    gen = generator(503)
    x1, x2 = randn(2, 6, 12, gen=gen), randn(2, 5, 8, gen=gen)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    additive = torch.where(_mask_without_empty_rows(4, 7, gen), 0.0, -math.inf).double() + randn(4, 7, gen=gen)
    cases = [
        Case((TorchMHA(12, 3, seed=11), x1, x1, x1), label="self-attention, 3 heads"),
        Case((TorchMHA(8, 2, bias=False, seed=12), randn(3, 4, 8, gen=gen), randn(3, 7, 8, gen=gen),
              randn(3, 7, 8, gen=gen)), label="cross-attention, n = 4, m = 7, no bias"),
        Case((TorchMHA(6, 1, seed=13), randn(2, 3, 6, gen=gen), *[randn(2, 5, 6, gen=gen)] * 2),
             label="a single head"),
        Case((TorchMHA(8, 8, seed=14), x2, x2, x2), label="8 heads of one feature"),
        Case((TorchMHA(12, 4, seed=15), randn(2, 4, 12, gen=gen), randn(2, 7, 12, gen=gen),
              randn(2, 7, 12, gen=gen)), {"attn_mask": _mask_without_empty_rows(4, 7, gen)},
             label="cross-attention, bool attn_mask (n, m): True = may attend"),
        Case((TorchMHA(8, 2, bias=False, seed=16), randn(3, 6, 8, gen=gen), *[randn(3, 6, 8, gen=gen)] * 2),
             {"key_padding_mask": _padding([4, 5, 1], 6)}, label="key_padding_mask (B, m): True = real token"),
        Case((TorchMHA(8, 4, seed=17), x2, x2, x2), {"attn_mask": causal, "key_padding_mask": _padding([5, 3], 5)},
             label="self-attention, causal and padding masks together"),
        Case((TorchMHA(12, 2, seed=18), randn(2, 4, 12, gen=gen), randn(2, 7, 12, gen=gen),
              randn(2, 7, 12, gen=gen)), {"attn_mask": additive, "key_padding_mask": _padding([7, 5], 7)},
             label="a float attn_mask, added to the scores, and a padding mask"),
        Case((TorchMHA(8, 2, seed=21), randn(1, 1, 8, gen=gen), *[randn(1, 4, 8, gen=gen)] * 2),
             label="one sequence, one query: dimensions of size 1 stay"),
    ]
    against = partial(verify, run_module(MultiHeadAttention), exercise="MultiHeadAttention",
                      arg_names=("mha", "query", "key", "value"), forbid=ATTENTION_BUILTINS, mistakes=mistakes)
    against(cases, torch_mha_reference, rtol=1e-10, atol=1e-10)
    loop_cases = [Case(cases[i].args, cases[i].kwargs, cases[i].label + "; compared with a loop over heads")
                  for i in (1, 3, 6)]
    against(loop_cases, _loop_reference, rtol=1e-10, atol=1e-10)
    float32 = [Case((TorchMHA(12, 3, dtype=torch.float32, seed=19),
                     *(randn(2, 5, 12, gen=gen, dtype=torch.float32) for _ in range(3))),
                    {"key_padding_mask": _padding([5, 2], 5)}, label="float32 weights and inputs")]
    against(float32, torch_mha_reference, rtol=1e-4, atol=1e-5)

    for d_model, num_heads, bias in [(12, 3, True), (8, 8, False)]:
        with case(f"the parameters of MultiHeadAttention({d_model}, {num_heads}, bias={bias})"):
            check_parameters(MultiHeadAttention, d_model, num_heads, bias)
    torch_mha = TorchMHA(8, 2, seed=20)
    built = "MultiHeadAttention.from_torch(mha) registers the copied weights as parameters"
    module = None
    with case(built):
        module = call_student(MultiHeadAttention.from_torch, torch_mha.mha, what="MultiHeadAttention.from_torch(mha)")
        expected = count_parameters(torch_mha.mha)
        if probe(module_summary, module, what="MultiHeadAttention.from_torch(mha)")["parameters"] != expected:
            fail("MultiHeadAttention.from_torch(mha) should return a module with as many parameters as mha "
                 f"({expected}); register the copied weights as parameters.")
    x = randn(2, 3, 8, gen=gen)
    with case("output.sum().backward() reaches every parameter of the module of from_torch(mha)"):
        needs(module, built)
        call_student(module, x, x, x, what="the module of MultiHeadAttention.from_torch(mha)(x, x, x)")
        no_grad = probe(parameters_without_grad, module, x, what="output.sum().backward() on your module's output",
                        forbid=ATTENTION_BUILTINS)
        if no_grad:
            fail(f"After output.sum().backward(), the parameters {no_grad} of your module have no gradient: the "
                 "output must be computed from the module's parameters, with autograd on.")

    expect_error(MultiHeadAttention, 12, 5, error=ValueError, what="MultiHeadAttention(12, 5)",
                 why="d_model = 12 cannot be split into 5 equal heads")
    with torch.random.fork_rng(devices=[]):
        seq_first = nn.MultiheadAttention(8, 2)
        other_kdim = nn.MultiheadAttention(8, 2, kdim=4, vdim=4, batch_first=True)
    for torch_module, what, why in [
        (seq_first, "MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2))",
         "that module expects (T, B, D) inputs (batch_first=False)"),
        (other_kdim, "MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4, batch_first=True))",
         "its keys and values have 4 features, not d_model = 8"),
    ]:
        with case(f"{what} raises ValueError"):  # reading from_torch off the student's class runs their code
            expect_error(MultiHeadAttention.from_torch, torch_module, error=ValueError, what=what, why=why)
    key, value = randn(2, 4, 6, gen=gen), randn(2, 4, 6, gen=gen)
    for args, kwargs, what, why in [
        ((x, key, value), {}, "module(query (2, 3, 8), key (2, 4, 6), value (2, 4, 6)) with d_model = 8",
         "key and value have 6 features, not d_model = 8"),
        ((x, x, x), {"attn_mask": torch.ones(3, 4, dtype=torch.bool)},
         "module(x, x, x, attn_mask of shape (3, 4)) with 3 queries and 3 keys",
         "attn_mask must have shape (n, m) = (3, 3)"),
    ]:
        with case(f"{what} raises ValueError"):
            needs(module, built)
            expect_error(module, *args, error=ValueError, what=what, why=why, **kwargs)
    with case("module(x, x, x, key_padding_mask of shape (3, 3)) with a batch of 2 raises ValueError"):
        needs(module, built)
        expect_error(module, x, x, x, key_padding_mask=torch.ones(3, 3, dtype=torch.bool), error=ValueError,
                     what="module(x, x, x, key_padding_mask of shape (3, 3)) with a batch of 2",
                     why="key_padding_mask must have shape (B, m) = (2, 3)")


@hidden
def check_grouped_query_attention(grouped_query_attention) -> None:
    """Against SDPA with enable_gqa=True (math backend, float64): g = 1, g = h, in between; masks."""
    gen = generator(504)

    def qkv(B, h, g, n, m, d, d_v=None, dtype=torch.float64):
        return (randn(B, h, n, d, gen=gen, dtype=dtype), randn(B, g, m, d, gen=gen, dtype=dtype),
                randn(B, g, m, d if d_v is None else d_v, gen=gen, dtype=dtype))

    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    additive = torch.where(_mask_without_empty_rows(4, 6, gen), 0.0, -math.inf).double() + randn(2, 8, 4, 6, gen=gen)
    blocked = _mask_without_empty_rows(3, 5, gen)
    blocked[0] = False
    cases = [
        Case(qkv(2, 8, 2, 4, 6, 4), label="8 query heads, 2 key/value heads (4 per group)"),
        Case(qkv(1, 6, 3, 3, 5, 8, d_v=5), label="6 query heads, 3 key/value heads, d_v != d"),
        Case(qkv(2, 4, 1, 5, 5, 4), label="multi-query attention (g = 1)"),
        Case(qkv(2, 4, 4, 3, 7, 6), label="g = h: ordinary multi-head attention"),
        Case(qkv(2, 8, 2, 4, 6, 8), {"mask": _mask_without_empty_rows(4, 6, gen)}, label="bool mask (n, m)"),
        Case(qkv(3, 4, 2, 5, 5, 4), {"mask": causal}, label="causal mask"),
        Case(qkv(3, 6, 2, 4, 6, 4), {"mask": _padding([6, 3, 1], 6)[:, None, None, :]},
             label="padding mask (B, 1, 1, m)"),
        Case(qkv(2, 8, 4, 4, 6, 4), {"mask": additive}, label="float mask (B, h, n, m), added to the scores"),
        Case(qkv(1, 4, 2, 3, 5, 4), {"mask": blocked}, label="query 0 may attend to no key"),
        Case(qkv(2, 4, 2, 3, 5, 4), {"mask": torch.zeros(3, 5, dtype=torch.float64).masked_fill(~blocked, -math.inf)},
             label="a float mask whose row 0 is all -inf: that query gets zero weights and a zero output"),
        # Dimensions of size 1 beyond the reduced one: a .squeeze() or an index [0] must not remove them.
        Case(qkv(1, 2, 1, 1, 4, 3, d_v=1), label="one sequence, one query, one key/value head, d_v = 1"),
    ]
    against = partial(verify, grouped_query_attention, reference=gqa_reference, exercise="grouped_query_attention",
                      arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS, mistakes=MISTAKES["grouped_query_attention"])
    against(cases, rtol=1e-10, atol=1e-12)
    float32 = [Case(qkv(2, 8, 2, 5, 5, 8, dtype=torch.float32), {"mask": causal}, label="float32")]
    against(float32, rtol=1e-4, atol=1e-5)
    for shapes, why in [
        (((1, 6, 2, 4), (1, 4, 3, 4), (1, 4, 3, 4)), "6 query heads cannot be shared equally among 4 key/value heads"),
        (((1, 4, 2, 4), (1, 2, 3, 4), (1, 1, 3, 4)), "K has 2 heads but V has 1"),
        (((1, 4, 2, 4), (1, 2, 3, 5), (1, 2, 3, 4)), "Q and K have different d (4 and 5)"),
        (((1, 4, 2, 4), (1, 2, 3, 4), (1, 2, 6, 4)), "K has 3 keys but V has 6 values"),
        (((4, 2, 4), (2, 3, 4), (2, 3, 4)), "Q, K and V must be 4-D: (B, heads, T, d)"),
    ]:
        expect_error(grouped_query_attention, *(randn(*s, gen=gen) for s in shapes), error=ValueError,
                     what=f"grouped_query_attention(Q {shapes[0]}, K {shapes[1]}, V {shapes[2]})", why=why)


# --- attention on a graph: the mistake catalogue and the hidden check -------------------------



@decisions("adjacency", "loops", "scaled", "softmax_over", "masked_score", "zero_empty_rows")
def graph_attention(X, edges, W_Q, W_K, W_V, self_loops=True, *, adjacency="mask[target, source]",
                    loops="added when self_loops", scaled=True, softmax_over="the neighbours",
                    masked_score=float("-inf"), zero_empty_rows=True):
    """graph_attention, with the decisions its mistakes get wrong."""
    if X.dim() != 2:
        raise ValueError(f"X should have shape (N, d), got shape {tuple(X.shape)}")
    N, d = X.shape
    if edges.dim() != 2 or edges.shape[0] != 2:
        raise ValueError(f"edges should have shape (2, E), got shape {tuple(edges.shape)}")
    if edges.dtype.is_floating_point or edges.dtype.is_complex or edges.dtype == torch.bool:
        raise ValueError(f"edges should hold integer node indices, got dtype {edges.dtype}")
    if edges.numel() and (edges.min() < 0 or edges.max() >= N):
        raise ValueError(f"edges should hold node indices 0 ... {N - 1}")
    if W_Q.shape[0] != d or W_K.shape[0] != d or W_V.shape[0] != d or W_Q.shape[1] != W_K.shape[1]:
        raise ValueError(f"W_Q, W_K and W_V should have {d} rows, and W_Q and W_K as many columns")
    mask = torch.full((N, N), adjacency == "the complete graph")  # the edges ignored
    if adjacency == "mask[target, source]":
        mask[edges[1], edges[0]] = True
    elif adjacency == "mask[source, target]":  # node i attends to the nodes it sends to
        mask[edges[0], edges[1]] = True
    if loops == "always added" or (loops == "added when self_loops" and self_loops):
        mask |= torch.eye(N, dtype=torch.bool)
    elif loops == "diagonal set to self_loops":  # also deletes the explicit edges (i, i)
        mask.fill_diagonal_(self_loops)
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / math.sqrt(Q.shape[-1]) if scaled else Q @ K.T
    if softmax_over == "all nodes":  # then the non-neighbours zeroed: rows no longer sum to one
        weights = torch.softmax(scores, dim=-1) * mask
        return weights @ V, weights
    scores = scores.masked_fill(~mask, masked_score)
    if not zero_empty_rows:  # a node with no neighbour: 0 / 0, or weights spread over all nodes
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
    has_neighbour = mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~has_neighbour, 0.0), dim=-1) * has_neighbour
    return weights @ V, weights


# Another algorithm (a softmax over the list of edges, not over a mask), so a function of its own.
def graph_attention_duplicates_counted(X, edges, W_Q, W_K, W_V, self_loops=True):
    # One score per listed edge and a softmax over the edges into each node: an edge listed
    # twice enters the sum twice.
    N = X.shape[0]
    sources, targets = edges[0], edges[1]
    if self_loops:
        nodes = torch.arange(N)
        sources, targets = torch.cat([sources, nodes]), torch.cat([targets, nodes])
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = (Q[targets] * K[sources]).sum(dim=-1) / math.sqrt(Q.shape[-1])
    top = torch.full((N,), float("-inf"), dtype=X.dtype).scatter_reduce(0, targets, scores, "amax")
    e = torch.exp(scores - top[targets])
    total = torch.zeros(N, dtype=X.dtype).index_add(0, targets, e)
    weights = torch.zeros(N, N, dtype=X.dtype).index_put((targets, sources), e / total[targets], accumulate=True)
    return weights @ V, weights


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/multi_head.toml


@hidden
def check_graph_attention(graph_attention) -> None:
    """Against masked SDPA (math backend, float64) on random graphs: isolated nodes, duplicates, explicit loops."""
    gen = generator(505)

    def weights(N: int, d: int, d_k: int, d_v: int, dtype=torch.float64, scale: float = 1.0) -> tuple:
        return (randn(N, d, gen=gen, dtype=dtype) * scale, randn(d, d_k, gen=gen, dtype=dtype),
                randn(d, d_k, gen=gen, dtype=dtype), randn(d, d_v, gen=gen, dtype=dtype))

    def case(N, d, d_k, d_v, edges, label, *, self_loops=None, dtype=torch.float64, scale=1.0, weight=1.0) -> Case:
        X, W_Q, W_K, W_V = weights(N, d, d_k, d_v, dtype, scale)
        kwargs = {} if self_loops is None else {"self_loops": self_loops}
        return Case((X, edges, W_Q, W_K, W_V), kwargs, label, weight)

    empty = torch.zeros(2, 0, dtype=torch.long)
    cases = [
        case(8, 5, 4, 3, random_graph(8, 14, gen, no_in_edge=(2,), isolated=(6,), loops=(4,), duplicates=3),
             "8 nodes: none into node 2, node 6 isolated, explicit loop at 4, 3 duplicate edges"),
        case(8, 5, 4, 3, random_graph(8, 14, gen, no_in_edge=(1,), isolated=(5,), loops=(3, 7), duplicates=2),
             "the same kind of graph with self_loops=False", self_loops=False),
        case(6, 4, 4, 4, random_graph(6, 30, gen, duplicates=10), "a dense graph with many duplicates"),
        case(5, 3, 2, 6, random_graph(5, 6, gen, no_in_edge=(0, 4), loops=(4,)),
             "d_v != d_k; node 4 receives only its explicit loop", self_loops=False),
        case(4, 3, 3, 2, empty, "no edge at all, self_loops=True: every node attends to itself alone"),
        case(4, 3, 3, 2, empty, "no edge at all, self_loops=False: every row is empty", self_loops=False),
        # One node with its self-loop: its one weight is 1 whatever the scores, so most wrong answers pass.
        case(1, 2, 2, 2, empty, "a single node, no edge", weight=0.25),
        case(9, 6, 4, 5, random_graph(9, 20, gen, isolated=(0, 8), duplicates=4), "large scores (X * 20)",
             scale=20.0),
        case(7, 4, 8, 3, torch.tensor([[0, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 0]]),
             "a directed cycle 0 -> 1 -> ... -> 6 -> 0", self_loops=False),
        case(5, 3, 2, 1, random_graph(5, 7, gen, no_in_edge=(1,)), "values of one feature (d_v = 1)",
             self_loops=False),
    ]
    against = partial(verify, graph_attention, reference=graph_attention_reference, exercise="graph_attention",
                      arg_names=("X", "edges", "W_Q", "W_K", "W_V"), forbid=ATTENTION_BUILTINS,
                      mistakes=MISTAKES["graph_attention"])
    against(cases, rtol=1e-10, atol=1e-12)
    float32 = [case(8, 5, 4, 3, random_graph(8, 14, gen, no_in_edge=(3,), duplicates=2), "float32",
                    dtype=torch.float32)]
    against(float32, rtol=1e-4, atol=1e-5)

    X, W_Q, W_K, W_V = weights(4, 3, 2, 2)
    ok = torch.tensor([[0, 1], [1, 2]])
    for args, what, why in [
        ((X[0], ok, W_Q, W_K, W_V), "graph_attention(X (3,), ...)", "X must have shape (N, d)"),
        ((X, torch.tensor([0, 1, 2]), W_Q, W_K, W_V), "graph_attention(X (4, 3), edges (3,), ...)",
         "edges must have shape (2, E)"),
        ((X, torch.tensor([[0, 4], [1, 2]]), W_Q, W_K, W_V), "graph_attention(X (4, 3), edges [[0, 4], [1, 2]], ...)",
         "node 4 does not exist in a graph of 4 nodes"),
        ((X, torch.tensor([[0, -1], [1, 2]]), W_Q, W_K, W_V),
         "graph_attention(X (4, 3), edges [[0, -1], [1, 2]], ...)", "-1 is not a node (indices run from 0 to 3)"),
        ((X, ok.double(), W_Q, W_K, W_V), "graph_attention(X (4, 3), edges of dtype float64, ...)",
         "edges must hold integer node indices"),
        ((X, ok, W_Q, randn(3, 5, gen=gen), W_V), "graph_attention(X (4, 3), edges, W_Q (3, 2), W_K (3, 5), W_V)",
         "queries and keys must have the same width d_k"),
        ((X, ok, W_Q, W_K, randn(5, 2, gen=gen)), "graph_attention(X (4, 3), edges, W_Q, W_K, W_V (5, 2))",
         "W_V must have d = 3 rows, one per feature of X"),
    ]:
        expect_error(graph_attention, *args, error=ValueError, what=what, why=why)
