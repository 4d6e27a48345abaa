"""What is right in notebook 05, multi-head attention: ``nn.MultiheadAttention`` and
``F.scaled_dot_product_attention`` (``enable_gqa``) as referees, how a student's module is
built and run with given weights, and what its parameters must be."""

from __future__ import annotations

import torch
from torch import nn

from ..grader.inputs import generator, math_sdpa, randn
from ..grader.student import harness, probe
from ..shared.errors import fail

INF = float("inf")


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


@harness
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
    """A probe: the parameters of ``module`` that get no gradient from ``module(x, x, x)[0].sum()``.

    Asked of autograd's graph (``torch.autograd.grad``), not read from ``.grad``, which the module's own code
    could fill in while it runs."""
    output, _ = module(x, x, x)
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(output.sum(), [p for _, p in named], allow_unused=True) if named else ()
    unreached = {name for (name, _), grad in zip(named, grads) if grad is None}
    return [name for name, p in module.named_parameters() if name in unreached or not p.requires_grad]


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
