"""Visible checks for notebook 07, the cost of attention and FlashAttention.

The counting exercises are checked against numbers worked out by hand from the formulas
of the notebook; the attention exercises against ``F.scaled_dot_product_attention``
(math backend, float64), which the student's functions may not call.
"""

from __future__ import annotations

import torch

from ..grader.inputs import generator, randn
from ..grader.student import expect_error
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

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "complexity"

# --- the counting exercises ---------------------------------------------------------------------


def check_attention_flops(attention_flops) -> None:
    """Two configurations whose FLOPs were counted by hand."""
    cases = [
        # one head, one query, one key, d_k = d_v = 1: one multiply-add in each product.
        (Case((1, 1, 1, 1, 1, 1), label="one query, one key, one dimension"), 4),
        # 2 * 2*3*5*7*11 + 2 * 2*3*5*7*13 = 4620 + 5460
        (Case((2, 3, 5, 7, 11, 13), label="every size different"), 10080),
    ]
    verify_number(attention_flops, cases, exercise="attention_flops", notebook=NOTEBOOK, arg_names=FLOPS_ARGS,
                  integer=True)
    print("attention_flops passes the visible checks.")


def check_attention_memory_bytes(attention_memory_bytes) -> None:
    """Three configurations whose bytes were counted by hand, in three dtypes."""
    cases = [
        (Case((1, 1, 2, 3, torch.float32), label="6 entries of 4 bytes"), 24),
        (Case((2, 4, 8, 16, torch.float16), label="1024 entries of 2 bytes"), 2048),
        (Case((3, 1, 5, 2, torch.float64), label="30 entries of 8 bytes"), 240),
    ]
    verify_number(attention_memory_bytes, cases, exercise="attention_memory_bytes", notebook=NOTEBOOK,
                  arg_names=MEMORY_ARGS, integer=True)
    print("attention_memory_bytes passes the visible checks.")


def check_fit_power_law(fit_power_law) -> None:
    """An exact power law with a constant that is not 1, and a noisy one whose fit was computed once."""
    ns = [16, 32, 64, 128, 256]
    exact = [5.0 * n**2 for n in ns]
    noisy = [1.0, 2.5, 9.0, 14.0, 70.0]  # least-squares slope of (log n, log cost): 1.4743992861060176
    cases = [
        (Case((ns, exact), label="cost = 5 n^2 exactly"), 2.0),
        (Case(([1, 2, 4, 8, 16], noisy), label="noisy data"), 1.4743992861060176),
    ]
    verify_number(fit_power_law, cases, exercise="fit_power_law", notebook=NOTEBOOK, arg_names=("ns", "costs"),
                  integer=False, rel_tol=FIT_RTOL, abs_tol=FIT_ATOL)
    expect_error(fit_power_law, [1, 2, 3], [1.0, 2.0], error=ValueError, what="fit_power_law([1, 2, 3], [1.0, 2.0])",
                 why="there are 3 sizes and 2 costs")
    print("fit_power_law passes the visible checks.")


# --- the attention exercises -----------------------------------------------------------------------


def _attention_cases() -> list[Case]:
    gen = generator(70)
    return [
        Case((randn(2, 10, 4, gen=gen), randn(2, 10, 4, gen=gen), randn(2, 10, 3, gen=gen), 4),
             label="10 queries, size 4: the last chunk or block has 2"),
        Case((randn(2, 7, 4, gen=gen), randn(2, 11, 4, gen=gen), randn(2, 11, 5, gen=gen), 3), {"is_causal": True},
             label="causal with n = 7 < m = 11"),
    ]


def _check_attention(fn, exercise: str, size_name: str, cases: list[Case]) -> None:
    verify(fn, cases, sdpa_reference, exercise=exercise, notebook=NOTEBOOK, arg_names=("Q", "K", "V", size_name),
           outputs=None, forbid=ATTENTION_BUILTINS, rtol=1e-9, atol=1e-11)
    gen = generator(71)
    expect_error(fn, randn(2, 3, 4, gen=gen), randn(2, 5, 3, gen=gen), randn(2, 5, 6, gen=gen), 2,
                 error=ValueError, what=f"{exercise}(Q (2, 3, 4), K (2, 5, 3), V (2, 5, 6), 2)",
                 why="Q and K have different d_k (4 and 3)")


def check_chunked_attention(chunked_attention) -> None:
    """Against SDPA: a last chunk that is shorter, and causal attention with n < m."""
    _check_attention(chunked_attention, "chunked_attention", "chunk_size", _attention_cases())
    print("chunked_attention passes the visible checks.")


def check_flash_attention(flash_attention) -> None:
    """Against SDPA: shorter last blocks, causal with n < m, scores large enough to overflow exp, and rows whose
    scores are all very negative (a running max must start at -inf)."""
    gen = generator(72)
    large = Case((30 * randn(1, 9, 4, gen=gen), 30 * randn(1, 9, 4, gen=gen), randn(1, 9, 2, gen=gen), 4),
                 label="scores in the thousands: exp of a raw score overflows")
    negative = Case((*very_negative_scores(gen, (1,), 5, 9, 4, 2, 1e4), 4),
                    label="every score about -1e4: a running max started at 0 underflows every exp")
    _check_attention(flash_attention, "flash_attention", "block_size", _attention_cases() + [large, negative])
    print("flash_attention passes the visible checks.")


# --- sliding window ---------------------------------------------------------------------------------


def check_sliding_window_mask(sliding_window_mask) -> None:
    """A 5 x 5 mask with a window of 2, written out."""
    assert_bool_mask(sliding_window_mask)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    verify(sliding_window_mask, [Case((5, 2), label="each query sees itself and the previous key")],
           lambda n, window: expected, exercise="sliding_window_mask", notebook=NOTEBOOK, arg_names=("n", "window"),
           outputs=None)
    expect_error(sliding_window_mask, 4, 0, error=ValueError, what="sliding_window_mask(4, 0)",
                 why="a window must hold at least one key")
    print("sliding_window_mask passes the visible checks.")
