"""Notebook 09: the reference passes every check, every catalogued mistake is caught and named, and
each protection of the checks (the allocation count, the cached keys, the calls of the model, the
training probe, the parameter names, the norms' eps, the message of a full cache, the guard) catches what it must."""

from __future__ import annotations

import inspect
import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.checks import decoding_and_training as visible
from autograder.hidden import decoding_and_training as hidden
from autograder.hidden.decoding_and_training import MISTAKES
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

ASSIGNMENT = "09_decoding_and_training"
SIGNATURES = {
    "KVCache": "(batch, kv_heads, max_len, d_head, dtype=torch.float32)",
    "decode_step": "(q, k_new, v_new, cache, rope_base=10000.0)",
    "alibi_slopes": "(num_heads)",
    "alibi_bias": "(n, m, slopes)",
    "DecoderBlock": "(d_model, num_heads, d_ff, rope_base=10000.0)",
    "generate": "(model, prompt, steps, use_cache=True)",
}
#: The names each check takes after the exercise itself (the notebook's test cells pass them).
PARTNERS = {"decode_step": ("KVCache",), "DecoderBlock": ("KVCache",), "generate": ("TinyDecoder",)}


@pytest.fixture(scope="module")
def solution() -> types.SimpleNamespace:
    """The answer cells, with the notebook's own definitions (TinyDecoder, built on the answers)."""
    return solution_namespace(ASSIGNMENT)


def test_the_interface(solution):
    """The signatures the notebook promises (test_catalogue.py holds every catalogued mistake to the reference's)."""
    found = {name: str(inspect.signature(getattr(solution, name))) for name in SIGNATURES}
    assert {name: text.replace("<class 'torch.float32'>", "torch.float32") for name, text in found.items()} == SIGNATURES


#: The mistakes the syllabus asks for, by the name the catalogue gives them.
REQUIRED = {
    "KVCache": {"the cache grown by concatenating a new tensor at every step"},
    "decode_step": {"top-left causal alignment when decoding", "RoPE restarting at position 0 for each new token",
                    "keys cached before the rotation but used after it", "keys rotated before caching and again after"},
    "alibi_slopes": {"slopes of the next power of two without the interleave"},
    "alibi_bias": {"ALiBi bias with the wrong sign"},
    "DecoderBlock": {"a decoder block with post-norm where pre-norm was asked"},
    "generate": {"generate that feeds the whole sequence at every step when use_cache=True"},
}


def test_the_issue_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise


# --- the KV cache ------------------------------------------------------------------------------------------


class CacheReturningCopies:
    """Preallocated, but append returns copies: right values, O(n^2) bytes, and not torch.cat."""

    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.keys = torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype)
        self.values = torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype)
        self.length = 0

    def __len__(self):
        return self.length

    def append(self, k, v):
        end = self.length + k.shape[2]
        if end > self.keys.shape[2]:
            raise ValueError(f"{end} tokens do not fit in max_len = {self.keys.shape[2]}")
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.keys[:, :, :end].clone(), self.values[:, :, :end].clone()


class CacheWritingAtTheStart(CacheReturningCopies):
    """Forgets the offset: every append writes at position 0, so later appends change earlier views."""

    def append(self, k, v):
        t = k.shape[2]
        self.keys[:, :, :t] = k
        self.values[:, :, :t] = v
        self.length += t
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]


class CacheWithTerseError:
    """Preallocated and right, but its ValueError does not say how long the cache is or would be."""

    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.keys = torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype)
        self.values = torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype)
        self.length = 0

    def __len__(self):
        return self.length

    def append(self, k, v):
        end = self.length + k.shape[2]
        if end > self.keys.shape[2]:
            raise ValueError("the cache is full")
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


def test_allocation_count_separates_preallocation_from_copies(solution):
    args = (1, 2, visible.COPY_STEPS, 8, visible.COPY_STEPS)
    reference, _ = visible.cache_allocations(solution.KVCache, *args)
    assert visible.allocation_problem(reference, 1, 2, 8, torch.float32) is None
    concatenated, by_cat = visible.cache_allocations(hidden.CacheConcatenated, *args)
    assert visible.allocation_problem(concatenated, 1, 2, 8, torch.float32) and by_cat == concatenated
    copies, by_cat = visible.cache_allocations(CacheReturningCopies, *args)
    assert visible.allocation_problem(copies, 1, 2, 8, torch.float32) and by_cat == 0
    with pytest.raises(CheckFailed) as failure:
        hidden.check_KVCache(CacheReturningCopies)
    assert "O(n^2)" in str(failure.value)
    assert "This looks like the mistake" not in str(failure.value)  # not torch.cat: no mistake is named


class CacheAlwaysFloat32(CacheWithTerseError):
    """Right but for its dtype argument, which it ignores."""

    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        super().__init__(batch, kv_heads, max_len, d_head)


def test_views_changed_by_later_appends_are_caught():
    with pytest.raises(CheckFailed) as failure:
        visible.check_KVCache(CacheWritingAtTheStart)
    assert "must not be changed by later appends" in str(failure.value)
    for check in (visible.check_KVCache, hidden.check_KVCache):  # its earlier views are right, in float32
        with pytest.raises(CheckFailed, match="should have the cache's dtype torch.float64") as failure:
            check(CacheAlwaysFloat32)
        assert "later appends" not in str(failure.value)


def test_a_full_cache_must_name_both_lengths():
    with pytest.raises(CheckFailed) as failure:
        visible.check_KVCache(CacheWithTerseError)
    assert "should name both lengths" in str(failure.value)


# --- decode_step ----------------------------------------------------------------------------------------------


def decode_positions_from_one(q, k_new, v_new, cache, rope_base=10000.0):
    """Numbers positions from 1: every distance is right, so every output is; the cached keys are not."""

    def rotate(x, positions):
        d = x.shape[-1]
        angles = positions.double()[:, None] * rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

    h, t, d = q.shape[1], q.shape[2], q.shape[3]
    positions = torch.arange(len(cache), len(cache) + t) + 1
    keys, values = cache.append(rotate(k_new, positions), v_new)
    keys = keys.repeat_interleave(h // keys.shape[1], dim=1)
    values = values.repeat_interleave(h // values.shape[1], dim=1)
    m = keys.shape[2]
    scores = rotate(q, positions) @ keys.transpose(-2, -1) / math.sqrt(d)
    weights = torch.softmax(scores.masked_fill(torch.arange(m) > torch.arange(m - t, m)[:, None], -math.inf), -1)
    return weights @ values, weights


def test_a_constant_shift_of_positions_is_seen_in_the_cache_only(solution):
    gen = torch.Generator().manual_seed(0)
    case = visible.decode_case(gen, 1, 2, 2, 8, [3, 1, 2], "shift")
    output, weights, keys = visible.run_decode(decode_positions_from_one, solution.KVCache)(*case.args)
    expected = visible.decode_reference(*case.args)
    assert torch.allclose(output, expected[0], atol=1e-12) and torch.allclose(weights, expected[1], atol=1e-12)
    assert not torch.allclose(keys, expected[2], atol=1e-6)
    with pytest.raises(CheckFailed) as failure:
        visible.check_decode_step(decode_positions_from_one, solution.KVCache)
    assert "The key cache of decode_step is not" in str(failure.value)


def decode_with_sdpa(q, k_new, v_new, cache, rope_base=10000.0):
    keys, values = cache.append(k_new, v_new)
    return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True), None


def test_the_guard_forbids_sdpa_inside_decode_step(solution):
    with pytest.raises(CheckFailed, match="which this exercise asks you to write yourself"):
        visible.check_decode_step(decode_with_sdpa, solution.KVCache)


def test_a_broken_cache_is_reported_before_decode_step(solution):
    with pytest.raises(CheckFailed, match="Fix KVCache first"):
        visible.check_decode_step(solution.decode_step, hidden.CacheWholeStorage)


# --- ALiBi: the visible numbers are the paper's --------------------------------------------------------------


def test_visible_alibi_numbers_agree_with_the_papers_code():
    for h, exponents in visible.SLOPE_EXPONENTS.items():
        assert torch.allclose(visible.slopes_of(exponents), hidden.slopes_reference(h), rtol=1e-7, atol=0)
    assert torch.equal(visible.BIAS_2_3, hidden.bias_reference(2, 3, torch.tensor([0.5, 0.25])))


def test_papers_slopes_for_a_few_head_counts():
    assert hidden.paper_slopes(8) == [2.0**-i for i in range(1, 9)]
    assert hidden.paper_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    assert hidden.paper_slopes(12) == pytest.approx([2.0**-i for i in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5,
                                                                                     2**-3.5])


# --- the decoder block -----------------------------------------------------------------------------------------


class BlockWithOtherNames(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, rope_base=10000.0):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d_model, eps=1e-6), nn.RMSNorm(d_model, eps=1e-6)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)


def test_parameter_names_are_checked_by_name(solution):
    with pytest.raises(CheckFailed) as failure:
        visible.check_DecoderBlock(BlockWithOtherNames, solution.KVCache)
    message = str(failure.value)
    assert "missing: q_proj.weight (8, 8)" in message and "not expected: qkv.weight (24, 8)" in message


def default_eps_block(solution):
    class DefaultEps(solution.DecoderBlock):
        def __init__(self, d_model, num_heads, d_ff, rope_base=10000.0):
            super().__init__(d_model, num_heads, d_ff, rope_base)
            self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)  # eps=None: the dtype's machine epsilon

    return DefaultEps


@pytest.mark.parametrize("check", [visible.check_DecoderBlock, hidden.check_DecoderBlock])
def test_norms_with_the_default_eps_are_named_not_taken_for_float32(solution, check):
    with pytest.raises(CheckFailed) as failure:
        check(default_eps_block(solution), solution.KVCache)
    message = str(failure.value)
    assert "norm1 is nn.RMSNorm with eps=None, norm2 is nn.RMSNorm with eps=None" in message
    assert "nn.RMSNorm(d_model, eps=1e-6)" in message and "Was part of it computed in torch.float32" not in message


def detached_block(solution):
    class Detached(solution.DecoderBlock):
        def forward(self, x, cache=None):
            with torch.no_grad():  # the right values, but no gradient reaches the block's parameters
                change = super().forward(x, cache) - x
            return x + change

    return Detached


def local_block(solution):
    class Local(solution.DecoderBlock):
        def forward(self, x, cache=None):  # each position sees only itself, gated by its own q . k
            normed = self.norm1(x)
            gate = torch.sigmoid((self.q_proj(normed) * self.k_proj(normed)).sum(dim=-1, keepdim=True))
            x = x + self.out_proj(gate * self.v_proj(normed))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    return Local


def test_training_probe_learns_with_the_reference_only(solution):
    assert hidden.training_problem(visible.train_block(solution.DecoderBlock)) is None
    assert "got no gradient" in hidden.training_problem(visible.train_block(detached_block(solution)))
    assert "the mean loss went from" in hidden.training_problem(visible.train_block(local_block(solution)))


# --- generate ----------------------------------------------------------------------------------------------------


def test_the_calls_of_the_model_are_what_catches_recomputation(solution):
    weights = visible.Weights(1, 8, 2, 16, vocab=11, num_layers=2)
    prompt = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(0))
    wasteful = hidden.generate_whole_sequence_each_step
    counted = visible.CountedCalls(visible.build_model(solution.TinyDecoder, weights))
    tokens = wasteful(counted, prompt, 6)
    assert torch.equal(tokens, visible.greedy_reference(weights, prompt, 6))  # the tokens alone cannot tell
    assert visible.calls_problem(*counted.calls(), 4, 6)
    counted = visible.CountedCalls(visible.build_model(solution.TinyDecoder, weights))
    solution.generate(counted, prompt, 6)
    fed, cached = counted.calls()
    assert fed.tolist() == [4, 1, 1, 1, 1, 1] and bool(cached.all())
    assert visible.calls_problem(fed, cached, 4, 6) is None


class PostNormDecoder(hidden.ReferenceTinyDecoder):
    """A TinyDecoder whose blocks are post-norm: generate is right, the model is not."""

    def __init__(self, vocab, d_model, num_heads, d_ff, num_layers):
        super().__init__(vocab, d_model, num_heads, d_ff, num_layers)
        self.blocks = nn.ModuleList(hidden.BlockPostNorm(d_model, num_heads, d_ff) for _ in range(num_layers))


def test_a_wrong_model_is_reported_before_generate(solution):
    with pytest.raises(CheckFailed, match="Fix DecoderBlock first"):
        visible.check_generate(solution.generate, PostNormDecoder)


# --- probes are public, module-level functions -------------------------------------------------------------------


@pytest.mark.parametrize("examine", [visible.cache_scenario, visible.cache_allocations, visible.module_parameters,
                                     visible.train_block])
def test_probes_live_in_the_public_checks(examine):
    assert examine.__module__.startswith("autograder.references.")  # public, shared with the hidden checks
    assert "<locals>" not in examine.__qualname__
