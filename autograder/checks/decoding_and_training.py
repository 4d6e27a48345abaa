"""Visible checks for notebook 09: the KV cache, decoding, ALiBi, a decoder block, generation.

The referees are PyTorch's: ``F.scaled_dot_product_attention`` (math backend, float64) over
the whole sequence for every decoding step, ``causal_lower_right`` for the alignment,
``F.rms_norm``, ``F.linear`` and ``F.gelu`` for the block, a full recomputation for greedy
generation. The student's classes run where the student's code runs: the checks build them
through the student's own constructors, load weights with the module's own
``load_state_dict``, and look inside them only through the probes below (module-level
functions that return plain data).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..grader.compare import assert_close, assert_shape, assert_tensor
from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import call_student, probe, served_to
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..kernel.watches import AllocationMeter as AllocationMeter  # the notebook imports it from here
from ..references.decoding_and_training import (
    COPY_STEPS,
    DECODE_ARGS,
    DECODE_OUTPUTS,
    allocation_problem,
    cache_allocations,
    cache_chunks,
    check_cache_cases,
    check_full_cache,
    decode_case,
    decode_reference,
    require_cache,
    run_decode,
)
from ..references.decoding_and_training import cache_scenario as cache_scenario  # the tests import them from here
from ..references.masking import lower_right_pattern
from ..references.tiny_decoder import (
    BLOCK_ARGS,
    CountedCalls,
    RecomputingDecoder,
    Weights,
    block_reference,
    block_shapes,
    calls_problem,
    check_model,
    check_parameters,
    greedy_reference,
    run_block,
    run_generate,
)
from ..references.tiny_decoder import build_model as build_model  # the tests import them from here
from ..references.tiny_decoder import module_parameters as module_parameters
from ..references.tiny_decoder import train_block as train_block
from ..shared.errors import fail

INF = float("inf")


# --- the KV cache: what a caller sees, and what the appends allocate ---------------------------------


def check_KVCache(KVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """Appends against concatenation, views that later appends leave alone, O(1) copies per append, a full cache."""
    gen = generator(91)
    cases = [
        Case((2, 3, 8, 4, cache_chunks(gen, 2, 3, 4, [2, 1, 3])), {"dtype": torch.float64},
             label="a prompt of 2 tokens, then 1, then 3"),
        Case((1, 2, 4, 2, cache_chunks(gen, 1, 2, 2, [1, 1, 1, 1])), {"dtype": torch.float64},
             label="one token at a time until the cache is full"),
    ]
    check_cache_cases(KVCache, cases)
    allocated, _ = probe(cache_allocations, KVCache, 1, 2, COPY_STEPS, 8, COPY_STEPS,
                         what=f"KVCache(1, 2, {COPY_STEPS}, 8) and {COPY_STEPS} appends of one token")
    problem = allocation_problem(allocated, 1, 2, 8, torch.float32)
    if problem:
        fail(problem)
    check_full_cache(KVCache, 1, 2, 5, 4, 4, 3)
    print("KVCache passes the visible checks.")


# --- decode_step ------------------------------------------------------------------------------------------


def check_decode_step(decode_step, KVCache) -> None:  # noqa: N803
    """Step by step against causal attention over the whole sequence (SDPA, float64); the cached keys rotated."""
    require_cache(KVCache, "decode_step")
    gen = generator(93)
    cases = [
        decode_case(gen, 2, 2, 2, 8, [3, 1, 1, 2], "a prompt of 3 tokens, two single tokens, then 2 at once"),
        decode_case(gen, 1, 4, 2, 4, [2, 3], "4 query heads share 2 key/value heads", rope_base=100.0),
    ]
    verify(run_decode(decode_step, KVCache), cases, decode_reference, exercise="decode_step", arg_names=DECODE_ARGS,
           outputs=DECODE_OUTPUTS, forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-12)
    print("decode_step passes the visible checks.")


# --- ALiBi --------------------------------------------------------------------------------------------------

#: The paper's slopes written out as powers of two: h = 8 is 2^-1 ... 2^-8; h = 6 takes the 4 slopes of
#: h = 4 (2^-2, 2^-4, 2^-6, 2^-8), then every other slope of h = 8 (2^-1, 2^-3, ...) until 6.
SLOPE_EXPONENTS = {
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    6: [-2, -4, -6, -8, -1, -3],
    2: [-4, -8],
}


def slopes_of(exponents: Sequence[float]) -> torch.Tensor:
    """2 ** exponent for each exponent, in float32."""
    return torch.tensor([2.0**e for e in exponents], dtype=torch.float32)


def check_alibi_slopes(alibi_slopes) -> None:
    """h = 8, 6 and 2 against the slopes of the paper's rule, written out; float32."""
    cases = [Case((h,), label=label) for h, label in
             [(8, "a power of two: 2^(-8i/8) for i = 1..8"), (6, "not a power of two: the paper's interleave"),
              (2, "two heads")]]
    verify(alibi_slopes, cases, lambda h: slopes_of(SLOPE_EXPONENTS[h]), exercise="alibi_slopes",
           arg_names=("num_heads",), outputs=None, rtol=1e-6, atol=0)
    print("alibi_slopes passes the visible checks.")


#: alibi_bias(2, 3, [0.5, 0.25]): query i of 2 at position i + 1, keys 0..2; distance i + 1 - j.
BIAS_2_3 = torch.tensor([[[-0.5, 0.0, -INF], [-1.0, -0.5, 0.0]],
                         [[-0.25, 0.0, -INF], [-0.5, -0.25, 0.0]]], dtype=torch.float32)


def sdpa_with_mask(mask: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA on random float64 inputs with ``mask`` as its float mask, and the same inputs' shape."""
    h, n, m = mask.shape
    q, k, v = randn(h, n, 4, gen=gen), randn(h, m, 4, gen=gen), randn(h, m, 3, gen=gen)
    return math_sdpa(q, k, v, attn_mask=mask.double()), (q, k, v)


def check_alibi_bias(alibi_bias) -> None:
    """A small bias written out; with zero slopes it is SDPA's bottom-right causal mask; decoding rows agree."""
    cases = [Case((2, 3, torch.tensor([0.5, 0.25])), label="2 new queries, 3 keys, 2 heads")]
    verify(alibi_bias, cases, lambda n, m, slopes: BIAS_2_3, exercise="alibi_bias", arg_names=("n", "m", "slopes"),
           outputs=None, rtol=1e-6, atol=0)
    n, m = 3, 7
    zero = call_student(alibi_bias, n, m, torch.zeros(2), what=f"alibi_bias({n}, {m}, slopes = zeros(2))")
    assert_tensor(zero, f"alibi_bias({n}, {m}, zeros(2))")
    assert_shape(zero, (2, n, m), f"alibi_bias({n}, {m}, zeros(2))")
    gen = generator(94)
    got, (q, k, v) = sdpa_with_mask(zero, gen)
    with_pytorch_mask = math_sdpa(q, k, v, attn_mask=lower_right_pattern(n, m))
    assert_close(got, with_pytorch_mask, f"SDPA with alibi_bias({n}, {m}, zeros(2)) as its float mask", rtol=1e-12,
                 atol=1e-12, hint="With zero slopes the bias is 0 where a key may be seen and -inf where it may not: "
                 "the bottom-right causal mask of torch.nn.attention.bias.causal_lower_right, which lets query i of "
                 "n see the keys j <= i + m - n.")
    print("alibi_bias passes the visible checks.")


# --- the decoder block and the model -------------------------------------------------------------------------


def check_DecoderBlock(DecoderBlock, KVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """The parameters by name; against the block built from PyTorch functions, whole and with a cache (float64)."""
    require_cache(KVCache, "DecoderBlock")
    block = call_student(DecoderBlock, 8, 2, 16, what="DecoderBlock(8, 2, 16)")
    check_parameters(block, block_shapes(8, 16), "DecoderBlock(8, 2, 16)")
    gen = generator(95)
    weights = Weights(950, 8, 2, 16)
    cases = [
        Case((weights, randn(2, 5, 8, gen=gen)), label="the whole sequence, no cache"),
        Case((Weights(951, 12, 3, 20, rope_base=100.0), randn(1, 6, 12, gen=gen)), {"steps": [3, 1, 2]},
             label="with a cache: a prompt of 3 tokens, then 1, then 2"),
    ]
    verify(run_block(DecoderBlock, KVCache), cases, block_reference, exercise="DecoderBlock", arg_names=BLOCK_ARGS,
           outputs=None, forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-10)
    print("DecoderBlock passes the visible checks.")


# --- generate ------------------------------------------------------------------------------------------------


def check_generate(generate, TinyDecoder) -> None:  # noqa: N803
    """Greedy tokens against a full recomputation, with and without the cache; the cache path feeds one token per step."""
    weights = Weights(960, 8, 2, 16, vocab=11, num_layers=2)
    check_model(TinyDecoder, weights, "generate")
    gen = generator(97)
    prompt = torch.randint(0, 11, (2, 4), generator=gen)
    cases = [Case((weights, prompt, 6), {"use_cache": use}, label=f"use_cache={use}") for use in (True, False)]
    verify(run_generate(generate, TinyDecoder), cases, greedy_reference, exercise="generate",
           arg_names=("model", "prompt", "steps"), outputs=None, rtol=0, atol=0)
    # the model is served from the grader: its calls are counted where the student's code cannot reach them
    counted = CountedCalls(RecomputingDecoder(weights))
    call_student(generate, served_to(generate, counted, CountedCalls.METHODS), prompt, 6, use_cache=True,
                 what="generate(model, prompt (2, 4), 6, use_cache=True)")
    problem = calls_problem(*counted.calls(), 4, 6)
    if problem:
        fail(problem)
    print("generate passes the visible checks.")


# --- training: does the block learn? ----------------------------------------------------------------------------


