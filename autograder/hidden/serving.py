"""Hidden checks and mistake catalogue for notebook 11, serving (instructor-only).

The references that are an exercise's solution live here: the bytes-per-token formula and greedy speculative
decoding (whose number of target calls the hidden check compares exactly). The checks judge the student's
classes through the probes of :mod:`autograder.references.serving`; a mistake is named when it makes the same
kind of problem (paged cache) or the same result (everything else) on the same input.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from ..cases import case
from ..diagnosis import Mistake, MistakeFound, Outcome, by_id, matching
from ..errors import fail
from ..guard import ATTENTION_BUILTINS
from ..inputs import generator, randn
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
from ..student import call_student, probe
from ..verify import Case, verify, verify_number
from . import hidden

BYTES = "1. Bytes per token"
WASTE = "2. What contiguous caches waste"
PAGED = "3. A paged KV cache"
PAGED_ATTENTION = "4. Attention through the block table"
LATENT = "5. Multi-head latent attention"
SPECULATIVE = "6. Speculative decoding"


# --- references that are solutions -------------------------------------------------------------------------------


def bytes_reference(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    """2 L g d bytes-per-number (keys and values), or L d_latent bytes-per-number (MLA's latent)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return num_layers * d_latent * itemsize if d_latent is not None else 2 * num_layers * kv_heads * d_head * itemsize


def speculative_reference(target, draft, prompt, steps, k):
    """Greedy speculative decoding as the notebook specifies it (the number of target calls is exact)."""
    tokens, calls = prompt, 0
    while tokens.shape[1] - prompt.shape[1] < steps:
        left = steps - (tokens.shape[1] - prompt.shape[1])
        proposed = tokens
        for _ in range(min(k, left - 1)):
            proposed = torch.cat([proposed, draft(proposed)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        n = tokens.shape[1]
        choices = target(proposed)[:, n - 1:].argmax(dim=-1)
        calls += 1
        accepted = int((choices[:, :-1] == proposed[:, n:])[0].long().cumprod(0).sum())
        tokens = torch.cat([tokens, proposed[:, n:n + accepted], choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:], calls


# --- the catalogue: cache_bytes_per_token ---------------------------------------------------------------------------


def bytes_keys_only(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    itemsize = torch.empty((), dtype=dtype).element_size()
    if d_latent is not None:
        return num_layers * d_latent * itemsize
    return num_layers * kv_heads * d_head * itemsize  # the values forgotten


def bytes_query_heads(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    itemsize = torch.empty((), dtype=dtype).element_size()
    if d_latent is not None:
        return num_layers * d_latent * itemsize
    return 2 * num_layers * num_heads * d_head * itemsize  # every query head counted


def bytes_latent_twice(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    itemsize = torch.empty((), dtype=dtype).element_size()
    if d_latent is not None:
        return 2 * num_layers * d_latent * itemsize  # the latent counted as keys and as values
    return 2 * num_layers * kv_heads * d_head * itemsize


def bytes_four_per_number(num_layers, num_heads, kv_heads, d_head, dtype, d_latent=None):
    if d_latent is not None:
        return num_layers * d_latent * 4
    return 2 * num_layers * kv_heads * d_head * 4  # float32 assumed


# --- the catalogue: PagedKVCache (each class is a whole answer with one mistake) ------------------------------------


class CacheCounterAllocation:
    """Blocks handed out by a counter that free() winds back: a block still in use is handed out again."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head, self.num_blocks = block_size, kv_heads, d_head, num_blocks
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.used = 0
        self.tables, self.lengths, self.next_id = {}, {}, 0

    def new_sequence(self):
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        needed = -(-end // self.block_size) - len(table)
        if self.used + needed > self.num_blocks:
            raise ValueError(f"the pool has {self.num_blocks - self.used} free blocks, {needed} are needed")
        for _ in range(needed):
            table.append(self.used)
            self.used += 1
        for pos in range(start, end):
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, pos - start]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, pos - start]
        self.lengths[seq] = end

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        self.used -= len(self.tables.pop(seq))  # the next block handed out may be another sequence's
        del self.lengths[seq]

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        table, n = self.tables[seq], self.lengths[seq]
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


class CacheNeverReused:
    """free() forgets the sequence but never gives its blocks back."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths, self.next_id = {}, {}, 0

    def new_sequence(self):
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise ValueError(f"the pool has {len(self.free_blocks)} free blocks, {needed} are needed")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        for pos in range(start, end):
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, pos - start]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, pos - start]
        self.lengths[seq] = end

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        del self.tables[seq], self.lengths[seq]  # its blocks are lost to the pool

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        table, n = self.tables[seq], self.lengths[seq]
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


class CacheGatherPoolOrder:
    """gather reads the sequence's blocks in the order of the pool (sorted ids), not of the block table."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths, self.next_id = {}, {}, 0

    def new_sequence(self):
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise ValueError(f"the pool has {len(self.free_blocks)} free blocks, {needed} are needed")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        for pos in range(start, end):
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, pos - start]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, pos - start]
        self.lengths[seq] = end

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        self.free_blocks.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        blocks, n = sorted(self.tables[seq]), self.lengths[seq]  # pool order
        return (self.keys[blocks].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[blocks].transpose(0, 1).flatten(1, 2)[:, :n])


class CachePoolCopied:
    """Each append writes with an out-of-place index_put: a new pool, a copy of everything, at every append."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths, self.next_id = {}, {}, 0

    def new_sequence(self):
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise ValueError(f"the pool has {len(self.free_blocks)} free blocks, {needed} are needed")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        positions = torch.arange(start, end)
        blocks = torch.tensor(table)[positions // self.block_size]
        slots = positions % self.block_size
        self.keys = self._put(self.keys, blocks, slots, k)
        self.values = self._put(self.values, blocks, slots, v)
        self.lengths[seq] = end

    def _put(self, pool, blocks, slots, x):
        pool = pool.clone()  # a new pool at every append
        pool[blocks, :, slots] = x.transpose(0, 1).to(pool.dtype)
        return pool

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        self.free_blocks.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        table, n = self.tables[seq], self.lengths[seq]
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


class CachePartialWrite:
    """Blocks taken token by token: an append that runs out of blocks fails half-way, keeping what it took."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths, self.next_id = {}, {}, 0

    def new_sequence(self):
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        table = self.tables[seq]
        for i in range(k.shape[1]):
            pos = self.lengths[seq]
            if pos % self.block_size == 0:
                if not self.free_blocks:
                    raise ValueError("the pool has no free block left")  # after writing part of the append
                table.append(self.free_blocks.pop())
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, i]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, i]
            self.lengths[seq] = pos + 1

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        self.free_blocks.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        table, n = self.tables[seq], self.lengths[seq]
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


class CacheIdsReused:
    """new_sequence numbers sequences by how many are live: a freed sequence's id is given again."""

    def __init__(self, num_blocks, block_size, kv_heads, d_head, dtype=torch.float32, device=None):
        self.block_size, self.kv_heads, self.d_head = block_size, kv_heads, d_head
        self.keys = torch.zeros(num_blocks, kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables, self.lengths = {}, {}

    def new_sequence(self):
        seq = len(self.tables)  # the number of live sequences: an id already given comes back
        self.tables[seq], self.lengths[seq] = [], 0
        return seq

    def append(self, seq, k, v):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        if k.dim() != 3 or k.shape != v.shape or k.shape[0] != self.kv_heads or k.shape[2] != self.d_head:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be ({self.kv_heads}, t, {self.d_head})")
        start, end, table = self.lengths[seq], self.lengths[seq] + k.shape[1], self.tables[seq]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise ValueError(f"the pool has {len(self.free_blocks)} free blocks, {needed} are needed")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        for pos in range(start, end):
            self.keys[table[pos // self.block_size], :, pos % self.block_size] = k[:, pos - start]
            self.values[table[pos // self.block_size], :, pos % self.block_size] = v[:, pos - start]
        self.lengths[seq] = end

    def free(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        self.free_blocks.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return list(self.tables[seq])

    def length(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        return self.lengths[seq]

    def gather(self, seq):
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq}")
        table, n = self.tables[seq], self.lengths[seq]
        return (self.keys[table].transpose(0, 1).flatten(1, 2)[:, :n],
                self.values[table].transpose(0, 1).flatten(1, 2)[:, :n])


# --- the catalogue: paged_attention -----------------------------------------------------------------------------------


def paged_pool_order(q, cache, seqs):
    S, h, d = q.shape
    outputs = []
    for i, seq in enumerate(seqs):
        n, table = cache.length(seq), sorted(cache.block_table(seq))  # the blocks in pool order
        keys = cache.keys[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat_interleave(h // cache.kv_heads, dim=0)
        values = cache.values[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat_interleave(h // cache.kv_heads, dim=0)
        weights = torch.softmax((keys @ q[i, :, :, None]).squeeze(-1) / math.sqrt(d), dim=-1)
        outputs.append((weights[:, None, :] @ values).squeeze(1))
    return torch.stack(outputs)


def paged_heads_tiled(q, cache, seqs):
    S, h, d = q.shape
    outputs = []
    for i, seq in enumerate(seqs):
        n, table = cache.length(seq), cache.block_table(seq)
        repeats = h // cache.kv_heads
        keys = cache.keys[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat(repeats, 1, 1)  # head i reads i % g
        values = cache.values[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat(repeats, 1, 1)
        weights = torch.softmax((keys @ q[i, :, :, None]).squeeze(-1) / math.sqrt(d), dim=-1)
        outputs.append((weights[:, None, :] @ values).squeeze(1))
    return torch.stack(outputs)


def paged_whole_blocks(q, cache, seqs):
    S, h, d = q.shape
    outputs = []
    for i, seq in enumerate(seqs):
        table = cache.block_table(seq)  # every slot of the last block, filled or not
        keys = cache.keys[table].transpose(0, 1).flatten(1, 2).repeat_interleave(h // cache.kv_heads, dim=0)
        values = cache.values[table].transpose(0, 1).flatten(1, 2).repeat_interleave(h // cache.kv_heads, dim=0)
        weights = torch.softmax((keys @ q[i, :, :, None]).squeeze(-1) / math.sqrt(d), dim=-1)
        outputs.append((weights[:, None, :] @ values).squeeze(1))
    return torch.stack(outputs)


def paged_unscaled(q, cache, seqs):
    S, h, d = q.shape
    outputs = []
    for i, seq in enumerate(seqs):
        n, table = cache.length(seq), cache.block_table(seq)
        keys = cache.keys[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat_interleave(h // cache.kv_heads, dim=0)
        values = cache.values[table].transpose(0, 1).flatten(1, 2)[:, :n].repeat_interleave(h // cache.kv_heads, dim=0)
        weights = torch.softmax((keys @ q[i, :, :, None]).squeeze(-1), dim=-1)  # no 1/sqrt(d)
        outputs.append((weights[:, None, :] @ values).squeeze(1))
    return torch.stack(outputs)


# --- the catalogue: MultiHeadLatentAttention ----------------------------------------------------------------------------


class LatentAbsorbedUnscaled(nn.Module):
    """The absorbed path forgets 1/sqrt(d_head)."""

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
            scores = (q @ w_k) @ c[:, None].transpose(-2, -1)  # the scale forgotten
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (weights @ c[:, None]) @ w_v.transpose(-2, -1)
        else:
            k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
            out = weights @ v
        return self.out_proj(out.transpose(1, 2).flatten(-2))


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


class LatentAbsorbedLatentScale(nn.Module):
    """The absorbed scores divided by sqrt(d_latent): the dot product is in latent space, the scale is not."""

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
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(list(latent_cache), dim=1)
        m = c.shape[1]
        future = torch.arange(m)[None, :] > torch.arange(m - T, m)[:, None]
        if absorbed:
            w_k, w_v = self.k_up.weight.unflatten(0, (h, d)), self.v_up.weight.unflatten(0, (h, d))
            scores = (q @ w_k) @ c[:, None].transpose(-2, -1) / math.sqrt(self.d_latent)  # the latent's width
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (weights @ c[:, None]) @ w_v.transpose(-2, -1)
        else:
            k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
            out = weights @ v
        return self.out_proj(out.transpose(1, 2).flatten(-2))


class LatentCachedExpanded(nn.Module):
    """The cache holds the up-projected keys and values instead of the latent: right outputs, h d_head numbers each."""

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
        kv = torch.cat([self.k_up(c), self.v_up(c)], dim=-1)  # cached after the up-projection
        if latent_cache is not None:
            latent_cache.append(kv)
            kv = torch.cat(list(latent_cache), dim=1)
        m = kv.shape[1]
        future = torch.arange(m)[None, :] > torch.arange(m - T, m)[:, None]
        k = kv[..., :h * d].unflatten(-1, (h, d)).transpose(1, 2)
        v = kv[..., h * d:].unflatten(-1, (h, d)).transpose(1, 2)
        weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).flatten(-2))


class LatentTopLeft(nn.Module):
    """The causal mask aligned top-left: with a cache, the new queries see only the first keys."""

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
        future = torch.ones(T, m, dtype=torch.bool).triu(1)  # top-left
        if absorbed:
            w_k, w_v = self.k_up.weight.unflatten(0, (h, d)), self.v_up.weight.unflatten(0, (h, d))
            scores = (q @ w_k) @ c[:, None].transpose(-2, -1) / math.sqrt(d)
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = (weights @ c[:, None]) @ w_v.transpose(-2, -1)
        else:
            k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
            out = weights @ v
        return self.out_proj(out.transpose(1, 2).flatten(-2))


class LatentAbsorbedExpands(nn.Module):
    """absorbed=True computes the expanded keys and values of the whole cache: right outputs, none of the saving."""

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
        k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)  # the same on both paths: the cache expanded
        v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
        weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(future, float("-inf")), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).flatten(-2))


# --- the catalogue: speculative_generate -----------------------------------------------------------------------------


def speculative_keeps_after_disagreement(target, draft, prompt, steps, k):
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            proposed = tokens
            for _ in range(min(k, left - 1)):
                proposed = torch.cat([proposed, draft(proposed)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
            n = tokens.shape[1]
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            agree = choices[:, :-1] == proposed[:, n:]
            kept = proposed[:, n:][agree][None, :]  # every agreeing token, also after a disagreement
            accepted = int(agree.sum())
            tokens = torch.cat([tokens, kept, choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:prompt.shape[1] + steps], calls


def speculative_no_bonus(target, draft, prompt, steps, k):
    # the text's checks of its arguments, as any answer has them: with k = 0 this loop would never end
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0 or k < 1 or steps < 1:
        raise ValueError("speculative_generate takes a prompt (1, T) with T >= 1, steps >= 1 and k >= 1")
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            proposed = tokens
            for _ in range(min(k, left)):
                proposed = torch.cat([proposed, draft(proposed)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
            n = tokens.shape[1]
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            guesses = proposed[:, n:]
            accepted = int((choices[:, :-1] == guesses)[0].long().cumprod(0).sum())
            tokens = torch.cat([tokens, guesses[:, :accepted]], dim=1)
            if accepted < guesses.shape[1]:  # the target's own token only at a disagreement: the bonus dropped
                tokens = torch.cat([tokens, choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:], calls


def speculative_draft_token_at_disagreement(target, draft, prompt, steps, k):
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            proposed = tokens
            for _ in range(min(k, left - 1)):
                proposed = torch.cat([proposed, draft(proposed)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
            n = tokens.shape[1]
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            guesses = proposed[:, n:]
            accepted = int((choices[:, :-1] == guesses)[0].long().cumprod(0).sum())
            if accepted < guesses.shape[1]:
                tokens = torch.cat([tokens, guesses[:, :accepted + 1]], dim=1)  # the draft's token, not the target's
            else:
                tokens = torch.cat([tokens, guesses, choices[:, -1:]], dim=1)
    return tokens[:, prompt.shape[1]:], calls


def speculative_draft_blind_to_its_proposals(target, draft, prompt, steps, k):
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            n = tokens.shape[1]
            guesses = []
            for _ in range(min(k, left - 1)):  # every proposal made from the accepted tokens alone
                guesses.append(draft(tokens)[:, -1].argmax(dim=-1, keepdim=True))
            proposed = torch.cat([tokens, *guesses], dim=1)
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            accepted = int((choices[:, :-1] == proposed[:, n:])[0].long().cumprod(0).sum())
            tokens = torch.cat([tokens, proposed[:, n:n + accepted], choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:], calls


def speculative_counts_draft_calls(target, draft, prompt, steps, k):
    tokens, calls = prompt, 0
    with torch.no_grad():
        while tokens.shape[1] - prompt.shape[1] < steps:
            left = steps - (tokens.shape[1] - prompt.shape[1])
            proposed = tokens
            for _ in range(min(k, left - 1)):
                proposed = torch.cat([proposed, draft(proposed)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
                calls += 1  # a call of the draft counted as a call of the target
            n = tokens.shape[1]
            choices = target(proposed)[:, n - 1:].argmax(dim=-1)
            calls += 1
            accepted = int((choices[:, :-1] == proposed[:, n:])[0].long().cumprod(0).sum())
            tokens = torch.cat([tokens, proposed[:, n:n + accepted], choices[:, accepted:accepted + 1]], dim=1)
    return tokens[:, prompt.shape[1]:], calls


ABSORB = ("scores are q_h . (W_h c_j) = (W_h^T q_h) . c_j, where W_h = k_up.weight[h d_head:(h+1) d_head] is "
          "(d_head, d_latent): the absorbed query is q_h @ W_h, d_latent numbers, and the scale is still "
          "1/sqrt(d_head), the width of the dot product the scores stand for.")

MISTAKES: dict[str, list[Mistake]] = {
    "cache_bytes_per_token": [
        Mistake("the values forgotten: only the keys counted", "the cache holds a key and a value per token, per "
                "layer and per key/value head: 2 L g d numbers.", BYTES, bytes_keys_only,
                id="serving/cache_bytes_per_token/the-values-forgotten"),
        Mistake("query heads counted instead of key/value heads", "with grouped-query attention only the g = kv_heads "
                "key/value heads are cached; the h query heads are computed for the new token and never stored.",
                BYTES, bytes_query_heads, id="serving/cache_bytes_per_token/query-heads-counted"),
        Mistake("MLA's latent counted twice, as keys and as values", "the latent c is one vector of d_latent numbers "
                "per token and per layer, from which both keys and values are up-projected: L d_latent numbers.",
                BYTES, bytes_latent_twice, id="serving/cache_bytes_per_token/the-latent-counted-twice"),
        Mistake("four bytes per number whatever the dtype", "the bytes of one number are the dtype's: "
                "torch.empty((), dtype=dtype).element_size(), 2 for float16 and bfloat16.", BYTES,
                bytes_four_per_number, id="serving/cache_bytes_per_token/four-bytes-per-number"),
    ],
    "PagedKVCache": [
        Mistake("a block still in use handed out again", "blocks come from the free blocks only; a counter wound back "
                "by free() hands out a block another sequence still holds, and its tokens get overwritten.", PAGED,
                CacheCounterAllocation, id="serving/PagedKVCache/a-block-still-in-use-handed-out-again"),
        Mistake("a freed sequence's blocks never reused", "free(seq) must give the sequence's blocks back to the "
                "pool; otherwise the pool runs dry though most of it holds no live token.", PAGED, CacheNeverReused,
                id="serving/PagedKVCache/freed-blocks-never-reused"),
        Mistake("paged gather in pool order instead of table order", "token p of a sequence is in block table[p // "
                "block_size]: the table's order is the sequence's order; sorting the block ids (the pool's order) "
                "scrambles a sequence whose blocks were reused.", PAGED, CacheGatherPoolOrder,
                id="serving/PagedKVCache/gather-in-pool-order"),
        Mistake("the pool copied at every append", "an out-of-place update (x = x.index_put(...), x = x.clone() then "
                "write) makes a new pool at every append: O(pool) copies per token. Write into the pool in place.",
                PAGED, CachePoolCopied, id="serving/PagedKVCache/the-pool-copied-at-every-append"),
        Mistake("a failed append that keeps what it took", "an append the pool cannot hold must change nothing: count "
                "the blocks it needs first and raise before taking any block or writing any token.", PAGED,
                CachePartialWrite, id="serving/PagedKVCache/a-failed-append-that-keeps-what-it-took"),
        Mistake("sequence ids reused", "an id numbered by the live sequences comes back after a free, and an old "
                "holder of the id reads or writes the new sequence. Count ids up, never reuse one.", PAGED,
                CacheIdsReused, id="serving/PagedKVCache/sequence-ids-reused"),
    ],
    "paged_attention": [
        Mistake("blocks read in pool order instead of table order", "token p of a sequence is in block "
                "table[p // block_size]: read the blocks in the table's order.", PAGED_ATTENTION, paged_pool_order,
                id="serving/paged_attention/blocks-read-in-pool-order"),
        Mistake("grouped heads mapped with repeat instead of repeat_interleave", "query head i reads key/value head "
                "i // (h // kv_heads): consecutive query heads share one. repeat tiles the heads (0, 1, 0, 1, ...).",
                PAGED_ATTENTION, paged_heads_tiled, id="serving/paged_attention/grouped-heads-mapped-wrongly"),
        Mistake("the unused slots of the last block attended", "a sequence of length n uses the first n slots of its "
                "blocks; the rest of the last block holds stale tokens of earlier sequences or zeros.",
                PAGED_ATTENTION, paged_whole_blocks, id="serving/paged_attention/the-unused-slots-attended"),
        Mistake("scores not scaled by 1/sqrt(d_head)", "attention divides q . k by sqrt(d_head), as in notebook 02.",
                PAGED_ATTENTION, paged_unscaled, id="serving/paged_attention/scores-not-scaled"),
    ],
    "MultiHeadLatentAttention": [
        Mistake("the absorbed path without the scale", ABSORB, LATENT, LatentAbsorbedUnscaled,
                id="serving/MultiHeadLatentAttention/the-absorbed-path-without-the-scale"),
        Mistake("W_k_up transposed in the absorbed path", ABSORB, LATENT, LatentAbsorbedTransposed,
                id="serving/MultiHeadLatentAttention/w-k-up-transposed"),
        Mistake("the absorbed scores scaled by 1/sqrt(d_latent)", ABSORB, LATENT, LatentAbsorbedLatentScale,
                id="serving/MultiHeadLatentAttention/scaled-by-the-latent-width"),
        Mistake("the latent cached after the up-projection", "latent_cache holds c = kv_down(x), (B, T, d_latent) per "
                "call: caching the up-projected keys and values stores 2 h d_head numbers per token and undoes what "
                "MLA is for.", LATENT, LatentCachedExpanded,
                id="serving/MultiHeadLatentAttention/the-latent-cached-after-the-up-projection"),
        Mistake("top-left causal alignment with a cache", "the T new queries are the last T of the m positions: query "
                "i sees the keys j <= i + m - T (bottom-right, as in notebook 09).", LATENT, LatentTopLeft,
                id="serving/MultiHeadLatentAttention/top-left-causal-alignment"),
        Mistake("an absorbed path that expands the cache", "absorbed=True must never make per-head keys or values of "
                "the cached tokens: fold W_k_up into the query and W_v_up into the output.", LATENT,
                LatentAbsorbedExpands, id="serving/MultiHeadLatentAttention/an-absorbed-path-that-expands"),
    ],
    "speculative_generate": [
        Mistake("draft tokens kept after the first disagreement", "only the longest agreeing prefix is kept: after "
                "the first proposal the target disagrees with, the draft's later tokens were proposed after a wrong "
                "token and mean nothing.", SPECULATIVE, speculative_keeps_after_disagreement,
                id="serving/speculative_generate/draft-tokens-kept-after-the-first-disagreement"),
        Mistake("the target's bonus token dropped", "when every proposal is accepted, the target's call has also "
                "given its choice after the last one: keep it. Each call then yields accepted + 1 tokens, and "
                "draft = target needs ceil(steps / (k + 1)) calls.", SPECULATIVE, speculative_no_bonus,
                id="serving/speculative_generate/the-target-s-bonus-token-dropped"),
        Mistake("the draft's token kept at the first disagreement", "where the target disagrees, its own choice is "
                "the next token, not the draft's.", SPECULATIVE, speculative_draft_token_at_disagreement,
                id="serving/speculative_generate/the-draft-s-token-kept-at-the-disagreement"),
        Mistake("the draft never sees its own proposals", "the draft proposes one token at a time, each after the "
                "tokens before it, its own earlier proposals of the round included: y_2 is the draft's choice after "
                "the sequence and y_1, not after the sequence again.", SPECULATIVE,
                speculative_draft_blind_to_its_proposals,
                id="serving/speculative_generate/the-draft-never-sees-its-own-proposals"),
        Mistake("calls of the draft counted as calls of the target", "target_calls counts the forward passes of the "
                "target only: the draft's are the cheap ones.", SPECULATIVE, speculative_counts_draft_calls,
                id="serving/speculative_generate/draft-calls-counted"),
    ],
}


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
    mistakes = [replace(m, fn=lambda *args, fn=m.fn: paged_attention_on(fn, *args)) for m in MISTAKES["paged_attention"]]
    verify(run_paged_attention(paged_attention, ATTENTION_BUILTINS), cases, paged_attention_reference,
           exercise="paged_attention", arg_names=PAGED_ARGS, outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=mistakes, rtol=1e-10, atol=1e-12)
    float32 = [paged_case(gen, 5, 4, 2, 2, 8, [(0, [3, 1], 6), (1, [4, 0], 8)], [0, 1], "float32",
                          dtype=torch.float32)]
    verify(run_paged_attention(paged_attention, ATTENTION_BUILTINS), float32, paged_attention_reference,
           exercise="paged_attention", arg_names=PAGED_ARGS, outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=mistakes, rtol=1e-4, atol=1e-5)
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
    mistakes = [replace(m, fn=run_mla(m.fn)) for m in MISTAKES["MultiHeadLatentAttention"]]
    verify(run_mla(MultiHeadLatentAttention), cases, mla_reference, exercise="MultiHeadLatentAttention",
           arg_names=MLA_ARGS, outputs=MLA_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=1e-10,
           atol=1e-12)
    float32 = [Case((LatentWeights(11035, 16, 2, 8, 6, dtype=torch.float32), randn(2, 5, 16, gen=gen, dtype=torch.float32)),
                    {"steps": [3, 2], "absorbed": absorbed}, label=f"float32, absorbed={absorbed}") for absorbed in (False, True)]
    verify(run_mla(MultiHeadLatentAttention), float32, mla_reference, exercise="MultiHeadLatentAttention",
           arg_names=MLA_ARGS, outputs=MLA_OUTPUTS, forbid=ATTENTION_BUILTINS, mistakes=mistakes, rtol=1e-4, atol=1e-5)
    weights = LatentWeights(11034, *(32, 4, 16, 8))
    with case("the absorbed path does not expand the cache: a decode step after 256 cached tokens"):
        problem = absorbed_problem(probe(absorbed_allocations, MultiHeadLatentAttention, weights.state,
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
    mistakes = [replace(m, fn=lambda *a, fn=m.fn: speculative_run(fn, *a)) for m in MISTAKES["speculative_generate"]]
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

