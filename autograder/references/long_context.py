"""What is right in notebook 10, long context: the sink-window mask written as a loop, the tokens a
rolling KV cache keeps, linear attention in its quadratic form (float64), and how the checks run a
student's RollingKVCache and watch what it holds."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..grader.cases import case as case_of_check
from ..grader.compare import describe
from ..grader.diagnosis import Mistake, MistakeFound, matching, through
from ..grader.inputs import generator, randn
from ..grader.memory import watched_call
from ..grader.student import call_student, expect_error, harness, probe
from ..grader.verify import Case
from ..kernel.call import Outcome
from ..kernel.guard import ATTENTION_BUILTINS
from ..kernel.watches import TensorWatch
from ..shared.errors import fail


def sink_window_reference(n: int, m: int, window: int, sinks: int = 0) -> torch.Tensor:
    """The mask by its definition, one pair at a time: query i sits at p = i + m - n; key j is allowed when
    0 <= p - j < window, or when j < sinks and j <= p."""
    mask = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        p = i + m - n
        for j in range(m):
            mask[i, j] = (0 <= p - j < window) or (j < sinks and j <= p)
    return mask


def kept_positions(seen: int, window: int, sinks: int) -> list[int]:
    """The positions a rolling cache holds after ``seen`` tokens: the first ``sinks`` and the last ``window``."""
    return sorted(set(range(min(sinks, seen))) | set(range(max(0, seen - window), seen)))


def rolling_tokens(gen: torch.Generator, batch: int, kv_heads: int, d_head: int, count: int,
                   dtype=torch.float64) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """``count`` random tokens ``(k, v)``, each ``(batch, kv_heads, 1, d_head)``."""
    return tuple((torch.randn(batch, kv_heads, 1, d_head, generator=gen, dtype=torch.float64).to(dtype),
                  torch.randn(batch, kv_heads, 1, d_head, generator=gen, dtype=torch.float64).to(dtype))
                 for _ in range(count))


def rolling_scenario(RollingKVCache, batch, kv_heads, window, sinks, d_head, tokens, dtype=torch.float32):  # noqa: N803
    """Probe: append the tokens one at a time, as a decoder does; return what the caller saw after each append.

    After each append the caller overwrites its own ``k`` and ``v`` with NaN (a decoder reuses its
    buffers). What an append returned is copied at once (it is valid until the next append).
    Returns ``(lengths, keys, values, positions)``: ``len(cache)`` before the first append and
    after each one (a tensor), then per append the kept keys, values and positions.
    """
    cache = RollingKVCache(batch, kv_heads, window, sinks, d_head, dtype=dtype)
    lengths, keys, values, positions = [len(cache)], [], [], []
    for k, v in tokens:
        k, v = k.clone(), v.clone()
        returned = cache.append(k, v)
        if not (isinstance(returned, tuple) and len(returned) == 3
                and all(isinstance(t, torch.Tensor) for t in returned)):
            raise TypeError(f"cache.append(k, v) should return a tuple (keys, values, positions) of tensors, but it "
                            f"returned {describe(returned)}")
        k.fill_(float("nan"))
        v.fill_(float("nan"))
        keys.append(returned[0].detach().clone())
        values.append(returned[1].detach().clone())
        positions.append(returned[2].detach().clone())
        lengths.append(len(cache))
    return torch.tensor(lengths), tuple(keys), tuple(values), tuple(positions)


def rolling_expected(batch, kv_heads, window, sinks, d_head, tokens, dtype=torch.float32):
    """The reference outcome of :func:`rolling_scenario`: the kept tokens, in the order of their positions."""
    all_k = torch.cat([k for k, _ in tokens], dim=2).to(dtype)
    all_v = torch.cat([v for _, v in tokens], dim=2).to(dtype)
    lengths, keys, values, positions = [0], [], [], []
    for seen in range(1, len(tokens) + 1):
        kept = torch.tensor(kept_positions(seen, window, sinks), dtype=torch.long)
        keys.append(all_k[:, :, kept])
        values.append(all_v[:, :, kept])
        positions.append(kept)
        lengths.append(seen)
    return torch.tensor(lengths), tuple(keys), tuple(values), tuple(positions)


def rolling_bytes_held(RollingKVCache, batch, kv_heads, window, sinks, d_head, count, dtype=torch.float32):  # noqa: N803
    """Probe: the bytes of tensors still alive after ``count`` appends that were allocated during them.

    The tokens are made inside the watch and dropped by the caller after their append, so a
    cache that keeps them (or copies of them) is charged for them; what an append returns is
    dropped too. Only the cache can hold what remains.
    """
    gen = torch.Generator().manual_seed(0)
    watch = TensorWatch([], rows=1 << 30, cols=1 << 30, max_elements=1 << 62)
    with watch:
        cache = RollingKVCache(batch, kv_heads, window, sinks, d_head, dtype=dtype)
        for _ in range(count):
            k = torch.randn(batch, kv_heads, 1, d_head, generator=gen, dtype=dtype)
            v = torch.randn(batch, kv_heads, 1, d_head, generator=gen, dtype=dtype)
            returned = cache.append(k, v)
            del k, v, returned
    held = watch.current
    del cache
    return held


#: Appends of the storage watch, and the bytes a cache may hold after them in units of its own storage.
HELD_STEPS = (24, 96)
HELD_ALLOWANCE = 3


def storage_bytes(batch, kv_heads, window, sinks, d_head, dtype=torch.float32) -> int:
    """The bytes of a rolling cache's keys and values: 2 * batch * kv_heads * (sinks + window) * d_head elements."""
    return 2 * batch * kv_heads * (sinks + window) * d_head * torch.empty((), dtype=dtype).element_size()


def held_problem(held: list[int], batch, kv_heads, window, sinks, d_head) -> str | None:
    """A message when the bytes a cache holds grow with the tokens seen or exceed a few times its storage."""
    storage = storage_bytes(batch, kv_heads, window, sinks, d_head)
    allowed = HELD_ALLOWANCE * storage
    if max(held) <= allowed:
        return None
    counts = " and ".join(f"{n} appends it holds {b:,} bytes" for n, b in zip(HELD_STEPS, held))
    return (f"A RollingKVCache({batch}, {kv_heads}, window={window}, sinks={sinks}, {d_head}) must hold constant "
            f"storage: keys and values of sinks + window = {sinks + window} tokens, {storage:,} bytes. After "
            f"{counts} of tensors made during the appends (at most {allowed:,} are allowed). A cache whose memory "
            f"grows with the tokens seen keeps tokens it should have evicted (a growing list, torch.cat). Allocate "
            f"the (batch, kv_heads, sinks + window, d_head) storage once and overwrite the oldest token of the "
            f"window in place.")


def phi(x: torch.Tensor) -> torch.Tensor:
    """The feature map of linear attention: elu(x) + 1, positive everywhere."""
    return F.elu(x) + 1


def linear_quadratic(Q, K, V, is_causal=False, eps=1e-6):
    """Linear attention in its quadratic form, in float64: (phi(Q) phi(K)^T, masked) V / (row sums + eps)."""
    q, k, v = (t.detach().to(torch.float64) for t in (Q, K, V))
    A = phi(q) @ phi(k).transpose(-2, -1)
    if is_causal:
        n = A.shape[-2]
        A = A * torch.ones(n, n, dtype=torch.bool).tril()
    return ((A @ v) / (A.sum(-1, keepdim=True) + eps)).to(Q.dtype)


def recurrent_reference(Q, K, V, eps=1e-6):
    """What linear_attention_recurrent must return: the causal quadratic form and the final state from the sums."""
    fk = phi(K.detach().to(torch.float64))
    S = (fk.transpose(-2, -1) @ V.detach().to(torch.float64)).to(Q.dtype)
    return linear_quadratic(Q, K, V, is_causal=True, eps=eps), (S, fk.sum(-2).to(Q.dtype))


LINEAR_ARGS = ("Q", "K", "V")


def judge_rolling(got, expected, window: int, sinks: int, dtype=torch.float32) -> str | None:
    """A message saying how the outcome of :func:`rolling_scenario` differs from the expected one, or None."""
    lengths, keys, values, positions = got
    want_lengths, want_keys, want_values, want_positions = expected
    if not torch.equal(lengths, want_lengths):
        return (f"len(cache) before the first append and after each append should be {want_lengths.tolist()} (the "
                f"number of tokens seen, evicted ones included), but it is {lengths.tolist()}.")
    for step in range(len(want_keys)):
        seen = step + 1
        what = f"After append number {seen} ({seen} tokens seen), the"
        got_p, want_p = positions[step], want_positions[step]
        if got_p.dtype != torch.long or got_p.dim() != 1:
            return (f"{what} positions should be a 1-D tensor of dtype torch.long (int64), but they are "
                    f"{describe(got_p)}.")
        if not torch.equal(got_p, want_p):
            shown = want_p.tolist()
            hints = []
            if sorted(got_p.tolist()) == shown:
                hints.append("They are the right tokens out of order: return them sorted by position (the sinks, "
                             "then the window from oldest to newest), not in the order of the storage's slots.")
            lost = [p for p in range(min(sinks, seen)) if p not in got_p.tolist()]
            if lost:
                hints.append(f"The sink(s) at position(s) {lost} were evicted: the first sinks = {sinks} tokens stay "
                             "for ever, and only the window rolls.")
            return (f"{what} cache should hold the positions {shown} (the first sinks = {sinks} tokens and the last "
                    f"window = {window}, the new one included), in order, but it returned positions "
                    f"{got_p.tolist()}." + ("\n" + " ".join(hints) if hints else ""))
        for name, got_all, want_all in [("keys", keys, want_keys), ("values", values, want_values)]:
            g, w = got_all[step], want_all[step]
            label = f"{what} {name} returned (the tokens at positions {want_p.tolist()})"
            if g.dtype != w.dtype:
                return f"{label} should have the cache's dtype {w.dtype}, but they have dtype {g.dtype}."
            if tuple(g.shape) != tuple(w.shape):
                return f"{label} should have shape {tuple(w.shape)}, but they have shape {tuple(g.shape)}."
            if not bool(((g == w) | (g.isnan() & w.isnan())).all()):
                hint = ""
                if torch.isnan(g).any():
                    hint = ("\nNaN appears where the caller's tensors were: after each append the check overwrites the "
                            "k and v it passed, so the cache must copy them into its own storage, not keep them.")
                return (f"{label} differ from the tokens appended at those positions: the largest difference is "
                        f"{(g.double() - w.double()).abs().nan_to_num(float('inf')).max().item():.3g}.{hint}")
    return None


ROLLING_NAMES = ("batch", "kv_heads", "window", "sinks", "d_head")


def rolling_case(seed: int, batch: int, kv_heads: int, window: int, sinks: int, d_head: int, count: int,
                 label: str, dtype=torch.float64, token_dtype=torch.float64) -> Case:
    """A cache's sizes and ``count`` random tokens of ``token_dtype``, appended one at a time."""
    tokens = rolling_tokens(generator(seed), batch, kv_heads, d_head, count, token_dtype)
    return Case((batch, kv_heads, window, sinks, d_head, tokens), {"dtype": dtype}, label)


def _scenario_of(cache_class):
    def scenario(*args, **kwargs):
        return rolling_scenario(cache_class, *args, **kwargs)

    return scenario


def check_rolling_cases(RollingKVCache, cases: Sequence[Case], mistakes: Sequence[Mistake] = ()) -> None:  # noqa: N803
    """Run :func:`rolling_scenario` on every case, compare with the kept tokens, name the mistakes that fit."""
    diagnosable = through(mistakes, _scenario_of)
    for case in cases:
        batch, kv_heads, window, sinks, d_head, tokens = case.args
        dtype = case.kwargs.get("dtype", torch.float32)
        shape = f"RollingKVCache({batch}, {kv_heads}, window={window}, sinks={sinks}, {d_head}, dtype={dtype})"
        with case_of_check(case.label or shape, case.weight):
            got = probe(rolling_scenario, RollingKVCache, *case.args, what=f"{shape} with {len(tokens)} appends of "
                        "one token", forbid=ATTENTION_BUILTINS, **case.kwargs)
            problem = judge_rolling(got, rolling_expected(*case.args, **case.kwargs), window, sinks)
            if problem is None:
                continue
            message = (f"With a cache {shape} and {len(tokens)} tokens appended one at a time ({case.label}):\n"
                       f"{problem}")
            found = matching(Outcome(value=got), diagnosable, case.args, case.kwargs, rtol=0, atol=0)
            raise MistakeFound(message, found)


def held_bytes_problem(RollingKVCache, batch=1, kv_heads=2, window=3, sinks=2, d_head=4) -> str | None:  # noqa: N803
    """The bytes the student's cache holds after the appends of :data:`HELD_STEPS`; a message when too many."""
    held = [probe(rolling_bytes_held, RollingKVCache, batch, kv_heads, window, sinks, d_head, count,
                  what=f"RollingKVCache({batch}, {kv_heads}, window={window}, sinks={sinks}, {d_head}) and {count} "
                       "appends of one token", forbid=ATTENTION_BUILTINS)
            for count in HELD_STEPS]
    return held_problem(held, batch, kv_heads, window, sinks, d_head)


#: What to do instead of an n x m tensor, by exercise.
LINEAR_ADVICE = {
    "linear_attention": "Linear attention never builds it, not even as a causal mask: sum phi(k_j) v_j^T first (a "
                        "(d, d_v) matrix, or its prefix sums (n, d, d_v) when causal), then multiply by phi(q_i).",
    "linear_attention_recurrent": "The recurrent form keeps only its state: S (d, d_v) and z (d,), updated by each "
                                  "token, read by its query.",
}


def watch_linear(fn, exercise: str, args: tuple, kwargs: dict) -> None:
    """Run ``fn`` under the watch: no tensor with the n x m scores' number of elements (or two long axes).

    The recurrent form is held to its state: no tensor as large as the n outer products phi(k_j) v_j^T
    either, the prefix sums of the parallel form (a recurrence that calls it is not one).
    """
    n, m = args[0].shape[-2], args[1].shape[-2]
    limit = n * m
    if exercise == "linear_attention_recurrent":
        limit = min(limit, n * args[0].shape[-1] * args[2].shape[-1])
    value, watch = watched_call(fn, args, kwargs, exercise=exercise, rows=n, cols=m, max_elements=limit,
                                forbid=ATTENTION_BUILTINS)
    if watch["offender"] is not None:
        op, shape = watch["offender"]
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(LINEAR_ARGS, args))
        flags = "".join(f", {k}={v}" for k, v in kwargs.items())
        size = torch.Size(shape).numel()
        what = (f"as big as the n x m = {n} x {m} matrix phi(Q) phi(K)^T" if size >= n * m or limit == n * m else
                f"as big as the n = {n} outer products phi(k_j) v_j^T ({limit} numbers), the prefix sums of the "
                "parallel form")
        fail(f"With {shapes}{flags}: {exercise} allocated a tensor of shape {tuple(shape)} (in {op}), {what}. "
             f"{LINEAR_ADVICE[exercise]}")
    return value


def expect_append_errors(RollingKVCache) -> None:  # noqa: N803
    """A RollingKVCache(1, 2, 3, 1, 4) refuses a token of the wrong shape (the text's ValueError); a case each,
    each with a cache of its own."""
    for shape, why in [((1, 2, 2, 4), "append takes one token at a time"), ((1, 3, 1, 4), "the cache has 2 "
                       "key/value heads, not 3"), ((1, 2, 1, 5), "the cache has d_head = 4, not 5")]:
        what = f"cache.append(k {shape}, v {shape}) with a RollingKVCache(1, 2, 3, 1, 4)"
        with case_of_check(f"{what} raises ValueError"):
            cache = call_student(RollingKVCache, 1, 2, 3, 1, 4, what="RollingKVCache(1, 2, 3, 1, 4)")
            expect_error(cache.append, torch.zeros(shape), torch.zeros(shape), error=ValueError, why=why, what=what)


def expect_shape_errors(fn, exercise: str, gen: torch.Generator) -> None:
    """The shapes that do not fit, refused with a ValueError: linear attention's three, the recurrence's three."""
    if exercise == "linear_attention":
        cases = [((3, 4), (5, 4), (5, 2), {"is_causal": True}, "the causal form needs as many queries as keys (n = 3, "
                  "m = 5)"),
                 ((3, 4), (5, 3), (5, 2), {}, "Q and K differ in d (4 and 3)"),
                 ((3, 4), (5, 4), (6, 2), {}, "K has 5 keys but V has 6 values")]
    else:
        cases = [((4, 3), (5, 3), (5, 2), {}, "the recurrence reads one query per key: n = 4 queries, m = 5 keys"),
                 ((5, 4), (5, 3), (5, 2), {}, "Q and K differ in d (4 and 3)"),
                 ((5, 3), (5, 3), (6, 2), {}, "K has 5 keys but V has 6 values")]
    for q, k, v, kwargs, why in cases:
        flags = "".join(f", {key}={value}" for key, value in kwargs.items())
        expect_error(fn, randn(*q, gen=gen), randn(*k, gen=gen), randn(*v, gen=gen), error=ValueError, why=why,
                     what=f"{exercise}(Q {q}, K {k}, V {v}{flags})", **kwargs)


@harness
def run_recurrent(linear_attention_recurrent):
    """How a check runs the recurrent form: its result checked for structure and flattened to (output, S, z)."""

    def run(Q, K, V, eps=1e-6):
        result = linear_attention_recurrent(Q, K, V, eps=eps)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], tuple)
                and len(result[1]) == 2):
            fail(f"linear_attention_recurrent should return (output, (S, z)), but it returned {describe(result)}.")
        output, (S, z) = result
        return output, S, z

    return run


def recurrent_flat(Q, K, V, eps=1e-6):
    """The reference of :func:`run_recurrent`'s result: (output, S, z)."""
    output, (S, z) = recurrent_reference(Q, K, V, eps)
    return output, S, z


RECURRENT_OUTPUTS = ("output", "final state S", "final normaliser z")
