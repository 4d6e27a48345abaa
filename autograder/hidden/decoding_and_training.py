"""Hidden checks and mistake catalogue for notebook 09: decoding, ALiBi and a trained decoder (instructor-only).

The checks run the student's classes as the visible ones do (constructors, ``load_state_dict``
and probes); when no class is given (the test suite calls ``check_x(fn)`` alone), the
reference classes of this module stand in for the student's ``KVCache`` and ``TinyDecoder``.
Each exercise's catalogue is one reference with its decisions named (:mod:`autograder.grader.variation`):
a mistake is the reference with one decision changed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..grader.cases import case
from ..grader.compare import assert_close, assert_shape, assert_tensor, describe, is_close
from ..grader.diagnosis import Mistake, MistakeFound, by_id, diagnose, read_mistakes, through
from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import attempt, call_student, expect_error, probe, served_to
from ..grader.variation import decisions, variant
from ..grader.verify import Case, verify
from ..kernel.call import Outcome
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.decoding_and_training import (
    COPY_STEPS,
    DECODE_ARGS,
    DECODE_OUTPUTS,
    allocation_problem,
    cache_allocations,
    cache_chunks,
    check_cache_cases,
    check_full_cache,
    decode_case,
    decode_reference,
    require_cache,
    run_decode,
)
from ..references.tiny_decoder import (
    BLOCK_ARGS,
    CountedCalls,
    Weights,
    block_reference,
    block_shapes,
    build_model,
    calls_problem,
    check_model,
    check_parameters,
    greedy_reference,
    run_block,
    run_generate,
    train_block,
)
from ..shared.errors import CheckFailed, fail
from . import hidden

# --- references: each ``@decisions`` names what its catalogued mistakes get wrong (the defaults are right) ----
# ReferenceKVCache and ReferenceTinyDecoder also stand in for the student's classes when a check is called alone.


@decisions("grown_by", "returned", "room_checked", "length_counts")
class ReferenceKVCache:
    """A preallocated cache: storage made at the first append, views of the first len positions returned."""

    grown_by = "writing into storage"  # or "concatenating", or "keeping the caller's tensors"
    returned = "the first len positions"  # or "the whole storage"
    room_checked = True
    length_counts = "tokens"  # or "appends"

    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.size, self.dtype, self.filled, self.appends = (batch, kv_heads, max_len, d_head), dtype, 0, 0
        self.storage, self.chunks = None, []

    def __len__(self):
        return self.filled if self.length_counts == "tokens" else self.appends

    def append(self, k, v):
        batch, kv_heads, max_len, d_head = self.size
        if k.shape != v.shape or k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != (batch, kv_heads, d_head):
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be ({batch}, {kv_heads}, t, {d_head})")
        end = self.filled + k.shape[2]
        if self.room_checked and end > max_len:
            raise ValueError(f"{end} tokens do not fit in max_len = {max_len}")
        if self.grown_by == "writing into storage":
            if self.storage is None:
                self.storage = torch.zeros(2, *self.size, dtype=self.dtype, device=k.device)
            self.storage[0, :, :, self.filled:end] = k
            self.storage[1, :, :, self.filled:end] = v
            keys, values = self.storage[0], self.storage[1]
        elif self.grown_by == "concatenating":
            k, v = k.to(self.dtype), v.to(self.dtype)
            if self.storage is None:
                self.storage = (k.clone(), v.clone())
            else:
                self.storage = (torch.cat([self.storage[0], k], dim=2), torch.cat([self.storage[1], v], dim=2))
            keys, values = self.storage
        else:
            self.chunks.append((k, v))
            keys = torch.cat([c[0] for c in self.chunks], dim=2).to(self.dtype)
            values = torch.cat([c[1] for c in self.chunks], dim=2).to(self.dtype)
        self.filled, self.appends = end, self.appends + 1
        if self.returned != "the first len positions":
            return keys, values
        return keys[:, :, :end], values[:, :, :end]


def paper_slopes(num_heads: int) -> list[float]:
    """The ALiBi paper's get_slopes (Press et al., 2022, the authors' code), in float64."""

    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + paper_slopes(2 * closest)[0::2][: num_heads - closest]


def slopes_reference(num_heads):
    return torch.tensor(paper_slopes(num_heads), dtype=torch.float32)


@decisions("sign", "alignment", "future_keys")
def bias_reference(n, m, slopes, *, sign=-1, alignment="bottom-right", future_keys="-inf"):
    """sign * slope * (i + m - n - j) where that distance is >= 0, -inf where it is negative."""
    if slopes.dim() != 1:
        raise ValueError(f"slopes must have shape (h,), not {tuple(slopes.shape)}")
    offset = m - n if alignment == "bottom-right" else 0
    distance = (torch.arange(n)[:, None] + offset - torch.arange(m)[None, :]).to(slopes.dtype)
    if future_keys == "the absolute distance":
        distance = distance.abs()
    bias = sign * slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf")) if future_keys == "-inf" else bias


@decisions("alignment", "positions_from", "keys_rotated", "heads_shared_by")
def decode_step(q, k_new, v_new, cache, rope_base=10000.0, *, alignment="bottom-right", positions_from="len(cache)",
                keys_rotated="before caching", heads_shared_by="repeat_interleave"):
    """``keys_rotated``: "before caching", "when new only" (cached unrotated), "when read", or "before and when read"."""
    def rotate(x, positions):
        d = x.shape[-1]
        angles = positions.double()[:, None] * rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

    if (q.dim() != 4 or k_new.dim() != 4 or k_new.shape != v_new.shape or k_new.shape[2] != q.shape[2]
            or q.shape[1] % k_new.shape[1]):
        raise ValueError(f"q {tuple(q.shape)}, k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} do not fit")
    h, t, d = q.shape[1], q.shape[2], q.shape[3]
    start = len(cache) if positions_from == "len(cache)" else 0
    positions = torch.arange(start, start + t)
    rotated_first = keys_rotated in ("before caching", "before and when read")
    keys, values = cache.append(rotate(k_new, positions) if rotated_first else k_new, v_new)
    m = keys.shape[2]
    if keys_rotated == "when new only":
        keys = torch.cat([keys[:, :, :-t], rotate(k_new, positions)], dim=2)
    elif keys_rotated != "before caching":
        keys = rotate(keys, torch.arange(m))
    if heads_shared_by == "repeat_interleave":
        keys = keys.repeat_interleave(h // keys.shape[1], dim=1)
        values = values.repeat_interleave(h // values.shape[1], dim=1)
    else:
        keys, values = keys.repeat(1, h // keys.shape[1], 1, 1), values.repeat(1, h // values.shape[1], 1, 1)
    scores = rotate(q, positions) @ keys.transpose(-2, -1) / math.sqrt(d)
    first = m - t if alignment == "bottom-right" else 0
    future = torch.arange(m)[None, :] > torch.arange(first, first + t)[:, None]
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return weights @ values, weights


@decisions("power_of_two", "first_i", "interleave_from")
def alibi_slopes(num_heads, *, power_of_two="largest not above", first_i=1, interleave_from=0):
    """``power_of_two``: "largest not above" (the paper's), "next", or "num_heads itself"."""
    if num_heads < 1:
        raise ValueError(f"num_heads = {num_heads}: there must be at least one head")

    def geometric(n):
        return [2 ** (-8 * i / n) for i in range(first_i, n + first_i)]

    p = {"largest not above": 2 ** math.floor(math.log2(num_heads)), "next": 2 ** math.ceil(math.log2(num_heads)),
         "num_heads itself": num_heads}[power_of_two]
    extra = geometric(2 * p)[interleave_from::2][: num_heads - p] if p < num_heads else []
    return torch.tensor(geometric(p)[:num_heads] + extra, dtype=torch.float32)


@decisions("norm", "gelu_approximate", "mlp_normed", "positions_restart", "values_rotated")
class DecoderBlock(nn.Module):
    """A self-contained pre-norm decoder block, with the decisions its mistakes get wrong (class attributes)."""

    norm = "pre"  # or "post": norm1(x + attn(x)), the original Transformer's order
    gelu_approximate = "none"
    mlp_normed = True  # False: the MLP reads x, not norm2(x)
    positions_restart = False  # True: RoPE positions 0..T-1 whatever the cache holds
    values_rotated = False

    def __init__(self, d_model, num_heads, d_ff, rope_base=10000.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        self.num_heads, self.rope_base = num_heads, rope_base
        self.norm1, self.norm2 = nn.RMSNorm(d_model, eps=1e-6), nn.RMSNorm(d_model, eps=1e-6)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def attention(self, x, cache):
        B, T, D = x.shape
        h, d = self.num_heads, D // self.num_heads
        q, k, v = (p(x).reshape(B, T, h, d).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        start = 0 if cache is None or self.positions_restart else len(cache)
        angles = torch.arange(start, start + T).double()[:, None] * self.rope_base ** (
            -torch.arange(0, d, 2, dtype=torch.float64) / d)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        q, k, rotated_v = (torch.stack([t[..., 0::2] * cos - t[..., 1::2] * sin, t[..., 0::2] * sin + t[..., 1::2] * cos],
                                       dim=-1).flatten(-2) for t in (q, k, v))
        v = rotated_v if self.values_rotated else v
        if cache is not None:
            k, v = cache.append(k, v)
        m = k.shape[2]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(
            torch.arange(m)[None, :] > torch.arange(m - T, m)[:, None], float("-inf"))
        return self.out_proj((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, D))

    def forward(self, x, cache=None):
        if self.norm == "post":
            x = self.norm1(x + self.attention(x, cache))
            return self.norm2(x + self.fc2(F.gelu(self.fc1(x), approximate=self.gelu_approximate)))
        x = x + self.attention(self.norm1(x), cache)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x) if self.mlp_normed else x), approximate=self.gelu_approximate))


@decisions("with_cache", "position", "prompt_returned")
def generate(model, prompt, steps, use_cache=True, *, with_cache="the prompt once, then the token just chosen",
             position=-1, prompt_returned=False):
    """``with_cache``: that, or "the whole sequence, new caches at every step", "... into one cache", "ignored"."""
    B, T = prompt.shape
    chosen, tokens = [], prompt
    with torch.no_grad():
        if use_cache and with_cache == "the prompt once, then the token just chosen":
            caches = model.new_caches(B, T + steps)
            logits = model(prompt, caches)
            for step in range(steps):
                token = logits[:, position].argmax(dim=-1)
                chosen.append(token)
                if step + 1 < steps:
                    logits = model(token[:, None], caches)
        else:
            caches = None
            if use_cache and with_cache == "the whole sequence into one cache":
                caches = model.new_caches(B, steps * T + steps * (steps - 1) // 2)  # every step appends everything
            for _ in range(steps):
                if use_cache and with_cache == "the whole sequence, new caches at every step":
                    caches = model.new_caches(B, T + steps)
                token = model(tokens, caches)[:, position].argmax(dim=-1)
                chosen.append(token)
                tokens = torch.cat([tokens, token[:, None]], dim=1)
    new = torch.stack(chosen, dim=1).reshape(B, steps)
    return torch.cat([prompt, new], dim=1) if prompt_returned else new


class ReferenceTinyDecoder(nn.Module):
    """The notebook's TinyDecoder built from :class:`DecoderBlock` and :class:`ReferenceKVCache`."""

    def __init__(self, vocab, d_model, num_heads, d_ff, num_layers):
        super().__init__()
        self.num_heads, self.d_head = num_heads, d_model // num_heads
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-6)

    def forward(self, tokens, caches=None):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return self.norm(x) @ self.embed.weight.T

    def new_caches(self, batch, max_len):
        return [ReferenceKVCache(batch, self.num_heads, max_len, self.d_head, dtype=self.embed.weight.dtype)
                for _ in self.blocks]


# The variants the tests name.
CacheConcatenated = variant(ReferenceKVCache, grown_by="concatenating")
CacheWholeStorage = variant(ReferenceKVCache, returned="the whole storage")
BlockPostNorm = variant(DecoderBlock, norm="post")
generate_whole_sequence_each_step = variant(generate, with_cache="the whole sequence, new caches at every step")

MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/decoding_and_training.toml


def _mistakes_through(harness, exercise: str, *parts) -> list[Mistake]:
    """The catalogue of ``exercise`` run the way the student's answer is run (``harness(mistake, *parts)``)."""
    return through(MISTAKES[exercise], lambda fn: harness(fn, *parts))


# --- hidden checks -----------------------------------------------------------------------------------------------


def _full_cache_scenario(cache_class):
    """Append 4 tokens then 3 more to a cache of max_len 5 built from ``cache_class``: what the last append does."""

    def scenario(max_len, held, extra):
        gen = generator(90)
        cache = cache_class(1, 2, max_len, 4)
        for k, v in cache_chunks(gen, 1, 2, 4, [held, extra], torch.float32):
            result = cache.append(k, v)
        return result

    return scenario


@hidden
def check_KVCache(KVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """Many shapes and chunkings against concatenation; dtype; O(1) allocation per append; full and wrong inputs."""
    gen = generator(901)
    cases = [
        Case((2, 3, 9, 4, cache_chunks(gen, 2, 3, 4, [4, 1, 1, 3])), {"dtype": torch.float64},
             label="a prompt of 4, two single tokens, 3 more: full"),
        Case((1, 1, 3, 2, cache_chunks(gen, 1, 1, 2, [3])), {"dtype": torch.float64},
             label="one append fills the cache"),
        Case((3, 2, 10, 8, cache_chunks(gen, 3, 2, 8, [1, 2, 3])), {"dtype": torch.float64},
             label="growing chunks, room left"),
        Case((2, 2, 6, 4, cache_chunks(gen, 2, 2, 4, [2, 2])), label="float64 tokens into a float32 cache (default)"),
        Case((1, 4, 5, 6, cache_chunks(gen, 1, 4, 6, [1, 1, 1, 1, 1], torch.float32)), {"dtype": torch.float32},
             label="float32, one token at a time"),
    ]
    check_cache_cases(KVCache, cases, MISTAKES["KVCache"])

    with case(f"{COPY_STEPS} appends of one token copy nothing"):
        allocated, by_cat = probe(cache_allocations, KVCache, 2, 2, COPY_STEPS, 4, COPY_STEPS,
                                  what=f"KVCache(2, 2, {COPY_STEPS}, 4) and {COPY_STEPS} appends of one token")
        problem = allocation_problem(allocated, 2, 2, 4, torch.float32)
        if problem:
            concatenated = by_id(MISTAKES["KVCache"],
                                 "decoding_and_training/KVCache/the-cache-grown-by-concatenating-a-new-tensor")
            theirs, theirs_by_cat = cache_allocations(concatenated.fn, 2, 2, COPY_STEPS, 4, COPY_STEPS)
            # The same bytes, allocated by torch.cat as the mistake's are: that is the mistake.
            same = abs(allocated - theirs) <= 0.25 * theirs and abs(by_cat - theirs_by_cat) <= 0.25 * theirs_by_cat
            raise MistakeFound(problem, [concatenated] if same else [])

    for max_len, held, extra in [(5, 4, 3), (7, 7, 1)]:
        with case(f"a full cache: {extra} more token(s) to a cache of max_len {max_len} holding {held} raise "
                  "ValueError naming both lengths"):
            try:
                check_full_cache(KVCache, 1, 2, max_len, 4, held, extra)
            except CheckFailed as failure:
                student, _ = attempt(_full_cache_scenario(KVCache), (5, 4, 3), exercise="KVCache")
                mistake = diagnose(student, _mistakes_through(_full_cache_scenario, "KVCache"), (5, 4, 3))
                raise MistakeFound(str(failure), [mistake] if mistake else []) from None

    for shape_k, shape_v, why in [((2, 2, 1, 4), (2, 2, 1, 4), "the cache has 3 key/value heads, not 2"),
                                  ((2, 3, 1, 5), (2, 3, 1, 5), "the cache has d_head = 4, not 5"),
                                  ((2, 3, 2, 4), (2, 3, 1, 4), "k holds 2 tokens but v holds 1")]:
        what = f"cache.append(k {shape_k}, v {shape_v}) with a KVCache(2, 3, 6, 4)"
        with case(f"{what} raises ValueError"):  # each case builds its own cache
            cache = call_student(KVCache, 2, 3, 6, 4, what="KVCache(2, 3, 6, 4)")
            expect_error(cache.append, torch.zeros(shape_k), torch.zeros(shape_v), error=ValueError, why=why,
                         what=what)


@hidden
def check_decode_step(decode_step, KVCache=None) -> None:  # noqa: N803
    """Against causal attention over the whole sequence (SDPA, float64) for many ways of cutting it into steps."""
    KVCache = ReferenceKVCache if KVCache is None else KVCache  # noqa: N806
    with case("the KVCache decode_step is checked with passes its own check"):
        require_cache(KVCache, "decode_step")
    gen = generator(902)
    cases = [
        decode_case(gen, 2, 4, 4, 8, [5, 1, 1, 1], "a prompt of 5, then one token at a time"),
        decode_case(gen, 1, 4, 1, 6, [1, 1, 1, 1, 1], "multi-query attention (g = 1), one token at a time"),
        decode_case(gen, 2, 6, 3, 4, [4, 4], "two steps of 4 tokens, 6 query heads on 3 key/value heads"),
        decode_case(gen, 1, 2, 2, 8, [7], "the whole sequence in one step: plain causal attention"),
        decode_case(gen, 2, 2, 1, 16, [3, 2, 1], "d = 16, rope_base = 100", rope_base=100.0),
        decode_case(gen, 1, 8, 2, 4, [2, 1, 3, 1], "8 query heads on 2 key/value heads, uneven steps"),
    ]
    mistakes = _mistakes_through(run_decode, "decode_step", ReferenceKVCache)
    float32 = [decode_case(gen, 2, 4, 2, 8, [3, 1, 2], "float32", dtype=torch.float32)]
    for group, rtol, atol in [(cases, 1e-10, 1e-12), (float32, 1e-4, 1e-5)]:
        verify(run_decode(decode_step, KVCache), group, decode_reference, exercise="decode_step", arg_names=DECODE_ARGS,
               outputs=DECODE_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=rtol, atol=atol)
    for (h, g, t_q, t_k), why in [((3, 2, 1, 1), "3 query heads cannot share 2 key/value heads equally"),
                                  ((2, 2, 2, 1), "q holds 2 new tokens but k_new holds 1")]:
        q, k_new, v_new = randn(1, h, t_q, 4, gen=gen), randn(1, g, t_k, 4, gen=gen), randn(1, g, t_k, 4, gen=gen)
        what = f"decode_step(q (1, {h}, {t_q}, 4), k_new (1, {g}, {t_k}, 4), v_new (1, {g}, {t_k}, 4), cache)"
        with case(f"{what} raises ValueError"):  # each case builds its own cache
            cache = call_student(KVCache, 1, g, 4, 4, dtype=torch.float64, what=f"KVCache(1, {g}, 4, 4)")
            expect_error(decode_step, q, k_new, v_new, cache, error=ValueError, why=why, what=what)


@hidden
def check_alibi_slopes(alibi_slopes) -> None:
    """Every head count from 1 to 16 and some beyond, against the paper's get_slopes; float32; h < 1 refused."""
    cases = [Case((h,), label=f"{h} head{'s' * (h > 1)}, " + ("a power of two" if math.log2(h).is_integer()
                                                               else "not a power of two"))
             for h in [*range(1, 17), 20, 24, 32, 40]]
    verify(alibi_slopes, cases, slopes_reference, exercise="alibi_slopes", arg_names=("num_heads",), outputs=None,
           mistakes=MISTAKES["alibi_slopes"], rtol=1e-6, atol=0)
    expect_error(alibi_slopes, 0, error=ValueError, what="alibi_slopes(0)", why="there must be at least one head")


@hidden
def check_alibi_bias(alibi_bias) -> None:
    """Against the definition for many n <= m and n > m; float64 slopes; as SDPA's float mask, bottom-right."""
    cases = [
        Case((1, 6, slopes_reference(4)), label="decoding one token against 6 keys"),
        Case((4, 4, slopes_reference(3)), label="square, 3 heads"),
        Case((3, 8, slopes_reference(2)), label="3 new tokens, 8 keys"),
        Case((5, 5, torch.zeros(2)), label="zero slopes: a causal mask of 0 and -inf"),
        Case((2, 5, slopes_reference(6).double()), label="float64 slopes give a float64 bias"),
        Case((4, 2, slopes_reference(2)), label="more queries than keys: the first rows see no key"),
        Case((1, 1, slopes_reference(1)), label="one query, one key", weight=0.25),  # a bias of 0: a small share
    ]
    verify(alibi_bias, cases, bias_reference, exercise="alibi_bias", arg_names=("n", "m", "slopes"), outputs=None,
           mistakes=MISTAKES["alibi_bias"], rtol=1e-6, atol=1e-7)
    gen = generator(903)
    slopes = slopes_reference(4)
    for n, m in [(1, 9), (3, 9), (9, 9)]:
        what = f"alibi_bias({n}, {m}, slopes of 4 heads)"
        q, k, v = randn(4, n, 8, gen=gen), randn(4, m, 8, gen=gen), randn(4, m, 8, gen=gen)
        with case(f"SDPA with {what} as its float mask"):
            bias = call_student(alibi_bias, n, m, slopes, what=what)
            assert_tensor(bias, f"The result of {what}")
            assert_shape(bias, (4, n, m), f"The result of {what}")
            scores = q @ k.transpose(-2, -1) / math.sqrt(8) + bias_reference(n, m, slopes).double()
            assert_close(math_sdpa(q, k, v, attn_mask=bias.double()), torch.softmax(scores, dim=-1) @ v,
                         f"SDPA with {what} as its float mask", rtol=1e-10, atol=1e-12)
    expect_error(alibi_bias, 2, 3, torch.ones(2, 2), error=ValueError, what="alibi_bias(2, 3, slopes (2, 2))",
                 why="slopes must be one number per head, of shape (h,)")


def training_problem(result: dict) -> str | None:
    """A message when the training probe's block got no gradient somewhere or did not learn, or None."""
    losses, no_grad = result["losses"], result["no_grad"]
    if no_grad:
        return (f"After loss.backward(), the parameters {no_grad} of DecoderBlock(16, 2, 32) got no gradient: the "
                "block's output must be computed from all its parameters, with autograd on (no torch.no_grad, no "
                ".detach(), no .item() in forward).")
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < 0.5 * first:
        return (f"Trained for {len(losses)} steps of Adam (lr 1e-2) to output the token 3 places back, with an "
                f"embedding and a linear read-out around DecoderBlock(16, 2, 32), the mean loss went from "
                f"{first:.3f} (first 5 steps) to {last:.3f} (last 5); the reference block brings it below half. Only "
                "attention can fetch that token: check that gradients reach q_proj, k_proj, v_proj and out_proj, "
                "and that the causal mask lets each position see the 3 tokens before it.")
    return None


@hidden
def check_DecoderBlock(DecoderBlock, KVCache=None) -> None:  # noqa: N802, N803 - named after the class it checks
    """Against the block from PyTorch functions, whole and through a cache, float64 and float32; it learns."""
    KVCache = ReferenceKVCache if KVCache is None else KVCache  # noqa: N806
    with case("the KVCache DecoderBlock is checked with passes its own check"):
        require_cache(KVCache, "DecoderBlock")
    for d_model, num_heads, d_ff in [(12, 3, 20), (8, 1, 8)]:
        what = f"DecoderBlock({d_model}, {num_heads}, {d_ff})"
        with case(f"the parameters of {what}"):
            check_parameters(call_student(DecoderBlock, d_model, num_heads, d_ff, what=what),
                             block_shapes(d_model, d_ff), what)
    gen = generator(904)
    cases = [
        Case((Weights(9040, 12, 3, 20), randn(2, 6, 12, gen=gen)), label="3 heads, the whole sequence"),
        Case((Weights(9041, 8, 1, 8), randn(3, 4, 8, gen=gen)), label="one head"),
        Case((Weights(9042, 16, 4, 24, rope_base=100.0), randn(1, 7, 16, gen=gen)), label="rope_base = 100"),
        Case((Weights(9043, 12, 3, 20), randn(2, 6, 12, gen=gen)), {"steps": [1, 1, 1, 1, 1, 1]},
             label="with a cache, one token at a time"),
        Case((Weights(9044, 16, 2, 16), randn(2, 7, 16, gen=gen)), {"steps": [4, 1, 2]},
             label="with a cache: a prompt of 4, then 1, then 2"),
    ]
    mistakes = _mistakes_through(run_block, "DecoderBlock", ReferenceKVCache)
    float32 = [Case((Weights(9045, 8, 2, 16, dtype=torch.float32), randn(2, 5, 8, gen=gen, dtype=torch.float32)),
                    {"steps": [3, 2]}, label="float32, with a cache")]
    for group, rtol, atol in [(cases, 1e-10, 1e-10), (float32, 1e-4, 1e-5)]:
        verify(run_block(DecoderBlock, KVCache), group, block_reference, exercise="DecoderBlock", arg_names=BLOCK_ARGS,
               outputs=None, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=rtol, atol=atol)

    with case("it learns: DecoderBlock(16, 2, 32) trained for 40 steps"):
        result = probe(train_block, DecoderBlock, what="training DecoderBlock(16, 2, 32) for 40 steps",
                       forbid=ATTENTION_BUILTINS)
        problem = training_problem(result)
        if problem:
            fail(problem)
    expect_error(DecoderBlock, 10, 4, 16, error=ValueError, what="DecoderBlock(10, 4, 16)",
                 why="d_model = 10 cannot be split into 4 equal heads")


@hidden
def check_generate(generate, TinyDecoder=None) -> None:  # noqa: N803
    """Greedy tokens against full recomputation on several models; with the cache, one token per call."""
    TinyDecoder = ReferenceTinyDecoder if TinyDecoder is None else TinyDecoder  # noqa: N806
    gen = generator(905)
    models = [Weights(9050, 8, 2, 16, vocab=11, num_layers=2), Weights(9051, 12, 3, 16, vocab=7, num_layers=1),
              Weights(9052, 8, 4, 8, vocab=13, num_layers=3)]
    with case("the TinyDecoder generate is checked with gives the right logits"):
        check_model(TinyDecoder, models[0], "generate")
    cases = []
    for weights, batch, length, steps in [(models[0], 2, 5, 8), (models[1], 3, 1, 6), (models[2], 1, 3, 1),
                                          (models[0], 1, 8, 10)]:
        prompt = torch.randint(0, weights.vocab, (batch, length), generator=gen)
        for use in (True, False):
            cases.append(Case((weights, prompt, steps), {"use_cache": use},
                              label=f"a prompt of {length} token(s), use_cache={use}"))
    mistakes = _mistakes_through(run_generate, "generate", ReferenceTinyDecoder)
    verify(run_generate(generate, TinyDecoder), cases, greedy_reference, exercise="generate",
           arg_names=("model", "prompt", "steps"), outputs=None, mistakes=mistakes, rtol=0, atol=0)

    weights, prompt, steps = models[1], torch.randint(0, 7, (2, 3), generator=gen), 5
    with case("use_cache=True: the prompt in one call, then one token per call"):
        # the model is served from here: its calls are counted where the student's code cannot reach
        counted = CountedCalls(build_model(ReferenceTinyDecoder, weights))
        what = f"generate(model, prompt (2, 3), {steps}, use_cache=True)"
        tokens = call_student(generate, served_to(generate, counted, CountedCalls.METHODS), prompt, steps,
                              use_cache=True, what=what)
        if not isinstance(tokens, torch.Tensor):
            fail(f"{what} should return a tensor of tokens, but it returned {describe(tokens)}.")
        fed, cached = counted.calls()
        problem = calls_problem(fed, cached, 3, steps)
        if problem:
            student = Outcome(value=(fed, cached))
            mistake = diagnose(student, _mistakes_through(_calls_of, "generate", weights), (prompt, steps), rtol=0,
                               atol=0)
            raise MistakeFound(problem, [mistake] if mistake else [])
        if not is_close(tokens, greedy_reference(weights, prompt, steps), 0, 0):
            fail(f"generate(model, prompt (2, 3), {steps}, use_cache=True) returned {tokens.tolist()}, not the greedy "
                 f"tokens {greedy_reference(weights, prompt, steps).tolist()}.")


def _calls_of(generate, weights):
    def calls(prompt, steps):
        counted = CountedCalls(build_model(ReferenceTinyDecoder, weights))
        generate(counted, prompt, steps, use_cache=True)
        return counted.calls()

    return calls
