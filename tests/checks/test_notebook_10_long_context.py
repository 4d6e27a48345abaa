"""Notebook 10: the interface, the mistakes the syllabus asks for, correct answers in other styles, and each
protection of the checks (the order and dtype of the positions, the copy of the caller's tokens, the memory a
rolling cache holds, the n x m watch, the guard) catching what it must."""

from __future__ import annotations

import collections
import inspect
import types

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import long_context as visible
from autograder.hidden import long_context as hidden
from autograder.hidden.long_context import MISTAKES
from autograder.kernel.guard import ForbiddenCall
from autograder.references.long_context import HELD_ALLOWANCE, rolling_bytes_held, storage_bytes
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "10_long_context"
SIGNATURES = {
    "sink_window_mask": "(n, m, window, sinks=0)",
    "RollingKVCache": "(batch, kv_heads, window, sinks, d_head, dtype=torch.float32)",
    "linear_attention": "(Q, K, V, is_causal=False, eps=1e-06)",
    "linear_attention_recurrent": "(Q, K, V, eps=1e-06)",
}
#: The mistakes the syllabus asks for, by the name the catalogue gives them.
REQUIRED = {
    "sink_window_mask": {"window off by one (window + 1 keys)", "window off by one (window - 1 keys)",
                         "window anchored top-left", "sinks counted inside the window"},
    "RollingKVCache": {"the cache evicts a sink", "tokens returned out of order"},
    "linear_attention": {"phi not positive (phi(x) = x)", "phi not positive (relu)",
                         "the causal form built with an n x n mask"},
    "linear_attention_recurrent": {"state read before adding the token (updated after the output)"},
}


@pytest.fixture(scope="module")
def solution() -> types.SimpleNamespace:
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    found = {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES}
    assert {name: text.replace("<class 'torch.float32'>", "torch.float32") for name, text in found.items()} == SIGNATURES


def test_the_required_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


def both_checks(exercise: str, answer) -> None:
    getattr(visible, f"check_{exercise}")(answer)
    getattr(hidden, f"check_{exercise}")(answer)


# --- correct answers in other styles pass ---------------------------------------------------------------------


def mask_by_loops(n, m, window, sinks=0):
    if window < 1 or sinks < 0:
        raise ValueError("window >= 1 and sinks >= 0")
    mask = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        p = i + m - n
        if p >= 0:  # a query before the first key sees nothing
            mask[i, max(0, p - window + 1):p + 1] = True
            mask[i, :min(sinks, p + 1)] = True
    return mask


class DequeCache:
    """Sinks in a list and the window in a deque of copies: constant memory, tokens stacked at every append."""

    def __init__(self, batch, kv_heads, window, sinks, d_head, dtype=torch.float32):
        if window < 1 or sinks < 0:
            raise ValueError("window >= 1 and sinks >= 0")
        self.shape, self.sinks, self.dtype, self.seen = (batch, kv_heads, 1, d_head), sinks, dtype, 0
        self.first, self.recent = [], collections.deque(maxlen=window)

    def __len__(self):
        return self.seen

    def append(self, k, v):
        if tuple(k.shape) != self.shape or tuple(v.shape) != self.shape:
            raise ValueError(f"one token of shape {self.shape}")
        token = (self.seen, k.to(self.dtype).clone(), v.to(self.dtype).clone())
        (self.first if self.seen < self.sinks else self.recent).append(token)
        self.seen += 1
        kept = self.first + list(self.recent)
        return (torch.cat([t[1] for t in kept], dim=2), torch.cat([t[2] for t in kept], dim=2),
                torch.tensor([t[0] for t in kept]))


def linear_by_einsum(Q, K, V, is_causal=False, eps=1e-6):
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or (is_causal and Q.shape[-2] != K.shape[-2]):
        raise ValueError("shapes do not fit")
    fq, fk = F.elu(Q) + 1, F.elu(K) + 1
    if is_causal:
        S = torch.einsum("...jd,...je->...jde", fk, V).cumsum(-3)
        return torch.einsum("...id,...ide->...ie", fq, S) / (torch.einsum("...id,...id->...i", fq, fk.cumsum(-2))
                                                            [..., None] + eps)
    return torch.einsum("...id,...de->...ie", fq, torch.einsum("...jd,...je->...de", fk, V)) / (
        torch.einsum("...id,...d->...i", fq, fk.sum(-2))[..., None] + eps)


def recurrent_by_addcmul(Q, K, V, eps=1e-6):
    if Q.shape[-2:] != K.shape[-2:] or K.shape[-2] != V.shape[-2]:
        raise ValueError("shapes do not fit")
    fq, fk = F.elu(Q) + 1, F.elu(K) + 1
    S = torch.zeros(*Q.shape[:-2], Q.shape[-1], V.shape[-1], dtype=Q.dtype)
    z = torch.zeros(*Q.shape[:-2], Q.shape[-1], dtype=Q.dtype)
    out = torch.empty(*Q.shape[:-1], V.shape[-1], dtype=Q.dtype)
    for i in range(Q.shape[-2]):
        S = torch.addcmul(S, fk[..., i, :].unsqueeze(-1), V[..., i, :].unsqueeze(-2))
        z = z + fk[..., i, :]
        out[..., i, :] = torch.einsum("...d,...de->...e", fq[..., i, :], S) / (
            torch.einsum("...d,...d->...", fq[..., i, :], z)[..., None] + eps)
    return out, (S, z)


def mask_by_tril(n, m, window, sinks=0):
    if window < 1 or sinks < 0:
        raise ValueError("window >= 1 and sinks >= 0")
    ones = torch.ones(n, m, dtype=torch.bool)
    causal, too_old = ones.tril(m - n), ones.tril(m - n - window)
    sink = torch.zeros(n, m, dtype=torch.bool)
    sink[:, :sinks] = True
    return (causal & ~too_old) | (sink & causal)


class RingWithPositions:
    """Storage made in the constructor, a ring of positions read back with argsort."""

    def __init__(self, batch, kv_heads, window, sinks, d_head, dtype=torch.float32):
        if window < 1 or sinks < 0:
            raise ValueError("window >= 1 and sinks >= 0")
        self.window, self.sinks, self.shape, self.seen = window, sinks, (batch, kv_heads, 1, d_head), 0
        self.k = torch.zeros(batch, kv_heads, sinks + window, d_head, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.full((sinks + window,), -1, dtype=torch.long)

    def __len__(self):
        return self.seen

    def append(self, k, v):
        if k.shape != self.shape or v.shape != self.shape:
            raise ValueError(f"one token of shape {self.shape}")
        slot = self.seen if self.seen < self.sinks else self.sinks + (self.seen - self.sinks) % self.window
        self.k[:, :, slot], self.v[:, :, slot], self.pos[slot] = k[:, :, 0], v[:, :, 0], self.seen
        self.seen += 1
        used = (self.pos >= 0).nonzero().flatten()
        order = used[self.pos[used].argsort()]
        return self.k[:, :, order], self.v[:, :, order], self.pos[order]


def linear_by_chunks(Q, K, V, is_causal=False, eps=1e-6, chunk=16):
    """The causal form by chunks: small quadratic blocks inside a chunk, a carried state between chunks."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or (is_causal and Q.shape[-2] != K.shape[-2]):
        raise ValueError("shapes do not fit")
    fq, fk = torch.where(Q > 0, Q + 1, torch.exp(Q)), torch.where(K > 0, K + 1, torch.exp(K))
    if not is_causal:
        return fq @ (fk.transpose(-1, -2) @ V) / (fq @ fk.sum(-2, keepdim=True).transpose(-1, -2) + eps)
    S = Q.new_zeros(*Q.shape[:-2], Q.shape[-1], V.shape[-1])
    z = Q.new_zeros(*Q.shape[:-2], 1, Q.shape[-1])
    outputs = []
    for s in range(0, Q.shape[-2], chunk):
        q, k, v = fq[..., s:s + chunk, :], fk[..., s:s + chunk, :], V[..., s:s + chunk, :]
        A = (q @ k.transpose(-1, -2)).tril()
        outputs.append((q @ S + A @ v) / ((q * z).sum(-1, keepdim=True) + A.sum(-1, keepdim=True) + eps))
        S, z = S + k.transpose(-1, -2) @ v, z + k.sum(-2, keepdim=True)
    return torch.cat(outputs, -2)


@pytest.mark.parametrize(("exercise", "answer"), [
    ("sink_window_mask", mask_by_loops), ("sink_window_mask", mask_by_tril), ("RollingKVCache", DequeCache),
    ("RollingKVCache", RingWithPositions), ("linear_attention", linear_by_einsum),
    ("linear_attention", linear_by_chunks), ("linear_attention_recurrent", recurrent_by_addcmul)])
def test_correct_answers_in_other_styles_pass(exercise, answer, capsys):
    both_checks(exercise, answer)
    assert f"{exercise} passes the hidden checks" in capsys.readouterr().out


# --- the protections catch what they must -----------------------------------------------------------------------


class KeepsCallerTensors(DequeCache):
    def append(self, k, v):
        (self.first if self.seen < self.sinks else self.recent).append((self.seen, k, v))  # no copy
        self.seen += 1
        kept = self.first + list(self.recent)
        return (torch.cat([t[1] for t in kept], dim=2).to(self.dtype), torch.cat([t[2] for t in kept], dim=2)
                .to(self.dtype), torch.tensor([t[0] for t in kept]))


class Int32Positions(DequeCache):
    def append(self, k, v):
        keys, values, positions = super().append(k, v)
        return keys, values, positions.int()


@pytest.mark.parametrize("check", [visible.check_RollingKVCache, hidden.check_RollingKVCache])
def test_a_cache_that_keeps_the_callers_tokens_is_told_to_copy(check):
    with pytest.raises(CheckFailed, match="must copy them into its own storage"):
        check(KeepsCallerTensors)


def test_positions_must_be_long():
    with pytest.raises(CheckFailed, match="torch.long"):
        visible.check_RollingKVCache(Int32Positions)


def test_the_memory_watch_sees_a_growing_cache_and_spares_a_constant_one(solution):
    keeps_all = next(m.fn for m in MISTAKES["RollingKVCache"] if m.name == "the cache keeps every token")
    storage = storage_bytes(1, 2, 3, 2, 4)
    assert rolling_bytes_held(solution.RollingKVCache, 1, 2, 3, 2, 4, 96) <= storage
    assert rolling_bytes_held(keeps_all, 1, 2, 3, 2, 4, 96) > HELD_ALLOWANCE * storage


def linear_with_mask_in_both(Q, K, V, is_causal=False, eps=1e-6):
    """Right values; the non-causal form builds phi(Q) phi(K)^T."""
    A = (F.elu(Q) + 1) @ (F.elu(K) + 1).transpose(-2, -1)
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2] or (is_causal and Q.shape[-2] != K.shape[-2]):
        raise ValueError("shapes do not fit")
    A = A.tril() if is_causal else A
    return A @ V / (A.sum(-1, keepdim=True) + eps)


def test_the_n_by_m_watch_names_the_quadratic_form():
    with pytest.raises(CheckFailed, match=r"as big as the\s+n x m") as failure:
        hidden.check_linear_attention(linear_with_mask_in_both)
    assert "the n x m matrix phi(Q) phi(K)^T built" in str(failure.value)


def linear_calling_sdpa(Q, K, V, is_causal=False, eps=1e-6):
    F.scaled_dot_product_attention(Q, K, V)
    return linear_by_einsum(Q, K, V, is_causal, eps)


def test_the_guard_forbids_sdpa():
    with pytest.raises(ForbiddenCall, match="scaled_dot_product_attention"):
        visible.check_linear_attention(linear_calling_sdpa)


def test_the_hidden_mask_check_compares_with_sdpa_on_the_mask():
    """A mask that is right as a mask is right under SDPA: the extra check passes the reference and fails a mistake."""
    wrong = next(m.fn for m in MISTAKES["sink_window_mask"] if m.name == "window anchored top-left")
    with pytest.raises(CheckFailed):
        hidden.check_sink_window_mask(wrong)


def test_eps_above_and_below_is_named_in_linear_attention_s_words():
    """eps added to the numerator too: named as such, and the message speaks of linear attention, not of softmax."""
    wrong = next(m.fn for m in MISTAKES["linear_attention"] if m.name == "eps added to the numerator and the denominator")
    with pytest.raises(CheckFailed) as failure:
        hidden.check_linear_attention(wrong)
    message = str(failure.value)
    assert "'eps added to the numerator and the denominator'" in message
    assert "eps left out" not in message and "log-sum-exp" not in message and "softmax" not in message.lower().replace(
        "the softmax replaced by a feature map", "")
