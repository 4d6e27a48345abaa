"""Notebook 07: the reference passes every check, every catalogued mistake is caught and named,
and the tensor watch of flash_attention catches what it must (and nothing the reference does)."""

from __future__ import annotations

import importlib.util
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import complexity as visible
from autograder.hidden import complexity as hidden
from autograder.hidden.complexity import MISTAKES
from autograder.shared.errors import CheckFailed

from ..notebook_code import ROOT, answer_cells, solution_namespace, source_notebook

ASSIGNMENT = "07_complexity"
SIGNATURES = {
    "attention_flops": "(batch, heads, n, m, d_k, d_v)",
    "attention_memory_bytes": "(batch, heads, n, m, dtype)",
    "fit_power_law": "(ns, costs)",
    "chunked_attention": "(Q, K, V, chunk_size, is_causal=False)",
    "flash_attention": "(Q, K, V, block_size, is_causal=False)",
    "sliding_window_mask": "(n, window)",
}


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    """The signatures the notebook promises (test_catalogue.py holds every catalogued mistake to the reference's)."""
    assert {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES} == SIGNATURES


REQUIRED = {
    "attention_flops": {"FLOPs without the factor 2"},
    "attention_memory_bytes": {"bytes that ignore the dtype (4 bytes assumed)"},
    "chunked_attention": {"last chunk dropped", "bottom-right causal alignment"},
    "flash_attention": {"output accumulator not rescaled", "bottom-right causal alignment", "last key block dropped",
                        "last query block dropped"},
    "sliding_window_mask": {"window off by one (w + 1 keys)", "window off by one (w - 1 keys)"},
    "fit_power_law": {"line forced through the origin", "slope of the two end points"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


# --- the visible checks' hand-computed numbers agree with the references -------------------------


def test_visible_numbers_agree_with_the_formulas(solution):
    assert solution.attention_flops(2, 3, 5, 7, 11, 13) == 10080
    assert solution.attention_flops(1, 1, 1, 1, 1, 1) == 4
    assert solution.attention_memory_bytes(1, 1, 2, 3, torch.float32) == 24
    assert solution.attention_memory_bytes(2, 4, 8, 16, torch.float16) == 2048
    assert solution.attention_memory_bytes(3, 1, 5, 2, torch.float64) == 240
    noisy = solution.fit_power_law([1, 2, 4, 8, 16], [1.0, 2.5, 9.0, 14.0, 70.0])
    assert noisy == pytest.approx(1.4743992861060176, rel=1e-12)
    expected = torch.ones(5, 5, dtype=torch.bool).tril() & ~torch.ones(5, 5, dtype=torch.bool).tril(-2)
    assert torch.equal(solution.sliding_window_mask(5, 2), expected)


def test_fit_accepts_a_float32_computation():
    """A correct fit computed in float32 must pass: the tolerance is not float64-only."""

    def fit_float32(ns, costs):
        if len(ns) != len(costs) or len(ns) < 2 or min(costs) <= 0:
            raise ValueError("bad input")
        x = torch.log(torch.tensor(ns, dtype=torch.float32))
        y = torch.log(torch.tensor(costs, dtype=torch.float32))
        dx = x - x.mean()
        return float((dx * (y - y.mean())).sum() / (dx * dx).sum())

    visible.check_fit_power_law(fit_float32)
    hidden.check_fit_power_law(fit_float32)


def test_numbers_must_be_plain_python_numbers(solution):
    def flops_as_float(batch, heads, n, m, d_k, d_v):
        return float(solution.attention_flops(batch, heads, n, m, d_k, d_v))

    def fit_as_tensor(ns, costs):
        return torch.tensor(solution.fit_power_law(ns, costs))

    with pytest.raises(CheckFailed, match="should be an int, but it is the float"):
        visible.check_attention_flops(flops_as_float)
    with pytest.raises(CheckFailed, match="should be a float .*tensor of shape \\(\\)"):
        visible.check_fit_power_law(fit_as_tensor)


def test_mask_must_be_boolean(solution):
    with pytest.raises(CheckFailed, match="torch.bool"):
        visible.check_sliding_window_mask(lambda n, window: solution.sliding_window_mask(n, window).float())


# --- the tensor watch of chunked_attention and flash_attention -----------------------------------


def validated(fn):
    """``fn`` with the ValueErrors the checks ask for, so that only what the test is about can fail."""

    def wrapper(Q, K, V, block_size, is_causal=False):
        if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or block_size < 1:
            raise ValueError(f"bad shapes {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)} or size {block_size}")
        return fn(Q, K, V, block_size, is_causal)

    return wrapper


def naive_attention(Q, K, V, block_size, is_causal=False):
    return F.scaled_dot_product_attention(Q, K, V, is_causal=is_causal)


@validated
def naive_by_hand(Q, K, V, block_size, is_causal=False):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


@validated
def naive_flattened(Q, K, V, block_size, is_causal=False):
    """The n x m scores built one row at a time into a flat buffer: no 2-D tensor of that shape exists."""
    n, m = Q.shape[-2], K.shape[-2]
    flat = torch.empty(*Q.shape[:-2], n * m, dtype=Q.dtype)
    for i in range(n):
        flat[..., i * m:(i + 1) * m] = (Q[..., i, :, None] * K.transpose(-2, -1)).sum(-2) / math.sqrt(Q.shape[-1])
    scores = flat.unflatten(-1, (n, m))
    if is_causal:
        scores = scores.masked_fill(torch.arange(m) > torch.arange(n)[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def blocks_in_lists(keep_every_row: bool):
    """Tiled, right values, no online softmax: a block of queries keeps its scores against every key block in a
    list (max first, then the exponentials); kept until the end with ``keep_every_row``, else freed before the
    next block of queries."""

    @validated
    def listed(Q, K, V, block_size, is_causal=False):
        n, m = Q.shape[-2], K.shape[-2]
        Q = Q / math.sqrt(Q.shape[-1])
        outputs, kept = [], []
        for q0 in range(0, n, block_size):
            q = Q[..., q0:q0 + block_size, :]
            blocks = []
            for k0 in range(0, m, block_size):
                s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
                if is_causal:
                    s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1]) > torch.arange(q0, q0 + s.shape[-2])[:, None],
                                      float("-inf"))
                blocks.append(s)
            row_max = torch.stack([b.amax(-1) for b in blocks]).amax(0)[..., None]
            probs = [torch.exp(b - row_max) for b in blocks]
            if keep_every_row:
                kept += probs
            total = sum(p.sum(-1, keepdim=True) for p in probs)
            outputs.append(sum(p @ V[..., k0:k0 + block_size, :] for p, k0 in zip(probs, range(0, m, block_size)))
                           / total)
        return torch.cat(outputs, dim=-2)

    return listed


every_block_kept = blocks_in_lists(keep_every_row=True)
one_row_of_blocks_kept = blocks_in_lists(keep_every_row=False)


@validated
def through_numpy(Q, K, V, block_size, is_causal=False):
    import numpy as np

    q, k, v = (np.asarray(t) for t in (Q, K, V))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        s = np.where(np.arange(s.shape[-1]) > np.arange(s.shape[-2])[:, None], -np.inf, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy((w / w.sum(-1, keepdims=True)) @ v)


@pytest.mark.parametrize("fn", [naive_attention])
def test_guard_forbids_sdpa_in_chunked_and_flash(fn):
    for check in (visible.check_chunked_attention, visible.check_flash_attention, hidden.check_chunked_attention,
                  hidden.check_flash_attention):
        with pytest.raises(CheckFailed, match="called torch.nn.functional.scaled_dot_product_attention"):
            check(fn)


def mha_inside(Q, K, V, block_size, is_causal=False):
    d = Q.shape[-1]
    mha = torch.nn.MultiheadAttention(d, 1, batch_first=True, dtype=Q.dtype)
    return mha(Q, K, V, need_weights=False)[0]


def test_guard_forbids_multi_head_attention():
    for check in (visible.check_flash_attention, hidden.check_flash_attention):
        with pytest.raises(CheckFailed, match="called torch.nn.MultiheadAttention"):
            check(mha_inside)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (naive_by_hand, "as big as the n x m = 40 x 45 score matrix"),
        (naive_flattened, "as big as the n x m = 40 x 45 score matrix"),
        (every_block_kept, "bytes of tensors alive at once"),
        (through_numpy, "converted a tensor to NumPy"),
    ],
)
def test_tensor_watch_of_flash(fn, expected):
    """Each of these gives the right values; the watch is what fails them."""
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(2, s, 3, generator=gen, dtype=torch.float64) for s in (9, 11, 11))
    for causal in (False, True):
        torch.testing.assert_close(fn(Q, K, V, 4, causal), F.scaled_dot_product_attention(Q, K, V, is_causal=causal))
    with pytest.raises(CheckFailed, match=expected):
        hidden.check_flash_attention(fn)


def test_chunked_attention_submitted_as_flash_is_caught(solution):
    def chunked_as_flash(Q, K, V, block_size, is_causal=False):
        return solution.chunked_attention(Q, K, V, block_size, is_causal)

    visible.check_flash_attention(chunked_as_flash)  # the values are right...
    with pytest.raises(CheckFailed, match="a block of queries against all m = 70 keys"):
        hidden.check_flash_attention(chunked_as_flash)  # ...but the keys are not tiled


def test_naive_submitted_as_chunked_is_caught():
    def naive_as_chunked(Q, K, V, chunk_size, is_causal=False):
        return naive_by_hand(Q, K, V, chunk_size, is_causal)

    visible.check_chunked_attention(naive_as_chunked)
    with pytest.raises(CheckFailed, match="one chunk of queries at a time"):
        hidden.check_chunked_attention(naive_as_chunked)


@validated
def padded_flash(Q, K, V, block_size, is_causal=False):
    """Right: FlashAttention on K and V padded with zeros to a multiple of the block (copies of the inputs)."""
    n, m = Q.shape[-2], K.shape[-2]
    pad = -m % block_size
    K = torch.cat([K, K.new_zeros(*K.shape[:-2], pad, K.shape[-1])], dim=-2)
    V = torch.cat([V, V.new_zeros(*V.shape[:-2], pad, V.shape[-1])], dim=-2)
    Q = Q / math.sqrt(Q.shape[-1])
    out = []
    for q0 in range(0, n, block_size):
        q = Q[..., q0:q0 + block_size, :]
        rows = torch.arange(q0, q0 + q.shape[-2])[:, None]
        run_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=Q.dtype)
        run_sum = torch.zeros_like(run_max)
        acc = torch.zeros(*q.shape[:-1], V.shape[-1], dtype=Q.dtype)
        for k0 in range(0, m + pad, block_size):
            cols = torch.arange(k0, k0 + block_size)
            s = (q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)).masked_fill(cols >= m, float("-inf"))
            if is_causal:
                s = s.masked_fill(cols > rows, float("-inf"))
            new_max = torch.maximum(run_max, s.amax(-1, keepdim=True))
            if torch.isinf(new_max).all():
                continue
            p = torch.exp(s - new_max)
            factor = torch.exp(run_max - new_max)
            run_sum = run_sum * factor + p.sum(-1, keepdim=True)
            acc = acc * factor + p @ V[..., k0:k0 + block_size, :]
            run_max = new_max
        out.append(acc / run_sum)
    return torch.cat(out, dim=-2)


@validated
def two_passes_recomputed(Q, K, V, block_size, is_causal=False):
    """Right and small: a first pass over the key blocks for each query's max and sum, a second that recomputes
    each block of scores (no online rescaling, nothing kept between blocks)."""
    n, m = Q.shape[-2], K.shape[-2]
    Q = Q / math.sqrt(Q.shape[-1])

    def scores(q, q0, k0):
        s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
        if is_causal:
            s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1]) > torch.arange(q0, q0 + s.shape[-2])[:, None],
                              float("-inf"))
        return s

    out = []
    for q0 in range(0, n, block_size):
        q = Q[..., q0:q0 + block_size, :]
        row_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=Q.dtype)
        for k0 in range(0, m, block_size):
            row_max = torch.maximum(row_max, scores(q, q0, k0).amax(-1, keepdim=True))
        total = torch.zeros_like(row_max)
        acc = torch.zeros(*q.shape[:-1], V.shape[-1], dtype=Q.dtype)
        for k0 in range(0, m, block_size):
            p = torch.exp(scores(q, q0, k0) - row_max)
            total = total + p.sum(-1, keepdim=True)
            acc = acc + p @ V[..., k0:k0 + block_size, :]
        out.append(acc / total)
    return torch.cat(out, dim=-2)


def test_a_row_of_key_blocks_kept_is_caught_by_the_long_rows():
    """The 96 x 96 peak (block 8, d = 2) let it through: 8 x 96 scores are below half a matrix."""
    visible.check_flash_attention(one_row_of_blocks_kept)  # the values are right
    hidden._check_peak(one_row_of_blocks_kept)
    with pytest.raises(CheckFailed, match="every key block of a block of queries"):
        hidden.check_flash_attention(one_row_of_blocks_kept)


@pytest.mark.parametrize("style", [padded_flash, two_passes_recomputed])
def test_flash_in_other_styles_passes(style):
    hidden.check_flash_attention(style)


def test_reference_flash_stays_far_below_the_budgets(solution):
    gen = torch.Generator().manual_seed(1)
    args = tuple(torch.randn(1, 96, 2, generator=gen, dtype=torch.float64) for _ in range(3)) + (8,)
    _, watch = hidden.watched_call(solution.flash_attention, args, {"is_causal": True}, exercise="flash_attention",
                                   rows=96, cols=96, max_elements=96 * 96)
    assert watch["offender"] is None
    assert watch["peak"] < 96 * 96 * 8 // 4, watch["peak"]  # under half of the budget (half a matrix)
    args = tuple(torch.randn(1, s, 1, generator=gen, dtype=torch.float64) for s in (32, 4096, 4096)) + (32,)
    _, watch = hidden.watched_call(solution.flash_attention, args, {}, exercise="flash_attention", rows=32,
                                   cols=4096, max_elements=32 * 4096)
    assert watch["peak"] < hidden.tiled_budget(args[:3], 32) // 2, watch["peak"]


# --- the reference functions and the notebook's numbers ------------------------------------------


def test_bad_inputs_raise_value_error(solution):
    for fn in (solution.chunked_attention, solution.flash_attention):
        with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(2, 5, 3\)"):
            fn(torch.zeros(2, 3, 4), torch.zeros(2, 5, 3), torch.zeros(2, 5, 4), 2)
        with pytest.raises(ValueError):
            fn(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(2, 5, 4), 0)
    with pytest.raises(ValueError):
        solution.fit_power_law([1, 2], [1.0])
    with pytest.raises(ValueError):
        solution.sliding_window_mask(4, 0)


def test_reference_matches_sdpa_in_float32_at_bench_sizes(solution):
    gen = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(1, 2, 1000, 64, generator=gen) for _ in range(3))
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
        torch.testing.assert_close(solution.flash_attention(Q, K, V, 256, causal), expected, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(solution.chunked_attention(Q, K, V, 300, causal), expected, atol=2e-6, rtol=1e-5)


def test_the_numbers_in_the_prose(solution):
    """The prose quotes these; they must be what the cells compute."""
    GiB = 2**30
    assert solution.attention_memory_bytes(8, 32, 8192, 8192, torch.float16) == 32 * GiB
    assert solution.attention_memory_bytes(8, 32, 8192, 8192, torch.float32) == 64 * GiB
    assert solution.attention_memory_bytes(1, 8, 16384, 16384, torch.float32) == 8 * GiB  # the bench's naive point
    text = "\n".join(c.source for c in source_notebook(ASSIGNMENT).cells if c.cell_type == "markdown")
    assert "32 GiB in float16 and 64 GiB in float32" in text
    namespace: dict = {}
    code = next(c.source for c in source_notebook(ASSIGNMENT).cells if "def blocks_visited" in c.source)
    exec(code.split("\n\n\nn, B")[0], namespace)
    assert namespace["blocks_visited"](8192, 1024, 128) == 540
    assert "leaves 540 of the 4096 blocks" in text
    flops = solution.attention_flops(1, 1, 8192, 8192, 64, 64)
    naive, fused = 6 * 8192 * 8192 * 4, (2 * 8192 * 64 + 64 * 2 * 8192 * 64) * 4
    assert round((flops / fused) / (flops / naive)) == 6 and "six times more arithmetic" in text


def test_bench_runs_the_notebook_reference():
    spec = importlib.util.spec_from_file_location("attention_bench", ROOT / "bench" / "attention_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    names = bench.reference_functions()
    for name in ("chunked_attention", "flash_attention"):
        assert str(inspect.signature(names[name])) == SIGNATURES[name]
    gen = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(1, 2, 70, 8, generator=gen) for _ in range(3))
    torch.testing.assert_close(names["flash_attention"](Q, K, V, bench.BLOCK), F.scaled_dot_product_attention(Q, K, V))
    assert bench.fit_power_law([2, 4, 8], [3 * 2**1.5, 3 * 4**1.5, 3 * 8**1.5]) == pytest.approx(1.5)


def flash_started_at(start: str):
    """The reference flash_attention with its running max started at ``start`` instead of -inf."""
    source = answer_cells(ASSIGNMENT)["flash_attention"]
    line = 'running_max = torch.full((*q.shape[:-1], 1), float("-inf"),'
    assert line in source
    namespace = {"torch": torch, "math": math}
    exec(source.replace(line, f"running_max = torch.full((*q.shape[:-1], 1), {start},"), namespace)
    return namespace["flash_attention"]


@pytest.mark.parametrize("start", ["0.0", "-1e9", "-1e30"])
def test_a_running_max_started_at_a_finite_value_is_caught(start):
    """Right on every ordinary input; only rows whose scores all lie far below the start tell (0/0)."""
    fn = flash_started_at(start)
    Q, K, V = (torch.randn(2, 9, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(fn(Q, K, V, 4), F.scaled_dot_product_attention(Q, K, V))
    with pytest.raises(CheckFailed, match="'the running max started at 0'"):
        hidden.check_flash_attention(fn)
    if start == "0.0":
        with pytest.raises(CheckFailed, match="every score about -1e"):
            visible.check_flash_attention(fn)


def test_the_most_negative_float_is_a_safe_start(capsys):
    """Any finite score lies above finfo.min, so starting there is right (the checks must not reject it)."""
    fn = flash_started_at("torch.finfo(Q.dtype).min")
    visible.check_flash_attention(fn)
    hidden.check_flash_attention(fn)
    assert "passes the hidden checks" in capsys.readouterr().out
