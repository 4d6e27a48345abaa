"""Visible checks for notebook 01, attention as a soft dictionary lookup."""

from __future__ import annotations

import torch

from ..grader.compare import assert_close, assert_pair
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.verify import Case, naming_mistakes, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.soft_lookup import (
    hard_lookup_reference,
    nadaraya_watson_reference,
    sdpa_reference,
    soft_lookup_reference,
)

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "soft_lookup"


def _lookup_example() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keys = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 1.0], [2.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]], dtype=torch.float64)
    query = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    return query, keys, values


def check_hard_lookup(hard_lookup) -> None:
    """The value of the best-matching key, the first one on a tie."""
    query, keys, values = _lookup_example()
    first = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    tie = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    cases = [
        Case((query, keys, values), label="the best key is the third"),
        Case((first, keys, values), label="the best key is the first"),
        Case((tie, keys, values), label="keys 2 and 3 tie: the first of them wins"),
        Case((torch.tensor([0.0, 1.0, 2.0, 2.0], dtype=torch.float64), keys, values),
             label="the first key has the highest dot product, though the second points more nearly the query's way"),
    ]
    verify(
        hard_lookup,
        cases,
        hard_lookup_reference,
        exercise="hard_lookup",
        notebook=NOTEBOOK,
        arg_names=("query", "keys", "values"),
        outputs=None,
    )
    print("hard_lookup passes the visible checks.")


def check_soft_lookup(soft_lookup) -> None:
    """Weights = softmax(keys @ query / temperature); output = weights @ values."""
    query, keys, values = _lookup_example()
    cases = [Case((query, keys, values)), Case((query, keys, values), {"temperature": 2.0})]
    verify(soft_lookup, cases, soft_lookup_reference, exercise="soft_lookup", notebook=NOTEBOOK,
           arg_names=("query", "keys", "values"))
    best = int(torch.argmax(keys @ query))
    one_hot = torch.zeros(len(keys), dtype=torch.float64).index_fill(0, torch.tensor(best), 1.0)
    cold_case = Case((query, keys, values), {"temperature": 1e-3})
    with naming_mistakes(soft_lookup, cold_case, (values[best], one_hot), exercise="soft_lookup", notebook=NOTEBOOK):
        cold, _ = assert_pair(call_student(soft_lookup, query, keys, values, temperature=1e-3,
                                           what="soft_lookup(..., temperature=1e-3)"), "soft_lookup(..., temperature=1e-3)")
        assert_close(cold, values[best], "soft_lookup at temperature 1e-3", atol=1e-6,
                     hint="As the temperature goes to 0 the soft lookup should become the hard one.")
        hot, _ = assert_pair(call_student(soft_lookup, query, keys, values, temperature=1e6,
                                          what="soft_lookup(..., temperature=1e6)"), "soft_lookup(..., temperature=1e6)")
        assert_close(hot, values.mean(dim=0), "soft_lookup at temperature 1e6", atol=1e-5,
                     hint="As the temperature grows the output should tend to the mean of the values.")
    print("soft_lookup passes the visible checks.")


def check_nadaraya_watson(nadaraya_watson) -> None:
    """Gaussian-kernel regression: scores -(x_q - x_i)^2 / (2 h^2), softmax over training points."""
    x_train = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    y_train = torch.tensor([0.0, 1.0, 4.0, 9.0], dtype=torch.float64)
    x_query = torch.tensor([0.5, 2.0], dtype=torch.float64)
    cases = [Case((x_query, x_train, y_train, 1.0)), Case((x_query, x_train, y_train, 0.3))]
    verify(nadaraya_watson, cases, nadaraya_watson_reference, exercise="nadaraya_watson", notebook=NOTEBOOK,
           arg_names=("x_query", "x_train", "y_train", "bandwidth"))
    print("nadaraya_watson passes the visible checks.")


def check_scaled_dot_product_attention(scaled_dot_product_attention) -> None:
    """Against PyTorch's F.scaled_dot_product_attention in float64, on two shapes."""
    gen = generator(0)
    cases = [
        Case((randn(3, 4, gen=gen), randn(3, 4, gen=gen), randn(3, 4, gen=gen)), label="self-attention, no batch"),
        Case((randn(2, 3, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 6, gen=gen)), label="n != m and d_v != d_k"),
    ]
    verify(scaled_dot_product_attention, cases, sdpa_reference, exercise="scaled_dot_product_attention", notebook=NOTEBOOK,
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS)
    expect_error(
        scaled_dot_product_attention, randn(2, 3, 4, gen=gen), randn(2, 5, 3, gen=gen), randn(2, 5, 6, gen=gen),
        error=ValueError, what="scaled_dot_product_attention(Q (2, 3, 4), K (2, 5, 3), V)",
        why="Q and K have different d_k (4 and 3)",
    )
    print("scaled_dot_product_attention passes the visible checks.")
