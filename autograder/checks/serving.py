"""Visible checks for notebook 11, serving: bytes per token, a paged KV cache, paged attention, multi-head latent
attention and speculative decoding.

The referees: numbers written out for the bytes; contiguous caches (the chunks appended, concatenated) for the
paged cache; SDPA per sequence (math backend, float64) for paged attention; the expanded attention with the same
weights for MLA; notebook 09's greedy decoding by full recomputation for speculative decoding. The student's
classes run where the student's code runs, through the probes of :mod:`autograder.references.serving`. Where the
grader has the catalogue (never in the student's bundle), a failing visible check names the mistakes it matches.
"""

from __future__ import annotations

import math

import torch

from ..grader.diagnosis import catalogue, through
from ..grader.inputs import generator, randn
from ..grader.student import call_student, probe
from ..grader.verify import Case, verify, verify_number
from ..kernel.guard import ATTENTION_BUILTINS
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
    greedy_of,
    mla_reference,
    mla_shapes,
    paged_append_errors,
    paged_attention_errors,
    paged_attention_on,
    paged_attention_reference,
    paged_case,
    proposals_all_accepted,
    run_mla,
    run_paged_attention,
    script,
    speculative_errors,
    speculative_problem,
    speculative_run,
    unknown_ids,
)
from ..references.tiny_decoder import module_parameters
from ..shared.errors import fail

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "serving"


def check_cache_bytes_per_token(cache_bytes_per_token) -> None:
    """Three configurations whose bytes are written out: multi-head, grouped-query, MLA's latent."""
    cases = [
        (Case((32, 32, 32, 128, torch.float16), label="a 7B-class model, multi-head, float16"),
         2 * 32 * 32 * 128 * 2),
        (Case((32, 32, 8, 128, torch.bfloat16), label="grouped-query, 8 key/value heads, bfloat16"),
         2 * 32 * 8 * 128 * 2),
        (Case((60, 128, 128, 128, torch.bfloat16), {"d_latent": 512}, label="DeepSeek-V2's latent, bfloat16"),
         60 * 512 * 2),
    ]
    verify_number(cache_bytes_per_token, cases, exercise="cache_bytes_per_token", notebook=NOTEBOOK,
                  arg_names=("num_layers", "num_heads", "kv_heads", "d_head", "dtype"), integer=True)
    bytes_errors(cache_bytes_per_token)
    print("cache_bytes_per_token passes the visible checks.")


def check_PagedKVCache(PagedKVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """Three scripts against contiguous caches (a freed block reused, a full pool); appends copy nothing held."""
    gen = generator(111)
    cases = [
        (6, 2, 2, 4, script(gen, 2, 4, ["new", "new", ("append", 0, 3), ("append", 1, 2), ("append", 0, 2)]),
         torch.float64, "two sequences growing in turn"),
        (3, 2, 1, 4, script(gen, 1, 4, ["new", "new", ("append", 0, 2), ("append", 1, 4), ("free", 0),
                                        ("append", 1, 1), "new"]), torch.float64,
         "a full pool: after free, the freed block is the only one left"),
        (4, 2, 1, 2, script(gen, 1, 2, ["new", ("append", 0, 3), "new", ("append", 1, 2), ("append", 0, 4)]),
         torch.float64, "an append of 4 tokens that needs 2 blocks when 1 is free"),
    ]
    check_paged_scripts(PagedKVCache, cases, catalogue(NOTEBOOK, "PagedKVCache"))
    problem = append_allocation_problem(probe(append_allocations, PagedKVCache, what="64 appends of one token"))
    if problem:
        fail(problem)
    unknown_ids(PagedKVCache)
    paged_append_errors(PagedKVCache)
    print("PagedKVCache passes the visible checks.")


def check_paged_attention(paged_attention) -> None:
    """Against SDPA per sequence on the gathered keys and values (float64): a table out of order, grouped heads."""
    gen = generator(112)
    cases = [
        paged_case(gen, 6, 4, 2, 4, 8, [(3, [5, 1], 6), (7, [0], 3)], [3, 7],
                   "blocks out of pool order, 4 query heads on 2 key/value heads"),
        paged_case(gen, 4, 2, 1, 2, 4, [(0, [2, 3, 1], 5), (1, [], 0)], [1, 0], "an empty sequence first"),
    ]
    mistakes = through(catalogue(NOTEBOOK, "paged_attention"), lambda fn: lambda *args: paged_attention_on(fn, *args))
    verify(run_paged_attention(paged_attention, ATTENTION_BUILTINS), cases, paged_attention_reference,
           exercise="paged_attention", arg_names=PAGED_ARGS, outputs=None, forbid=ATTENTION_BUILTINS,
           mistakes=mistakes, rtol=1e-10, atol=1e-12)
    paged_attention_errors(paged_attention, cases[0])
    print("paged_attention passes the visible checks.")


def check_MultiHeadLatentAttention(MultiHeadLatentAttention) -> None:  # noqa: N802, N803 - named after the class it checks
    """The parameters by name; both paths against the expanded attention (float64); the absorbed path watched."""
    sizes = (16, 2, 8, 12)
    what = "MultiHeadLatentAttention(16, 2, 8, 12)"
    summary = probe(module_parameters, call_student(MultiHeadLatentAttention, *sizes, what=what),
                    what=f"the parameters of {what}")
    expected = mla_shapes(*sizes)
    got = {name: tuple(shape) for name, shape in summary["parameters"].items()}
    if not summary["is_module"] or got != expected:
        fail(f"The parameters of {what} should be exactly {', '.join(f'{n} {s}' for n, s in expected.items())} "
             f"(nn.Linear(..., bias=False) each), but they are {', '.join(f'{n} {s}' for n, s in got.items()) or 'none'}."
             " The checks load reference weights by these names.")
    gen = generator(113)
    weights, x = LatentWeights(1130, *sizes), randn(2, 6, 16, gen=gen)
    cases = [Case((weights, x), {"steps": [3, 1, 2], "absorbed": absorbed},
                  label=f"a prompt of 3, one token, then 2, absorbed={absorbed}") for absorbed in (False, True)]
    verify(run_mla(MultiHeadLatentAttention, ATTENTION_BUILTINS), cases, mla_reference, exercise="MultiHeadLatentAttention",
           arg_names=MLA_ARGS, outputs=MLA_OUTPUTS, forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-12,
           mistakes=through(catalogue(NOTEBOOK, "MultiHeadLatentAttention"), run_mla))
    problem = absorbed_problem(probe(absorbed_allocations, MultiHeadLatentAttention,
                                     LatentWeights(1131, 32, 4, 16, 8).state, forbid=ATTENTION_BUILTINS,
                                     what="an absorbed decode step after 256 cached tokens"))
    if problem:
        fail(problem)
    print("MultiHeadLatentAttention passes the visible checks.")


def check_speculative_generate(speculative_generate) -> None:
    """The target's greedy tokens (float64) with a weaker draft and with draft = target; the calls counted; errors."""
    target = (1140, 16, 2, 32, 24, 2, None, True)  # never repeating a token: proposing one k times is wrong
    for draft, prompt, steps, k, calls, label in [
        ((1140, 16, 2, 32, 24, 2, 1, True), [13, 22, 16, 12], 12, 3, None, "a draft made of the target's first block"),
        (target, [5, 0, 17, 9], 10, 2, math.ceil(10 / 3), "draft = target: every proposal accepted, ceil(steps / "
         "(k + 1)) calls"),
    ]:
        prompt = torch.tensor([prompt])
        what = f"speculative_generate(target, draft, prompt (1, 4), {steps}, {k}) ({label})"
        got = speculative_run(speculative_generate, target, draft, prompt, steps, k)
        found = speculative_problem(got, target, draft, prompt, steps, k, greedy_of(target, prompt, steps), calls)
        if found is not None:
            fail(f"{found[1]}\n({label})")
        if draft == target and got[3] != proposals_all_accepted(steps, k):
            fail(f"{what} gave the right tokens and target calls, but called the draft {got[3]} times where the rounds "
                 f"propose {proposals_all_accepted(steps, k)} tokens in all: each round proposes min(k, steps left - "
                 "1) tokens, one call of the draft each, and no proposal is made that could only produce a token "
                 "beyond steps.")
    speculative_errors(speculative_generate, target)
    print("speculative_generate passes the visible checks.")
