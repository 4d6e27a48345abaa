"""What is right in notebook 11, serving: how the checks run a paged KV cache, paged attention, multi-head latent
attention and speculative decoding, what they compare with, and the probes that run where the student's code runs.

The referees: a contiguous cache per sequence (the chunks appended, concatenated) for ``PagedKVCache``; SDPA on
each sequence's gathered keys and values (math backend, float64) for ``paged_attention``; the expanded attention
(SDPA with ``K = c W_k_up``, ``V = c W_v_up``) with the same weights for ``MultiHeadLatentAttention``; notebook 09's
greedy decoding by full recomputation (:func:`~autograder.references.tiny_decoder.greedy_reference`) for
``speculative_generate``, whose models are notebook 09's TinyDecoder computed from PyTorch functions
(:class:`CountedDecoder`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..grader.cases import case as case_of_check
from ..grader.compare import describe
from ..grader.diagnosis import Mistake, MistakeFound, run
from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import call_student, expect_error, probe, served_to
from ..grader.verify import Case
from ..kernel.guard import ATTENTION_BUILTINS
from ..kernel.watches import AllocationMeter, watch_allocations
from ..references.tiny_decoder import Weights, decoder_reference
from ..shared.errors import fail

# --- the paged KV cache: a script of operations, run on the student's class -------------------------------------

#: What a check does to a cache, one operation at a time: ("new",), ("append", i, k, v) to the i-th sequence made,
#: ("free", i).
Op = tuple


def paged_scenario(PagedKVCache, num_blocks, block_size, kv_heads, d_head, ops: Sequence[Op],  # noqa: N803
                   dtype=torch.float64) -> dict:
    """Probe: run ``ops`` on a new cache; after each, what a caller sees of every live sequence.

    After each append the caller overwrites its ``k`` and ``v`` with NaN (a model reuses its buffers). A
    ``ValueError`` is recorded, not raised (the checks expect some). Returns plain data: the ids made, and per
    operation the error (or None), the lengths, block tables and gathered keys and values of the live sequences in
    the order they were made, the pool as it is then, and whether the pool tensors still use the memory allocated
    at construction.
    """
    cache = PagedKVCache(num_blocks, block_size, kv_heads, d_head, dtype=dtype)
    pool = [_storage(cache.keys), _storage(cache.values)]
    ids: list = []
    live: list[int] = []
    states = []
    for op in ops:
        error = None
        try:
            if op[0] == "new":
                ids.append(cache.new_sequence())
                live.append(len(ids) - 1)
            elif op[0] == "append":
                k, v = op[2].clone(), op[3].clone()
                cache.append(ids[op[1]], k, v)
                k.fill_(float("nan"))
                v.fill_(float("nan"))
            else:
                cache.free(ids[op[1]])
                live.remove(op[1])
        except ValueError as problem:
            error = str(problem)[:500]
        lengths, tables, keys, values = [], [], [], []
        for i in live:
            lengths.append(cache.length(ids[i]))
            tables.append(list(cache.block_table(ids[i])))
            gathered = cache.gather(ids[i])
            if not (isinstance(gathered, tuple) and len(gathered) == 2
                    and all(isinstance(t, torch.Tensor) for t in gathered)):
                raise TypeError(f"cache.gather(seq) should return a pair (keys, values) of tensors, but it returned "
                                f"{describe(gathered)}")
            keys.append(gathered[0].detach().clone())
            values.append(gathered[1].detach().clone())
        states.append({"error": error, "live": list(live), "lengths": lengths, "tables": tables, "keys": tuple(keys),
                       "values": tuple(values), "pool": cache.keys.detach().clone(),
                       "same_pool": [_storage(cache.keys), _storage(cache.values)] == pool})
    return {"ids": ids, "states": states}


def _storage(pool) -> list:
    """Where a pool tensor's memory is, and its shape: the same after an append that wrote in place (a view too)."""
    return [pool.untyped_storage().data_ptr(), list(pool.shape)] if isinstance(pool, torch.Tensor) else [None, None]


def paged_expected(num_blocks: int, block_size: int, ops: Sequence[Op]) -> list[dict]:
    """What each operation of ``ops`` must give, whatever blocks the cache chooses.

    Per operation: whether it must fail (an append needing more blocks than are free), whether it would fail if
    freed blocks never went back to the pool, the live sequences and their lengths, keys and values.
    """
    free, never_returned = num_blocks, 0
    chunks: dict[int, list] = {}
    lengths: dict[int, int] = {}
    made = 0
    expected = []
    for op in ops:
        must_fail = without_reuse = False
        if op[0] == "new":
            chunks[made], lengths[made] = [], 0
            made += 1
        elif op[0] == "append":
            i, t = op[1], op[2].shape[1]
            needed = -(-(lengths[i] + t) // block_size) - -(-lengths[i] // block_size)
            if needed > free:
                must_fail = True
            else:
                without_reuse = never_returned + needed > num_blocks
                free -= needed
                never_returned += needed
                chunks[i].append((op[2], op[3]))
                lengths[i] += t
        else:
            free += -(-lengths.pop(op[1]) // block_size)
            del chunks[op[1]]
        live = sorted(chunks)
        expected.append({"must_fail": must_fail, "without_reuse": without_reuse, "live": live,
                         "lengths": [lengths[i] for i in live],
                         "keys": [_joined(chunks[i], 0) for i in live], "values": [_joined(chunks[i], 1) for i in live]})
    return expected


def _joined(chunks: list, which: int) -> torch.Tensor | None:
    return torch.cat([c[which] for c in chunks], dim=1) if chunks else None


def describe_ops(ops: Sequence[Op], upto: int | None = None) -> str:
    """The operations in words: ``new a, append 3 to a, ...``."""
    names = "abcdefghijklmnopqrstuvwxyz"
    words, made = [], 0
    for op in ops[:upto]:
        if op[0] == "new":
            words.append(f"new {names[made]}")
            made += 1
        elif op[0] == "append":
            words.append(f"append {op[2].shape[1]} to {names[op[1]]}")
        else:
            words.append(f"free {names[op[1]]}")
    return ", ".join(words)


def _table_in_pool(pool: torch.Tensor, table: list, length: int, block_size: int) -> torch.Tensor | None:
    """The keys the pool holds where ``table`` says a sequence's tokens are (None: the table cannot be read)."""
    if length == 0:
        return None
    try:
        return torch.stack([pool[table[p // block_size], :, p % block_size] for p in range(length)], dim=1)
    except (IndexError, TypeError, RuntimeError):
        return None


def judge_paged(got: dict, num_blocks: int, block_size: int, ops: Sequence[Op], dtype) -> tuple[str, str] | None:
    """``(kind, message)`` for the first way the outcome of :func:`paged_scenario` is wrong, or None.

    ``kind`` names the problem for the catalogue (``shared-block``, ``not-reused``, ``gather-order``, ...): a
    mistake is named when it makes the same kind of problem, whatever blocks the student's cache hands out.
    """
    names = "abcdefghijklmnopqrstuvwxyz"
    ids = got["ids"]
    if any(type(i) is not int for i in ids):
        return "ids", f"new_sequence() should return an int, but it returned {[describe(i) for i in ids]}."
    if len(set(ids)) != len(ids):
        return "id-reused", (f"After {describe_ops(ops)}, new_sequence() returned the ids {ids}: an id was given twice. "
                             "Ids are never reused: a request that still holds an old id (a client retrying, a "
                             "scheduler's queue) must get an error, not another sequence's tokens.")
    previous: dict[int, tuple] = {}
    for step, (state, want) in enumerate(zip(got["states"], paged_expected(num_blocks, block_size, ops))):
        where = f"After {describe_ops(ops, step + 1)} (a pool of {num_blocks} blocks of {block_size} tokens)"
        op = ops[step]
        if want["must_fail"] and state["error"] is None:
            return "no-room", (f"{where}, the last append needs more blocks than the pool has free: it should raise "
                               "ValueError, and write nothing.")
        if not want["must_fail"] and state["error"] is not None:
            kind = "not-reused" if want["without_reuse"] else "error"
            return kind, (f"{where}, the last operation raised ValueError: {state['error']}\nThe pool has enough free "
                          "blocks for it" + (", counting the blocks of the sequences freed before: free(seq) must "
                                             "give its blocks back to the pool." if kind == "not-reused" else "."))
        if not state["same_pool"]:
            return "reallocated", (f"{where}, cache.keys or cache.values no longer uses the memory allocated at construction: "
                                   "the pool is allocated once, and appends write into it in place (a slice assignment,"
                                   " not a new tensor).")
        if state["live"] != want["live"]:
            return "error", f"{where}, the live sequences should be {want['live']}, not {state['live']}."
        if want["must_fail"] and op[0] == "append":
            i = op[1]
            before = previous.get(i)
            now = (state["lengths"][want["live"].index(i)], state["tables"][want["live"].index(i)])
            if before is not None and now != before:
                return "partial-write", (f"{where}, the last append raised ValueError (right), but it changed the "
                                         f"sequence: length and block table went from {before} to {now}. Count the "
                                         "blocks needed first, and refuse before taking any block or writing any token.")
        if state["lengths"] != want["lengths"]:
            shown = {names[i]: n for i, n in zip(want["live"], state["lengths"])}
            return "length", (f"{where}, length(seq) should be {dict(zip([names[i] for i in want['live']], want['lengths']))},"
                              f" but it is {shown}.")
        held: dict[int, str] = {}
        for i, table, length in zip(want["live"], state["tables"], want["lengths"]):
            blocks = -(-length // block_size)
            if not isinstance(table, list) or any(type(b) is not int for b in table) or len(table) != blocks:
                return "table-size", (f"{where}, block_table({names[i]}) is {table}: {length} tokens in blocks of "
                                      f"{block_size} need exactly {blocks} block id(s), ints, in order.")
            for b in table:
                if not 0 <= b < num_blocks:
                    return "table-size", f"{where}, block_table({names[i]}) = {table} names a block outside 0..{num_blocks - 1}."
                if b in held:
                    return "shared-block", (f"{where}, block {b} is in the block tables of {held[b]} and {names[i]} at "
                                            "once: a block in use was handed out again, and one sequence's new tokens "
                                            "overwrite the other's. A block may be taken only from the free ones.")
                held[b] = names[i]
        for i, table, length, keys, values, want_k, want_v in zip(want["live"], state["tables"], want["lengths"],
                                                                   state["keys"], state["values"], want["keys"],
                                                                   want["values"]):
            shape = (keys.shape[0], length, keys.shape[-1]) if want_k is None else tuple(want_k.shape)
            right = (tuple(keys.shape) == shape and tuple(values.shape) == shape and keys.dtype == dtype
                     and (want_k is None or (torch.equal(keys, want_k.to(dtype)) and torch.equal(values, want_v.to(dtype)))))
            if right:
                continue
            nan = keys.is_floating_point() and bool(torch.isnan(keys).any())
            in_pool = _table_in_pool(state["pool"], table, length, block_size)
            if not nan and want_k is not None and in_pool is not None and torch.equal(in_pool, want_k.to(dtype)):
                return "gather-order", (f"{where}, the pool holds the tokens of {names[i]} where its block table "
                                        f"{table} says, but gather({names[i]}) returns other keys: read the blocks in "
                                        "the order of the block table (table[0] holds tokens 0..block_size-1), not "
                                        "in the order of the pool, and return only length(seq) tokens.")
            wanted = f"({keys.shape[0] if keys.dim() else '?'}, {length}, d_head) in {dtype}"
            hint = (" NaN appears where the caller's tensors were (the check overwrites its k and v after each "
                    "append): copy k and v into the pool, do not keep them.") if nan else ""
            return "wrong-tokens", (f"{where}, gather({names[i]}) should return the {length} tokens appended to it, in "
                                    f"order, as {wanted}, but it returned keys {describe(keys)}.{hint}")
        previous = {i: (n, t) for i, n, t in zip(want["live"], state["lengths"], state["tables"])}
    return None


#: A script for a cache: (num_blocks, block_size, kv_heads, d_head, ops, dtype, label).
PagedCase = tuple


def paged_kind(cache_class, case: PagedCase) -> str | None:
    """The kind of problem ``cache_class`` (a catalogued mistake, run here) makes on ``case``, or None."""
    num_blocks, block_size, kv_heads, d_head, ops, dtype, _ = case
    outcome = run(paged_scenario, (cache_class, num_blocks, block_size, kv_heads, d_head, ops), {"dtype": dtype})
    if outcome.error is not None:
        return f"raised {outcome.error[0]}"
    found = judge_paged(outcome.value, num_blocks, block_size, ops, dtype)
    return None if found is None else found[0]


def check_paged_scripts(PagedKVCache, cases: Sequence[PagedCase], mistakes: Sequence[Mistake] = ()) -> None:  # noqa: N803
    """Run each script on the student's cache, judge it, and name the mistakes that make the same kind of problem."""
    for case in cases:
        num_blocks, block_size, kv_heads, d_head, ops, dtype, label = case
        what = f"PagedKVCache({num_blocks}, {block_size}, {kv_heads}, {d_head}, dtype={dtype}) ({label})"
        with case_of_check(label):
            got = probe(paged_scenario, PagedKVCache, num_blocks, block_size, kv_heads, d_head, ops, dtype=dtype,
                        what=what)
            found = judge_paged(got, num_blocks, block_size, ops, dtype)
            if found is not None:
                kind, message = found
                raise MistakeFound(f"With {what}:\n{message}", [m for m in mistakes if paged_kind(m.fn, case) == kind])


#: Appends of one token each in the allocation probe of PagedKVCache, and what one may allocate: this many tokens of
#: keys and values, plus small index tensors.
APPEND_STEPS = 64
APPEND_ALLOWANCE = 4
INDEX_BYTES = 512


def append_allocations(PagedKVCache, steps: int = APPEND_STEPS) -> int:  # noqa: N803
    """Probe: bytes of new tensors allocated by appends 2 to ``steps`` of one token each (2 heads, d_head 8)."""
    cache = PagedKVCache(steps // 4 + 1, 4, 2, 8)
    seq = cache.new_sequence()
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randn(2, 1, 8, generator=gen) for _ in range(2 * steps)]
    cache.append(seq, tokens[0], tokens[1])
    with AllocationMeter() as meter:
        for i in range(1, steps):
            cache.append(seq, tokens[2 * i], tokens[2 * i + 1])
    return meter.allocated


def append_allocation_problem(allocated: int, steps: int = APPEND_STEPS) -> str | None:
    """A message when appends allocate memory that grows with what the pool holds, or None."""
    token = 2 * 2 * 8 * 4
    allowed = (steps - 1) * (APPEND_ALLOWANCE * token + INDEX_BYTES)
    if allocated <= allowed:
        return None
    return (f"{steps} appends of one token to PagedKVCache({steps // 4 + 1}, 4, 2, 8) allocated {allocated:,} bytes of "
            f"new tensors after the first, {allocated / (steps - 1):,.0f} per append, where one token of keys and "
            f"values is {token} bytes: each append copies what the pool (or the sequence) already holds. Write the "
            f"new tokens into their slots of the pool in place (at most {allowed:,} bytes are allowed here).")


def bytes_errors(cache_bytes_per_token) -> None:
    """Sizes below 1 and query heads that do not share the key/value heads equally: ValueError."""
    for args, why in [((0, 8, 8, 64, torch.float16), "num_layers = 0: every size must be at least 1"),
                      ((4, 8, 3, 64, torch.float16), "8 query heads cannot share 3 key/value heads equally"),
                      ((4, 8, 0, 64, torch.float16), "kv_heads = 0: every size must be at least 1")]:
        expect_error(cache_bytes_per_token, *args, error=ValueError, why=why,
                     what=f"cache_bytes_per_token{args[:4] + ('torch.float16',)}".replace("'", ""))
    expect_error(cache_bytes_per_token, 4, 8, 8, 64, torch.float16, d_latent=0, error=ValueError,
                 why="d_latent = 0: every size must be at least 1",
                 what="cache_bytes_per_token(4, 8, 8, 64, torch.float16, d_latent=0)")


def unknown_id_errors(PagedKVCache) -> list:  # noqa: N803
    """Probe: what each method does with a freed id and with an id never made: ``[call, error type or None]`` pairs."""
    cache = PagedKVCache(4, 2, 1, 2)
    seq = cache.new_sequence()
    cache.append(seq, torch.ones(1, 3, 2), torch.ones(1, 3, 2))
    cache.free(seq)
    stranger = 10_000 + 7 * seq + 1
    calls = [("append to a freed sequence", lambda: cache.append(seq, torch.ones(1, 1, 2), torch.ones(1, 1, 2))),
             ("gather of a freed sequence", lambda: cache.gather(seq)),
             ("length of a freed sequence", lambda: cache.length(seq)),
             ("block_table of a freed sequence", lambda: cache.block_table(seq)),
             ("free of a freed sequence", lambda: cache.free(seq)),
             ("gather of an id never made", lambda: cache.gather(stranger)),
             ("append to an id never made", lambda: cache.append(stranger, torch.ones(1, 1, 2), torch.ones(1, 1, 2)))]
    found = []
    for what, call in calls:
        try:
            call()
            found.append([what, None])
        except Exception as error:  # noqa: BLE001 - the check wants the type
            found.append([what, type(error).__name__])
    return found


def unknown_ids(PagedKVCache) -> None:  # noqa: N803
    """Every method given a freed id or an id never made raises a ValueError (the text's rule)."""
    with case_of_check("a freed id and an id never made raise ValueError in every method"):
        for what, error in probe(unknown_id_errors, PagedKVCache, what="a freed id and an id never made"):
            expect_raised(None if error is None else [error, ""], ValueError, f"PagedKVCache: {what}",
                          "the id is unknown to the cache")


def paged_append_errors(PagedKVCache) -> None:  # noqa: N803
    """``append`` with ``k`` or ``v`` of the wrong shape raises a ValueError; a case each, with a cache of its own."""
    for shape_k, shape_v, why in [((3, 1, 3), (3, 1, 3), "the cache has 2 key/value heads, not 3"),
                                  ((2, 1, 4), (2, 1, 4), "the cache has d_head = 3, not 4"),
                                  ((2, 2, 3), (2, 1, 3), "k holds 2 tokens but v holds 1")]:
        what = f"cache.append(seq, k {shape_k}, v {shape_v}) with a PagedKVCache(4, 2, 2, 3)"
        with case_of_check(f"{what} raises ValueError"):
            cache = call_student(PagedKVCache, 4, 2, 2, 3, what="PagedKVCache(4, 2, 2, 3)")
            seq = call_student(cache.new_sequence, what="cache.new_sequence()")
            expect_error(cache.append, seq, torch.zeros(shape_k), torch.zeros(shape_v), error=ValueError, why=why,
                         what=what)


def chunk(gen: torch.Generator, kv_heads: int, t: int, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys and values of ``t`` tokens, ``(kv_heads, t, d_head)``, float64."""
    return randn(kv_heads, t, d_head, gen=gen), randn(kv_heads, t, d_head, gen=gen)


def script(gen: torch.Generator, kv_heads: int, d_head: int, steps: Sequence) -> list[Op]:
    """Operations from a short notation: "new", ("append", i, t), ("free", i)."""
    ops: list[Op] = []
    for step in steps:
        if step == "new":
            ops.append(("new",))
        elif step[0] == "append":
            ops.append(("append", step[1], *chunk(gen, kv_heads, step[2], d_head)))
        else:
            ops.append(step)
    return ops


# --- paged attention: a pool and block tables handed to the student's function ---------------------------------


class PoolView:
    """A paged cache whose pool and block tables are given: how the checks hand a cache to ``paged_attention``.

    It has what ``paged_attention`` may read: ``keys``, ``values``, ``block_size``, ``kv_heads``,
    ``block_table(seq)`` and ``length(seq)``. Its ``gather`` refuses: reading the pool through the block
    table is the exercise.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, sequences: Sequence) -> None:
        self.keys, self.values = keys, values
        self.block_size, self.kv_heads = keys.shape[2], keys.shape[1]
        self._tables = {int(seq): (list(table), int(length)) for seq, table, length in sequences}

    def _known(self, seq):
        if seq not in self._tables:
            raise ValueError(f"no sequence {seq!r} in this cache")
        return self._tables[seq]

    def block_table(self, seq) -> list[int]:
        return list(self._known(seq)[0])

    def length(self, seq) -> int:
        return self._known(seq)[1]

    def gather(self, seq):
        raise RuntimeError("paged_attention may not call cache.gather: read the pool (cache.keys, cache.values) "
                           "through cache.block_table(seq) and cache.length(seq) yourself (section 4)")


def gathered(view: PoolView, seq) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of ``seq`` in order, read through its table: ``(kv_heads, length, d_head)`` each."""
    table, length = view._known(seq)
    return (view.keys[table].transpose(0, 1).flatten(1, 2)[:, :length],
            view.values[table].transpose(0, 1).flatten(1, 2)[:, :length])


def paged_attention_on(paged_attention, keys, values, sequences, q, seqs):
    """Probe: ``paged_attention(q, cache, seqs)`` on a :class:`PoolView` of the given pool and block tables."""
    return paged_attention(q, PoolView(keys, values, sequences), seqs)


def paged_attention_error(paged_attention, keys, values, sequences, q, seqs):
    """Probe: the type and message of the error ``paged_attention`` raises on these inputs, or None."""
    try:
        paged_attention_on(paged_attention, keys, values, sequences, q, seqs)
    except Exception as error:  # noqa: BLE001 - the check wants the type
        return [type(error).__name__, str(error)[:300]]
    return None


def paged_attention_reference(keys, values, sequences, q, seqs) -> torch.Tensor:
    """SDPA of each query over its sequence's gathered keys and values (grouped heads), float64; zeros when empty."""
    view = PoolView(keys, values, sequences)
    outputs = []
    for i, seq in enumerate(seqs):
        k, v = gathered(view, seq)
        if k.shape[1] == 0:
            outputs.append(q.new_zeros(q.shape[1], values.shape[-1]))
            continue
        out = math_sdpa(q[i, :, None].double(), k.double(), v.double(), enable_gqa=True)
        outputs.append(out[:, 0].to(q.dtype))
    return torch.stack(outputs)


PAGED_ARGS = ("keys", "values", "sequences", "q", "seqs")


def paged_attention_errors(paged_attention, case: Case) -> None:
    """Query heads that do not share the key/value heads equally, and seqs of another length than q: ValueError."""
    keys, values, sequences, q, seqs = case.args
    for args, why in [((q[:, :3], seqs), f"3 query heads cannot share {keys.shape[1]} key/value heads equally"),
                      ((q, seqs[:-1]), f"q holds {q.shape[0]} queries but seqs names {len(seqs) - 1} sequences")]:
        what = f"paged_attention(q {tuple(args[0].shape)}, a cache with {keys.shape[1]} key/value heads, seqs={args[1]})"
        with case_of_check(f"{what} raises ValueError"):
            expect_raised(probe(paged_attention_error, paged_attention, keys, values, sequences, *args, what=what,
                                forbid=ATTENTION_BUILTINS),
                          ValueError, what, why)


def paged_case(gen, num_blocks, block_size, kv_heads, h, d_head, sequences, seqs, label, dtype=torch.float64):
    """A pool of random keys and values, the block tables ``sequences`` (id, table, length), queries for ``seqs``."""
    keys = randn(num_blocks, kv_heads, block_size, d_head, gen=gen, dtype=dtype)
    values = randn(num_blocks, kv_heads, block_size, d_head, gen=gen, dtype=dtype)
    q = randn(len(seqs), h, d_head, gen=gen, dtype=dtype)
    return Case((keys, values, list(sequences), q, list(seqs)), label=label)


def run_paged_attention(paged_attention, forbid=()) -> Callable[..., Any]:
    """How a check runs ``paged_attention``: where the student's code runs, on a :class:`PoolView`."""
    def run(keys, values, sequences, q, seqs):
        return probe(paged_attention_on, paged_attention, keys, values, sequences, q, seqs, forbid=forbid,
                     what=f"paged_attention(q {tuple(q.shape)}, cache, seqs={list(seqs)})")

    return run


# --- multi-head latent attention ----------------------------------------------------------------------------------


def mla_shapes(d_model: int, num_heads: int, d_head: int, d_latent: int) -> dict[str, tuple[int, int]]:
    """The parameters of a MultiHeadLatentAttention, by name, with their shapes."""
    wide = num_heads * d_head
    return {"q_proj.weight": (wide, d_model), "kv_down.weight": (d_latent, d_model), "k_up.weight": (wide, d_latent),
            "v_up.weight": (wide, d_latent), "out_proj.weight": (d_model, wide)}


class LatentWeights:
    """Random weights of a MultiHeadLatentAttention and its sizes; a one-line repr names it in a message."""

    def __init__(self, seed: int, d_model: int, num_heads: int, d_head: int, d_latent: int,
                 dtype=torch.float64) -> None:
        gen = generator(seed)
        self.sizes = (d_model, num_heads, d_head, d_latent)
        self.state = {name: randn(*shape, gen=gen, dtype=dtype) / math.sqrt(shape[1])
                      for name, shape in mla_shapes(*self.sizes).items()}

    def __repr__(self) -> str:
        return "MultiHeadLatentAttention({}, {}, {}, {}) with random weights".format(*self.sizes)


def mla_outputs(MultiHeadLatentAttention, sizes, state, x, steps=None, absorbed=False):  # noqa: N803
    """Probe: the module built by its constructor, given ``state``, run on ``x`` whole or in ``steps`` with a cache.

    Returns ``(output, latents, tokens per entry)``: the outputs side by side ``(B, T, d_model)``, the cache's
    entries concatenated ``(B, cached, d_latent)`` and the number of tokens of each entry (empty without a cache).
    """
    module = MultiHeadLatentAttention(*sizes).to(x.dtype)
    module.load_state_dict({name: t.to(x.dtype) for name, t in state.items()}, strict=False)  # buffers of its own allowed
    B, d_latent = x.shape[0], sizes[3]
    if steps is None:
        return module(x, absorbed=absorbed), x.new_zeros(B, 0, d_latent), torch.zeros(0, dtype=torch.long)
    cache: list = []
    outputs, start = [], 0
    for t in steps:
        outputs.append(module(x[:, start:start + t], cache, absorbed=absorbed))
        start += t
    if not all(isinstance(c, torch.Tensor) for c in cache):
        raise TypeError(f"latent_cache should hold tensors only, but it holds {[describe(c) for c in cache]}")
    latents = torch.cat([c.detach() for c in cache], dim=1) if cache else x.new_zeros(B, 0, d_latent)
    return (torch.cat(outputs, dim=1), latents,
            torch.tensor([c.shape[1] if c.dim() > 1 else -1 for c in cache], dtype=torch.long))


def mla_reference(weights: LatentWeights, x, steps=None, absorbed=False):
    """The expanded attention from PyTorch functions: K = c W_k_up, V = c W_v_up, SDPA (causal), the same weights."""
    w = {name: t.to(x.dtype) for name, t in weights.state.items()}
    _, h, d, _ = weights.sizes
    c = F.linear(x, w["kv_down.weight"])

    def heads(t):
        return t.unflatten(-1, (h, d)).transpose(1, 2)

    q, k, v = heads(F.linear(x, w["q_proj.weight"])), heads(F.linear(c, w["k_up.weight"])), heads(F.linear(c, w["v_up.weight"]))
    out = F.linear(math_sdpa(q, k, v, is_causal=True).transpose(1, 2).flatten(-2), w["out_proj.weight"])
    if steps is None:
        return out, x.new_zeros(x.shape[0], 0, weights.sizes[3]), torch.zeros(0, dtype=torch.long)
    return out, c, torch.tensor(list(steps), dtype=torch.long)


MLA_ARGS = ("weights", "x")
MLA_OUTPUTS = ("output", "latent cache", "tokens per cache entry")


def run_mla(MultiHeadLatentAttention, forbid=()) -> Callable[..., Any]:  # noqa: N803
    """How a check runs the student's class: :func:`mla_outputs` where the student's code runs, under ``forbid``
    (there the rules of the check's own call do not reach: the probe carries them)."""
    def run(weights, x, steps=None, absorbed=False):
        how = "whole" if steps is None else f"in steps {list(steps)} with a latent cache"
        return probe(mla_outputs, MultiHeadLatentAttention, weights.sizes, weights.state, x, steps, absorbed,
                     what=f"{weights!r}, absorbed={absorbed}, {how}", forbid=forbid)

    return run


#: The absorbed decode step the watch runs: tokens already cached, and the sizes (d_latent < d_head, so that the
#: cached latents themselves are smaller than one head's keys).
WATCH_CACHED, WATCH_SIZES = 256, (32, 4, 16, 8)


def absorbed_allocations(MultiHeadLatentAttention, state, cached: int = WATCH_CACHED):  # noqa: N803
    """Probe: one absorbed decode step after ``cached`` tokens, watched; the first tensor as large as one head's keys.

    Returns ``[op, shape]`` of the first new tensor of at least ``cached * d_head`` elements, or None.
    """
    d_model, _, d_head, _ = WATCH_SIZES
    module = MultiHeadLatentAttention(*WATCH_SIZES).double()
    module.load_state_dict(state, strict=False)
    gen = torch.Generator().manual_seed(1)
    cache: list = []
    with torch.no_grad():
        module(torch.randn(1, cached, d_model, generator=gen, dtype=torch.float64), cache)
        x = torch.randn(1, 1, d_model, generator=gen, dtype=torch.float64)
        _, seen = watch_allocations(lambda x: module(x, cache, absorbed=True), (x,), {}, rows=2**62, cols=2**62,
                                    max_elements=cached * d_head)
    return seen["offender"]


def absorbed_problem(offender) -> str | None:
    """A message when the absorbed decode step made a tensor as large as one head's keys of the cached tokens."""
    if offender is None:
        return None
    d_model, h, d_head, d_latent = WATCH_SIZES
    return (f"With absorbed=True, one decode step of MultiHeadLatentAttention{WATCH_SIZES} after {WATCH_CACHED} cached "
            f"tokens made a tensor of shape {tuple(offender[1])} ({offender[0]}), at least as large as one head's keys "
            f"of the cached tokens ({WATCH_CACHED} x {d_head}): it up-projects the cache. The absorbed path folds "
            f"W_k_up into the query (q_h W_k_up,h: {d_latent} numbers per head) and W_v_up into the output, and "
            f"attends over the latents themselves.")


# --- speculative decoding ------------------------------------------------------------------------------------------


class CountedDecoder:
    """Notebook 09's TinyDecoder computed from PyTorch functions (``model(tokens)`` -> logits), counting its calls.

    ``layers`` keeps only the first blocks of ``weights`` (a weaker model sharing the target's embedding).
    ``no_repeat`` bans, at every position, the token just read (its logit is -inf): a random model's
    greedy output soon repeats one token, where a wrong speculative decoder that proposes the same
    token k times would be right; banned, no greedy output holds the same token twice in a row.
    """

    def __init__(self, weights: Weights, layers: int | None = None, no_repeat: bool = False) -> None:
        self.weights = weights
        if layers is not None:
            self.weights = copy.copy(weights)
            self.weights.num_layers = layers
        self.no_repeat = no_repeat
        self.calls = 0

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if not (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and not tokens.is_floating_point()):
            raise TypeError(f"the model takes tokens, a (batch, T) tensor of ints, not {describe(tokens)}")
        self.calls += 1
        logits = decoder_reference(self.weights, tokens)
        if self.no_repeat:
            logits = logits.scatter(-1, tokens[..., None], float("-inf"))
        return logits

    def __repr__(self) -> str:
        return (repr(self.weights) + ("" if self.weights.num_layers is None else f" ({self.weights.num_layers} layer(s))")
                + (", never repeating the token just read" if self.no_repeat else ""))


#: A model as plain data: (seed, d_model, num_heads, d_ff, vocab, num_layers, layers used[, no_repeat]).
Spec = tuple


def decoder_of(spec: Spec) -> CountedDecoder:
    """The model a spec names."""
    seed, d_model, num_heads, d_ff, vocab, num_layers, used, *no_repeat = spec
    return CountedDecoder(Weights(seed, d_model, num_heads, d_ff, vocab=vocab, num_layers=num_layers), used,
                          no_repeat=bool(no_repeat and no_repeat[0]))


def greedy_of(spec: Spec, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """The greedy continuation of the model ``spec`` names, by full recomputation (notebook 09's): ``(1, steps)``."""
    model, tokens = decoder_of(spec), prompt
    with torch.no_grad():
        for _ in range(steps):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return tokens[:, prompt.shape[1]:]


def speculative_run(speculative_generate, target: Spec, draft: Spec, prompt, steps, k):
    """``speculative_generate`` run with the two models, each counting its calls where the check runs.

    Where the answer runs in the student's kernel, the models are served from the grader
    (:func:`autograder.grader.student.served_to`): the kernel gets stand-ins, and the calls are made and
    counted here. Returns ``(tokens, target_calls as returned, calls of the target counted, calls of
    the draft counted)``.
    """
    target_model, draft_model = decoder_of(target), decoder_of(draft)
    what = f"speculative_generate(target, draft, prompt {tuple(prompt.shape)}, {steps}, {k})"
    result = call_student(speculative_generate, served_to(speculative_generate, target_model),
                          served_to(speculative_generate, draft_model), prompt, steps, k, what=what)
    if not (isinstance(result, tuple) and len(result) == 2):
        fail(f"{what} should return a pair (tokens, target_calls), not {describe(result)}.")
    tokens, calls = result
    if isinstance(calls, torch.Tensor) and calls.numel() == 1 and not calls.is_floating_point():
        calls = int(calls.item())
    return tokens, calls, target_model.calls, draft_model.calls


SPECULATIVE_ARGS = ("target", "draft", "prompt", "steps", "k")


def proposals_all_accepted(steps: int, k: int) -> int:
    """The draft's proposals (one call each) when every one is accepted: min(k, steps left - 1) per round."""
    proposals, left = 0, steps
    while left > 0:
        proposed = min(k, left - 1)
        proposals, left = proposals + proposed, left - proposed - 1
    return proposals


def expect_raised(raised, error: type[BaseException], what: str, why: str) -> None:
    """Fail unless ``raised``, what an error probe returned (``[type name, message]`` or None), is ``error``.

    The probes of this notebook call the student's code where it runs and return the error it raised;
    this is :func:`autograder.grader.student.expect_error` for them.
    """
    if raised is None:
        fail(f"{what} should raise {error.__name__} because {why}, but it returned without an error.")
    if raised[0] != error.__name__:
        fail(f"{what} should raise {error.__name__} because {why}, but it raised {raised[0]}: {raised[1]}")


def speculative_errors(speculative_generate, target: Spec) -> None:
    """The prompt, steps and k the text refuses: each must raise a ValueError."""
    for args, why in [((torch.zeros(2, 3, dtype=torch.long), 4, 2), "the prompt must be a batch of one, (1, T)"),
                      ((torch.zeros(1, 0, dtype=torch.long), 4, 2), "the prompt must hold at least one token"),
                      ((torch.zeros(1, 3, dtype=torch.long), 4, 0), "k = 0: a round proposes at least one token"),
                      ((torch.zeros(1, 3, dtype=torch.long), 0, 2), "steps = 0: at least one token is asked for")]:
        what = f"speculative_generate(target, draft, prompt {tuple(args[0].shape)}, steps={args[1]}, k={args[2]})"
        models = (served_to(speculative_generate, decoder_of(target)) for _ in range(2))
        expect_error(speculative_generate, *models, *args, error=ValueError, what=what, why=why)


def spec_words(spec: Spec) -> str:
    """A model spec in words."""
    seed, d_model, num_heads, d_ff, vocab, num_layers, used, *no_repeat = spec
    kept = "" if used is None else f", its first {used} block(s) only"
    banned = ", never repeating the token just read" if no_repeat and no_repeat[0] else ""
    return f"TinyDecoder({vocab}, {d_model}, {num_heads}, {d_ff}, {num_layers}) seed {seed}{kept}{banned}"


def speculative_problem(got, target: Spec, draft: Spec, prompt, steps, k, greedy: torch.Tensor,
                        calls: int | None) -> tuple[str, str] | None:
    """``(kind, message)`` for the first way an outcome of :func:`speculative_run` is wrong, or None.

    ``greedy`` is the target's greedy output; ``calls`` the target calls the algorithm makes, when known.
    """
    tokens, reported, counted, _ = got
    where = (f"With target = {spec_words(target)}, draft = {spec_words(draft)}, a prompt of {prompt.shape[1]} "
             f"tokens, steps = {steps}, k = {k}")
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (1, steps):
        return "tokens", f"{where}: the tokens should be a tensor of shape (1, {steps}), not {describe(tokens)}."
    if not torch.equal(tokens.long(), greedy):
        first = int((tokens.long() != greedy)[0].nonzero()[0])
        return "tokens", (f"{where}: the tokens should be the target's greedy ones,\n{greedy[0].tolist()}\nbut they are\n"
                          f"{tokens[0].tolist()}\n(first difference at new token {first}). Keep the longest prefix of "
                          "the proposal on which the target's own choice agrees, then the target's choice at the first "
                          "disagreement (or after the last proposal): nothing else.")
    if type(reported) is not int:
        return "count", f"{where}: target_calls should be an int, not {describe(reported)}."
    if reported != counted:
        return "count", (f"{where}: target_calls is {reported}, but the target was called {counted} times. Count the "
                         "forward passes of the target only (not the draft's, not tokens, not rounds).")
    if counted > steps:
        return "calls", (f"{where}: the target was called {counted} times for {steps} tokens: every call must yield at "
                         "least one token (the target's own choice after the accepted prefix).")
    if calls is not None and counted != calls:
        return "calls", (f"{where}: the target should be called {calls} times, but it was called {counted} times. Each "
                         "round proposes min(k, steps left - 1) tokens, calls the target once on the sequence with the "
                         "proposal, and keeps the accepted prefix plus the target's own next token (the bonus token "
                         "when every proposal is accepted).")
    return None
