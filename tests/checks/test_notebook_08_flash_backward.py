"""Notebook 08: the reference passes every check, every catalogued mistake is caught and named, and the
protections of the checks (the tensor watch, the guard, the saved-tensor budget, gradcheck) each catch
what they must and nothing the reference does; the checks also work on the student's objects as proxies."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import flash_backward as visible
from autograder.engine.source_check import forbidden_use
from autograder.grader import remote
from autograder.grader.local_channel import LocalChannel
from autograder.hidden import flash_backward as hidden
from autograder.hidden.flash_backward import MISTAKES
from autograder.shared.errors import CheckFailed

from ..course_copy import mistake_source
from ..notebook_code import answer_cells, solution_namespace

ASSIGNMENT = "08_flash_backward"
SIGNATURES = {
    "softmax_backward": "(p, grad_p, dim=-1)",
    "attention_backward": "(Q, K, V, dO, is_causal=False)",
    "flash_attention_forward": "(Q, K, V, block_size, is_causal=False)",
    "flash_attention_backward": "(Q, K, V, O, dO, lse, block_size, is_causal=False)",
}
EXERCISES = [*SIGNATURES, "FlashAttention"]


@pytest.fixture(scope="module")
def solution():
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    """The signatures the notebook promises (test_catalogue.py holds every catalogued mistake to the reference's)."""
    assert {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES} == SIGNATURES
    assert issubclass(solution.FlashAttention, torch.autograd.Function)
    assert str(inspect.signature(solution.FlashAttention.forward)) == "(ctx, Q, K, V, block_size, is_causal=False)"


def signature(fn) -> str:
    return str(inspect.signature(fn))


#: The mistakes the issue lists, by exercise.
REQUIRED = {
    "softmax_backward": {"softmax backward without the rowsum term"},
    "attention_backward": {"softmax backward without the rowsum term", "dQ without the 1/sqrt(d) factor",
                           "dK without the 1/sqrt(d) factor", "dS transposed when forming dK",
                           "the causal mask not re-applied in the backward pass"},
    "flash_attention_forward": {"the logsumexp of unscaled scores"},
    "flash_attention_backward": {"D computed as rowsum(dO) instead of rowsum(dO * O)",
                                 "the causal mask not re-applied in the backward pass",
                                 "dQ without the 1/sqrt(d) factor", "dK without the 1/sqrt(d) factor",
                                 "dS transposed when forming dK"},
    "FlashAttention": {"saving P (an n x m tensor) for backward"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


# --- the checks on the student's objects as proxies (how a notebook is graded) ---------------------


def proxies(namespace: dict, *names: str) -> list:
    channel = LocalChannel(namespace)
    found = [remote.lookup(channel, name) for name in names]
    assert all(ok for ok, _ in found)
    return [value for _, value in found]


def test_hidden_checks_pass_through_proxies(solution, capsys):
    """Every probe of these checks (autograd, saved tensors, gradcheck, the watches) runs where the
    student's code runs and returns plain data."""
    namespace = dict(vars(solution))
    for exercise, proxy in zip(EXERCISES, proxies(namespace, *EXERCISES)):
        assert isinstance(proxy, remote.Remote)
        getattr(hidden, f"check_{exercise}")(proxy)
    assert capsys.readouterr().out.count("passes the hidden checks") == len(EXERCISES)


class SourceReadingChannel(LocalChannel):
    """A channel that reads the student's source for forbidden built-ins, as grading does."""

    def __init__(self, namespace: dict, sources: list[str]) -> None:
        super().__init__(namespace)
        self.sources = sources

    def forbidden_use(self, name, rules, exercise):
        return forbidden_use(self.sources, name, rules, exercise)


CASES = [(exercise, i, m.name) for exercise, catalogue in MISTAKES.items() for i, m in enumerate(catalogue)]
IDS = [f"{e}-{i}-{n}" for e, i, n in CASES]


@pytest.mark.parametrize(("exercise", "index", "name"), CASES, ids=IDS)
def test_mistake_is_named_when_graded(solution, exercise, index, name):
    """As a graded notebook runs it: the mistake's source as the answer, called through a proxy, its
    source read for forbidden built-ins first (autograd is then found there, before any call)."""
    mistake = MISTAKES[exercise][index]
    source = mistake_source(mistake, exercise)
    namespace = dict(vars(solution))
    exec(compile("import math\nimport torch\n" + source, "<answer>", "exec"), namespace)
    channel = SourceReadingChannel(namespace, ["import math\nimport torch", source])
    found, proxy = remote.lookup(channel, exercise)
    assert found and isinstance(proxy, remote.Remote)
    with pytest.raises(CheckFailed) as failure:
        getattr(hidden, f"check_{exercise}")(proxy)
    message = str(failure.value)
    assert f"'{name}'" in message, message
    if "by autograd" in name and exercise != "FlashAttention":
        assert f"{exercise}'s code uses torch.autograd.grad" in message, message


# --- the tensor watch: no n x m tensor, both axes tiled, little memory alive -------------------------


def naive_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    """Right values, from the whole n x m matrices."""
    scale = 1 / math.sqrt(Q.shape[-1])
    S = Q @ K.transpose(-2, -1) * scale
    if is_causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    P = torch.exp(S - lse.unsqueeze(-1))
    dS = P * (dO @ V.transpose(-2, -1) - (dO * O).sum(dim=-1, keepdim=True))
    return dS @ K * scale, dS.transpose(-2, -1) @ Q * scale, P.transpose(-2, -1) @ dO


def chunked_backward(Q, K, V, O, dO, lse, block_size, is_causal=False, *, over="queries"):
    """Right values, one block of queries against all keys (or of keys against all queries) at a time."""
    n, m = Q.shape[-2], K.shape[-2]
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    size_q, size_k = (block_size, m) if over == "queries" else (n, block_size)
    for q0 in range(0, n, size_q):
        for k0 in range(0, m, size_k):
            q, k, v = Q[..., q0:q0 + size_q, :], K[..., k0:k0 + size_k, :], V[..., k0:k0 + size_k, :]
            part = naive_backward(q, k, v, O[..., q0:q0 + size_q, :], dO[..., q0:q0 + size_q, :],
                                  lse[..., q0:q0 + size_q], block_size)
            dQ[..., q0:q0 + size_q, :] += part[0]
            dK[..., k0:k0 + size_k, :] += part[1]
            dV[..., k0:k0 + size_k, :] += part[2]
    return dQ, dK, dV


def blocks_kept_backward(solution):
    """Right values, blocked, but every block of P computed first and kept in a list."""
    def backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
        n, m = Q.shape[-2], K.shape[-2]
        scale = 1 / math.sqrt(Q.shape[-1])
        blocks = {}
        for q0 in range(0, n, block_size):
            for k0 in range(0, m, block_size):
                s = Q[..., q0:q0 + block_size, :] @ K[..., k0:k0 + block_size, :].transpose(-2, -1) * scale
                if is_causal:
                    i = torch.arange(q0, q0 + s.shape[-2])[:, None]
                    s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1]) > i, float("-inf"))
                blocks[q0, k0] = torch.exp(s - lse[..., q0:q0 + block_size, None])
        del blocks  # computed and kept at once: the peak is what matters
        return solution.flash_attention_backward(Q, K, V, O, dO, lse, block_size, is_causal)
    return backward


def test_reference_allocates_no_n_by_m_tensor(solution):
    # The watched configurations pass the reference: the protections below do not catch right answers.
    for causal in (False, True):
        hidden._check_no_n_by_m(solution.flash_attention_backward, "flash_attention_backward", is_causal=causal)
        hidden._check_no_n_by_m(solution.flash_attention_forward, "flash_attention_forward", is_causal=causal)
    hidden._check_peak(solution.flash_attention_backward, "flash_attention_backward")


def test_naive_backward_is_right_but_caught_by_the_watch(solution):
    visible.check_flash_attention_backward(naive_backward)  # the values are right
    with pytest.raises(CheckFailed, match=r"allocated a tensor of shape \(2, 40, 45\)"):
        hidden.check_flash_attention_backward(naive_backward)


@pytest.mark.parametrize(("over", "n", "m", "what"), [("queries", 20, 70, "all 70 keys"),
                                                        ("keys", 70, 20, "all 70 queries")])
def test_chunked_backward_is_caught_by_the_tiling_check(over, n, m, what):
    def chunked(Q, K, V, O, dO, lse, block_size, is_causal=False):
        return chunked_backward(Q, K, V, O, dO, lse, block_size, is_causal, over=over)

    with pytest.raises(CheckFailed, match=f"a block of 6 against {what}"):
        hidden._check_tiled(chunked, "flash_attention_backward", n, m)


def test_blocks_kept_at_once_are_caught_by_the_peak(solution):
    backward = blocks_kept_backward(solution)
    visible.check_flash_attention_backward(backward)  # the values are right
    with pytest.raises(CheckFailed, match="bytes of tensors alive at once"):
        hidden._check_peak(backward, "flash_attention_backward")


def one_row_of_blocks_kept(solution, exercise: str, along: str):
    """Right values (the solution's), but first the blocks of P along one block of queries (``along="keys"``) or
    one block of keys (``along="queries"``) are computed into a list, freed before the next one."""
    def kept(Q, K, V, *rest, is_causal=False):
        block_size = rest[-1]
        n, m = Q.shape[-2], K.shape[-2]
        outer, inner = (n, m) if along == "keys" else (m, n)
        for a in range(0, outer, block_size):
            blocks = []
            for b in range(0, inner, block_size):
                q0, k0 = (a, b) if along == "keys" else (b, a)
                s = Q[..., q0:q0 + block_size, :] @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
                blocks.append(torch.exp(s / math.sqrt(Q.shape[-1])))
            del blocks
        return getattr(solution, exercise)(Q, K, V, *rest, is_causal=is_causal)
    return kept


@pytest.mark.parametrize(("exercise", "side", "n", "m"), [("flash_attention_forward", "key", 32, 4096),
                                                          ("flash_attention_backward", "key", 32, 4096),
                                                          ("flash_attention_backward", "query", 4096, 32)])
def test_a_row_of_blocks_kept_is_caught_by_the_long_rows(solution, exercise, side, n, m):
    """The 96 x 96 peak (block 8, d = 2) let these through: 8 x 96 blocks are below half a matrix."""
    kept = one_row_of_blocks_kept(solution, exercise, "keys" if side == "key" else "queries")
    hidden._check_peak(kept, exercise)
    with pytest.raises(CheckFailed, match=f"every {side} block of a block"):
        hidden._check_long_rows(kept, exercise, n, m)
    with pytest.raises(CheckFailed, match="alive at once"):
        getattr(hidden, f"check_{exercise}")(kept)


@pytest.mark.parametrize(("n", "m"), [(32, 4096), (4096, 32)])
def test_tiled_answers_fit_the_long_rows(solution, n, m):
    hidden._check_long_rows(solution.flash_attention_forward, "flash_attention_forward", n, m)
    for backward in (solution.flash_attention_backward, rowsum_p_dp_backward):
        hidden._check_long_rows(backward, "flash_attention_backward", n, m)


def rowsum_p_dp_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    """Right, and tiled, with D = rowsum(P * dP) summed over the key blocks in a first pass (the other form of D)."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or block_size < 1:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, block_size={block_size}")
    if dO.shape != O.shape or lse.shape != Q.shape[:-1]:
        raise ValueError(f"dO {tuple(dO.shape)}, O {tuple(O.shape)}, lse {tuple(lse.shape)}")
    n, m, scale = Q.shape[-2], K.shape[-2], 1 / math.sqrt(Q.shape[-1])
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)

    def p_block(q, q0, k0):
        s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1) * scale
        if is_causal:
            rows = torch.arange(q0, q0 + s.shape[-2])[:, None]
            s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1])[None, :] > rows, float("-inf"))
        return torch.exp(s - lse[..., q0:q0 + block_size, None])

    for q0 in range(0, n, block_size):
        q, do = Q[..., q0:q0 + block_size, :], dO[..., q0:q0 + block_size, :]
        D = sum((p_block(q, q0, k0) * (do @ V[..., k0:k0 + block_size, :].transpose(-2, -1))).sum(-1, keepdim=True)
                for k0 in range(0, m, block_size))
        for k0 in range(0, m, block_size):
            k, v = K[..., k0:k0 + block_size, :], V[..., k0:k0 + block_size, :]
            p = p_block(q, q0, k0)
            ds = p * (do @ v.transpose(-2, -1) - D)
            dQ[..., q0:q0 + block_size, :] += ds @ k * scale
            dK[..., k0:k0 + block_size, :] += ds.transpose(-2, -1) @ q * scale
            dV[..., k0:k0 + block_size, :] += p.transpose(-2, -1) @ do
    return dQ, dK, dV


def test_d_as_rowsum_of_p_times_dp_passes(capsys):
    """With scores in the thousands, a gradient that is 0 exactly comes out as rounding of the scores' size; this
    form of D must not be told it is wrong there (it was, at the tolerance of ordinary scores)."""
    visible.check_flash_attention_backward(rowsum_p_dp_backward)
    hidden.check_flash_attention_backward(rowsum_p_dp_backward)
    assert "flash_attention_backward passes the hidden checks." in capsys.readouterr().out


# --- the guard: SDPA, its backward and automatic differentiation are forbidden ----------------------


def sdpa_kernel_forward(Q, K, V, block_size, is_causal=False):
    O, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(Q, K, V, is_causal=is_causal)[:2]
    return O, lse


def sdpa_kernel_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dO, Q, K, V, O, lse, 0.0, is_causal)
    return tuple(grads)


def autograd_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    leaves = [t.detach().requires_grad_(True) for t in (Q, K, V)]
    with torch.enable_grad():
        out = torch.softmax(leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ leaves[2]
        out.backward(dO)
    return tuple(t.grad for t in leaves)


@pytest.mark.parametrize(("check", "fn", "shown"), [
    (visible.check_flash_attention_forward, sdpa_kernel_forward, "torch.nn.functional.scaled_dot_product_attention"),
    (visible.check_flash_attention_backward, sdpa_kernel_backward,
     "the backward of torch.nn.functional.scaled_dot_product_attention"),
    (visible.check_flash_attention_backward, autograd_backward, "Tensor.backward"),
    (visible.check_softmax_backward, lambda p, grad_p, dim=-1: torch._softmax_backward_data(grad_p, p, dim, p.dtype),
     "torch._softmax_backward_data"),
])
def test_guard_forbids_the_builtins(check, fn, shown):
    with pytest.raises(CheckFailed, match="called " + shown.replace(".", r"\.").replace("(", r"\(")):
        check(fn)


def test_the_sdpa_kernel_shortcut_would_be_right(solution):
    # Without the guard, the fused kernel's backward gives the answer: the guard is what stops it.
    gen = torch.Generator().manual_seed(0)
    Q, K, V, dO = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(4))
    O, lse = sdpa_kernel_forward(Q, K, V, 4)
    ours = solution.flash_attention_backward(Q, K, V, O, dO, lse, 4)
    for a, b in zip(sdpa_kernel_backward(Q, K, V, O, dO, lse, 4), ours):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_backward_guard_catches_sdpa_inside_backward(solution):
    class SdpaInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, Q, K, V, block_size, is_causal=False):
            O, lse = solution.flash_attention_forward(Q, K, V, block_size, is_causal)
            ctx.save_for_backward(Q, K, V, O, lse)
            ctx.is_causal = is_causal
            return O

        @staticmethod
        def backward(ctx, dO):
            Q, K, V, O, lse = ctx.saved_tensors
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(True) for t in (Q, K, V)]
                out = F.scaled_dot_product_attention(*leaves, is_causal=ctx.is_causal)
                return (*torch.autograd.grad(out, leaves, dO), None, None)

    with pytest.raises(CheckFailed, match="called torch.nn.functional.scaled_dot_product_attention"):
        visible.check_FlashAttention(SdpaInBackward)


# --- FlashAttention: the saved-tensor budget, ctx attributes, gradcheck -----------------------------


def test_saved_budget_counts_q_k_v_o_and_lse():
    Q, K, V = torch.zeros(2, 8, 4, dtype=torch.float64), torch.zeros(2, 5, 4, dtype=torch.float64), \
        torch.zeros(2, 5, 3, dtype=torch.float64)
    # Q 64, K 40, V 30, O 2 * 8 * 3 = 48, lse 16 numbers of 8 bytes
    assert visible.saved_budget(Q, K, V) == (64 + 40 + 30 + 48 + 16) * 8


def extra_saving(solution):
    class SavesACopyOfQ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, Q, K, V, block_size, is_causal=False):
            O, lse = solution.flash_attention_forward(Q, K, V, block_size, is_causal)
            ctx.save_for_backward(Q, K, V, O, lse, Q / math.sqrt(Q.shape[-1]))
            ctx.block_size, ctx.is_causal = block_size, is_causal
            return O

        @staticmethod
        def backward(ctx, dO):
            Q, K, V, O, lse, _ = ctx.saved_tensors
            grads = solution.flash_attention_backward(Q, K, V, O, dO, lse, ctx.block_size, ctx.is_causal)
            return (*grads, None, None)
    return SavesACopyOfQ


def test_saving_more_than_q_k_v_o_and_lse_is_caught(solution):
    with pytest.raises(CheckFailed, match="more than the .* bytes of Q, K, V, O and lse"):
        visible.check_FlashAttention(extra_saving(solution))


def test_function_record_sees_saved_tensors_and_ctx_attributes(solution):
    gen = torch.Generator().manual_seed(1)
    Q, K, V, dO = visible.qkv(gen, (2,), 6, 6, 3, 3)
    record = visible.function_record(solution.FlashAttention, Q, K, V, dO, 4, True)
    assert [shape for shape, _ in record["saved"]] == [[2, 6, 3]] * 4 + [[2, 6]]
    assert record["saved_bytes"] == visible.saved_budget(Q, K, V) and record["ctx_tensors"] == []
    record = visible.function_record(MISTAKES["FlashAttention"][2].fn, Q, K, V, dO, 4, True)
    assert record["saved"] == [] and sorted(n for n, _ in record["ctx_tensors"]) == ["K", "O", "Q", "V", "lse"]


def test_gradcheck_catches_a_backward_that_is_slightly_off(solution):
    class SlightlyOff(solution.FlashAttention):
        @staticmethod
        def backward(ctx, dO):
            dQ, dK, dV, _, _ = solution.FlashAttention.backward(ctx, dO)
            return dQ * (1 + 1e-4), dK, dV, None, None

    gen = torch.Generator().manual_seed(2)
    Q, K, V, _ = visible.qkv(gen, (1,), 5, 7, 3, 2)
    visible.check_gradcheck(solution.FlashAttention, Q, K, V, 3, True)
    with pytest.raises(CheckFailed, match="gradcheck"):
        visible.check_gradcheck(SlightlyOff, Q, K, V, 3, True)


# --- references and helpers --------------------------------------------------------------------------


def test_softmax_reference_on_one_hot_rows_is_zero():
    p = torch.tensor([[0.0, 1.0, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    g = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    grad = visible.autograd_softmax_backward(p, g)
    assert torch.equal(grad[0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(grad[1], torch.tensor([-1 / 3, 0.0, 1 / 3], dtype=torch.float64))


def test_scaled_logsumexp_is_what_sdpa_kernel_returns():
    gen = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(1, 2, 9, 4, generator=gen) for _ in range(3))
    for causal in (False, True):
        _, lse = sdpa_kernel_forward(Q, K, V, 4, causal)
        torch.testing.assert_close(visible.scaled_logsumexp(Q, K, causal), lse, rtol=1e-5, atol=1e-5)


def forward_started_at(start: str):
    """The reference flash_attention_forward with its running max started at ``start`` instead of -inf."""
    source = answer_cells("08_flash_backward")["flash_attention_forward"]
    line = 'running_max = torch.full((*q.shape[:-1], 1), float("-inf"),'
    assert line in source
    namespace = {"torch": torch, "math": math}
    exec(source.replace(line, f"running_max = torch.full((*q.shape[:-1], 1), {start},"), namespace)
    return namespace["flash_attention_forward"]


@pytest.mark.parametrize("start", ["0.0", "-100.0"])
def test_a_running_max_started_at_a_finite_value_is_caught(start):
    """Right on every ordinary input; only rows whose scores all lie far below the start tell (0/0, lse -inf). The
    checks' rows lie about 1e3 and 1e4 below 0: a start far below them (-1e9) cannot be told from -inf by any row
    that a correct answer in another form (split-KV) still gets right."""
    fn = forward_started_at(start)
    Q, K, V = (torch.randn(2, 9, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(fn(Q, K, V, 4)[0], F.scaled_dot_product_attention(Q, K, V))
    with pytest.raises(CheckFailed, match="'the running max started at 0'"):
        hidden.check_flash_attention_forward(fn)
    if start == "0.0":
        with pytest.raises(CheckFailed, match="every score about -1e"):
            visible.check_flash_attention_forward(fn)


def test_the_most_negative_float_is_a_safe_start(capsys):
    fn = forward_started_at("torch.finfo(Q.dtype).min")
    visible.check_flash_attention_forward(fn)
    hidden.check_flash_attention_forward(fn)
    assert "passes the hidden checks" in capsys.readouterr().out


# --- the very negative rows: the mistake named, a correct answer in FlashDecoding's form passed --------------


def split_kv_forward(Q, K, V, block_size, is_causal=False):
    """Right and tiled, in FlashDecoding's form: each key block normalised on its own, (O_j, lse_j), and the blocks
    merged by their logsumexp: lse = logaddexp(lse, lse_j), O = e^(lse_old - lse) O + e^(lse_j - lse) O_j."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or block_size < 1:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, block_size={block_size}")
    n, m, scale = Q.shape[-2], K.shape[-2], 1 / math.sqrt(Q.shape[-1])
    outputs, lses = [], []

    def finite(x):
        return torch.where(torch.isinf(x), torch.zeros_like(x), x)

    for q0 in range(0, n, block_size):
        q = Q[..., q0:q0 + block_size, :] * scale
        lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=Q.dtype)
        out = torch.zeros((*q.shape[:-1], V.shape[-1]), dtype=Q.dtype)
        for k0 in range(0, m, block_size):
            s = q @ K[..., k0:k0 + block_size, :].transpose(-2, -1)
            if is_causal:
                rows = torch.arange(q0, q0 + s.shape[-2])[:, None]
                s = s.masked_fill(torch.arange(k0, k0 + s.shape[-1])[None, :] > rows, float("-inf"))
            top = finite(s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - top)
            total = p.sum(dim=-1, keepdim=True)
            block_out = (p @ V[..., k0:k0 + block_size, :]) / torch.where(total == 0, torch.ones_like(total), total)
            block_lse = top + torch.log(total)
            merged = finite(torch.logaddexp(lse, block_lse))
            out = torch.exp(lse - merged) * out + torch.exp(block_lse - merged) * block_out
            lse = torch.logaddexp(lse, block_lse)
        outputs.append(out)
        lses.append(lse.squeeze(-1))
    return torch.cat(outputs, dim=-2), torch.cat(lses, dim=-1)


def test_a_split_kv_forward_passes_the_hidden_checks(capsys):
    """Normalising each key block and merging by logsumexp is correct: the very negative rows (scores about -1e4
    and -1e3) do not fail it, and neither does any other hidden check of the forward."""
    hidden.check_flash_attention_forward(split_kv_forward)
    assert "flash_attention_forward passes the hidden checks." in capsys.readouterr().out


def test_a_running_max_started_at_0_is_still_named_by_the_very_negative_rows():
    mistake = next(m for m in MISTAKES["flash_attention_forward"] if m.name == "the running max started at 0")
    with pytest.raises(CheckFailed, match="'the running max started at 0'"):
        hidden._check_very_negative_rows(mistake.fn, "flash_attention_forward", 856)
