"""Visible checks for notebook 05, multi-head attention."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from ..diagnosis import Mistake, catalogue
from ..errors import fail
from ..guard import ATTENTION_BUILTINS
from ..inputs import generator, math_sdpa, randn
from ..student import call_student, expect_error, probe
from ..verify import Case, verify

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "multi_head"

INF = float("inf")


# --- referees built from PyTorch --------------------------------------------------------


def split_reference(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Head i gets features i*d ... (i+1)*d - 1 of every token: chunks of the last axis, stacked."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def merge_reference(x: torch.Tensor) -> torch.Tensor:
    """The heads laid side by side again: the per-head slices concatenated along features."""
    return torch.cat(x.unbind(dim=1), dim=-1)


class TorchMHA:
    """An ``nn.MultiheadAttention`` (batch_first=True) with random weights from a seeded generator.

    Its ``repr`` is one line, so a failing check can say which module it used.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, dtype=torch.float64, seed: int = 0):
        with torch.random.fork_rng(devices=[]):  # leave the global random state alone
            self.mha = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=dtype).eval()
        gen = generator(seed)
        with torch.no_grad():
            for p in self.mha.parameters():
                p.copy_(randn(*p.shape, gen=gen, dtype=dtype) / d_model**0.5)
        self.d_model, self.num_heads, self.bias, self.dtype = d_model, num_heads, bias, dtype

    def __repr__(self) -> str:
        return (
            f"nn.MultiheadAttention({self.d_model}, {self.num_heads}, bias={self.bias}, batch_first=True, "
            f"dtype={self.dtype})"
        )


def run_module(module_class):
    """``module_class.from_torch(mha)`` called on the inputs: how a check runs a MultiHeadAttention class."""

    def run(torch_mha, query, key, value, **masks):
        module = module_class.from_torch(torch_mha.mha)
        return module(query, key, value, **masks)

    return run


def torch_mha_reference(torch_mha, query, key, value, attn_mask=None, key_padding_mask=None):
    """``nn.MultiheadAttention`` itself, per-head weights, its masks converted to its convention.

    Its boolean masks mean True = masked, the opposite of this course, so they are inverted;
    a float ``attn_mask`` is added to the scores by both.
    """
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask
    if key_padding_mask is not None:
        key_padding_mask = ~key_padding_mask
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            # nn.MultiheadAttention wants both masks of one kind: make the padding mask additive too.
            key_padding_mask = torch.zeros(key_padding_mask.shape, dtype=attn_mask.dtype).masked_fill(
                key_padding_mask, -INF
            )
    with torch.no_grad():
        return torch_mha.mha(
            query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
            need_weights=True, average_attn_weights=False,
        )


def gqa_reference(Q, K, V, mask=None):
    """SDPA with ``enable_gqa=True`` (math backend); the weights are SDPA applied to the identity.

    A query with no allowed key gets zero weights and zero output (SDPA's math backend does this).
    """
    m = K.shape[-2]
    eye = torch.eye(m, dtype=K.dtype).expand(*K.shape[:-2], m, m)
    return (
        math_sdpa(Q, K, V, attn_mask=mask, enable_gqa=True),
        math_sdpa(Q, K, eye, attn_mask=mask, enable_gqa=True),
    )


def module_mistakes(notebook: str) -> list[Mistake]:
    """The catalogued MultiHeadAttention classes (when the grader has them), each run as the student's class is run."""
    return [replace(m, fn=run_module(m.fn)) for m in catalogue(notebook, "MultiHeadAttention")]


def count_parameters(module) -> int:
    """How many numbers the module's registered parameters hold."""
    return sum(p.numel() for p in module.parameters())


def module_summary(module) -> dict:
    """A probe: whether ``module`` is an ``nn.Module``, its class name and how many parameters it registers."""
    is_module = isinstance(module, nn.Module)
    return {"is_module": is_module, "type": type(module).__name__,
            "parameters": count_parameters(module) if is_module else 0}


def built_module(module_class, *args, **kwargs) -> dict:
    """A probe: the :func:`module_summary` of ``module_class(*args, **kwargs)``."""
    return module_summary(module_class(*args, **kwargs))


def parameters_without_grad(module, x: torch.Tensor) -> list[str]:
    """A probe: the parameters of ``module`` that get no gradient from ``module(x, x, x)[0].sum().backward()``."""
    output, _ = module(x, x, x)
    output.sum().backward()
    return [name for name, p in module.named_parameters() if p.grad is None]


def check_parameters(MultiHeadAttention, d_model: int, num_heads: int, bias: bool) -> None:
    """The module is an nn.Module whose registered parameters are W_Q, W_K, W_V, W_O (and biases)."""
    what = f"MultiHeadAttention({d_model}, {num_heads}, bias={bias})"
    summary = probe(built_module, MultiHeadAttention, d_model, num_heads, bias=bias, what=what)
    if not summary["is_module"]:
        fail(f"{what} should be an nn.Module (class MultiHeadAttention(nn.Module)), but it is a "
             f"{summary['type']}.")
    expected = 4 * d_model * d_model + (4 * d_model if bias else 0)
    got = summary["parameters"]
    if got != expected:
        fail(
            f"{what} has {got} parameters, but it should have {expected}: four d_model x d_model matrices "
            f"(W_Q, W_K, W_V and the output projection W_O)" + (" and their four biases of d_model" if bias else "")
            + ". Register them as attributes that are nn.Linear modules or nn.Parameter tensors "
            "(plain tensors are not parameters: an optimiser would never train them)."
        )


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


def graph_adjacency(edges: torch.Tensor, num_nodes: int, self_loops: bool = True) -> torch.Tensor:
    """Bool (N, N) mask, True at [i, j] when node i receives from node j.

    ``edges`` is ``(2, E)`` as in PyTorch Geometric: row 0 the sources, row 1 the targets, so
    edge (j, i) sets entry [i, j] (the row is the query, the target). An edge listed twice sets
    the same entry twice: duplicates change nothing. ``self_loops`` adds the diagonal; an
    explicit edge (i, i) counts either way.
    """
    mask = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    mask[edges[1], edges[0]] = True
    if self_loops:
        mask |= torch.eye(num_nodes, dtype=torch.bool)
    return mask


def graph_attention_reference(X, edges, W_Q, W_K, W_V, self_loops=True):
    """Masked SDPA (math backend) with the adjacency as the boolean mask; the weights are SDPA applied to the identity.

    A node with no neighbour has a row of False: SDPA's math backend gives it zero weights and a zero output.
    """
    N = X.shape[0]
    mask = graph_adjacency(edges, N, self_loops)
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    eye = torch.eye(N, dtype=X.dtype)
    return math_sdpa(Q, K, V, attn_mask=mask), math_sdpa(Q, K, eye, attn_mask=mask)


def random_graph(
    num_nodes: int,
    num_edges: int,
    gen: torch.Generator,
    *,
    no_in_edge: tuple[int, ...] = (),
    isolated: tuple[int, ...] = (),
    loops: tuple[int, ...] = (),
    duplicates: int = 0,
) -> torch.Tensor:
    """``(2, E)`` int64 random directed edges, shuffled: ``num_edges`` random ones, then explicit self-loops.

    No edge enters the nodes of ``no_in_edge`` and ``isolated``, and none leaves the ``isolated``
    ones; ``loops`` adds an explicit edge (i, i) for each listed node; the first ``duplicates``
    random edges are listed a second time.
    """
    senders = torch.tensor([i for i in range(num_nodes) if i not in isolated])
    receivers = torch.tensor([i for i in range(num_nodes) if i not in isolated and i not in no_in_edge])
    if num_edges:
        sources = senders[torch.randint(len(senders), (num_edges,), generator=gen)]
        targets = receivers[torch.randint(len(receivers), (num_edges,), generator=gen)]
    else:
        sources = targets = torch.zeros(0, dtype=torch.long)
    edges = torch.stack([sources, targets])
    explicit = torch.tensor(loops, dtype=torch.long).reshape(1, -1).expand(2, -1)
    edges = torch.cat([edges, explicit, edges[:, :duplicates]], dim=1)
    return edges[:, torch.randperm(edges.shape[1], generator=gen)]


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
