"""Hidden checks and mistake catalogue for notebook 07 (instructor-only).

Besides the values, the attention checks watch the tensors the student's function
allocates (:class:`autograder.kernel.watches.TensorWatch`, a ``TorchDispatchMode`` that sees every PyTorch
operation, composite ones included): ``chunked_attention`` and ``flash_attention`` must
never allocate an n x m tensor, ``flash_attention`` must tile the keys as well as the
queries, and the bytes it keeps alive at once must stay well below one n x m matrix. On a case
large enough for one n x m matrix to stand out (n = m = 4096), the memory of both is measured from
outside the kernel where grading has a control group (:func:`autograder.grader.memory.memory_rise`), which
code written to fool a watch cannot change.
"""

from __future__ import annotations

import math

import torch

from ..grader.cases import case
from ..grader.compare import assert_close, assert_tensor
from ..grader.diagnosis import read_mistakes
from ..grader.inputs import generator, randn
from ..grader.memory import (
    MEMORY_CASE_BLOCK,
    MEMORY_CASE_D,
    MEMORY_CASE_DTYPE,
    MEMORY_CASE_N,
    MEMORY_RISE_BOUND,
    memory_message,
    memory_rise,
    tiled_budget,
    watched_call,
)
from ..grader.student import call_student, expect_error
from ..grader.variation import decisions
from ..grader.verify import Case, verify, verify_number
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.complexity import (
    FIT_ATOL,
    FIT_RTOL,
    FLOPS_ARGS,
    MEMORY_ARGS,
    assert_bool_mask,
    sdpa_reference,
    very_negative_scores,
)
from ..shared.errors import fail
from . import hidden

# --- the references, with the decisions their catalogued mistakes get wrong -------------------------------------


@decisions("per_multiply_add", "value_size", "keys", "heads_counted", "batch_counted")
def flops(batch, heads, n, m, d_k, d_v, *, per_multiply_add=2, value_size="d_v", keys="m", heads_counted=True,
          batch_counted=True):
    """The FLOPs of Q K^T and A V; with no decision changed, what the check expects."""
    width = d_k + {"d_v": d_v, "d_k": d_k, "not counted": 0}[value_size]
    return (per_multiply_add * (batch if batch_counted else 1) * (heads if heads_counted else 1) * n
            * (m if keys == "m" else n) * width)


@decisions("bytes_per_entry", "in_bits", "matrices", "keys", "heads_counted")
def score_bytes(batch, heads, n, m, dtype, *, bytes_per_entry=None, in_bits=False, matrices=1, keys="m",
                heads_counted=True):
    """The bytes of one (batch, heads, n, m) matrix in ``dtype``; with no decision changed, what the check expects."""
    size = torch.finfo(dtype).bits if in_bits else bytes_per_entry or torch.empty((), dtype=dtype).element_size()
    return matrices * batch * (heads if heads_counted else 1) * n * (m if keys == "m" else n) * size


@decisions("log_sizes", "log_costs", "intercept", "regressed_on")
def power_law_fit(ns, costs, *, log_sizes=True, log_costs=True, intercept=True, regressed_on="sizes"):
    """The least-squares slope of log(cost) against log(n), in Python floats."""
    if len(ns) != len(costs) or len(ns) < 2 or min(ns) <= 0 or min(costs) <= 0:
        raise ValueError(f"need as many positive sizes as positive costs, at least 2: got {ns} and {costs}")
    x = [math.log(v) if log_sizes else float(v) for v in ns]
    y = [math.log(v) if log_costs else float(v) for v in costs]
    if not intercept:  # the line through the origin
        return sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x)
    mx, my = sum(x) / len(x), sum(y) / len(y)
    spread = sum((a - mx) ** 2 for a in x) if regressed_on == "sizes" else sum((b - my) ** 2 for b in y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / spread


def fit_end_points(ns, costs):  # another algorithm: two points instead of a least-squares fit
    return math.log(costs[-1] / costs[0]) / math.log(ns[-1] / ns[0])


@decisions("keep_last_chunk", "into_zeros", "alignment", "scaled", "softmax_dim")
def chunked(Q, K, V, chunk_size, is_causal=False, *, keep_last_chunk=True, into_zeros=False, alignment="top-left",
            scaled=True, softmax_dim=-1):
    """Softmax attention a chunk of queries at a time."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or chunk_size < 1:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, chunk_size={chunk_size}")
    n, m = Q.shape[-2], K.shape[-2]
    outputs = []
    out = torch.zeros(*Q.shape[:-1], V.shape[-1], dtype=Q.dtype) if into_zeros else None
    for start in range(0, n if keep_last_chunk else n - chunk_size + 1, chunk_size):
        scores = Q[..., start:start + chunk_size, :] @ K.transpose(-2, -1)
        if scaled:
            scores = scores / math.sqrt(Q.shape[-1])
        if is_causal:
            rows = torch.arange(start, start + scores.shape[-2])[:, None]
            if alignment != "top-left":
                rows = rows + (m - n) if alignment == "bottom-right" else rows - start
            scores = scores.masked_fill(torch.arange(m) > rows, float("-inf"))
        if into_zeros:
            out[..., start:start + chunk_size, :] = torch.softmax(scores, dim=softmax_dim) @ V
        else:
            outputs.append(torch.softmax(scores, dim=softmax_dim) @ V)
    return out if into_zeros else torch.cat(outputs, dim=-2)


@decisions("scaled", "start_max", "subtract_max", "rescale_sum", "rescale_accumulator", "divide_by_sum",
           "keep_last_key_block", "keep_last_query_block", "into_zeros", "alignment")
def flash(Q, K, V, block_size, is_causal=False, *, scaled=True, start_max=float("-inf"), subtract_max=True,
          rescale_sum=True, rescale_accumulator=True, divide_by_sum=True, keep_last_key_block=True,
          keep_last_query_block=True, into_zeros=False, alignment="top-left"):
    """The online softmax over blocks of queries and keys."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or block_size < 1:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, block_size={block_size}")
    n, m = Q.shape[-2], K.shape[-2]
    if scaled:
        Q = Q / math.sqrt(Q.shape[-1])
    outputs = []
    out = torch.zeros(*Q.shape[:-1], V.shape[-1], dtype=Q.dtype) if into_zeros else None
    for q0 in range(0, n if keep_last_query_block else n - block_size + 1, block_size):
        q = Q[..., q0:q0 + block_size, :]
        row_max = torch.full((*q.shape[:-1], 1), start_max, dtype=Q.dtype)
        row_sum = torch.zeros((*q.shape[:-1], 1), dtype=Q.dtype)
        acc = torch.zeros((*q.shape[:-1], V.shape[-1]), dtype=Q.dtype)
        for k0 in range(0, m if keep_last_key_block else m - block_size + 1, block_size):
            s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
            if is_causal:
                i = torch.arange(q0, q0 + s.shape[-2])[:, None] + (m - n if alignment == "bottom-right" else 0)
                j = torch.arange(k0, k0 + s.shape[-1])
                if alignment == "block-local":
                    i, j = i - q0, j - k0
                s = s.masked_fill(j > i, float("-inf"))
            # without the max, exp of the raw scores: the max taken as 0 throughout (exp(s - 0) is exp(s) exactly)
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True)) if subtract_max else torch.zeros_like(row_max)
            p = torch.exp(s - new_max)
            rescale = torch.exp(row_max - new_max)
            row_sum = (rescale * row_sum if rescale_sum else row_sum) + p.sum(dim=-1, keepdim=True)
            acc = (rescale * acc if rescale_accumulator else acc) + p @ V[..., k0:k0 + block_size, :]
            row_max = new_max
        if into_zeros:
            out[..., q0:q0 + block_size, :] = acc / row_sum if divide_by_sum else acc
        else:
            outputs.append(acc / row_sum if divide_by_sum else acc)
    return out if into_zeros else torch.cat(outputs, dim=-2)


@decisions("extra_keys", "past_only", "looking_ahead", "symmetric", "inverted")
def window_mask(n, window, *, extra_keys=0, past_only=True, looking_ahead=False, symmetric=False, inverted=False):
    """True where 0 <= i - j < window; with no decision changed, what the check expects."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i - j
    if looking_ahead:
        distance = -distance
    if symmetric:
        distance = distance.abs()
    mask = (distance < window + extra_keys) & ((distance >= 0) | (not past_only))
    return ~mask if inverted else mask


def _fit(ns, costs):
    """What the check expects of fit_power_law (in float64 tensors: not the Python floats of the catalogue's)."""
    x = torch.log(torch.tensor(ns, dtype=torch.float64))
    y = torch.log(torch.tensor(costs, dtype=torch.float64))
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/complexity.toml


# --- watching the tensors a function allocates ----------------------------------------------------


def _shapes(args: tuple) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip("QKV", args[:3]))


def _check_no_n_by_m(fn, exercise: str, size_name: str, *, is_causal: bool) -> None:
    """Config A: n = 40 and m = 45 are both longer than the block; no n x m tensor may appear."""
    gen = generator(700 + is_causal)
    Q, K, V = randn(2, 40, 3, gen=gen), randn(2, 45, 3, gen=gen), randn(2, 45, 4, gen=gen)
    args = (Q, K, V, 8)
    value, watch = watched_call(fn, args, {"is_causal": is_causal}, forbid=ATTENTION_BUILTINS, exercise=exercise,
                                rows=40, cols=45, max_elements=40 * 45)
    if watch["offender"] is not None:
        op, shape = watch["offender"]
        fail(f"With {_shapes(args)}, {size_name}=8, is_causal={is_causal}: {exercise} allocated a tensor of "
             f"shape {shape} (in {op}), as big as the n x m = 40 x 45 score matrix of a head. "
             + ("Compute the scores one chunk of queries at a time: (chunk_size x m) per head at most, and build "
                "a causal mask per chunk, not for the whole matrix." if exercise == "chunked_attention" else
                "FlashAttention never builds it, not even as a mask: work on blocks of queries and keys, keep "
                "a running max, a running sum and an output accumulator per query."))
    _check_value(value, args, is_causal, exercise)


def _check_value(value, args, is_causal, exercise) -> None:
    assert_close(value, sdpa_reference(*args, is_causal=is_causal), f"The result of {exercise}", rtol=1e-9,
                 atol=1e-11)


def _check_keys_tiled(flash_attention) -> None:
    """Config B: m = 70 keys, blocks of 6, d_k + d_v < 6: a block of queries against all keys is caught."""
    gen = generator(710)
    args = (randn(2, 20, 2, gen=gen), randn(2, 70, 2, gen=gen), randn(2, 70, 2, gen=gen), 6)
    value, watch = watched_call(flash_attention, args, {}, forbid=ATTENTION_BUILTINS, exercise="flash_attention",
                                rows=6, cols=70, max_elements=2 * 6 * 70)
    if watch["offender"] is not None:
        op, shape = watch["offender"]
        fail(f"With {_shapes(args)}, block_size=6: flash_attention allocated a tensor of shape {shape} (in {op}): "
             "a block of queries against all m = 70 keys. That is chunking the queries (section 4), not "
             "FlashAttention: tile the keys too, in blocks of block_size, and combine the blocks with the "
             "online softmax (running max, rescaled running sum, rescaled output accumulator).")
    _check_value(value, args, False, "flash_attention")


def _check_peak(flash_attention) -> None:
    """Config C: the bytes alive at once stay below half of one n x m matrix (no list of every block)."""
    gen = generator(720)
    args = (randn(1, 96, 2, gen=gen), randn(1, 96, 2, gen=gen), randn(1, 96, 2, gen=gen), 8)
    matrix = 96 * 96 * 8
    value, watch = watched_call(flash_attention, args, {"is_causal": True}, forbid=ATTENTION_BUILTINS,
                                exercise="flash_attention", rows=96, cols=96, max_elements=96 * 96)
    if watch["offender"] is not None or watch["peak"] > matrix // 2:
        fail(f"With {_shapes(args)}, block_size=8, is_causal=True: flash_attention had {watch['peak']} bytes of "
             f"tensors alive at once, while one 96 x 96 score matrix in float64 is {matrix} bytes. FlashAttention "
             "keeps only the current block of scores and, per query, a running max, a running sum and an output "
             "accumulator: do not keep every block (in a list, or in a preallocated matrix).")
    _check_value(value, args, True, "flash_attention")


def _check_long_rows(flash_attention) -> None:
    """Config D: 32 queries, 4096 keys, blocks of 32, d = 1: the key blocks of a block of queries are not all kept.

    Keeping them (to take the row's max first, then the exponentials) holds block_size x m scores, four times
    more than the inputs here; the online softmax holds a few block x block tiles and per-query statistics.
    """
    gen = generator(730)
    args = (randn(1, 32, 1, gen=gen), randn(1, 4096, 1, gen=gen), randn(1, 4096, 1, gen=gen), 32)
    value, watch = watched_call(flash_attention, args, {}, forbid=ATTENTION_BUILTINS, exercise="flash_attention",
                                rows=32, cols=4096, max_elements=32 * 4096)
    budget = tiled_budget(args[:3], 32)
    if watch["offender"] is not None or watch["peak"] > budget:
        fail(f"With {_shapes(args)}, block_size=32: flash_attention had {watch['peak']} bytes of tensors alive at "
             f"once, more than {budget} (four times its inputs and sixteen 32 x 32 blocks of scores). Did it keep "
             "the scores of every key block of a block of queries (in a list, to take their max first)? That is "
             "block_size x m numbers; FlashAttention folds each key block in as it comes (online softmax: running "
             "max, rescaled running sum, rescaled output accumulator) and then forgets it.")
    _check_value(value, args, False, "flash_attention")


#: The chunk of queries of chunked_attention's measured case: its scores are 2 MiB, those of all the queries 64 MiB.
MEMORY_CASE_CHUNK = 128
#: What each exercise keeps instead of the n x m scores, said when its measured memory is too much.
MEMORY_HINTS = {
    "chunked_attention": "Chunked attention holds the scores of one chunk of queries at a time (chunk_size x m), "
                         "never those of all n queries: compute each chunk's output, keep it, and let its scores go.",
    "flash_attention": None,  # memory_message's own, about FlashAttention's blocks
}


def measured_memory_check(fn, exercise: str) -> None:
    """Config E: n = m = 4096 in float32; the memory may rise by at most MEMORY_RISE_BOUND while ``fn`` runs.

    Measured from outside the kernel where grading has a control group, else by the watch. A call on a
    quarter of the size comes first, unmeasured, in the graded kernel: an error is named on a small case.
    It does not warm the kernel that is measured: measured from outside, the call runs in a fresh kernel,
    where PyTorch's first use of its operations counts (within the 5 to 10 MiB the references reach,
    :data:`~autograder.grader.memory.MEMORY_RISE_BOUND`); the watch counts tensors only, which such
    costs are not. The value is compared on every 64th query (the reference of the whole output would
    cost the grader more than the student's call).
    """
    gen = generator(790 if exercise == "flash_attention" else 745)
    n, d, dtype = MEMORY_CASE_N, MEMORY_CASE_D, MEMORY_CASE_DTYPE
    size, size_name = (MEMORY_CASE_BLOCK, "block_size") if exercise == "flash_attention" else \
        (MEMORY_CASE_CHUNK, "chunk_size")
    warm = tuple(randn(1, n // 4, d, gen=gen, dtype=dtype) for _ in range(3))
    call_student(fn, *warm, size, what=f"{exercise}(Q, K, V of shape {tuple(warm[0].shape)}, {size_name}={size})",
                 forbid=ATTENTION_BUILTINS)
    args = (*(randn(1, n, d, gen=gen, dtype=dtype) for _ in range(3)), size)
    case = f"{_shapes(args)} in float32, {size_name}={size}"
    rise = memory_rise(fn, args, {}, exercise=exercise, forbid=ATTENTION_BUILTINS, rows=n, cols=n)
    if rise.bytes > MEMORY_RISE_BOUND:
        fail(memory_message(rise, exercise, case, MEMORY_RISE_BOUND, MEMORY_HINTS[exercise]))
    assert_tensor(rise.value, f"The result of {exercise} with {case}")
    if tuple(rise.value.shape) != (1, n, d):
        fail(f"With {case}: {exercise} returned shape {tuple(rise.value.shape)}, not {(1, n, d)}.")
    rows = slice(None, None, 64)
    Q, K, V = (t.double() for t in args[:3])
    assert_close(rise.value[:, rows], sdpa_reference(Q[:, rows], K, V, size), f"With {case}, the result of "
                 f"{exercise} (every 64th query)", rtol=1e-4, atol=1e-5)


# --- hidden checks -------------------------------------------------------------------------------


@hidden
def check_attention_flops(attention_flops) -> None:
    """Many configurations, every size different, and the realistic one of the notebook."""
    configs = [(3, 5, 7, 11, 13, 17), (8, 32, 8192, 8192, 128, 128), (1, 1, 1, 1, 1, 1), (2, 4, 100, 30, 64, 16),
               (5, 2, 1, 9, 3, 3), (1, 12, 4096, 1024, 64, 128)]
    cases = [(Case(c), flops(*c)) for c in configs]
    verify_number(attention_flops, cases, exercise="attention_flops", arg_names=FLOPS_ARGS, integer=True,
                  mistakes=MISTAKES["attention_flops"])


@hidden
def check_attention_memory_bytes(attention_memory_bytes) -> None:
    """Every floating dtype of the course, n != m, and the realistic configuration."""
    configs = [(3, 5, 7, 11, torch.float16), (3, 5, 7, 11, torch.bfloat16), (3, 5, 7, 11, torch.float64),
               (2, 3, 10, 20, torch.float32), (8, 32, 8192, 8192, torch.float16), (8, 32, 8192, 8192, torch.float32),
               (1, 1, 1, 1, torch.float64), (4, 16, 512, 2048, torch.bfloat16)]
    cases = [(Case(c), score_bytes(*c)) for c in configs]
    verify_number(attention_memory_bytes, cases, exercise="attention_memory_bytes", arg_names=MEMORY_ARGS,
                  integer=True, mistakes=MISTAKES["attention_memory_bytes"])


@hidden
def check_fit_power_law(fit_power_law) -> None:
    """Exact power laws with constants far from 1, noisy ones, unsorted sizes, two points."""
    gen = generator(730)
    ns = [16, 32, 64, 128, 256, 512, 1024]
    cases = [
        (ns, [0.003 * n**1.5 for n in ns], "cost = 0.003 n^1.5 exactly"),
        (ns, [2e-9 * n**2 * math.exp(0.2 * randn(1, gen=gen).item()) for n in ns], "2e-9 n^2 with noise"),
        ([10, 30, 100, 300, 1000, 3000], [7.5e4 * n**3 * math.exp(0.5 * randn(1, gen=gen).item())
                                          for n in [10, 30, 100, 300, 1000, 3000]], "7.5e4 n^3 with noise"),
        ([100, 10, 1000, 50], [2.0 * n for n in [100, 10, 1000, 50]], "unsorted sizes, cost = 2 n"),
        ([4, 8], [1e6 / 4, 1e6 / 8], "two points, cost = 1e6 / n"),
        ([1, 2, 3, 4], [1.0, 1.0, 1.0, 1.0], "a constant cost"),
    ]
    pairs = [(Case((x, y), label=label), _fit(x, y)) for x, y, label in cases]
    verify_number(fit_power_law, pairs, exercise="fit_power_law", arg_names=("ns", "costs"), integer=False,
                  mistakes=MISTAKES["fit_power_law"], rel_tol=FIT_RTOL, abs_tol=FIT_ATOL)
    for ns_, costs, why in [([1, 2, 3], [1.0, 2.0], "there are 3 sizes and 2 costs"),
                            ([8], [3.0], "one point has no slope"),
                            ([1, 2, 4], [1.0, 0.0, 3.0], "a cost of 0 has no logarithm")]:
        expect_error(fit_power_law, ns_, costs, error=ValueError, what=f"fit_power_law({ns_}, {costs})", why=why)


ATTENTION_SHAPES = [
    # (batch dims, n, m, d_k, d_v, chunk or block size, is_causal, label)
    ((2,), 37, 45, 5, 7, 8, False, "n = 37 and m = 45 are not multiples of the size 8"),
    ((2, 3), 12, 12, 4, 4, 4, False, "two batch dimensions, sizes that divide"),
    ((), 9, 11, 3, 2, 4, False, "no batch dimension"),
    ((3,), 5, 5, 4, 6, 16, False, "a size larger than n"),
    ((1,), 1, 1, 1, 1, 1, False, "one query, one key"),
    ((2,), 6, 10, 4, 3, 1, False, "a size of 1"),
    ((2,), 7, 11, 4, 5, 3, True, "causal, n = 7 < m = 11"),
    ((2, 2), 13, 13, 4, 4, 5, True, "causal, n = m = 13"),
    ((2,), 11, 6, 3, 3, 4, True, "causal, n = 11 > m = 6"),
    ((), 10, 16, 4, 4, 3, True, "causal, no batch dimension"),
    # Dimensions of size 1 beyond the reduced one: a .squeeze() or an index [0] must not remove them.
    ((2, 1), 1, 6, 3, 1, 4, False, "one query, a batch dimension of 1, d_v = 1"),
    ((1,), 1, 5, 2, 2, 2, True, "causal with one query: it sees key 0 only"),
]


def _attention_cases(seed: int, size_name: str) -> list[Case]:
    gen = generator(seed)
    cases = []
    for batch, n, m, d_k, d_v, size, causal, label in ATTENTION_SHAPES:
        args = (randn(*batch, n, d_k, gen=gen), randn(*batch, m, d_k, gen=gen), randn(*batch, m, d_v, gen=gen), size)
        # One query and one key: its one weight is 1 whatever the scores; almost any answer passes, a small share.
        cases.append(Case(args, {"is_causal": True} if causal else {}, label, 0.25 if n == m == 1 else 1.0))
    return cases


def _check_attention(fn, exercise: str, size_name: str, seed: int, extra: list[Case]) -> None:
    names = ("Q", "K", "V", size_name)
    verify(fn, _attention_cases(seed, size_name) + extra, sdpa_reference, exercise=exercise, arg_names=names,
           outputs=None, forbid=ATTENTION_BUILTINS, mistakes=MISTAKES[exercise], rtol=1e-9, atol=1e-11)
    gen = generator(seed + 1)
    float32 = Case((randn(2, 3, 19, 8, gen=gen, dtype=torch.float32), randn(2, 3, 23, 8, gen=gen, dtype=torch.float32),
                    randn(2, 3, 23, 8, gen=gen, dtype=torch.float32), 4), {"is_causal": True}, "float32 inputs")
    verify(fn, [float32], sdpa_reference, exercise=exercise, arg_names=names, outputs=None,
           forbid=ATTENTION_BUILTINS, mistakes=MISTAKES[exercise], rtol=1e-4, atol=1e-5)
    for shapes, why in [(((2, 3, 4), (2, 5, 3), (2, 5, 6)), "Q and K have different d_k (4 and 3)"),
                        (((2, 3, 4), (2, 5, 4), (2, 6, 4)), "K has 5 keys but V has 6 values")]:
        args = tuple(randn(*s, gen=gen) for s in shapes)
        expect_error(fn, *args, 2, error=ValueError, why=why,
                     what=f"{exercise}(Q {shapes[0]}, K {shapes[1]}, V {shapes[2]}, 2)")
    expect_error(fn, randn(2, 3, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen), 0,
                 error=ValueError, what=f"{exercise}(Q, K, V, {size_name}=0)", why=f"{size_name} must be at least 1")


def _no_n_by_m_cases(fn, exercise: str, size_name: str) -> None:
    for causal in (False, True):
        with case(f"no n x m tensor: n = 40, m = 45, is_causal={causal}"):
            _check_no_n_by_m(fn, exercise, size_name, is_causal=causal)


@hidden
def check_chunked_attention(chunked_attention) -> None:
    """Against SDPA (math backend, float64) on many shapes, causal included; never an n x m tensor."""
    _check_attention(chunked_attention, "chunked_attention", "chunk_size", 740, [])
    _no_n_by_m_cases(chunked_attention, "chunked_attention", "chunk_size")
    with case(f"the memory rise with n = m = {MEMORY_CASE_N} in float32"):
        measured_memory_check(chunked_attention, "chunked_attention")


@hidden
def check_flash_attention(flash_attention) -> None:
    """Against SDPA on many shapes and huge scores; no n x m tensor, keys tiled, little memory alive."""
    gen = generator(750)
    large = [
        Case((40 * randn(2, 11, 4, gen=gen), 40 * randn(2, 13, 4, gen=gen), randn(2, 13, 3, gen=gen), 4),
             label="scores in the thousands: exp of a raw score overflows"),
        Case((40 * randn(2, 11, 4, gen=gen), 40 * randn(2, 13, 4, gen=gen), randn(2, 13, 3, gen=gen), 5),
             {"is_causal": True}, label="causal, scores in the thousands"),
    ]
    large.append(Case((*very_negative_scores(gen, (2,), 7, 9, 4, 3, 1e4), 3), {"is_causal": True},
                      "every score about -1e4, causal"))
    _check_attention(flash_attention, "flash_attention", "block_size", 760, large)
    # Alone: a running max started at -1e9 passes the case above, which must not rule out naming its mistake here.
    verify(flash_attention, [Case((*very_negative_scores(gen, (2,), 7, 9, 4, 3, 1e300), 4),
                                  label="every score about -1e300")], sdpa_reference, exercise="flash_attention",
           arg_names=("Q", "K", "V", "block_size"), outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=MISTAKES["flash_attention"], rtol=1e-9, atol=1e-11)
    _no_n_by_m_cases(flash_attention, "flash_attention", "block_size")
    with case("the keys are tiled too: m = 70 keys, blocks of 6"):
        _check_keys_tiled(flash_attention)
    with case("the bytes alive at once: n = m = 96, causal"):
        _check_peak(flash_attention)
    with case("long rows: 4096 keys, the key blocks not all kept"):
        _check_long_rows(flash_attention)
    with case(f"the memory rise with n = m = {MEMORY_CASE_N} in float32"):
        measured_memory_check(flash_attention, "flash_attention")


@hidden
def check_sliding_window_mask(sliding_window_mask) -> None:
    """Against the definition 0 <= i - j < window: window 1, windows inside, equal to and beyond n."""
    with case("a torch.bool mask"):
        assert_bool_mask(sliding_window_mask)
    # One position, or none: almost any answer of the right shape passes; a small share.
    cases = [Case((n, w), weight=0.25 if n <= 1 else 1.0)
             for n, w in [(6, 3), (1, 1), (5, 1), (8, 2), (13, 4), (7, 7), (4, 9), (10, 10), (0, 3)]]
    verify(sliding_window_mask, cases, window_mask, exercise="sliding_window_mask", arg_names=("n", "window"),
           outputs=None, mistakes=MISTAKES["sliding_window_mask"])
    for n, w in [(5, 0), (3, -2)]:
        expect_error(sliding_window_mask, n, w, error=ValueError, what=f"sliding_window_mask({n}, {w})",
                     why="a window must hold at least one key")
