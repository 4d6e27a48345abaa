"""Notebook 11, serving: the interface, the mistakes the syllabus asks for, and each protection of the checks (the
paged cache's judge, the allocation count, the absorbed path's watch, the count of target calls, the error cases)
caught by feeding in what it stops. The generic tests (catalogue, end to end, nbval) run over every notebook."""

from __future__ import annotations

import inspect
import math
import types

import pytest
import torch
from torch import nn

from autograder.checks import serving as visible
from autograder.grader.inputs import generator
from autograder.hidden import serving as hidden
from autograder.hidden.serving import MISTAKES, speculative_reference
from autograder.references.serving import (
    CountedDecoder,
    decoder_of,
    greedy_of,
    judge_paged,
    paged_expected,
    paged_scenario,
    script,
)
from autograder.references.tiny_decoder import decoder_reference, greedy_reference
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "11_serving"
SIGNATURES = {
    "cache_bytes_per_token": "(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None)",
    "PagedKVCache": "(num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None)",
    "paged_attention": "(q, cache, seqs)",
    "MultiHeadLatentAttention": "(d_model, num_heads, d_head, d_latent)",
    "speculative_generate": "(target, draft, prompt, steps, k)",
}
#: The mistakes the syllabus asks for, by the name the catalogue gives them.
REQUIRED = {
    "cache_bytes_per_token": {"query heads counted instead of key/value heads"},
    "PagedKVCache": {"a block still in use handed out again", "a freed sequence's blocks never reused",
                     "paged gather in pool order instead of table order"},
    "paged_attention": {"blocks read in pool order instead of table order",
                        "grouped heads mapped with repeat instead of repeat_interleave"},
    "MultiHeadLatentAttention": {"the absorbed path without the scale", "W_k_up transposed in the absorbed path",
                                 "the latent cached after the up-projection"},
    "speculative_generate": {"draft tokens kept after the first disagreement", "the target's bonus token dropped",
                             "calls of the draft counted as calls of the target"},
}


@pytest.fixture(scope="module")
def solution() -> types.SimpleNamespace:
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    found = {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES}
    assert {name: text.replace("<class 'torch.float32'>", "torch.float32") for name, text in found.items()} == SIGNATURES


def test_the_syllabus_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


# --- the paged cache: the judge is independent of which free block a cache takes --------------------------------


class HighestFirst:
    """A right cache that takes the highest free block first and appends with one index assignment."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks))
        self.tables, self.lengths, self.count = {}, {}, 100

    def new_sequence(self):
        self.count += 3
        self.tables[self.count], self.lengths[self.count] = [], 0
        return self.count

    def _known(self, seq):
        if seq not in self.tables:
            raise ValueError(f"unknown sequence {seq}")

    def append(self, seq, k, v):
        self._known(seq)
        if k.dim() != 3 or k.shape != v.shape or (k.shape[0], k.shape[2]) != (self.kv_heads, self.d_head):
            raise ValueError("wrong shapes")
        start, end = self.lengths[seq], self.lengths[seq] + k.shape[1]
        needed = -(-end // self.block_size) - len(self.tables[seq])
        if needed > len(self.free_blocks):
            raise ValueError("pool full")
        self.tables[seq] += [self.free_blocks.pop() for _ in range(needed)]
        positions = torch.arange(start, end)
        blocks = torch.tensor(self.tables[seq])[positions // self.block_size]
        self.keys[blocks, :, positions % self.block_size] = k.transpose(0, 1).to(self.keys.dtype)
        self.values[blocks, :, positions % self.block_size] = v.transpose(0, 1).to(self.values.dtype)
        self.lengths[seq] = end

    def free(self, seq):
        self._known(seq)
        self.free_blocks += self.tables.pop(seq)
        del self.lengths[seq]

    def block_table(self, seq):
        self._known(seq)
        return list(self.tables[seq])

    def length(self, seq):
        self._known(seq)
        return self.lengths[seq]

    def gather(self, seq):
        self._known(seq)
        n = self.lengths[seq]
        return tuple(torch.cat([pool[b] for b in self.tables[seq]], dim=1)[:, :n] if n else pool[:0].sum(0)[:, :0]
                     for pool in (self.keys, self.values))


def test_a_cache_with_another_policy_and_other_ids_passes():
    visible.check_PagedKVCache(HighestFirst)
    hidden.check_PagedKVCache(HighestFirst)


def test_the_paged_judge_sees_a_shared_block_and_a_failed_append_that_writes():
    gen = generator(0)
    ops = script(gen, 1, 2, ["new", "new", ("append", 0, 2), ("append", 1, 2)])
    got = paged_scenario(HighestFirst, 4, 2, 1, 2, ops)
    assert judge_paged(got, 4, 2, ops, torch.float64) is None
    got["states"][-1]["tables"][1] = list(got["states"][-1]["tables"][0])  # b's table names a's block
    assert judge_paged(got, 4, 2, ops, torch.float64)[0] == "shared-block"
    full = script(gen, 1, 2, ["new", ("append", 0, 4), ("append", 0, 1)])
    assert [e["must_fail"] for e in paged_expected(2, 2, full)] == [False, False, True]
    got = paged_scenario(HighestFirst, 2, 2, 1, 2, full)
    assert judge_paged(got, 2, 2, full, torch.float64) is None
    got["states"][-1]["lengths"] = [5]
    assert judge_paged(got, 2, 2, full, torch.float64)[0] in {"partial-write", "length"}


class CacheOfNaN(HighestFirst):
    """Keeps the caller's tensors (views of them) instead of copying them into the pool."""

    def append(self, seq, k, v):
        super().append(seq, k, v)
        self.last = (k, v)

    def gather(self, seq):
        keys, values = super().gather(seq)
        if hasattr(self, "last"):
            return self.last[0].expand_as(keys) if self.last[0].shape == keys.shape else keys, values
        return keys, values


def test_keys_read_from_the_caller_are_seen():
    with pytest.raises(CheckFailed, match="NaN"):
        visible.check_PagedKVCache(CacheOfNaN)


# --- MLA: the absorbed path's watch and the parameters ---------------------------------------------------------


def test_the_watch_names_an_absorbed_path_that_expands_and_passes_one_that_does_not(solution):
    expands = next(m for m in MISTAKES["MultiHeadLatentAttention"] if m.name == "an absorbed path that expands the cache")
    with pytest.raises(CheckFailed, match="up-projects the cache"):
        visible.check_MultiHeadLatentAttention(expands.fn)
    visible.check_MultiHeadLatentAttention(solution.MultiHeadLatentAttention)


class LatentWithBias(nn.Module):
    def __init__(self, d_model, num_heads, d_head, d_latent):
        super().__init__()
        self.q_proj = nn.Linear(d_model, num_heads * d_head)
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)
        self.k_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.v_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.out_proj = nn.Linear(num_heads * d_head, d_model, bias=False)


def test_parameters_by_name_and_shape():
    with pytest.raises(CheckFailed, match="q_proj.bias"):
        visible.check_MultiHeadLatentAttention(LatentWithBias)


# --- speculative decoding: calls, tokens, the error cases ---------------------------------------------------------


def test_the_reference_makes_the_calls_the_formula_says():
    target = (1140, 16, 2, 32, 24, 2, None)
    prompt = torch.tensor([[1, 2, 3]])
    for steps, k in [(10, 2), (7, 1), (9, 8), (1, 3)]:
        model, draft = decoder_of(target), decoder_of(target)
        tokens, calls = speculative_reference(model, draft, prompt, steps, k)
        assert calls == model.calls == math.ceil(steps / (k + 1))
        assert torch.equal(tokens, greedy_reference(model.weights, prompt, steps))


def plain_greedy(target, draft, prompt, steps, k):
    """Right tokens, one target call per token: never uses the draft."""
    tokens = prompt
    for _ in range(steps):
        tokens = torch.cat([tokens, target(tokens)[:, -1:].argmax(dim=-1)], dim=1)
    return tokens[:, prompt.shape[1]:], steps


def test_greedy_decoding_without_speculation_fails_the_count_of_calls():
    with pytest.raises(CheckFailed, match="should be called 4 times"):
        visible.check_speculative_generate(plain_greedy)


def test_a_speculative_answer_without_its_error_cases_fails(solution):
    def unchecked(target, draft, prompt, steps, k):
        if k == 0:
            k = 1
        return solution.speculative_generate(target, draft, prompt if prompt.shape[0] == 1 else prompt[:1], max(steps, 1), k)

    with pytest.raises(CheckFailed, match="should raise ValueError"):
        hidden.check_speculative_generate(unchecked)


def paged_attention_by_gather(q, cache, seqs):
    """Right values, but read through cache.gather: the block table left to the cache."""
    rows = []
    for i, seq in enumerate(seqs):
        keys, values = cache.gather(seq)
        keys, values = (t.repeat_interleave(q.shape[1] // t.shape[0], dim=0).to(q.dtype) for t in (keys, values))
        weights = torch.softmax(keys @ q[i, :, :, None] / q.shape[-1] ** 0.5, dim=1)
        rows.append((weights.transpose(1, 2) @ values)[:, 0])
    return torch.stack(rows)


@pytest.mark.parametrize("checks", [visible, hidden])
def test_paged_attention_may_not_call_gather(checks):
    """The exercise is attention through the block table: the checks' cache refuses gather, and says why."""
    with pytest.raises(CheckFailed, match="paged_attention may not call cache.gather: read the pool"):
        checks.check_paged_attention(paged_attention_by_gather)


#: The models and prompts of the speculative checks: (target spec, prompt, steps).
SPECULATIVE_FIXTURES = [((1140, 16, 2, 32, 24, 2, None, True), [13, 22, 16, 12], 12),
                        ((1140, 16, 2, 32, 24, 2, None, True), [5, 0, 17, 9], 10),
                        ((11040, 16, 2, 32, 24, 2, None, True), [18, 19, 22, 18], 12)]


@pytest.mark.parametrize(("spec", "prompt", "steps"), SPECULATIVE_FIXTURES)
def test_the_speculative_checks_models_never_repeat_a_token(spec, prompt, steps):
    """A draft that proposes one token k times is right wherever the target's greedy output repeats it: the checks'
    targets ban the token just read, so no greedy continuation holds a token twice in a row (without the ban, these
    random models soon repeat one token for ever)."""
    prompt = torch.tensor([prompt])
    tokens = greedy_of(spec, prompt, steps)[0].tolist()
    assert all(a != b for a, b in zip(tokens, tokens[1:])), tokens
    unbanned = greedy_of(spec[:7], prompt, steps)[0].tolist()
    assert any(a == b for a, b in zip(unbanned, unbanned[1:])), unbanned
    assert torch.equal(greedy_of(spec, prompt, steps), greedy_reference_banned(spec, prompt, steps))


def greedy_reference_banned(spec, prompt, steps):
    """The same continuation from notebook 09's decoder reference, the ban applied by hand."""
    weights, tokens = decoder_of(spec).weights, prompt
    for _ in range(steps):
        logits = decoder_reference(weights, tokens)[:, -1].clone()
        logits[0, tokens[0, -1]] = float("-inf")
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return tokens[:, prompt.shape[1]:]


def test_counted_decoder_refuses_float_tokens():
    model = CountedDecoder(decoder_of((1140, 16, 2, 32, 24, 2, None)).weights)
    with pytest.raises(TypeError):
        model(torch.zeros(1, 3))
    assert model.calls == 0


# --- the bytes: an int, and the error cases ------------------------------------------------------------------------


def test_a_float_number_of_bytes_is_refused(solution):
    def as_float(*args, **kwargs):
        return float(solution.cache_bytes_per_token(*args, **kwargs))

    with pytest.raises(CheckFailed, match="should be an int"):
        visible.check_cache_bytes_per_token(as_float)


def test_bytes_without_validation_fail_the_hidden_check(solution):
    def unchecked(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
        size = torch.empty((), dtype=dtype).element_size()
        return num_layers * d_latent * size if d_latent is not None else 2 * num_layers * kv_heads * d_head * size

    with pytest.raises(CheckFailed, match="should raise ValueError"):
        hidden.check_cache_bytes_per_token(unchecked)


# --- right answers in other styles pass ------------------------------------------------------------------------------


def bytes_from_itemsize(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    if min(num_layers, num_heads, kv_heads, d_head, 1 if d_latent is None else d_latent) < 1 or num_heads % kv_heads:
        raise ValueError("bad sizes")
    return num_layers * (d_latent if d_latent is not None else 2 * kv_heads * d_head) * dtype.itemsize


def paged_attention_by_slots(q, cache, seqs):
    """Token by token through the table (block, slot) with index_select, heads grouped by a view, einsum."""
    S, h, d = q.shape
    g = cache.kv_heads
    if h % g or len(seqs) != S:
        raise ValueError("shapes")
    rows = []
    for i, seq in enumerate(seqs):
        table, n = cache.block_table(seq), cache.length(seq)
        blocks = torch.tensor([table[p // cache.block_size] for p in range(n)], dtype=torch.long)
        slots = torch.tensor([p % cache.block_size for p in range(n)], dtype=torch.long)
        keys, values = cache.keys[blocks, :, slots].transpose(0, 1), cache.values[blocks, :, slots].transpose(0, 1)
        grouped = q[i].view(g, h // g, d)
        scores = torch.einsum("grd,gnd->grn", grouped, keys.to(q.dtype)) * d**-0.5
        weights = (scores - scores.amax(-1, keepdim=True)).exp() if keys.shape[1] else scores
        weights = weights / weights.sum(-1, keepdim=True) if keys.shape[1] else weights
        rows.append(torch.einsum("grn,gnd->grd", weights, values.to(q.dtype)).reshape(h, d))
    return torch.stack(rows)


class LatentFoldedOutput(nn.Module):
    """Absorbed: W_v_up folded into out_proj, the mask built with tril; expanded: einsum."""

    def __init__(self, d_model, num_heads, d_head, d_latent):
        super().__init__()
        self.h, self.d = num_heads, d_head
        self.q_proj = nn.Linear(d_model, num_heads * d_head, bias=False)
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)
        self.k_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.v_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.out_proj = nn.Linear(num_heads * d_head, d_model, bias=False)

    def forward(self, x, latent_cache=None, absorbed=False):
        T = x.shape[1]
        c = self.kv_down(x)
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(latent_cache, dim=1)
        m = c.shape[1]
        allowed = torch.ones(T, m, dtype=torch.bool).tril(m - T)
        q = self.q_proj(x).view(x.shape[0], T, self.h, self.d)
        if absorbed:
            w_k = self.k_up.weight.view(self.h, self.d, -1)
            scores = torch.einsum("bthd,hdl,bml->bhtm", q, w_k, c) / math.sqrt(self.d)
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
            mixed = torch.einsum("bhtm,bml->bthl", weights, c)  # (B, T, h, d_latent)
            w_o = self.out_proj.weight.view(-1, self.h, self.d)  # (d_model, h, d)
            folded = torch.einsum("ohd,hdl->hlo", w_o, self.v_up.weight.view(self.h, self.d, -1))
            return torch.einsum("bthl,hlo->bto", mixed, folded)
        k = self.k_up(c).view(c.shape[0], m, self.h, self.d)
        v = self.v_up(c).view(c.shape[0], m, self.h, self.d)
        scores = torch.einsum("bthd,bmhd->bhtm", q, k) / math.sqrt(self.d)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return self.out_proj(torch.einsum("bhtm,bmhd->bthd", weights, v).flatten(2))


def speculative_with_a_loop(target, draft, prompt, steps, k):
    """Acceptance found by a loop with break; the tokens kept in a Python list."""
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0 or steps < 1 or k < 1:
        raise ValueError("bad arguments")
    out, calls = [], 0
    while len(out) < steps:
        context = torch.cat([prompt, torch.tensor([out], dtype=prompt.dtype).reshape(1, -1)], dim=1)
        guesses = []
        for _ in range(min(k, steps - len(out) - 1)):
            guesses.append(int(draft(torch.cat([context, torch.tensor([guesses], dtype=prompt.dtype).reshape(1, -1)],
                                               dim=1))[0, -1].argmax()))
        logits = target(torch.cat([context, torch.tensor([guesses], dtype=prompt.dtype).reshape(1, -1)], dim=1))
        calls += 1
        choices = logits[0, context.shape[1] - 1:].argmax(-1).tolist()
        for guess, choice in zip(guesses, choices):
            if guess != choice:
                break
            out.append(guess)
        out.append(choices[len(out) - context.shape[1] + prompt.shape[1]])
    return torch.tensor([out]), calls


@pytest.mark.parametrize(("exercise", "answer"), [
    ("cache_bytes_per_token", bytes_from_itemsize), ("PagedKVCache", HighestFirst),
    ("paged_attention", paged_attention_by_slots), ("MultiHeadLatentAttention", LatentFoldedOutput),
    ("speculative_generate", speculative_with_a_loop)])
def test_right_answers_in_other_styles_pass(exercise, answer):
    getattr(visible, f"check_{exercise}")(answer)
    getattr(hidden, f"check_{exercise}")(answer)


# --- each protection, fed what it stops ---------------------------------------------------------------------------------


class NeverFull(HighestFirst):
    """When the pool is exhausted, writes over block 0 instead of refusing."""

    def append(self, seq, k, v):
        needed = -(-(self.lengths[seq] + k.shape[1]) // self.block_size) - len(self.tables[seq])
        if needed > len(self.free_blocks):
            self.free_blocks += [0] * needed
        super().append(seq, k, v)


class CopiesTheSequence(HighestFirst):
    """Writes in place, but copies everything its sequence holds at every append: O(n^2) for n appends."""

    def append(self, seq, k, v):
        if self.tables.get(seq):
            self.snapshot = self.keys[self.tables[seq]].clone(), self.values[self.tables[seq]].clone()
        super().append(seq, k, v)


class ForgivingIds(HighestFirst):
    """Answers for a freed sequence as for an empty one."""

    def _known(self, seq):
        self.tables.setdefault(seq, [])
        self.lengths.setdefault(seq, 0)


@pytest.mark.parametrize(("cache", "check", "message"), [
    (NeverFull, visible.check_PagedKVCache, "should raise ValueError, and write nothing"),
    (CopiesTheSequence, visible.check_PagedKVCache, "each append copies what the pool"),
    (ForgivingIds, hidden.check_PagedKVCache, "freed sequence should raise ValueError"),
])
def test_each_protection_of_the_paged_cache(cache, check, message):
    with pytest.raises(CheckFailed, match=message):
        check(cache)


def test_paged_attention_must_refuse_heads_that_do_not_group(solution):
    def ungrouped(q, cache, seqs):
        if q.shape[1] % cache.kv_heads:
            q = q[:, :cache.kv_heads * (q.shape[1] // cache.kv_heads)]
        return solution.paged_attention(q, cache, seqs)

    with pytest.raises(CheckFailed, match="3 query heads cannot share 2 key/value heads"):
        hidden.check_paged_attention(ungrouped)


def twice_per_token(target, draft, prompt, steps, k):
    """Right tokens, two target calls per token (reported)."""
    tokens = prompt
    for _ in range(steps):
        target(tokens)
        tokens = torch.cat([tokens, target(tokens)[:, -1:].argmax(dim=-1)], dim=1)
    return tokens[:, prompt.shape[1]:], 2 * steps


def test_more_target_calls_than_tokens_is_refused():
    with pytest.raises(CheckFailed, match="every call must yield at least one token"):
        visible.check_speculative_generate(twice_per_token)


def test_an_mla_with_a_buffer_of_its_own_passes(solution):
    class WithBuffer(solution.MultiHeadLatentAttention):
        def __init__(self, d_model, num_heads, d_head, d_latent):
            super().__init__(d_model, num_heads, d_head, d_latent)
            self.register_buffer("inverse_scale", torch.tensor(d_head**-0.5))  # persistent: in the state dict

    visible.check_MultiHeadLatentAttention(WithBuffer)
    hidden.check_MultiHeadLatentAttention(WithBuffer)


def always_k(target, draft, prompt, steps, k):
    """Proposes k tokens in every round and cuts the output to steps: right tokens and calls, wasted proposals."""
    tokens, calls = prompt, 0
    while tokens.shape[1] - prompt.shape[1] < steps:
        n, proposed = tokens.shape[1], tokens
        for _ in range(k):
            proposed = torch.cat([proposed, draft(proposed)[:, -1:].argmax(dim=-1)], dim=1)
        choices = target(proposed)[:, n - 1:].argmax(dim=-1)
        calls += 1
        accepted = int((choices[:, :-1] == proposed[:, n:])[0].long().cumprod(0).sum())
        tokens = torch.cat([tokens, proposed[:, n:n + accepted], choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:prompt.shape[1] + steps], calls


def test_proposals_beyond_the_steps_are_refused():
    """By the hidden check, and by the visible one (draft = target, where the proposals are known)."""
    with pytest.raises(CheckFailed, match="called the draft"):
        hidden.check_speculative_generate(always_k)
    with pytest.raises(CheckFailed, match="called the draft 8 times where the rounds propose 6 tokens"):
        visible.check_speculative_generate(always_k)


class PoolAsProperties(HighestFirst):
    """keys and values are views of one pool tensor, made afresh at every read (properties)."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.pool = torch.zeros(2, num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.free_blocks = list(range(num_blocks))
        self.tables, self.lengths, self.count = {}, {}, 100

    keys = property(lambda self: self.pool[0])
    values = property(lambda self: self.pool[1])


def test_a_pool_read_through_views_is_the_same_pool():
    visible.check_PagedKVCache(PoolAsProperties)
    hidden.check_PagedKVCache(PoolAsProperties)
