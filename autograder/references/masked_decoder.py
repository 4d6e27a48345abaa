"""Notebook 10's trained model: notebook 09's TinyDecoder (pre-norm blocks, RoPE, RMSNorm, exact GELU,
output tied to the embedding) made trainable without the student's notebook 09, attending under any
boolean mask and returning its attention weights, so that a window with or without sinks can be
applied to a model that was trained with full causal attention.

Built with the same submodules, in the same order, as notebook 09's reference solution: with the
same seed it starts from the same weights and trains to the same losses. What it does NOT do:
decode with a cache (every call reads the whole sequence), or number positions within a window
(positions are absolute, 0..T-1, whatever the mask keeps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .decoding_and_training import rope_reference
from .tiny_decoder import NORM_EPS


def rope_matrices(length: int, d_head: int, base: float = 10000.0, dtype=torch.float64) -> torch.Tensor:
    """RoPE as one ``(d_head, d_head)`` matrix per position: ``(d_head, length, d_head)``.

    RoPE is linear in its input, so rotating the identity gives the matrices; multiplying by
    them (``einsum("...td,dte->...te", x, R)``) rotates ``x`` while keeping its gradient, which
    the reference's rotation of ``x`` itself does not.
    """
    identity = torch.eye(d_head, dtype=dtype).unsqueeze(1).expand(d_head, length, d_head)
    return rope_reference(identity, torch.arange(length), base)


class MaskedBlock(nn.Module):
    """A pre-norm block, x + attn(norm1(x)) then + fc2(gelu(fc1(norm2(.)))), attending under a given mask."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        d_head, rest = divmod(d_model, num_heads)
        if rest or d_head % 2:
            raise ValueError(f"d_model = {d_model} does not split into {num_heads} heads of an even size (RoPE "
                             "rotates pairs of coordinates)")
        self.num_heads = num_heads
        self.norm1 = nn.RMSNorm(d_model, eps=NORM_EPS)
        square = (d_model, d_model)
        # Created in the order of notebook 09's block, so that one seed gives both the same weights.
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(*square, bias=False) for _ in range(4))
        self.norm2 = nn.RMSNorm(d_model, eps=NORM_EPS)
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D), mask (T, T) bool (True = may attend), rotations from :func:`rope_matrices` ->
        (the block's output (B, T, D), the attention weights (B, h, T, T))."""
        split = (self.num_heads, x.shape[-1] // self.num_heads)
        normed = self.norm1(x)
        q, k, v = (layer(normed).unflatten(-1, split).transpose(1, 2) for layer in (self.q_proj, self.k_proj, self.v_proj))
        q, k = (torch.einsum("bhtd,dte->bhte", t, rotations) for t in (q, k))
        scores = q @ k.transpose(-2, -1) / math.sqrt(split[1])
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + self.out_proj((weights @ v).transpose(1, 2).flatten(-2))
        mlp = self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x + mlp, weights


class MaskedDecoder(nn.Module):
    """Notebook 09's TinyDecoder attending under any mask: ``model(tokens, mask=None)`` -> (logits, weights).

    Args:
        vocab, d_model, num_heads, d_ff, num_layers: as notebook 09's ``TinyDecoder``.
        rope_base: the base of RoPE's frequencies.

    ``tokens`` (B, T) long; ``mask`` a boolean (T, T) tensor, True where query i may read key j
    (default: causal, ``j <= i``); returns the logits (B, T, vocab) and, per block, its attention
    weights (B, num_heads, T, T). Positions are 0..T-1 whatever the mask.
    """

    def __init__(self, vocab: int, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                 rope_base: float = 10000.0) -> None:
        super().__init__()
        self.rope_base = rope_base
        self.embed = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)  # logits of order 1 at the start, as in notebook 09
        self.blocks = nn.ModuleList(MaskedBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = nn.RMSNorm(d_model, eps=NORM_EPS)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, T, vocab) and each block's attention weights (B, h, T, T) under ``mask``."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens should be (batch, length), got shape {tuple(tokens.shape)}")
        T = tokens.shape[1]
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool).tril()
        elif mask.dtype != torch.bool or tuple(mask.shape) != (T, T):
            raise ValueError(f"mask should be a boolean ({T}, {T}) tensor for {T} tokens (True = may attend), got "
                             f"{mask.dtype} of shape {tuple(mask.shape)}")
        elif not bool(mask.any(dim=-1).all()):
            raise ValueError("every query needs at least one key: a row of the mask is all False, and its softmax "
                             "would be NaN")
        x = self.embed(tokens)
        rotations = rope_matrices(T, x.shape[-1] // self.blocks[0].num_heads, self.rope_base, x.dtype)
        every_weights = []
        for block in self.blocks:
            x, weights = block(x, mask.to(x.device), rotations.to(x.device))
            every_weights.append(weights)
        return self.norm(x) @ self.embed.weight.T, every_weights  # tied: the output layer is the embedding
