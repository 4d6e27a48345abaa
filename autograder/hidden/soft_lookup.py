"""Hidden checks and mistake catalogue for notebook 01 (instructor-only)."""

from __future__ import annotations

import math

import torch

from ..grader.diagnosis import read_mistakes
from ..grader.inputs import generator, randn
from ..grader.student import expect_error
from ..grader.variation import decisions, variant
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.soft_lookup import (
    hard_lookup_reference,
    nadaraya_watson_reference,
    sdpa_reference,
    soft_lookup_reference,
)
from . import hidden

# --- the mistake catalogue: each mistake is a reference with one decision changed -----------------


@decisions("similarity", "best", "soft", "returned")
def hard_lookup(query, keys, values, *, similarity="dot product", best="first max", soft=False, returned="value"):
    """The lookup, with the decisions its mistakes get wrong."""
    scores = keys @ query
    if similarity == "cosine":
        scores = scores / (keys.norm(dim=-1) * query.norm())
    if soft:
        return torch.softmax(scores, dim=-1) @ values
    if best == "first max":
        i = int(torch.argmax(scores))
    elif best == "last max":
        i = len(scores) - 1 - int(torch.argmax(scores.flip(0)))
    else:
        i = int(torch.argmin(scores))
    return (keys if returned == "key" else values)[i]


@decisions("temperature_as", "weights_by", "averaged")
def soft_lookup(query, keys, values, temperature=1.0, *, temperature_as="divisor", weights_by="softmax",
                averaged="values"):
    """The soft lookup, with the decisions its mistakes get wrong."""
    if query.shape[-1] != keys.shape[-1]:
        raise ValueError(f"the query has {query.shape[-1]} features and the keys have {keys.shape[-1]}")
    scores = keys @ query
    if temperature_as == "divisor":
        scores = scores / temperature
    elif temperature_as == "factor":
        scores = scores * temperature
    if weights_by == "softmax":
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.exp(scores)
        if weights_by == "exp / sum":
            weights = weights / weights.sum()
    return weights @ (keys if averaged == "keys" else values), weights


@decisions("negated", "divisor", "softmax_dim")
def nadaraya_watson(x_query, x_train, y_train, bandwidth, *, negated=True, divisor="2 h^2", softmax_dim=-1):
    """The Gaussian-kernel regression, with the decisions its mistakes get wrong."""
    scores = (x_query[:, None] - x_train[None, :]) ** 2
    if negated:
        scores = -scores
    scores = scores / {"2 h^2": 2 * bandwidth**2, "h^2": bandwidth**2, "2 h": 2 * bandwidth}[divisor]
    weights = torch.softmax(scores, dim=softmax_dim)
    return weights @ y_train, weights


@decisions("divisor", "softmax_dim", "weights_transposed")
def scaled_dot_product_attention(Q, K, V, *, divisor="sqrt(d_k)", softmax_dim=-1, weights_transposed=False):
    """Scaled dot-product attention, with the decisions its mistakes get wrong."""
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K has {K.shape[-2]} keys but V has {V.shape[-2]} values")
    scale = {"sqrt(d_k)": math.sqrt(Q.shape[-1]), "d_k": Q.shape[-1], "sqrt(d_v)": math.sqrt(V.shape[-1]), "1": 1}
    weights = torch.softmax(Q @ K.transpose(-2, -1) / scale[divisor], dim=softmax_dim)
    return weights @ V, weights.transpose(-2, -1) if weights_transposed else weights


sdpa_no_scaling = variant(scaled_dot_product_attention, divisor="1")  # the tests submit it by this name


# Functions of their own: a check's message shows the line of the pasted copy that fails on 4-D inputs.


def sdpa_transpose_3d(Q, K, V):
    weights = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(Q.shape[-1]), dim=-1)
    return weights @ V, weights


def sdpa_permute_3d(Q, K, V):
    weights = torch.softmax(Q @ K.permute(0, 2, 1) / math.sqrt(Q.shape[-1]), dim=-1)
    return weights @ V, weights


def sdpa_bmm_3d(Q, K, V):
    weights = torch.softmax(torch.bmm(Q, K.transpose(-2, -1)) / math.sqrt(Q.shape[-1]), dim=-1)
    return torch.bmm(weights, V), weights


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/soft_lookup.toml


# --- hidden checks ------------------------------------------------------------------------


def _lookup_cases(seed: int) -> list[Case]:
    gen = generator(seed)
    cases = []
    for m, d, d_v in [(5, 3, 2), (8, 16, 4), (2, 1, 7)]:
        keys = torch.randint(-3, 4, (m, d), generator=gen).double()
        cases.append(Case((randn(d, gen=gen), keys, randn(m, d_v, gen=gen)),
                          label=f"{m} keys of {d} feature{'s' * (d > 1)}, values of {d_v}"))
    keys = torch.tensor([[1.0, 1.0], [0.0, 2.0], [2.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    cases.append(Case((torch.tensor([1.0, 1.0], dtype=torch.float64), keys, randn(4, 3, gen=gen)),
                      label="all four keys tie"))
    return cases


@hidden
def check_hard_lookup(hard_lookup) -> None:
    """Random keys, values of another width, a four-way tie, and keys of different lengths."""
    gen = generator(105)
    keys = torch.tensor([[1.0, 0.0], [3.0, 3.0], [0.0, 1.0]], dtype=torch.float64)
    longer = Case((torch.tensor([1.0, 0.0], dtype=torch.float64), keys, randn(3, 2, gen=gen)),
                  label="the longer key [3, 3] has the higher dot product; [1, 0] points the query's way")
    verify(hard_lookup, [*_lookup_cases(101), longer], hard_lookup_reference, exercise="hard_lookup",
           arg_names=("query", "keys", "values"), outputs=None, mistakes=MISTAKES["hard_lookup"])


@hidden
def check_soft_lookup(soft_lookup) -> None:
    """Random inputs at several temperatures, including the cold limit, in float64 and float32."""
    cases = []
    for case, temperature in zip(_lookup_cases(102), (0.5, 1.0, 3.0, 1e-3)):
        cases.append(Case(case.args, {"temperature": temperature}, f"{case.label}, temperature {temperature:g}"))
    gen = generator(103)
    q, k, v = randn(4, gen=gen) * 20, randn(6, 4, gen=gen), randn(6, 3, gen=gen)
    cases.append(Case((q, k, v), {"temperature": 1e-2}, "large scores at a low temperature"))
    cases.append(Case((q.float(), k.float(), v.float()), {"temperature": 2.0}, "float32 inputs"))
    cases.append(Case((q, k, v[:, :1]), {"temperature": 1.0}, "values of one feature: the output has shape (1,)"))
    verify(soft_lookup, cases, soft_lookup_reference, exercise="soft_lookup", arg_names=("query", "keys", "values"),
           mistakes=MISTAKES["soft_lookup"], rtol=1e-5, atol=1e-6)
    expect_error(soft_lookup, randn(3, gen=gen), randn(5, 4, gen=gen), randn(5, 2, gen=gen), error=ValueError,
                 what="soft_lookup(query (3,), keys (5, 4), values)",
                 why="the query has 3 features and the keys have 4")


@hidden
def check_nadaraya_watson(nadaraya_watson) -> None:
    """Random data at three bandwidths."""
    gen = generator(104)
    cases = []
    for n, m, h in [(7, 20, 0.5), (1, 5, 2.0), (30, 11, 0.1)]:
        x_train = torch.rand(m, generator=gen, dtype=torch.float64) * 5
        cases.append(Case((torch.rand(n, generator=gen, dtype=torch.float64) * 5, x_train,
                           torch.sin(x_train) + 0.1 * randn(m, gen=gen), h),
                          label=f"{n} quer{'ies' if n > 1 else 'y'}, {m} training points, bandwidth {h:g}"))
    verify(nadaraya_watson, cases, nadaraya_watson_reference, exercise="nadaraya_watson",
           arg_names=("x_query", "x_train", "y_train", "bandwidth"), mistakes=MISTAKES["nadaraya_watson"],
           rtol=1e-6, atol=1e-9)


SDPA_SHAPES = [
    # (batch dims, n, m, d_k, d_v)
    ((2,), 5, 5, 8, 8),
    ((3,), 4, 7, 6, 3),
    ((2, 3), 5, 9, 4, 10),
    ((2, 1, 3), 6, 2, 5, 7),
    ((1,), 1, 1, 1, 1),
    ((4, 2), 3, 3, 16, 16),
    # Dimensions of size 1 beyond the reduced one: a .squeeze() or an index [0] must not remove them.
    ((3,), 1, 4, 5, 1),
    ((1, 2), 4, 1, 3, 2),
]


@hidden
def check_scaled_dot_product_attention(scaled_dot_product_attention) -> None:
    """Against F.scaled_dot_product_attention (math backend, float64) on many shapes, then float32."""
    gen = generator(105)
    cases = []
    for batch, n, m, d_k, d_v in SDPA_SHAPES:
        # One key: every weight is 1 whatever the scores, so a wrong scaling passes; one query and one key
        # besides: almost any answer of the right shape passes. Those inputs earn a small share.
        weight = 0.25 if n == m == 1 else 0.5 if m == 1 else 1.0
        cases.append(Case((randn(*batch, n, d_k, gen=gen), randn(*batch, m, d_k, gen=gen),
                           randn(*batch, m, d_v, gen=gen)),
                          label=f"batch {batch}, n = {n}, m = {m}, d_k = {d_k}, d_v = {d_v}", weight=weight))
    verify(scaled_dot_product_attention, cases, sdpa_reference, exercise="scaled_dot_product_attention",
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS,
           mistakes=MISTAKES["scaled_dot_product_attention"], rtol=1e-9, atol=1e-11)
    float32 = [Case(tuple(t.float() for t in cases[2].args), label="float32 inputs")]
    verify(scaled_dot_product_attention, float32, sdpa_reference, exercise="scaled_dot_product_attention",
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS,
           mistakes=MISTAKES["scaled_dot_product_attention"], rtol=1e-4, atol=1e-5)
    expect_error(scaled_dot_product_attention, randn(2, 3, 4, gen=gen), randn(2, 5, 4, gen=gen),
                 randn(2, 6, 4, gen=gen), error=ValueError,
                 what="scaled_dot_product_attention(Q (2, 3, 4), K (2, 5, 4), V (2, 6, 4))",
                 why="K has 5 keys but V has 6 values")
