"""Visible checks for notebook 05, multi-head attention."""

from __future__ import annotations

import torch

from ..grader.diagnosis import Mistake, catalogue, through
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.multi_head import (
    TorchMHA,
    check_parameters,
    gqa_reference,
    graph_attention_reference,
    merge_reference,
    random_graph,
    run_module,
    split_reference,
    torch_mha_reference,
)
from ..references.multi_head import graph_adjacency as graph_adjacency  # the tests import them from here
from ..shared.errors import fail

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "multi_head"


def module_mistakes(notebook: str) -> list[Mistake]:
    """The catalogued MultiHeadAttention classes (when the grader has them), each run as the student's class is run."""
    return through(catalogue(notebook, "MultiHeadAttention"), run_module)


# --- the checks -----------------------------------------------------------------------------


def check_split_heads(split_heads) -> None:
    """Head i, token t holds features i*d ... (i+1)*d - 1 of token t; D not divisible by h raises."""
    gen = generator(0)
    cases = [
        Case((randn(2, 3, 8, gen=gen), 2), label="2 heads of 4 features"),
        Case((randn(1, 4, 6, gen=gen), 3), label="3 heads of 2 features"),
        Case((randn(2, 6, 5, gen=gen).transpose(1, 2), 3), label="a non-contiguous x (a transposed tensor)"),
    ]
    verify(split_heads, cases, split_reference, exercise="split_heads", notebook=NOTEBOOK,
           arg_names=("x", "num_heads"), outputs=None, rtol=0, atol=0)
    expect_error(split_heads, randn(2, 3, 10, gen=gen), 3, error=ValueError,
                 what="split_heads(x (2, 3, 10), num_heads=3)", why="10 features cannot be split into 3 equal heads")
    print("split_heads passes the visible checks.")


def check_merge_heads(merge_heads) -> None:
    """(B, h, T, d) -> (B, T, h*d), the heads side by side; it undoes a split exactly."""
    gen = generator(1)
    cases = [
        Case((randn(2, 2, 3, 4, gen=gen),), label="2 heads of 4 features"),
        Case((randn(1, 3, 4, 2, gen=gen),), label="3 heads of 2 features"),
    ]
    verify(merge_heads, cases, merge_reference, exercise="merge_heads", notebook=NOTEBOOK, arg_names=("x",),
           outputs=None, rtol=0, atol=0)
    x = randn(2, 5, 12, gen=gen)
    merged = call_student(merge_heads, split_reference(x, 3), what="merge_heads(split of x (2, 5, 12) into 3 heads)")
    if not isinstance(merged, torch.Tensor) or merged.shape != x.shape or not torch.equal(merged, x):
        fail("merge_heads should undo the split exactly: merging x (2, 5, 12) split into 3 heads does not give x back.")
    print("merge_heads passes the visible checks.")


def check_MultiHeadAttention(MultiHeadAttention) -> None:  # noqa: N802 - named after the class it checks
    """Against nn.MultiheadAttention with the same weights (float64): self- and cross-attention, masks."""
    gen = generator(2)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    x, y = randn(2, 5, 8, gen=gen), randn(1, 5, 8, gen=gen)
    cases = [
        Case((TorchMHA(8, 2, seed=1), x, x, x), label="self-attention, no mask"),
        Case((TorchMHA(12, 3, bias=False, seed=2), randn(2, 3, 12, gen=gen), randn(2, 6, 12, gen=gen),
              randn(2, 6, 12, gen=gen)), {"key_padding_mask": padding},
             label="cross-attention, n != m, no bias, padding mask: True = real token"),
        Case((TorchMHA(8, 4, seed=3), y, y, y), {"attn_mask": causal},
             label="self-attention, causal mask: True = may attend"),
    ]
    verify(run_module(MultiHeadAttention), cases, torch_mha_reference, exercise="MultiHeadAttention",
           arg_names=("mha", "query", "key", "value"), forbid=ATTENTION_BUILTINS, mistakes=module_mistakes(NOTEBOOK),
           rtol=1e-10, atol=1e-10)
    check_parameters(MultiHeadAttention, 8, 2, True)
    expect_error(MultiHeadAttention, 10, 4, error=ValueError, what="MultiHeadAttention(10, 4)",
                 why="d_model = 10 cannot be split into 4 equal heads")
    print("MultiHeadAttention passes the visible checks.")


def check_grouped_query_attention(grouped_query_attention) -> None:
    """Against F.scaled_dot_product_attention(..., enable_gqa=True) in float64."""
    gen = generator(3)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    blocked = torch.ones(3, 5, dtype=torch.bool)
    blocked[1] = False
    cases = [
        Case((randn(2, 4, 3, 5, gen=gen), randn(2, 2, 6, 5, gen=gen), randn(2, 2, 6, 5, gen=gen)),
             label="4 query heads share 2 key/value heads"),
        Case((randn(1, 3, 4, 2, gen=gen), randn(1, 1, 4, 2, gen=gen), randn(1, 1, 4, 2, gen=gen)),
             {"mask": causal}, label="multi-query attention (g = 1), causal mask"),
        Case((randn(1, 2, 3, 4, gen=gen), randn(1, 2, 5, 4, gen=gen), randn(1, 2, 5, 4, gen=gen)),
             {"mask": blocked}, label="query 2 may attend to no key: its weights and output are zero"),
    ]
    verify(grouped_query_attention, cases, gqa_reference, exercise="grouped_query_attention", notebook=NOTEBOOK,
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-12)
    expect_error(grouped_query_attention, randn(1, 6, 2, 4, gen=gen), randn(1, 4, 3, 4, gen=gen),
                 randn(1, 4, 3, 4, gen=gen), error=ValueError,
                 what="grouped_query_attention(Q (1, 6, 2, 4), K (1, 4, 3, 4), V (1, 4, 3, 4))",
                 why="6 query heads cannot be shared equally among 4 key/value heads")
    print("grouped_query_attention passes the visible checks.")


# --- attention on a graph -------------------------------------------------------------------


def check_graph_attention(graph_attention) -> None:
    """Against masked SDPA (math backend, float64) with the graph's adjacency as the boolean mask."""
    gen = generator(4)
    X = randn(5, 4, gen=gen)
    W_Q, W_K, W_V = (randn(4, 3, gen=gen) for _ in range(3))
    # 0 -> 1, 2 -> 1 (listed twice), 1 -> 2, 1 -> 0, 4 -> 0, and the explicit self-loop 3 -> 3.
    # Node 4 receives no edge; node 3 receives only its own loop.
    edges = torch.tensor([[0, 2, 1, 2, 3, 1, 4], [1, 1, 2, 1, 3, 0, 0]])
    cases = [
        Case((X, edges, W_Q, W_K, W_V),
             label="duplicate edge 2 -> 1, explicit self-loop at node 3, no edge into node 4; self_loops=True"),
        Case((X, edges, W_Q, W_K, W_V), {"self_loops": False},
             label="the same graph with self_loops=False: node 4 has no neighbour, node 3 only its explicit loop"),
        Case((randn(7, 5, gen=gen), random_graph(7, 12, gen, no_in_edge=(6,)), randn(5, 2, gen=gen),
              randn(5, 2, gen=gen), randn(5, 6, gen=gen)), label="a random graph of 7 nodes, d_k = 2, d_v = 6"),
    ]
    verify(graph_attention, cases, graph_attention_reference, exercise="graph_attention", notebook=NOTEBOOK,
           arg_names=("X", "edges", "W_Q", "W_K", "W_V"), forbid=ATTENTION_BUILTINS, rtol=1e-10, atol=1e-12)
    expect_error(graph_attention, X, torch.tensor([[0, 5], [1, 2]]), W_Q, W_K, W_V, error=ValueError,
                 what="graph_attention(X (5, 4), edges [[0, 5], [1, 2]], ...)",
                 why="node 5 does not exist in a graph of 5 nodes (0 ... 4)")
    print("graph_attention passes the visible checks.")
