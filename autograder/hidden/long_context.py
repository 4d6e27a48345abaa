"""Hidden checks and mistake catalogue for notebook 10, long context (instructor-only).

The checks run the student's RollingKVCache as the visible ones do (its constructor, and probes
that run in the student's process); the mistakes of each exercise are run the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..grader.cases import case
from ..grader.compare import assert_close, assert_shape, assert_tensor
from ..grader.diagnosis import MistakeFound, by_id, read_mistakes, through
from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import call_student, expect_error, probe
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.long_context import (
    LINEAR_ARGS,
    RECURRENT_OUTPUTS,
    check_rolling_cases,
    expect_append_errors,
    expect_shape_errors,
    held_bytes_problem,
    linear_quadratic,
    recurrent_flat,
    rolling_case,
    rolling_scenario,
    run_recurrent,
    sink_window_reference,
    watch_linear,
)
from ..shared.errors import CheckFailed
from . import hidden

# --- the references, with the decisions their catalogued mistakes get wrong -------------------------------------


@decisions("extra_keys", "bottom_right", "sinks_in_window", "sinks_causal", "both_sides", "looking_ahead", "inverted")
def sink_window(n, m, window, sinks=0, *, extra_keys=0, bottom_right=True, sinks_in_window=False, sinks_causal=True,
                both_sides=False, looking_ahead=False, inverted=False):
    """True where 0 <= p - j < window, or j < sinks and j <= p, with p = i + m - n."""
    if window < 1 or sinks < 0:
        raise ValueError(f"window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
    p = torch.arange(n)[:, None] + (m - n if bottom_right else 0)
    j = torch.arange(m)[None, :]
    distance = j - p if looking_ahead else p - j
    width = window + extra_keys - (sinks if sinks_in_window else 0)
    recent = distance.abs() < width if both_sides else (distance >= 0) & (distance < width)
    mask = recent | ((j < sinks) & ((j <= p) | (not sinks_causal)))
    return ~mask if inverted else mask


@decisions("sinks_kept", "ring_after_sinks", "in_order", "sinks_in_window", "extra_window", "len_counts_seen")
class RollingCache:
    """The first sinks tokens, and the last window tokens in a ring of slots after theirs."""

    sinks_kept = True  # False: one ring of sinks + window slots, where a sink is evicted like any token
    ring_after_sinks = True  # False: the ring's slots start at 0, over the sinks'
    in_order = True  # False: the tokens returned in the order of their slots
    sinks_in_window = False  # True: the sinks take places of the window
    extra_window = 0  # 1: the new token not counted in the window
    len_counts_seen = True  # False: the tokens held

    def __init__(self, batch, kv_heads, window, sinks, d_head, dtype=torch.float32):
        if window < 1 or sinks < 0:
            raise ValueError(f"window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
        if not self.sinks_kept:
            window, sinks = sinks + window, 0
        if self.sinks_in_window:
            window = max(1, window - sinks)
        self.shape, self.window, self.sinks, self.dtype = (batch, kv_heads, d_head), window + self.extra_window, sinks, dtype
        self.keys = self.values = None
        self.seen = 0

    def __len__(self):
        return self.seen if self.len_counts_seen else min(self.seen, self.sinks + self.window)

    def slots(self, positions):
        ring = (self.sinks if self.ring_after_sinks else 0) + (positions - self.sinks) % self.window
        return torch.where(positions < self.sinks, positions, ring)

    def append(self, k, v):
        batch, kv_heads, d_head = self.shape
        if tuple(k.shape) != (batch, kv_heads, 1, d_head) or tuple(v.shape) != (batch, kv_heads, 1, d_head):
            raise ValueError(f"k and v must be ({batch}, {kv_heads}, 1, {d_head})")
        if self.keys is None:
            self.keys = torch.empty(batch, kv_heads, self.sinks + self.window, d_head, dtype=self.dtype,
                                    device=k.device)
            self.values = torch.empty_like(self.keys)
        slot = int(self.slots(torch.tensor(self.seen)))
        self.keys[:, :, slot] = k[:, :, 0]
        self.values[:, :, slot] = v[:, :, 0]
        self.seen += 1
        positions = torch.cat([torch.arange(min(self.sinks, self.seen)),
                               torch.arange(min(self.seen, max(self.sinks, self.seen - self.window)), self.seen)])
        slots = self.slots(positions)
        if not self.in_order:
            order = slots.argsort()
            positions, slots = positions[order], slots[order]
        return self.keys[:, :, slots], self.values[:, :, slots], positions


class CacheKeepsEveryToken:  # another algorithm: a growing store instead of a ring of slots
    def __init__(self, batch, kv_heads, window, sinks, d_head, dtype=torch.float32):
        if window < 1 or sinks < 0:
            raise ValueError(f"window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
        self.shape, self.window, self.sinks, self.dtype = (batch, kv_heads, d_head), window, sinks, dtype
        self.keys = self.values = None

    def __len__(self):
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, k, v):
        batch, kv_heads, d_head = self.shape
        if tuple(k.shape) != (batch, kv_heads, 1, d_head) or tuple(v.shape) != (batch, kv_heads, 1, d_head):
            raise ValueError(f"k and v must be ({batch}, {kv_heads}, 1, {d_head})")
        k, v = k.to(self.dtype), v.to(self.dtype)
        if self.keys is None:
            self.keys, self.values = k.clone(), v.clone()
        else:  # every token kept: the memory grows with the tokens seen
            self.keys = torch.cat([self.keys, k], dim=2)
            self.values = torch.cat([self.values, v], dim=2)
        seen = self.keys.shape[2]
        positions = torch.tensor(sorted(set(range(min(self.sinks, seen))) | set(range(max(0, seen - self.window),
                                                                                        seen))), dtype=torch.long)
        return self.keys[:, :, positions], self.values[:, :, positions], positions


@decisions("feature_map", "queries_scaled", "eps_in", "causal_form")
def linear(Q, K, V, is_causal=False, eps=1e-6, *, feature_map="elu + 1", queries_scaled=False, eps_in="denominator",
           causal_form="prefix sums"):
    """phi(Q) S / (phi(Q) z + eps), with prefix sums when causal."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} do not fit")
    if is_causal and Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"causal linear attention needs n == m, got {Q.shape[-2]} and {K.shape[-2]}")
    phi = {"elu + 1": lambda x: F.elu(x) + 1, "x": lambda x: x, "relu": F.relu, "exp": torch.exp, "elu": F.elu}
    fq, fk = phi[feature_map](Q / Q.shape[-1] ** 0.5 if queries_scaled else Q), phi[feature_map](K)
    if eps_in == "features":
        fq, fk = fq + eps, fk + eps
    if is_causal and causal_form == "n x n mask":
        n = Q.shape[-2]
        A = (fq @ fk.transpose(-2, -1)) * torch.ones(n, n, dtype=torch.bool, device=Q.device).tril()
        return (A @ V) / (A.sum(-1, keepdim=True) + eps)
    if is_causal and causal_form != "ignored":
        kv = fk.unsqueeze(-1) * V.unsqueeze(-2)
        S, z = torch.cumsum(kv, dim=-3), torch.cumsum(fk, dim=-2)
        if causal_form == "own key left out":
            S, z = S - kv, z - fk
        numerator, denominator = (fq.unsqueeze(-2) @ S).squeeze(-2), (fq * z).sum(-1, keepdim=True)
    else:
        numerator, denominator = fq @ (fk.transpose(-2, -1) @ V), fq @ fk.sum(-2).unsqueeze(-1)
    if eps_in == "numerator and denominator":
        numerator = numerator + eps
    if eps_in in ("denominator", "numerator and denominator"):
        denominator = denominator + eps
    return numerator / denominator


def linear_quadratic_form(Q, K, V, is_causal=False, eps=1e-6):  # another algorithm: the n x m matrix
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} do not fit")
    if is_causal and Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"causal linear attention needs n == m, got {Q.shape[-2]} and {K.shape[-2]}")
    A = (F.elu(Q) + 1) @ (F.elu(K) + 1).transpose(-2, -1)  # the n x m matrix, as softmax attention builds it
    if is_causal:
        A = A.tril()
    return (A @ V) / (A.sum(-1, keepdim=True) + eps)


@decisions("keys_through_phi", "accumulated", "read_after_adding", "normalised")
def recurrent(Q, K, V, eps=1e-6, *, keys_through_phi=True, accumulated=True, read_after_adding=True, normalised=True):
    """A (d, d_v) state and a (d,) normaliser, each token added, then its query read."""
    if Q.shape[-2:] != K.shape[-2:] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} do not fit")
    fq, fk = F.elu(Q) + 1, F.elu(K) + 1 if keys_through_phi else K
    S = Q.new_zeros(*Q.shape[:-2], Q.shape[-1], V.shape[-1])
    z = Q.new_zeros(*Q.shape[:-2], Q.shape[-1])
    outputs = []
    for i in range(Q.shape[-2]):
        q, before = fq[..., i, :], (S, z)
        token_S, token_z = fk[..., i, :, None] * V[..., i, None, :], fk[..., i, :]
        S, z = (S + token_S, z + token_z) if accumulated else (token_S, token_z)
        read_S, read_z = (S, z) if read_after_adding else before
        numerator = (q.unsqueeze(-2) @ read_S).squeeze(-2)
        outputs.append(numerator / ((q * read_z).sum(-1, keepdim=True) + eps) if normalised else numerator)
    return torch.stack(outputs, dim=-2), (S, z)


def recurrent_by_prefix_sums(Q, K, V, eps=1e-6):  # another algorithm: the parallel form
    fq, fk = F.elu(Q) + 1, F.elu(K) + 1
    S = torch.cumsum(fk.unsqueeze(-1) * V.unsqueeze(-2), dim=-3)  # the parallel form: every S_i at once
    z = torch.cumsum(fk, dim=-2)
    output = (fq.unsqueeze(-2) @ S).squeeze(-2) / ((fq * z).sum(-1, keepdim=True) + eps)
    return output, (S[..., -1, :, :], z[..., -1, :])


def recurrent_quadratic(Q, K, V, eps=1e-6):  # another algorithm: the n x n matrix
    fq, fk = F.elu(Q) + 1, F.elu(K) + 1
    A = (fq @ fk.transpose(-2, -1)).tril()  # the n x n matrix instead of a state
    return (A @ V) / (A.sum(-1, keepdim=True) + eps), (fk.transpose(-2, -1) @ V, fk.sum(-2))


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/long_context.toml


# --- hidden checks -----------------------------------------------------------------------------------------------


@hidden
def check_sink_window_mask(sink_window_mask) -> None:
    """Against the loop reference: n < m, n == m, n > m, windows and sinks of every size; errors."""
    cases = [Case(args) for args in [(6, 6, 3, 0), (6, 6, 3, 2), (1, 9, 3, 2), (3, 9, 2, 2), (5, 8, 4, 1),
                                     (7, 7, 1, 1), (4, 4, 9, 0), (4, 4, 2, 6), (8, 3, 2, 1), (10, 10, 10, 0),
                                     (2, 12, 5, 3)]]
    verify(sink_window_mask, cases, sink_window_reference, exercise="sink_window_mask",
           arg_names=("n", "m", "window", "sinks"), outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=MISTAKES["sink_window_mask"])
    square = [Case((n, n, w), label=f"n == m = {n}, window {w}, no sinks: notebook 07's sliding_window_mask, "
                                    "0 <= i - j < window")
              for n, w in [(5, 1), (8, 2), (13, 4)]]
    verify(sink_window_mask, square, lambda n, m, w: sink_window_reference(n, m, w), exercise="sink_window_mask",
           arg_names=("n", "m", "window"), outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=MISTAKES["sink_window_mask"])
    gen = generator(1001)
    n, m, window, sinks = 4, 10, 3, 2
    q, k, v = randn(2, n, 4, gen=gen), randn(2, m, 4, gen=gen), randn(2, m, 3, gen=gen)
    with case(f"SDPA with sink_window_mask({n}, {m}, {window}, {sinks}) as its mask"):
        mask = call_student(sink_window_mask, n, m, window, sinks,
                            what=f"sink_window_mask({n}, {m}, {window}, {sinks})")
        assert_tensor(mask, "The mask")
        assert_shape(mask, (n, m), f"sink_window_mask({n}, {m}, {window}, {sinks})")
        assert_close(math_sdpa(q, k, v, attn_mask=mask),
                     math_sdpa(q, k, v, attn_mask=sink_window_reference(n, m, window, sinks)),
                     f"SDPA with sink_window_mask({n}, {m}, {window}, {sinks}) as its mask", rtol=1e-12, atol=1e-12)
    for args, why in [((4, 4, 0), "a window must hold at least one key"), ((4, 4, -3, 0), "a window must hold at "
                      "least one key"), ((4, 4, 2, -1), "there cannot be a negative number of sinks")]:
        expect_error(sink_window_mask, *args, error=ValueError, what=f"sink_window_mask{args}", why=why)


def _rolling_attention(got, q: torch.Tensor) -> torch.Tensor:
    """Decoding with what the cache returned: query t attends to the keys and values of append t."""
    _, keys, values, _ = got
    outputs = []
    for t, (k, v) in enumerate(zip(keys, values)):
        scores = q[:, :, t:t + 1] @ k.transpose(-2, -1).double() / q.shape[-1] ** 0.5
        outputs.append(torch.softmax(scores, dim=-1) @ v.double())
    return torch.cat(outputs, dim=2)


@hidden
def check_RollingKVCache(RollingKVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """Kept tokens at every step for many sizes; decoding through them equals the masked attention; storage; errors."""
    cases = [
        rolling_case(1011, 2, 2, 4, 1, 4, 12, "window 4, one sink, 12 tokens: the window wraps twice"),
        rolling_case(1012, 1, 3, 1, 2, 2, 6, "window 1: only the newest token besides 2 sinks"),
        rolling_case(1013, 1, 1, 3, 0, 4, 9, "no sink: a plain rolling window"),
        rolling_case(1014, 2, 1, 2, 4, 3, 7, "more sinks than window"),
        rolling_case(1015, 1, 2, 5, 2, 2, 4, "fewer tokens than sinks + window: nothing evicted yet"),
        rolling_case(1016, 1, 2, 3, 1, 4, 7, "float64 tokens into a float32 cache (the default dtype)",
                     dtype=torch.float32),
        rolling_case(1017, 1, 2, 3, 1, 4, 7, "float32", dtype=torch.float32, token_dtype=torch.float32),
    ]
    check_rolling_cases(RollingKVCache, cases, MISTAKES["RollingKVCache"])

    # what a model sees through the cache: attention over the kept tokens equals full attention with the mask
    decoding = rolling_case(1018, 1, 2, 3, 2, 4, 10, "decoding 10 tokens through the cache")
    batch, kv_heads, window, sinks, d_head, tokens = decoding.args
    with case(decoding.label):
        got = probe(rolling_scenario, RollingKVCache, *decoding.args, what="decoding through the cache",
                    forbid=ATTENTION_BUILTINS, **decoding.kwargs)
        q = randn(batch, kv_heads, len(tokens), d_head, gen=generator(1019))
        k = torch.cat([k for k, _ in tokens], dim=2)
        v = torch.cat([v for _, v in tokens], dim=2)
        mask = sink_window_reference(len(tokens), len(tokens), window, sinks)
        expected = math_sdpa(q, k, v, attn_mask=mask)
        try:
            assert_close(_rolling_attention(got, q), expected, "Attention of each new token over the keys and values "
                         f"the cache returned (window={window}, sinks={sinks})", rtol=1e-10, atol=1e-12)
        except CheckFailed as failure:
            raise MistakeFound(str(failure) + "\nIt should equal full attention with sink_window_mask(T, T, window, "
                               "sinks) as its mask.", []) from None

    with case("the cache holds its window and sinks, no more"):
        problem = held_bytes_problem(RollingKVCache, 2, 2, 3, 1, 4)
        if problem:
            raise MistakeFound(problem, [by_id(MISTAKES["RollingKVCache"],
                                               "long_context/RollingKVCache/the-cache-keeps-every-token")])
    for args, why in [((1, 2, 0, 1, 4), "a window must hold at least one token"),
                      ((1, 2, 3, -1, 4), "there cannot be a negative number of sinks")]:
        expect_error(RollingKVCache, *args, error=ValueError, what=f"RollingKVCache{args}", why=why)
    expect_append_errors(RollingKVCache)


def _offender_mistake(fn, args: tuple, kwargs: dict, exercise: str, mistake_id: str,
                      prefix_sums_id: str | None = None) -> None:
    """Run the watch; when it fails, name the mistake ``mistake_id`` (an n x m tensor), or ``prefix_sums_id``
    (a tensor as large as the n outer products, the recurrence's parallel form)."""
    n, m = args[0].shape[-2], args[1].shape[-2]
    with case(f"no n x m tensor: n = {n}, m = {m}" + "".join(f", {k}={v}" for k, v in kwargs.items())):
        try:
            watch_linear(fn, exercise, args, kwargs)
        except CheckFailed as failure:
            if "allocated a tensor" not in str(failure):
                raise
            named = prefix_sums_id if prefix_sums_id and "outer products" in str(failure) else mistake_id
            raise MistakeFound(str(failure), [by_id(MISTAKES[exercise], named)]) from None


@hidden
def check_linear_attention(linear_attention) -> None:
    """Against the quadratic form (float64) for many shapes, causal or not, small inputs and a large eps; watched."""
    gen = generator(1020)
    cases = [
        Case((randn(2, 4, 3, gen=gen) * 0.1 - 12, randn(2, 6, 3, gen=gen) * 0.1 - 12, randn(2, 6, 2, gen=gen)),
             label="inputs near -12: the denominator is almost only eps"),
        Case((randn(2, 3, 6, 4, gen=gen), randn(2, 3, 9, 4, gen=gen), randn(2, 3, 9, 5, gen=gen)),
             label="batch and heads, n = 6 < m = 9, d_v = 5"),
        Case((randn(7, 3, gen=gen), randn(4, 3, gen=gen), randn(4, 2, gen=gen)), label="no batch, n = 7 > m = 4"),
        Case((randn(2, 8, 4, gen=gen), randn(2, 8, 4, gen=gen), randn(2, 8, 3, gen=gen)), {"is_causal": True},
             label="causal"),
        Case((randn(1, 2, 5, 2, gen=gen), randn(1, 2, 5, 2, gen=gen), randn(1, 2, 5, 6, gen=gen)),
             {"is_causal": True}, label="causal, d_v = 6 > d = 2"),
        Case((randn(2, 5, 3, gen=gen), randn(2, 5, 3, gen=gen), randn(2, 5, 2, gen=gen)),
             {"is_causal": True, "eps": 4.0}, label="a large eps"),
        Case((3 * randn(2, 6, 4, gen=gen), 3 * randn(2, 6, 4, gen=gen), randn(2, 6, 3, gen=gen)),
             label="large inputs: many negative features"),
    ]
    verify(linear_attention, cases, linear_quadratic, exercise="linear_attention", arg_names=LINEAR_ARGS,
           outputs=None, forbid=ATTENTION_BUILTINS, mistakes=MISTAKES["linear_attention"], rtol=1e-9, atol=1e-13)
    float32 = [Case((randn(2, 5, 4, gen=gen, dtype=torch.float32), randn(2, 5, 4, gen=gen, dtype=torch.float32),
                     randn(2, 5, 3, gen=gen, dtype=torch.float32)), {"is_causal": True}, label="float32")]
    verify(linear_attention, float32, linear_quadratic, exercise="linear_attention", arg_names=LINEAR_ARGS,
           outputs=None, forbid=ATTENTION_BUILTINS, mistakes=MISTAKES["linear_attention"], rtol=1e-4, atol=1e-6)
    _offender_mistake(linear_attention, (randn(1, 48, 3, gen=gen), randn(1, 64, 3, gen=gen), randn(1, 64, 2, gen=gen)),
                      {}, "linear_attention", "long_context/linear_attention/n-by-m-matrix-built")
    _offender_mistake(linear_attention, (randn(1, 80, 2, gen=gen), randn(1, 80, 2, gen=gen), randn(1, 80, 3, gen=gen)),
                      {"is_causal": True}, "linear_attention", "long_context/linear_attention/causal-with-n-by-n-mask")
    expect_shape_errors(linear_attention, "linear_attention", gen)


@hidden
def check_linear_attention_recurrent(linear_attention_recurrent) -> None:
    """Against the causal quadratic form and the final sums (float64), many shapes; no n x n tensor."""
    gen = generator(1021)
    cases = [
        Case((randn(2, 3, 6, 4, gen=gen), randn(2, 3, 6, 4, gen=gen), randn(2, 3, 6, 5, gen=gen)),
             label="batch and heads, d_v = 5"),
        # One token: the output is about its value whatever the feature map; a small share.
        Case((randn(1, 3, gen=gen), randn(1, 3, gen=gen), randn(1, 2, gen=gen)), label="a single token", weight=0.25),
        Case((randn(7, 2, gen=gen), randn(7, 2, gen=gen), randn(7, 3, gen=gen)), label="no batch dimension"),
        Case((randn(2, 4, 3, gen=gen) * 0.1 - 12, randn(2, 4, 3, gen=gen) * 0.1 - 12, randn(2, 4, 2, gen=gen)),
             label="inputs near -12: the denominator is almost only eps"),
        Case((randn(1, 5, 3, gen=gen), randn(1, 5, 3, gen=gen), randn(1, 5, 3, gen=gen)), {"eps": 2.0},
             label="a large eps"),
    ]
    mistakes = through(MISTAKES["linear_attention_recurrent"], run_recurrent)
    verify(run_recurrent(linear_attention_recurrent), cases, recurrent_flat, exercise="linear_attention_recurrent",
           arg_names=LINEAR_ARGS, outputs=RECURRENT_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=1e-9,
           atol=1e-13)
    float32 = [Case((randn(2, 4, 3, gen=gen, dtype=torch.float32), randn(2, 4, 3, gen=gen, dtype=torch.float32),
                     randn(2, 4, 2, gen=gen, dtype=torch.float32)), label="float32: output and state in float32")]
    verify(run_recurrent(linear_attention_recurrent), float32, recurrent_flat, exercise="linear_attention_recurrent",
           arg_names=LINEAR_ARGS, outputs=RECURRENT_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=1e-4,
           atol=1e-6)
    _offender_mistake(linear_attention_recurrent,
                      (randn(1, 80, 2, gen=gen), randn(1, 80, 2, gen=gen), randn(1, 80, 2, gen=gen)), {},
                      "linear_attention_recurrent", "long_context/linear_attention_recurrent/n-by-n-matrix",
                      "long_context/linear_attention_recurrent/parallel-form")
    expect_shape_errors(linear_attention_recurrent, "linear_attention_recurrent", gen)
