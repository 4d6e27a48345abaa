"""Visible checks for notebook 06, positional encodings."""

from __future__ import annotations

import torch

from ..grader.compare import assert_close, assert_dtype, assert_shape, assert_tensor
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.verify import Case, naming_mistakes
from ..shared.errors import fail

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "positional_encoding"

#: sinusoidal_encoding(6, 4, base=100.0): rows are positions 0..5.
PE_6_4_BASE_100 = torch.tensor([
    [0.000000000000, 1.000000000000, 0.000000000000, 1.000000000000],
    [0.841470984808, 0.540302305868, 0.099833416647, 0.995004165278],
    [0.909297426826, -0.416146836547, 0.198669330795, 0.980066577841],
    [0.141120008060, -0.989992496600, 0.295520206661, 0.955336489126],
    [-0.756802495308, -0.653643620864, 0.389418342309, 0.921060994003],
    [-0.958924274663, 0.283662185463, 0.479425538604, 0.877582561890],
], dtype=torch.float64)

#: sinusoidal_encoding(3, 4, base=1000.0): names a mistake only where it also fits this table (with base 100 a base
#: of 10 gives the numbers of the exponent i/d instead of 2i/d: 10^(2i/d) = 100^(i/d)).
PE_3_4_BASE_1000 = torch.tensor([
    [0.000000000000, 1.000000000000, 0.000000000000, 1.000000000000],
    [0.841470984808, 0.540302305868, 0.031617506402, 0.999500041665],
    [0.909297426826, -0.416146836547, 0.063203397933, 0.998000666578],
], dtype=torch.float64)
#: apply_rope(ROPE_X, torch.tensor([3, 7]), base=100.0)
ROPE_X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 2.0, -3.0]], dtype=torch.float64)
ROPE_X_AT_3_7_BASE_100 = torch.tensor([
    [-1.272232512720, -1.838864985141, 1.683928640731, 4.707906576486],
    [-1.082395553703, -0.280035471547, 3.462337436282, -1.006091187378],
], dtype=torch.float64)


#: relative_shift_matrix(2, 4, base=100.0): blocks turning by 2 * 1 and 2 * 0.1 radians.
SHIFT_2_4_BASE_100 = torch.tensor([
    [-0.416146836547, 0.909297426826, 0.000000000000, 0.000000000000],
    [-0.909297426826, -0.416146836547, 0.000000000000, 0.000000000000],
    [0.000000000000, 0.000000000000, 0.980066577841, 0.198669330795],
    [0.000000000000, 0.000000000000, -0.198669330795, 0.980066577841],
], dtype=torch.float64)
#: Tolerance of a comparison with these 12-decimal tables.
TABLE_ATOL = 1e-11


def _result(fn, *args, what, **kwargs) -> torch.Tensor:
    value = call_student(fn, *args, what=what, **kwargs)
    assert_tensor(value, f"The result of {what}")
    return value


def check_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Shape and dtype, PE[0], range, sin/cos pairs, the frequency of each pair, reference values."""
    table = Case((6, 4, 100.0), {"dtype": torch.float64})
    other = Case((3, 4, 1000.0), {"dtype": torch.float64})
    with naming_mistakes(sinusoidal_encoding, table, PE_6_4_BASE_100, exercise="sinusoidal_encoding",
                         notebook=NOTEBOOK, rtol=0, atol=TABLE_ATOL, confirm=[(other, PE_3_4_BASE_1000)]):
        _sinusoidal_properties(sinusoidal_encoding)
    print("sinusoidal_encoding passes the visible checks.")


def _sinusoidal_properties(sinusoidal_encoding) -> None:
    what = "sinusoidal_encoding(100, 32)"
    pe = _result(sinusoidal_encoding, 100, 32, what=what)
    assert_shape(pe, (100, 32), f"The result of {what}")
    assert_dtype(pe, torch.float32, f"The result of {what} (float32 by default)")
    first = torch.tensor([0.0, 1.0] * 16)
    assert_close(pe[0], first, f"PE[0] of {what}", rtol=0, atol=1e-6,
                 hint="At position 0 every angle is 0: sin 0 = 0 in the even columns, cos 0 = 1 in the odd ones.")
    if pe.abs().max() > 1 + 1e-6:
        fail(f"Every entry of {what} should lie in [-1, 1] (sines and cosines), but yours reaches "
             f"{pe.abs().max().item():.4g}.")
    pair = pe[:, 0::2].double() ** 2 + pe[:, 1::2].double() ** 2
    assert_close(pair, torch.ones_like(pair), f"PE[:, 2i]^2 + PE[:, 2i+1]^2 of {what}", rtol=0, atol=1e-5,
                 hint="Columns 2i and 2i+1 are the sine and the cosine of the same angle pos * omega_i.")
    # Pair i turns by omega_i = base^(-2i/d) per position: read the angle of row 1 off the circle.
    omega = torch.atan2(pe[1, 0::2].double(), pe[1, 1::2].double())
    expected = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    assert_close(omega, expected, f"the angle turned by each pair between positions 0 and 1 in {what}",
                 rtol=1e-5, atol=1e-6, hint="Pair i (columns 2i, 2i+1) turns by omega_i = base^(-2i/d_model) "
                 "per position: 1 for the first pair, then slower and slower.")
    small = _result(sinusoidal_encoding, 6, 4, 100.0, what="sinusoidal_encoding(6, 4, base=100.0)")
    assert_close(small, PE_6_4_BASE_100.float(), "sinusoidal_encoding(6, 4, base=100.0)", rtol=0, atol=1e-5)
    big = _result(sinusoidal_encoding, 6, 4, 100.0, dtype=torch.float64,
                  what="sinusoidal_encoding(6, 4, base=100.0, dtype=torch.float64)")
    assert_dtype(big, torch.float64, "sinusoidal_encoding(6, 4, base=100.0, dtype=torch.float64)")
    assert_close(big, PE_6_4_BASE_100, "sinusoidal_encoding(6, 4, base=100.0, dtype=torch.float64)",
                 rtol=0, atol=TABLE_ATOL)
    expect_error(sinusoidal_encoding, 10, 7, error=ValueError, what="sinusoidal_encoding(10, 7)",
                 why="d_model = 7 is odd: sin/cos pairs need an even number of columns")


def check_relative_shift_matrix(relative_shift_matrix) -> None:
    """Shape, dtype, PE[pos + k] = M @ PE[pos] on a small table, orthogonality, M_0 = I."""
    table = Case((2, 4, 100.0), {"dtype": torch.float64})
    with naming_mistakes(relative_shift_matrix, table, SHIFT_2_4_BASE_100, exercise="relative_shift_matrix",
                         notebook=NOTEBOOK, rtol=0, atol=TABLE_ATOL):
        _shift_properties(relative_shift_matrix)
    print("relative_shift_matrix passes the visible checks.")


def _shift_properties(relative_shift_matrix) -> None:
    what = "relative_shift_matrix(2, 4, base=100.0)"
    M = _result(relative_shift_matrix, 2, 4, 100.0, what=what)
    assert_shape(M, (4, 4), f"The result of {what}")
    assert_dtype(M, torch.float32, f"The result of {what} (float32 by default)")
    pe = PE_6_4_BASE_100
    for k in (1, 2, 5, -1, -3):
        what = f"relative_shift_matrix({k}, 4, base=100.0, dtype=torch.float64)"
        M = _result(relative_shift_matrix, k, 4, 100.0, dtype=torch.float64, what=what)
        assert_shape(M, (4, 4), f"The result of {what}")
        lo, hi = max(0, -k), 6 - max(0, k)
        assert_close(pe[lo:hi] @ M.T, pe[lo + k:hi + k], f"M @ PE[pos] for pos = {lo}..{hi - 1} with M = {what}",
                     rtol=0, atol=1e-9, hint=f"Row r of this comparison is position {lo} + r: M @ PE[pos] "
                     f"should be PE[pos + {k}] (the expected rows come from sinusoidal_encoding(6, 4, 100.0)).")
        assert_close(M @ M.T, torch.eye(4, dtype=torch.float64), f"M @ M.T with M = {what}", rtol=0, atol=1e-12,
                     hint="M is block diagonal with 2x2 rotations, so it is orthogonal.")
    zero = _result(relative_shift_matrix, 0, 6, what="relative_shift_matrix(0, 6)")
    assert_close(zero, torch.eye(6), "relative_shift_matrix(0, 6)", rtol=0, atol=1e-7,
                 hint="A shift by 0 positions changes nothing: M_0 is the identity.")
    expect_error(relative_shift_matrix, 1, 5, error=ValueError, what="relative_shift_matrix(1, 5)",
                 why="d_model = 5 is odd")


def check_apply_rope(apply_rope) -> None:
    """Reference values, shape and dtype, norm kept, position 0 unchanged, scores depend on m - n only."""
    table = Case((ROPE_X, torch.tensor([3, 7]), 100.0))
    with naming_mistakes(apply_rope, table, ROPE_X_AT_3_7_BASE_100, exercise="apply_rope", notebook=NOTEBOOK,
                         rtol=0, atol=TABLE_ATOL):
        _rope_properties(apply_rope)
    print("apply_rope passes the visible checks.")


def _rope_properties(apply_rope) -> None:
    what = "apply_rope(x (2, 4), positions [3, 7], base=100.0)"
    y = _result(apply_rope, ROPE_X, torch.tensor([3, 7]), 100.0, what=what)
    assert_shape(y, (2, 4), f"The result of {what}")
    assert_dtype(y, torch.float64, f"The result of {what}")
    assert_close(y, ROPE_X_AT_3_7_BASE_100, f"The result of {what}", rtol=0, atol=1e-9,
                 hint="Pair (x[2i], x[2i+1]) at position p turns by the angle p * base^(-2i/d), counterclockwise: "
                 "(x[2i] cos - x[2i+1] sin, x[2i] sin + x[2i+1] cos).")

    gen = generator(6)
    x = randn(2, 3, 5, 8, gen=gen)
    positions = torch.arange(5)
    what = "apply_rope(x (2, 3, 5, 8), arange(5))"
    y = _result(apply_rope, x, positions, what=what)
    assert_shape(y, (2, 3, 5, 8), f"The result of {what}")
    assert_dtype(y, torch.float64, f"The result of {what}")
    assert_close(y[..., 0, :], x[..., 0, :], f"position 0 of {what}", rtol=0, atol=1e-12,
                 hint="At position 0 every angle is 0: the vector is unchanged.")
    assert_close(y.norm(dim=-1), x.norm(dim=-1), f"the norm of every vector of {what}", rtol=1e-10, atol=1e-12,
                 hint="A rotation keeps lengths.")
    one = _result(apply_rope, x[1, 2], positions, what="apply_rope(x[1, 2] (5, 8), arange(5))")
    assert_close(y[1, 2], one, "apply_rope on a batch, slice [1, 2], compared with apply_rope on that slice alone",
                 rtol=1e-12, atol=1e-12, hint="Leading batch dimensions must be handled independently.")
    y32 = _result(apply_rope, x.float(), positions, what="apply_rope(x float32, arange(5))")
    assert_dtype(y32, torch.float32, "apply_rope on float32 inputs")

    q, k = randn(8, gen=gen), randn(8, gen=gen)
    pos = torch.tensor([2, 9, 40, 47])  # (q at 2, k at 9) and (q at 40, k at 47): both m - n = -7
    qs = _result(apply_rope, q.expand(4, 8).clone(), pos, what="apply_rope(q repeated 4 times, [2, 9, 40, 47])")
    ks = _result(apply_rope, k.expand(4, 8).clone(), pos, what="apply_rope(k repeated 4 times, [2, 9, 40, 47])")
    assert_close(qs[2] @ ks[3], qs[0] @ ks[1], "the score of q at 40 with k at 47, compared with q at 2 and k at 9",
                 rtol=1e-10, atol=1e-10, hint="With RoPE a score depends on the offset m - n only (here -7).")
    expect_error(apply_rope, randn(4, 5, gen=gen), torch.arange(4), error=ValueError,
                 what="apply_rope(x (4, 5), positions (4,))", why="the last dimension 5 is odd")
    expect_error(apply_rope, randn(4, 6, gen=gen), torch.arange(3), error=ValueError,
                 what="apply_rope(x (4, 6), positions (3,))", why="x has 4 tokens but positions has 3")
