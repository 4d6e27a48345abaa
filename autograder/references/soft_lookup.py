"""What is right in notebook 01, attention as a soft dictionary lookup: the formulas of the lookups and
``F.scaled_dot_product_attention`` (math backend, float64) as the referee of attention."""

from __future__ import annotations

import math

import torch

from ..grader.inputs import math_sdpa


def hard_lookup_reference(q, k, v):
    """The value of the best-matching key, the first one on a tie (``torch.argmax``)."""
    return v[int(torch.argmax(k @ q))]


def soft_lookup_reference(q, k, v, temperature=1.0):
    """Weights = softmax(keys @ query / temperature); output = weights @ values."""
    w = torch.softmax(k @ q / temperature, dim=-1)
    return w @ v, w


def nadaraya_watson_reference(xq, xt, yt, h):
    """Gaussian-kernel regression: scores -(x_q - x_i)^2 / (2 h^2), softmax over the training points."""
    w = torch.softmax(-((xq[:, None] - xt[None, :]) ** 2) / (2 * h**2), dim=-1)
    return w @ yt, w


def sdpa_reference(Q, K, V):
    """PyTorch's attention (math backend) and the weights softmax(Q K^T / sqrt(d_k))."""
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    return math_sdpa(Q, K, V), weights
