"""What is right in notebook 02, why divide by sqrt(d_k): the built-ins its exercises may not call,
the softmax Jacobian by automatic differentiation (the referee), the spread of a measured
variance, what the visible checks' seeded calls of the two random experiments give when drawn as
their texts prescribe (the code that draws them is the hidden checks': it is the answer), and how
a numeric answer is read."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from ..grader.compare import describe
from ..kernel.guard import forbidden
from ..shared.errors import fail

# --- built-ins the exercises of this notebook may not call ----------------------------------
# torch.autograd.functional.jacobian, torch.func.jacrev and torch.autograd.grad all reach the
# torch function ``grad``; torch.func.jacfwd goes through ``_make_dual``; Tensor.backward and
# torch.autograd.backward are ``backward``; softmax's own backward is ``_softmax_backward_data``.

AUTOGRAD_JACOBIAN = forbidden(
    "torch.autograd.functional.jacobian (or torch.autograd.grad, torch.func.jacrev)", "jacobian", "grad", "jacrev"
)
BACKWARD = forbidden("Tensor.backward", "backward")
FORWARD_AD = forbidden("torch.func.jacfwd (forward-mode automatic differentiation)", "_make_dual", "jacfwd")
SOFTMAX_BACKWARD = forbidden("torch._softmax_backward_data (softmax's own backward)", "_softmax_backward_data",
                             family=r"(?i)softmax.*backward")
#: softmax_jacobian is written from the formula, not obtained by automatic differentiation.
JACOBIAN_BUILTINS = (AUTOGRAD_JACOBIAN, BACKWARD, FORWARD_AD, SOFTMAX_BACKWARD)

ENTR = forbidden("torch.special.entr", "special_entr", "entr")
XLOGY = forbidden("torch.xlogy", "special_xlogy", "xlogy", "xlogy_")
#: attention_entropy handles 0 log 0 itself.
ENTROPY_BUILTINS = (ENTR, XLOGY)

#: The curves saturation_curve returns.
KEYS = ("max_weight", "entropy", "jacobian_norm")


def score_variance_standard_error(d_k: int, num_samples: int, scaled: bool = False) -> float:
    """Standard error of the sample variance of ``num_samples`` scores q.k (notebook section 3).

    X = q.k is a sum of d_k products Y_i = q_i k_i with E[Y^2] = 1 and E[Y^4] = 9, so
    E[X^4] = 9 d + 3 d (d - 1) = 3 d^2 + 6 d and Var(X^2) = 2 d^2 + 6 d. The sample variance
    of n scores has variance (mu_4 - sigma^4 (n - 3) / (n - 1)) / n, with mu_4 = E[X^4] and
    sigma^4 = d^2; dividing the scores by sqrt(d) divides it by d^2.
    """
    d, n = float(d_k), float(num_samples)
    var = (3 * d * d + 6 * d - d * d * (n - 3) / (n - 1)) / n
    return math.sqrt(var) / (d if scaled else 1.0)


def autograd_softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """The Jacobian of torch.softmax at the scores log(p), row by row, by torch.autograd.functional.jacobian.

    softmax(log p) = p when the entries of p are positive and sum to 1, and the Jacobian of
    softmax depends on the scores only through its output, so this is the Jacobian at any
    scores whose softmax is p.
    """
    scores = p.log()
    rows = scores.reshape(-1, scores.shape[-1])
    blocks = [torch.autograd.functional.jacobian(lambda z: torch.softmax(z, dim=-1), row) for row in rows]
    m = scores.shape[-1]
    return torch.stack(blocks).reshape(*scores.shape[:-1], m, m)


def answer_value(value: Any, name: str, *, positive: bool = False) -> float:
    """The student's numeric answer ``name`` as a float, or a message saying what is wrong with it."""
    if value is None:
        fail(f"{name} is still None: set it to a number in its cell, run the cell, then run this check.")
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(f"{name} should be a number (a Python float), but it is {describe(value)}.")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        fail(f"{name} should be a {'positive ' if positive else ''}finite number, but it is {value}.")
    return value


#: How far a result may be from the experiment drawn as prescribed: rounding only (another order of
#: the same sums, another correct formula), never another draw, which moves it by a standard error.
REPRODUCE_RTOL, REPRODUCE_ATOL = 1e-8, 1e-9


def entropy_reference(weights: torch.Tensor) -> torch.Tensor:
    """The entropy in nats of each row (last axis), 0 log 0 = 0."""
    return -torch.xlogy(weights, weights).sum(dim=-1)


#: What the visible checks' calls give when drawn as the texts prescribe (the hidden checks compute them for any
#: seed; ``tests/checks/test_notebook_02_scaling.py`` recomputes these): empirical_score_variance(16, 20000, scaled,
#: generator seeded 1), then saturation_curve([16, 128, 1024], scaled, 16, 500, generator seeded 5 or 6).
VISIBLE_SCORE_VARIANCE = {False: 15.770049611921891, True: 0.9856281007451182}
VISIBLE_SATURATION = {
    False: {"max_weight": [0.6844626000333035, 0.8861734946892973, 0.9608567681562944],
            "entropy": [0.9187344426421734, 0.29239749266151294, 0.08995572892280566],
            "jacobian_norm": [0.2815620032910393, 0.13824771423997329, 0.05134793588165245]},
    True: {"max_weight": [0.2578554078472971, 0.23603082840789943, 0.24901475597935654],
           "entropy": [2.3333579797892243, 2.376347665311224, 2.3489019157565147],
           "jacobian_norm": [0.3051045930548844, 0.3038141308212621, 0.3068606955642058]},
}


def reproduces(got: Any, want: Any) -> bool:
    """Whether ``got`` is ``want`` up to rounding: a number, or a dict of tensors (saturation_curve's)."""
    if isinstance(want, dict):
        return (isinstance(got, dict) and set(got) == set(want) and all(
            isinstance(got[key], torch.Tensor) and got[key].shape == want[key].shape
            and torch.allclose(got[key].double(), want[key], rtol=REPRODUCE_RTOL, atol=REPRODUCE_ATOL)
            for key in want))
    return math.isclose(float(got), float(want), rel_tol=REPRODUCE_RTOL, abs_tol=REPRODUCE_ATOL)


#: What the texts prescribe, for the messages of a result that is not the prescribed draw's.
SCORE_VARIANCE_DRAW = (
    "The text fixes every random number: the queries first, then the keys, each a (num_samples, d_k) float64 "
    "tensor from torch.randn(..., generator=generator, dtype=torch.float64); the score of pair r is the dot "
    "product of row r of each; the result is the unbiased sample variance of the scores (Tensor.var, which "
    "divides by num_samples - 1). Other draws (another dtype or shape) or another estimator give other "
    "numbers, although they may agree with the theory."
)
SATURATION_DRAW = (
    "The text fixes every random number: for each d_k in order, Q (num_queries, d_k) first, then K "
    "(num_keys, d_k), float64, from torch.randn(..., generator=generator, dtype=torch.float64); then the means "
    "over the rows of the largest weight, of the entropy in nats and of the Frobenius norm of each row's "
    "Jacobian. Another order of the draws or another statistic gives other numbers, although they may agree "
    "with the experiment's spread."
)
