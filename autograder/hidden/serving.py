"""Hidden checks and mistake catalogue for notebook 11, serving (instructor-only).

Each exercise's catalogue is one reference with its decisions named (:mod:`autograder.grader.variation`): a mistake is
the reference with one decision changed. Two references are also what a check compares with: the bytes-per-token
formula and greedy speculative decoding (whose number of target calls the hidden check compares exactly). The
W_k_up-transposed mistake of latent attention stays a class of its own (see there). The checks judge the student's
classes through the probes of :mod:`autograder.references.serving`; a mistake is named when it makes the same
kind of problem (paged cache) or the same result (everything else) on the same input.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..grader.cases import case
from ..grader.diagnosis import Mistake, MistakeFound, by_id, matching, read_mistakes, through
from ..grader.inputs import generator, randn
from ..grader.student import call_student, probe
from ..grader.variation import decisions
from ..grader.verify import Case, verify, verify_number
from ..kernel.call import Outcome
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.serving import (
    MLA_ARGS,
    MLA_OUTPUTS,
    PAGED_ARGS,
    LatentWeights,
    absorbed_allocations,
    absorbed_problem,
    append_allocation_problem,
    append_allocations,
    bytes_errors,
    check_paged_scripts,
    decoder_of,
    greedy_of,
    mla_reference,
    mla_shapes,
    paged_append_errors,
    paged_attention_errors,
    paged_attention_on,
    paged_attention_reference,
    paged_case,
    run_mla,
    run_paged_attention,
    script,
    speculative_errors,
    speculative_problem,
    speculative_run,
    unknown_ids,
)
from ..references.tiny_decoder import module_parameters
from ..shared.errors import fail
from . import hidden

# --- references, each with the decisions its catalogued mistakes get wrong ----------------------------------------
# The default of every decision is the right choice: with none changed, each reference is a right answer.


@decisions("kv_factor", "heads_cached", "latent_factor", "bytes_per_number")
def bytes_reference(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None, *, kv_factor=2,
                    heads_cached="kv_heads", latent_factor=1, bytes_per_number=None):
    """2 L g d bytes-per-number (keys and values), or L d_latent bytes-per-number (MLA's latent)."""
    sizes = {"num_layers": num_layers, "num_heads": num_heads, "kv_heads": kv_heads, "d_head": d_head}
    if d_latent is not None:
        sizes["d_latent"] = d_latent
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} = {value}: every size must be at least 1")
    if num_heads % kv_heads:
        raise ValueError(f"num_heads = {num_heads} is not a multiple of kv_heads = {kv_heads}")
    itemsize = torch.empty((), dtype=dtype).element_size() if bytes_per_number is None else bytes_per_number
    if d_latent is not None:
        return latent_factor * num_layers * d_latent * itemsize
    return kv_factor * num_layers * (kv_heads if heads_cached == "kv_heads" else num_heads) * d_head * itemsize


@decisions("blocks_from", "freed_blocks_returned", "gather_order", "pool_copied", "room_counted_first", "ids_from")
class PagedKVCache:
    """The paged cache, with the decisions its mistakes get wrong (class attributes its methods read)."""

    blocks_from = "the free blocks"  # or "a counter": wound back by free(), it hands out blocks still in use
    freed_blocks_returned = True
    gather_order = "table"  # or "pool": the block ids sorted
    pool_copied = False  # True: every append writes into a copy of the pool
    room_counted_first = True  # False: blocks taken token by token, so a failing append keeps what it took
    ids_from = "a counter"  # or "live sequences": a freed sequence's id given again

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head, self.num_blocks = block_size, kv_heads, d_head, num_blocks
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths, self.next_id, self.used = {}, {}, 0, 0

    def _known(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")

    def _free(self):
        return len(self.free_blocks) if self.blocks_from == "the free blocks" else self.num_blocks - self.used

    def _take(self):
        if self.blocks_from == "the free blocks":
            return self.free_blocks.pop()
        self.used += 1
        return self.used - 1

    def new_sequence(self):
        seq = self.next_id if self.ids_from == "a counter" else len(self.tables)
        self.next_id += 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        self._known(seq)
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        if self.room_counted_first:
            needed = -(-end // self.block_size) - len(table)
            if needed > self._free():
                raise ValueError(f"the pool has {self._free()} free blocks, {needed} are needed")
            for _ in range(needed):
                table.append(self._take())
        if self.pool_copied:
            self.keys, self.values = self.keys.clone(), self.values.clone()
        for pos in range(start, end):
            if pos // self.block_size == len(table):  # a block taken only when a token needs it
                if not self._free():
                    raise ValueError("the pool has no free block left")
                table.append(self._take())
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, pos - start]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, pos - start]
            self.lengths[seq] = pos + 1

    def free(self, seq):
        self._known(seq)
        table = self.tables.pop(seq)
        del self.lengths[seq]
        if self.blocks_from != "the free blocks":
            self.used -= len(table)
        elif self.freed_blocks_returned:
            self.free_blocks.extend(reversed(table))

    def block_table(self, seq):
        self._known(seq)
        return list(self.tables[seq])

    def length(self, seq):
        self._known(seq)
        return self.lengths[seq]

    def gather(self, seq):
        self._known(seq)
        table, n = self.tables[seq], self.lengths[seq]
        if self.gather_order != "table":
            table = sorted(table)
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


@decisions("blocks_read_in", "heads_shared_by", "slots_read", "scaled")
def paged_attention(q, cache, seqs, *, blocks_read_in="table order", heads_shared_by="repeat_interleave",
                    slots_read="the filled ones", scaled=True):
    """Attention through the block tables, with the decisions its mistakes get wrong."""
    S, h, d = q.shape
    g = cache.kv_heads
    if len(seqs) != S:
        raise ValueError(f"q holds {S} queries but seqs names {len(seqs)} sequences")
    if h % g:
        raise ValueError(f"{h} query heads cannot share {g} key/value heads equally")
    outputs = []
    for i, seq in enumerate(seqs):
        n, table = cache.length(seq), cache.block_table(seq)
        if blocks_read_in != "table order":
            table = sorted(table)
        keys = cache.keys[table].transpose(0, 1).flatten(1, 2)
        values = cache.values[table].transpose(0, 1).flatten(1, 2)
        if slots_read == "the filled ones":
            keys, values = keys[:, :n], values[:, :n]
        if heads_shared_by == "repeat_interleave":
            keys, values = keys.repeat_interleave(h // g, dim=0), values.repeat_interleave(h // g, dim=0)
        else:
            keys, values = keys.repeat(h // g, 1, 1), values.repeat(h // g, 1, 1)
        scores = (keys @ q[i, :, :, None]).squeeze(-1)
        weights = torch.softmax(scores / math.sqrt(d) if scaled else scores, dim=-1)
        outputs.append((weights[:, None, :] @ values).squeeze(1))
    return torch.stack(outputs)


@decisions("cached", "absorbed_scale", "absorbed_path_folds", "alignment")
class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention, with the decisions its mistakes get wrong (class attributes)."""

    cached = "latent"  # or "keys and values": the cache holds the up-projected keys and values
    absorbed_scale = "d_head"  # or "d_latent", or None
    absorbed_path_folds = True  # False: absorbed=True expands the cache as the other path does
    alignment = "bottom-right"  # or "top-left"

    def __init__(self, d_model, num_heads, d_head, d_latent):
        super().__init__()
        self.num_heads, self.d_head, self.d_latent = num_heads, d_head, d_latent
        self.q_proj = nn.Linear(d_model, num_heads * d_head, bias=False)
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)
        self.k_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.v_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.out_proj = nn.Linear(num_heads * d_head, d_model, bias=False)

    def forward(self, x, latent_cache=None, absorbed=False):
        B, T, _ = x.shape
        h, d = self.num_heads, self.d_head
        q = self.q_proj(x).unflatten(-1, (h, d)).transpose(1, 2)
        c = self.kv_down(x)
        if self.cached != "latent":
            c = torch.cat([self.k_up(c), self.v_up(c)], dim=-1)
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(list(latent_cache), dim=1)
        m = c.shape[1]
        first = m - T if self.alignment == "bottom-right" else 0
        future = torch.arange(m)[None, :] > torch.arange(first, first + T)[:, None]
        if absorbed and self.absorbed_path_folds and self.cached == "latent":
            w_k, w_v = self.k_up.weight.unflatten(0, (h, d)), self.v_up.weight.unflatten(0, (h, d))
            scores = (q @ w_k) @ c[:, None].transpose(-2, -1)
            if self.absorbed_scale is not None:
                scores = scores / math.sqrt(d if self.absorbed_scale == "d_head" else self.d_latent)
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (weights @ c[:, None]) @ w_v.transpose(-2, -1)
        else:
            if self.cached == "latent":
                k, v = self.k_up(c), self.v_up(c)
            else:
                k, v = c[..., :h * d], c[..., h * d:]
            k, v = k.unflatten(-1, (h, d)).transpose(1, 2), v.unflatten(-1, (h, d)).transpose(1, 2)
            weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
            out = weights @ v
        return self.out_proj(out.transpose(1, 2).flatten(-2))


# A class of its own, not a variant: the visible check's message for this mistake quotes its source by the
# class's name and the line that fails, which a variant's rewritten source would not keep.
class LatentAbsorbedTransposed(nn.Module):
    """The absorbed path multiplies the query by W_k_up transposed (possible only when d_head = d_latent)."""

    def __init__(self, d_model, num_heads, d_head, d_latent):
        super().__init__()
        self.num_heads, self.d_head = num_heads, d_head
        self.q_proj = nn.Linear(d_model, num_heads * d_head, bias=False)
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)
        self.k_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.v_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.out_proj = nn.Linear(num_heads * d_head, d_model, bias=False)

    def forward(self, x, latent_cache=None, absorbed=False):
        B, T, _ = x.shape
        h, d = self.num_heads, self.d_head
        q = self.q_proj(x).unflatten(-1, (h, d)).transpose(1, 2)
        c = self.kv_down(x)
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(list(latent_cache), dim=1)
        m = c.shape[1]
        future = torch.arange(m)[None, :] > torch.arange(m - T, m)[:, None]
        if absorbed:
            w_k, w_v = self.k_up.weight.unflatten(0, (h, d)), self.v_up.weight.unflatten(0, (h, d))
            scores = (q @ w_k.transpose(-2, -1)) @ c[:, None].transpose(-2, -1) / math.sqrt(d)  # W_k_up transposed
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (weights @ c[:, None]) @ w_v.transpose(-2, -1)
        else:
            k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
            out = weights @ v
        return self.out_proj(out.transpose(1, 2).flatten(-2))


@decisions("only_the_agreeing_prefix", "bonus_token", "targets_token_at_disagreement", "draft_sees_proposals",
           "draft_calls_counted")
def speculative_reference(target, draft, prompt, steps, k, *, only_the_agreeing_prefix=True, bonus_token=True,
                          targets_token_at_disagreement=True, draft_sees_proposals=True, draft_calls_counted=False):
    """Greedy speculative decoding as the notebook specifies it (the number of target calls is exact)."""
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0 or k < 1 or steps < 1:
        raise ValueError("speculative_generate takes a prompt (1, T) with T >= 1, steps >= 1 and k >= 1")
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            n = tokens.shape[1]
            proposed = tokens
            for _ in range(min(k, left - 1 if bonus_token else left)):
                guess = draft(proposed if draft_sees_proposals else tokens)[:, -1].argmax(dim=-1, keepdim=True)
                proposed = torch.cat([proposed, guess], dim=1)
                calls += 1 if draft_calls_counted else 0
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            guesses = proposed[:, n:]
            agree = choices[:, :-1] == guesses
            if only_the_agreeing_prefix:
                accepted = int(agree[0].long().cumprod(0).sum())
                kept = guesses[:, :accepted]
            else:
                accepted, kept = int(agree.sum()), guesses[agree][None, :]
            last = choices[:, accepted:accepted + 1]
            if accepted < guesses.shape[1] and not targets_token_at_disagreement:
                last = guesses[:, accepted:accepted + 1]
            if accepted == guesses.shape[1] and not bonus_token:
                last = last[:, :0]
            tokens = torch.cat([tokens, kept, last], dim=1)
    return tokens[:, prompt.shape[1]:prompt.shape[1] + steps], calls

MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/serving.toml


# --- hidden checks ------------------------------------------------------------------------------------------------


@hidden
def check_cache_bytes_per_token(cache_bytes_per_token) -> None:
    """Many configurations and dtypes against the formula; an int; sizes below 1 and heads that do not divide refused."""
    configs = [
        ((32, 32, 32, 128, torch.float16), {}, "multi-head, float16"),
        ((32, 32, 8, 128, torch.bfloat16), {}, "grouped-query, 8 key/value heads, bfloat16"),
        ((80, 64, 8, 128, torch.float32), {}, "grouped-query, float32"),
        ((32, 32, 1, 128, torch.float16), {}, "multi-query"),
        ((60, 128, 128, 128, torch.bfloat16), {"d_latent": 512}, "MLA's latent, bfloat16"),
        ((27, 16, 16, 128, torch.float32), {"d_latent": 576}, "MLA's latent with its RoPE key, float32"),
        ((2, 6, 3, 5, torch.float64), {}, "small, float64"),
        ((1, 1, 1, 1, torch.int8), {}, "one byte per number"),
    ]
    cases = [(Case(args, kwargs, label=label), bytes_reference(*args, **kwargs)) for args, kwargs, label in configs]
    verify_number(cache_bytes_per_token, cases, exercise="cache_bytes_per_token",
                  arg_names=("num_layers", "num_heads", "kv_heads", "d_head", "dtype"), integer=True,
                  mistakes=MISTAKES["cache_bytes_per_token"])
    bytes_errors(cache_bytes_per_token)


def paged_cases(gen) -> list[tuple]:
    """(num_blocks, block_size, kv_heads, d_head, ops, dtype, label) of the hidden check."""
    return [
        (6, 2, 2, 4, script(gen, 2, 4, ["new", "new", ("append", 0, 3), ("append", 1, 5), ("append", 0, 2),
                                        ("append", 1, 1)]), torch.float64, "two sequences growing in turn"),
        (4, 2, 1, 3, script(gen, 1, 3, ["new", "new", ("append", 0, 2), ("append", 1, 2), ("free", 0), "new",
                                        ("append", 2, 1), ("append", 1, 2)]), torch.float64,
         "a freed block taken by a new sequence while another still holds its own"),
        (3, 2, 2, 4, script(gen, 2, 4, ["new", "new", ("append", 0, 2), ("append", 1, 4), ("free", 0),
                                        ("append", 1, 2)]), torch.float64,
         "a full pool: the only free block is the freed one, so the table is not in pool order"),
        (4, 2, 1, 2, script(gen, 1, 2, ["new", ("append", 0, 3), "new", ("append", 1, 2), ("append", 0, 4),
                                        ("append", 0, 1)]), torch.float64,
         "an append the pool cannot hold, then one it can"),
        (5, 3, 2, 2, script(gen, 2, 2, ["new", "new", ("append", 1, 7), ("free", 1), "new", ("append", 2, 9),
                                        ("append", 0, 4), ("free", 0), ("append", 2, 3), "new", ("append", 3, 1)]),
         torch.float64, "sequences made and freed; ids never reused"),
        (3, 4, 3, 2, script(gen, 3, 2, ["new", ("append", 0, 1), ("append", 0, 1), ("append", 0, 1), ("append", 0, 6)]),
         torch.float32, "float32, one token at a time, then a chunk over two blocks"),
    ]


@hidden
def check_PagedKVCache(PagedKVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """Scripts of appends and frees against contiguous caches; blocks never shared, reused after a free; no copies."""
    check_paged_scripts(PagedKVCache, paged_cases(generator(1101)), MISTAKES["PagedKVCache"])
    with case("64 appends of one token copy nothing"):
        problem = append_allocation_problem(probe(append_allocations, PagedKVCache, what="64 appends of one token"))
        if problem:
            raise MistakeFound(problem, [by_id(MISTAKES["PagedKVCache"],
                                               "serving/PagedKVCache/the-pool-copied-at-every-append")])
    unknown_ids(PagedKVCache)
    paged_append_errors(PagedKVCache)


@hidden
def check_paged_attention(paged_attention) -> None:
    """Against SDPA per sequence on gathered keys and values (float64): tables out of order, grouped heads, empty."""
    gen = generator(1102)
    cases = [
        paged_case(gen, 8, 4, 2, 4, 8, [(5, [6, 1, 3], 10), (2, [0], 4), (9, [7, 2], 5)], [5, 2, 9],
                   "tables out of pool order, 4 query heads on 2 key/value heads, a partly filled last block"),
        paged_case(gen, 6, 3, 1, 3, 4, [(0, [4, 0], 6), (1, [], 0), (4, [5, 2, 1], 7)], [4, 1, 0],
                   "multi-query (one key/value head), an empty sequence, seqs in another order than made"),
        paged_case(gen, 5, 2, 3, 3, 6, [(11, [3, 4, 0, 2], 7)], [11], "one sequence, heads not grouped"),
        paged_case(gen, 4, 5, 2, 8, 8, [(3, [2], 1), (8, [1, 3], 6)], [8, 3, 8],
                   "a sequence queried twice, one token in a block of 5"),
        paged_case(gen, 6, 4, 2, 4, 16, [(1, [5, 0, 3], 12), (2, [4], 3)], [1, 2], "full blocks, 8 query heads per "
                   "key/value head"),
    ]
    mistakes = through(MISTAKES["paged_attention"], lambda fn: lambda *args: paged_attention_on(fn, *args))
    float32 = [paged_case(gen, 5, 4, 2, 2, 8, [(0, [3, 1], 6), (1, [4, 0], 8)], [0, 1], "float32",
                          dtype=torch.float32)]
    for group, rtol, atol in [(cases, 1e-10, 1e-12), (float32, 1e-4, 1e-5)]:
        verify(run_paged_attention(paged_attention, ATTENTION_BUILTINS), group, paged_attention_reference,
               exercise="paged_attention", arg_names=PAGED_ARGS, outputs=None, forbid=ATTENTION_BUILTINS,
               mistakes=mistakes, rtol=rtol, atol=atol)
    paged_attention_errors(paged_attention, cases[0])


def _check_mla_parameters(MultiHeadLatentAttention, sizes) -> None:  # noqa: N803
    what = "MultiHeadLatentAttention({}, {}, {}, {})".format(*sizes)
    module = call_student(MultiHeadLatentAttention, *sizes, what=what)
    summary = probe(module_parameters, module, what=f"the parameters of {what}")
    expected = mla_shapes(*sizes)
    got = {name: tuple(shape) for name, shape in summary["parameters"].items()}
    if not summary["is_module"] or got != expected:
        fail(f"The parameters of {what} should be exactly "
             f"{', '.join(f'{n} {s}' for n, s in expected.items())} (nn.Linear(..., bias=False) each), but they are "
             f"{', '.join(f'{n} {s}' for n, s in got.items()) or 'none'}" + ("" if summary["is_module"] else
                                                                          f" (a {summary['type']}, not an nn.Module)")
             + ". The checks load reference weights by these names.")


@hidden
def check_MultiHeadLatentAttention(MultiHeadLatentAttention) -> None:  # noqa: N802, N803 - named after the class it checks
    """Both paths against the expanded attention (float64), whole and with a latent cache; the absorbed path watched."""
    with case("the parameters of MultiHeadLatentAttention(24, 3, 8, 12)"):
        _check_mla_parameters(MultiHeadLatentAttention, (24, 3, 8, 12))
    gen = generator(1103)
    cases = []
    for weights, x, steps, label in [
        (LatentWeights(11030, 16, 2, 8, 8), randn(2, 7, 16, gen=gen), [3, 1, 1, 2], "d_head = d_latent = 8, a prompt "
         "of 3, two tokens, then 2"),
        (LatentWeights(11031, 24, 3, 8, 12), randn(1, 6, 24, gen=gen), None, "the whole sequence, no cache"),
        (LatentWeights(11032, 24, 4, 6, 10), randn(2, 9, 24, gen=gen), [1, 1, 1, 1, 1, 4], "one token at a time"),
        (LatentWeights(11033, 32, 2, 16, 4), randn(1, 8, 32, gen=gen), [5, 3], "a latent narrower than a head"),
    ]:
        for absorbed in (False, True):
            kwargs = {"absorbed": absorbed} if steps is None else {"steps": steps, "absorbed": absorbed}
            cases.append(Case((weights, x), kwargs, label=f"{label}, absorbed={absorbed}"))
    mistakes = through(MISTAKES["MultiHeadLatentAttention"], run_mla)
    float32 = [Case((LatentWeights(11035, 16, 2, 8, 6, dtype=torch.float32), randn(2, 5, 16, gen=gen, dtype=torch.float32)),
                    {"steps": [3, 2], "absorbed": absorbed}, label=f"float32, absorbed={absorbed}") for absorbed in (False, True)]
    for group, rtol, atol in [(cases, 1e-10, 1e-12), (float32, 1e-4, 1e-5)]:
        verify(run_mla(MultiHeadLatentAttention, ATTENTION_BUILTINS), group, mla_reference, exercise="MultiHeadLatentAttention",
               arg_names=MLA_ARGS, outputs=MLA_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=rtol, atol=atol)
    weights = LatentWeights(11034, *(32, 4, 16, 8))
    with case("the absorbed path does not expand the cache: a decode step after 256 cached tokens"):
        problem = absorbed_problem(probe(absorbed_allocations, MultiHeadLatentAttention, weights.state,
                                         forbid=ATTENTION_BUILTINS,
                                         what="an absorbed decode step after 256 cached tokens"))
        if problem:
            raise MistakeFound(problem, [by_id(MISTAKES["MultiHeadLatentAttention"],
                                               "serving/MultiHeadLatentAttention/an-absorbed-path-that-expands")])


def _same_run(student, theirs) -> bool:
    """Two outcomes of speculative_run are the same answer: the same tokens, the same calls reported and made."""
    return (isinstance(student, tuple) and isinstance(theirs, tuple) and len(student) == 4 and len(theirs) == 4
            and isinstance(student[0], torch.Tensor) and isinstance(theirs[0], torch.Tensor)
            and student[0].shape == theirs[0].shape and torch.equal(student[0].long(), theirs[0].long())
            and student[1] == theirs[1] and student[2] == theirs[2])


def _mistakes_named(student_value, case_args) -> list[Mistake]:
    mistakes = through(MISTAKES["speculative_generate"], lambda fn: lambda *a: speculative_run(fn, *a))
    return matching(Outcome(value=student_value), mistakes, case_args, same=_same_run)


@hidden
def check_speculative_generate(speculative_generate) -> None:
    """Tokens against the target's greedy decoding (float64); target calls exactly; ceil(steps / (k + 1)) for draft = target."""
    target = (11040, 16, 2, 32, 24, 2, None, True)  # never repeating a token: proposing one k times is wrong
    first_block = (11040, 16, 2, 32, 24, 2, 1, True)
    random = (11042, 16, 2, 32, 24, 1, None, True)
    cases = [
        (target, first_block, [18, 19, 22, 18], 12, 3, "a draft made of the target's first block"),
        (target, random, 4, 12, 2, "a random draft"),
        (target, target, 3, 13, 3, "draft = target"),
        (target, target, 6, 10, 1, "draft = target, k = 1"),
        (target, first_block, 1, 9, 8, "k larger than the steps left"),
        (target, random, 2, 1, 4, "one step: no proposal at all"),
    ]
    gen = generator(1104)
    for spec, draft, length, steps, k, label in cases:
        prompt = torch.tensor([length]) if isinstance(length, list) else torch.randint(0, spec[4], (1, length), generator=gen)
        # One step: no proposal is made, so any answer with the target's first greedy token passes; a small share.
        with case(label, weight=0.25 if steps == 1 else 1.0):
            got = speculative_run(speculative_generate, spec, draft, prompt, steps, k)
            target_model, draft_model = decoder_of(spec), decoder_of(draft)
            _, calls = speculative_reference(target_model, draft_model, prompt, steps, k)
            greedy = greedy_of(spec, prompt, steps)
            found = speculative_problem(got, spec, draft, prompt, steps, k, greedy, calls)
            if found is not None:
                raise MistakeFound(f"{found[1]}\n({label})", _mistakes_named(got, (spec, draft, prompt, steps, k)))
            if got[3] != draft_model.calls:  # the reference's proposals: min(k, steps left - 1) per round
                fail(f"speculative_generate(target, draft, prompt (1, {prompt.shape[1]}), {steps}, {k}) ({label}) gave the "
                     f"right tokens and target calls, but called the draft {got[3]} times where the rounds propose "
                     f"{draft_model.calls} tokens in all: each round proposes min(k, steps left - 1) tokens, one call of "
                     "the draft each, and no proposal is made that could only produce a token beyond steps.")
    speculative_errors(speculative_generate, target)

