"""Visible checks for notebook 10, long context: sink-window masks, a rolling KV cache, linear attention.

The referees: the mask written out by hand, the tokens a rolling cache must keep (compared
directly at every step), and linear attention's quadratic form in float64. The student's
functions may not call ``F.scaled_dot_product_attention`` or ``nn.MultiheadAttention``; the
cache and linear attention are watched for what they hold and allocate (probes run where the
student's code runs).
"""

from __future__ import annotations

import torch

from ..grader.compare import assert_dtype, assert_tensor
from ..grader.diagnosis import catalogue
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.long_context import (
    LINEAR_ARGS,
    RECURRENT_OUTPUTS,
    check_rolling_cases,
    expect_append_errors,
    expect_shape_errors,
    held_bytes_problem,
    linear_quadratic,
    recurrent_flat,
    rolling_case,
    run_recurrent,
    watch_linear,
)
from ..shared.errors import fail

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "long_context"


# --- the sink-window mask ----------------------------------------------------------------------------


def assert_bool_mask(sink_window_mask) -> None:
    """Fail unless the mask is a torch.bool tensor (True = may attend), before comparing values."""
    mask = call_student(sink_window_mask, 3, 5, 2, 1, what="sink_window_mask(3, 5, 2, 1)")
    assert_tensor(mask, "The result of sink_window_mask(3, 5, 2, 1)")
    assert_dtype(mask, torch.bool, "The result of sink_window_mask(3, 5, 2, 1)")


#: sink_window_mask(3, 6, 2, 1): queries at positions 3, 4, 5 see the key before them, themselves and key 0.
MASK_3_6 = torch.tensor([[1, 0, 1, 1, 0, 0],
                         [1, 0, 0, 1, 1, 0],
                         [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
#: sink_window_mask(3, 3, 1, 2): each query sees itself and the sinks up to its own position, never a later one.
MASK_3_3 = torch.tensor([[1, 0, 0],
                         [1, 1, 0],
                         [1, 1, 1]], dtype=torch.bool)
#: sink_window_mask(4, 4, 2): notebook 07's sliding window of 2, no sink.
MASK_4_4 = torch.tensor([[1, 0, 0, 0],
                         [1, 1, 0, 0],
                         [0, 1, 1, 0],
                         [0, 0, 1, 1]], dtype=torch.bool)


def check_sink_window_mask(sink_window_mask) -> None:
    """Three masks written out (bottom-right with a sink, sinks never in the future, a plain window); errors."""
    assert_bool_mask(sink_window_mask)
    cases = [Case((3, 6, 2, 1), label="3 queries at positions 3..5, 6 keys, window 2, one sink"),
             Case((3, 3, 1, 2), label="window 1, 2 sinks: query 0 must not see the sink at position 1"),
             Case((4, 4, 2), label="square, window 2, no sink: notebook 07's sliding window")]
    expected = {(3, 6, 2, 1): MASK_3_6, (3, 3, 1, 2): MASK_3_3, (4, 4, 2): MASK_4_4}
    verify(sink_window_mask, cases, lambda *args: expected[args],
           exercise="sink_window_mask", notebook=NOTEBOOK, arg_names=("n", "m", "window", "sinks"), outputs=None,
           forbid=ATTENTION_BUILTINS)
    expect_error(sink_window_mask, 4, 4, 0, error=ValueError, what="sink_window_mask(4, 4, 0)",
                 why="a window must hold at least one key (the query's own)")
    expect_error(sink_window_mask, 4, 4, 2, -1, error=ValueError, what="sink_window_mask(4, 4, 2, -1)",
                 why="there cannot be a negative number of sinks")
    print("sink_window_mask passes the visible checks.")


# --- the rolling KV cache ----------------------------------------------------------------------------------


def check_RollingKVCache(RollingKVCache) -> None:  # noqa: N802, N803 - named after the class it checks
    """The kept tokens compared directly after every append; constant storage; bad sizes refused."""
    cases = [rolling_case(101, 1, 2, 3, 2, 4, 8, "window 3, 2 sinks, 8 tokens"),
             rolling_case(102, 2, 1, 2, 0, 2, 5, "window 2, no sink")]
    check_rolling_cases(RollingKVCache, cases, catalogue(NOTEBOOK, "RollingKVCache"))
    problem = held_bytes_problem(RollingKVCache)
    if problem:
        fail(problem)
    expect_error(RollingKVCache, 1, 2, 0, 1, 4, error=ValueError, what="RollingKVCache(1, 2, window=0, sinks=1, 4)",
                 why="a window must hold at least one token (the newest)")
    expect_error(RollingKVCache, 1, 2, 3, -1, 4, error=ValueError, what="RollingKVCache(1, 2, window=3, sinks=-1, 4)",
                 why="there cannot be a negative number of sinks")
    expect_append_errors(RollingKVCache)
    print("RollingKVCache passes the visible checks.")


# --- linear attention ----------------------------------------------------------------------------------------


def check_linear_attention(linear_attention) -> None:
    """Against the quadratic form in float64, causal and not; a misplaced eps shows; no n x m tensor; errors."""
    gen = generator(103)
    cases = [
        Case((randn(2, 5, 4, gen=gen), randn(2, 7, 4, gen=gen), randn(2, 7, 3, gen=gen)),
             label="n = 5 queries, m = 7 keys, d_v = 3"),
        Case((randn(2, 6, 4, gen=gen), randn(2, 6, 4, gen=gen), randn(2, 6, 2, gen=gen)), {"is_causal": True},
             label="causal: query i uses keys j <= i"),
        Case((randn(1, 4, 3, gen=gen) - 12, randn(1, 4, 3, gen=gen) - 12, randn(1, 4, 2, gen=gen)),
             {"is_causal": True}, label="inputs near -12: phi is about 6e-6, so eps dominates the denominator"),
    ]
    verify(linear_attention, cases, linear_quadratic, exercise="linear_attention", notebook=NOTEBOOK,
           arg_names=LINEAR_ARGS, outputs=None, forbid=ATTENTION_BUILTINS, rtol=1e-9, atol=1e-12)
    for is_causal in (False, True):
        args = (randn(1, 64, 2, gen=gen), randn(1, 64, 2, gen=gen), randn(1, 64, 2, gen=gen))
        watch_linear(linear_attention, "linear_attention", args, {"is_causal": is_causal})
    expect_shape_errors(linear_attention, "linear_attention", gen)
    print("linear_attention passes the visible checks.")


def check_linear_attention_recurrent(linear_attention_recurrent) -> None:
    """Against the causal quadratic form and the sums over all keys (float64); only the state held; errors."""
    gen = generator(104)
    cases = [
        Case((randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 3, gen=gen)), label="5 tokens, d_v = 3"),
        Case((randn(1, 3, 2, gen=gen), randn(1, 3, 2, gen=gen), randn(1, 3, 2, gen=gen)), {"eps": 0.5},
             label="a large eps"),
    ]
    verify(run_recurrent(linear_attention_recurrent), cases, recurrent_flat, exercise="linear_attention_recurrent",
           notebook=NOTEBOOK, arg_names=LINEAR_ARGS, outputs=RECURRENT_OUTPUTS, forbid=ATTENTION_BUILTINS, rtol=1e-9,
           atol=1e-12)
    args = (randn(1, 64, 4, gen=gen), randn(1, 64, 4, gen=gen), randn(1, 64, 4, gen=gen))
    watch_linear(linear_attention_recurrent, "linear_attention_recurrent", args, {})
    expect_shape_errors(linear_attention_recurrent, "linear_attention_recurrent", gen)
    print("linear_attention_recurrent passes the visible checks.")
