"""What is right in notebook 09, decoding and training: the references of decoding (PyTorch's
attention with RoPE), how a KV cache and decode_step are run and what they may allocate, and the
steps of checking both kinds of checks run. The tiny decoder's references are in
:mod:`autograder.references.tiny_decoder`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..grader.cases import case as case_of_check
from ..grader.compare import assert_close, assert_shape, assert_tensor, describe
from ..grader.diagnosis import Mistake, MistakeFound, diagnose, through
from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import call_student, expect_error, harness, probe
from ..grader.verify import Case
from ..kernel.call import Outcome
from ..kernel.watches import AllocationMeter
from ..shared.errors import CheckFailed, fail


def rope_reference(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE as complex multiplication: pair (2i, 2i+1) times e^(i * position * base^(-2i/d)), in float64."""
    half = x.shape[-1] // 2
    freqs = torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * torch.arange(half, dtype=torch.float64)
                      / x.shape[-1])
    phase = torch.outer(positions.to(torch.float64), freqs)
    pairs = torch.view_as_complex(x.detach().to(torch.float64).unflatten(-1, (half, 2)).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(phase), phase)).flatten(-2).to(x.dtype)


def causal_rope_attention(q, k, v, rope_base=10000.0):
    """Causal self-attention over the whole sequence, RoPE at positions 0..T-1, grouped heads.

    Returns ``(output, weights, rotated keys)``: SDPA's output, its weights (SDPA applied to
    the identity as values) and the keys as a cache must hold them, rotated.
    """
    T = q.shape[-2]
    positions = torch.arange(T)
    q_rot, k_rot = rope_reference(q, positions, rope_base), rope_reference(k, positions, rope_base)
    output = math_sdpa(q_rot, k_rot, v, is_causal=True, enable_gqa=True)
    identity = torch.eye(T, dtype=v.dtype).expand(*v.shape[:-2], T, T).contiguous()
    weights = math_sdpa(q_rot, k_rot, identity, is_causal=True, enable_gqa=True)
    return output, weights, k_rot


def decode_reference(q, k, v, steps, rope_base=10000.0):
    """What decoding in ``steps`` must give: the whole sequence at once, whatever the steps."""
    return causal_rope_attention(q, k, v, rope_base)


def cache_scenario(KVCache, batch, kv_heads, max_len, d_head, chunks, dtype=torch.float32):  # noqa: N803
    """Append the ``(k, v)`` chunks in turn, as a decoder does; return what the caller saw.

    After each append the caller overwrites its own ``k`` and ``v`` with NaN (a decoder reuses
    its buffers). Returns ``(lengths, keys, values)``: ``len(cache)`` before the first append
    and after each one (a tensor), and the keys and values each append returned, read after the
    last append, so that a view a later append changed shows the change.
    """
    cache = KVCache(batch, kv_heads, max_len, d_head, dtype=dtype)
    lengths, keys, values = [len(cache)], [], []
    for k, v in chunks:
        k, v = k.clone(), v.clone()
        returned = cache.append(k, v)
        if not (isinstance(returned, tuple) and len(returned) == 2
                and all(isinstance(t, torch.Tensor) for t in returned)):
            raise TypeError(f"cache.append(k, v) should return a pair (keys, values) of tensors, but it returned "
                            f"{describe(returned)}")
        k.fill_(float("nan"))
        v.fill_(float("nan"))
        keys.append(returned[0])
        values.append(returned[1])
        lengths.append(len(cache))
    return (torch.tensor(lengths), tuple(t.detach().clone() for t in keys), tuple(t.detach().clone() for t in values))


def cache_expected(batch, kv_heads, max_len, d_head, chunks, dtype=torch.float32):
    """The reference outcome of :func:`cache_scenario`: every chunk so far, concatenated, in ``dtype``."""
    lengths, keys, values, seen_k, seen_v = [0], [], [], [], []
    for k, v in chunks:
        seen_k.append(k.to(dtype))
        seen_v.append(v.to(dtype))
        keys.append(torch.cat(seen_k, dim=2))
        values.append(torch.cat(seen_v, dim=2))
        lengths.append(keys[-1].shape[2])
    return torch.tensor(lengths), tuple(keys), tuple(values)


def judge_cache(got, expected, chunks) -> str | None:
    """A message saying how the outcome of :func:`cache_scenario` differs from the expected one, or None."""
    lengths, keys, values = got
    want_lengths, want_keys, want_values = expected
    if not torch.equal(lengths, want_lengths):
        return (f"len(cache) before the first append and after each append should be {want_lengths.tolist()} "
                f"(the number of tokens held), but it is {lengths.tolist()}.")
    sizes = [k.shape[2] for k, _ in chunks]
    for name, got_all, want_all in [("keys", keys, want_keys), ("values", values, want_values)]:
        for step, (g, w) in enumerate(zip(got_all, want_all)):
            what = (f"The {name} returned by append number {step + 1} (of {sizes[step]} token(s), to a cache holding "
                    f"{int(want_lengths[step])}), read after the last append,")
            try:
                assert_tensor(g, what)
                if g.dtype != w.dtype:
                    fail(f"{what} should have the cache's dtype {w.dtype}, but they have dtype {g.dtype}.")
                assert_close(g, w, what, rtol=0, atol=0)
            except CheckFailed as problem:
                hints = []
                if g.shape == w.shape and torch.isnan(g).any():
                    hints.append("NaN appears where the caller's tensors were: after each append the check overwrites "
                                 "the k and v it passed, so the cache must copy them into its own storage, not keep "
                                 "them.")
                elif tuple(g.shape[:2]) == tuple(w.shape[:2]) and g.shape[2] != w.shape[2]:
                    hints.append(f"Return the views storage[:, :, :len] of the first len(cache) = "
                                 f"{int(want_lengths[step + 1])} positions, not the whole storage.")
                last = chunks[-1][0 if name == "keys" else 1].to(w.dtype)
                shown = min(g.shape[2], last.shape[2])
                if (step + 1 < len(got_all) and g.shape == w.shape and g.dtype == w.dtype
                        and torch.equal(g[:, :, :shown], last[:, :, :shown])):
                    hints.append("These are the values of the last append: a view returned earlier must not be "
                                 "changed by later appends.")
                return str(problem) + ("\n" + " ".join(hints) if hints else "")
    return None


def cache_allocations(KVCache, batch, kv_heads, max_len, d_head, steps, dtype=torch.float32):  # noqa: N803
    """Probe: bytes of new tensors allocated by appends 2 to ``steps`` of one token each, and how many by torch.cat.

    The first append is not counted: it may allocate the storage. Returns ``(total, by_cat)``.
    """
    cache = KVCache(batch, kv_heads, max_len, d_head, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randn(batch, kv_heads, 1, d_head, generator=gen, dtype=dtype) for _ in range(2 * steps)]
    cache.append(tokens[0], tokens[1])
    with AllocationMeter() as meter:
        for i in range(1, steps):
            cache.append(tokens[2 * i], tokens[2 * i + 1])
    return meter.allocated, meter.by_op.get("aten.cat.default", 0)


#: Appends of one token each in the allocation check, and the bytes of new tensors they may allocate, per
#: append, in units of one token of keys and values: preallocated storage needs none.
COPY_STEPS = 64


COPY_ALLOWANCE = 4


def allocation_problem(allocated: int, batch, kv_heads, d_head, dtype) -> str | None:
    """A message when appends allocate memory that grows with the length of the cache, or None."""
    token = 2 * batch * kv_heads * d_head * torch.empty((), dtype=dtype).element_size()
    allowed = COPY_ALLOWANCE * (COPY_STEPS - 1) * token
    if allocated <= allowed:
        return None
    return (f"Appending {COPY_STEPS} tokens one at a time, appends 2 to {COPY_STEPS} allocated {allocated:,} bytes of "
            f"new tensors in all, {allocated / token:.0f} times the {token} bytes of one token of keys and values: "
            f"each append copies everything held so far (torch.cat, or a copy of what it returns), so decoding n "
            f"tokens copies O(n^2) numbers. Allocate the (batch, kv_heads, max_len, d_head) storage once, write "
            f"each new token into it, and return views of it (at most {allowed:,} bytes are allowed here).")


def check_cache_cases(KVCache, cases: Sequence[Case], mistakes: Sequence[Mistake] = ()) -> None:  # noqa: N803
    """Run :func:`cache_scenario` on every case and compare with the concatenation of the chunks."""
    names = ("batch", "kv_heads", "max_len", "d_head")
    diagnosable = through(mistakes, _scenario_of)
    for case in cases:
        batch, kv_heads, max_len, d_head, chunks = case.args
        shape = f"KVCache({batch}, {kv_heads}, {max_len}, {d_head}, dtype={case.kwargs.get('dtype', torch.float32)})"
        sizes = [k.shape[2] for k, _ in chunks]
        with case_of_check(case.label or f"{shape} with appends of {sizes} tokens", case.weight):
            got = probe(cache_scenario, KVCache, *case.args, what=f"{shape} with appends of {sizes} tokens",
                        **case.kwargs)
            problem = judge_cache(got, cache_expected(*case.args, **case.kwargs), chunks)
            if problem is not None:
                context = ", ".join(f"{n} = {v}" for n, v in zip(names, case.args))
                message = f"With a cache {shape} ({context}) and appends of {sizes} tokens ({case.label}):\n{problem}"
                mistake = diagnose(Outcome(value=got), diagnosable, case.args, case.kwargs, rtol=0, atol=0)
                raise MistakeFound(message, [mistake] if mistake else [])


def _scenario_of(cache_class):
    def scenario(*args, **kwargs):
        return cache_scenario(cache_class, *args, **kwargs)

    return scenario


def cache_chunks(gen, batch, kv_heads, d_head, sizes, dtype=torch.float64):
    """Random ``(k, v)`` chunks of the given numbers of tokens."""
    return tuple((randn(batch, kv_heads, t, d_head, gen=gen, dtype=dtype), randn(batch, kv_heads, t, d_head, gen=gen,
                                                                              dtype=dtype)) for t in sizes)


def check_full_cache(KVCache, batch, kv_heads, max_len, d_head, held, extra) -> BaseException | None:  # noqa: N803
    """A cache holding ``held`` tokens of ``max_len`` refuses ``extra`` more with a ValueError naming both lengths."""
    gen = generator(90)
    shape = f"KVCache({batch}, {kv_heads}, {max_len}, {d_head})"
    what = f"cache.append(k, v) of {extra} tokens to a {shape} holding {held}"
    cache = call_student(KVCache, batch, kv_heads, max_len, d_head, what=shape)
    for k, v in cache_chunks(gen, batch, kv_heads, d_head, [held], torch.float32):
        call_student(cache.append, k, v, what=f"cache.append(k, v) of {held} tokens to an empty {shape}")
    k, v = cache_chunks(gen, batch, kv_heads, d_head, [extra], torch.float32)[0]
    error = expect_error(cache.append, k, v, error=ValueError, what=what,
                         why=f"{held} + {extra} = {held + extra} tokens do not fit in max_len = {max_len}")
    if str(max_len) not in str(error) or str(held + extra) not in str(error):
        fail(f"{what} raised ValueError: {error}\nThe message should name both lengths: max_len = {max_len} and "
             f"the {held + extra} tokens the cache would hold, so that whoever reads it knows what to enlarge.")
    return error


def require_cache(KVCache, exercise: str) -> None:  # noqa: N803
    """Stop with a clear message when the student's KVCache, which ``exercise`` is checked with, is wrong."""
    gen = generator(92)
    case = (1, 2, 6, 4, cache_chunks(gen, 1, 2, 4, [3, 1, 2]))
    got = probe(cache_scenario, KVCache, *case, dtype=torch.float64,
                what="KVCache(1, 2, 6, 4, dtype=torch.float64) with appends of [3, 1, 2] tokens")
    problem = judge_cache(got, cache_expected(*case, dtype=torch.float64), case[-1])
    if problem:
        fail(f"{exercise} is checked with your KVCache, which does not pass its own check yet:\n{problem}\n"
             "Fix KVCache first (section 2), then run this check again.")


@harness
def run_decode(decode_step, KVCache) -> Callable[..., Any]:  # noqa: N803
    """How a check runs ``decode_step``: a fresh cache, the sequence fed in ``steps``, then the cache read back.

    Returns ``(output, weights, key cache)``: the outputs of every step side by side
    ``(B, h, T, d)``, the weights of every step gathered in one ``(B, h, T, T)`` matrix (row i
    is the token at position i; keys that did not exist yet get 0), and the first T keys the
    cache holds at the end.
    """

    def run(q, k, v, steps, rope_base=10000.0):
        B, h, T, d = q.shape
        g = k.shape[1]
        cache = KVCache(B, g, T + 1, d, dtype=q.dtype)
        outputs, weights, start = [], torch.zeros(B, h, T, T, dtype=q.dtype), 0
        for t in steps:
            what = f"decode_step on the tokens at positions {start}..{start + t - 1} (a cache holding {start})"
            result = decode_step(q[:, :, start:start + t], k[:, :, start:start + t], v[:, :, start:start + t], cache,
                                 rope_base)
            if not (isinstance(result, tuple) and len(result) == 2):
                fail(f"{what} should return a tuple (output, weights), but it returned {describe(result)}.")
            output, w = result
            assert_tensor(output, f"The output of {what}")
            assert_tensor(w, f"The weights of {what}")
            assert_shape(output, (B, h, t, v.shape[-1]), f"The output of {what}")
            assert_shape(w, (B, h, t, start + t), f"The weights of {what} (one row per new token, one column per "
                         "key: the cached ones and the new ones)")
            outputs.append(output)
            weights[:, :, start:start + t, :start + t] = w
            start += t
        keys, _ = cache.append(k.new_zeros(B, g, 1, d), v.new_zeros(B, g, 1, v.shape[-1]))
        return torch.cat(outputs, dim=-2), weights, keys[:, :, :T]

    return run


DECODE_ARGS = ("q", "k", "v", "steps")


DECODE_OUTPUTS = ("output", "weights", "key cache")


def decode_case(gen, B, h, g, d, steps, label, rope_base=None, dtype=torch.float64) -> Case:
    """Queries, keys and values of a whole sequence, fed to decode_step in ``steps``."""
    T = sum(steps)
    args = (randn(B, h, T, d, gen=gen, dtype=dtype), randn(B, g, T, d, gen=gen, dtype=dtype),
            randn(B, g, T, d, gen=gen, dtype=dtype), list(steps))
    return Case(args, {} if rope_base is None else {"rope_base": rope_base}, label)
