"""Hidden checks and mistake catalogue for notebook 06, positional encodings (instructor-only)."""

from __future__ import annotations

import math

import torch

from ..grader.cases import case, needs
from ..grader.compare import assert_close, assert_dtype, assert_shape, assert_tensor, is_close
from ..grader.diagnoses import explain_rounding
from ..grader.diagnosis import read_mistakes
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..shared.errors import fail
from . import hidden

# --- references (float64 inside, cast at the end) ---------------------------------------------


def _frequencies(d_model, base):
    """omega_i = base^(-2i/d) for the d/2 pairs, in float64."""
    return base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def _sinusoidal(max_len, d_model, base=10000.0, *, dtype=torch.float32):
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * _frequencies(d_model, base)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_len, d_model).to(dtype)


def _shift_matrix(k, d_model, base=10000.0, *, dtype=torch.float32):
    phi = k * _frequencies(d_model, base)
    c, s = phi.cos(), phi.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)


def _rope(x, positions, base=10000.0):
    """The complex-number formulation: pair (2i, 2i+1) is the complex number x_2i + i x_2i+1."""
    d = x.shape[-1]
    z = torch.view_as_complex(x.detach().to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    angles = positions.to(torch.float64)[:, None] * _frequencies(d, base)
    rotated = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).reshape(x.shape).to(x.dtype)


# --- the mistake catalogue: each mistake is a reference with one decision changed ---------------


@decisions("first_position", "exponent", "base_used", "divided", "layout")
def sinusoidal_encoding(max_len, d_model, base=10000.0, *, dtype=torch.float32, first_position=0, exponent="2i/d",
                        base_used=True, divided=True, layout="sin, cos"):
    """The sinusoidal encoding, with the decisions its mistakes get wrong."""
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    pos = torch.arange(first_position, max_len + first_position, dtype=torch.float64)[:, None]
    i = torch.arange(d_model // 2, dtype=torch.float64)
    power = (base if base_used else 10000.0) ** {"2i/d": 2 * i / d_model, "i/d": i / d_model, "2j/d": 4 * i / d_model}[exponent]
    angles = pos / power if divided else pos * power
    if layout == "halves":
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).to(dtype)
    even, odd = (torch.sin, torch.cos) if layout == "sin, cos" else (torch.cos, torch.sin)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = even(angles)
    pe[:, 1::2] = odd(angles)
    return pe.to(dtype)


@decisions("exponent", "steps", "transposed", "pairs")
def relative_shift_matrix(k, d_model, base=10000.0, *, dtype=torch.float32, exponent="2i/d", steps="k",
                          transposed=False, pairs="adjacent"):
    """The shift matrix, with the decisions its mistakes get wrong."""
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        phi = (k if steps == "k" else 1) / base ** ((2 * i if exponent == "2i/d" else i) / d_model)
        a, b = (2 * i, 2 * i + 1) if pairs == "adjacent" else (i, i + d_model // 2)
        sin = -math.sin(phi) if transposed else math.sin(phi)
        M[a, a] = math.cos(phi)
        M[a, b] = sin
        M[b, a] = -sin
        M[b, b] = math.cos(phi)
    return M.to(dtype)


@decisions("exponent", "positions_used", "opposite", "pairs", "tables")
def apply_rope(x, positions, base=10000.0, *, exponent="2i/d", positions_used=True, opposite=False, pairs="adjacent",
               tables="per pair"):
    """RoPE, with the decisions its mistakes get wrong."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"the last dimension of x must be even, got {d}")
    if positions.dim() != 1 or positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions must be 1-D, one per token of x, not of shape {tuple(positions.shape)}")
    exponents = torch.arange(0, d, 2, dtype=torch.float64) if exponent == "2i/d" else torch.arange(d // 2, dtype=torch.float64)
    freqs = base ** (-exponents / d)
    at = positions.to(torch.float64) if positions_used else torch.arange(x.shape[-2], dtype=torch.float64)
    angles = at[:, None] * freqs
    if tables == "rotate-half":  # the tables cat([angles, angles]) of the rotate-half layout
        emb = torch.cat([angles, angles], dim=-1)
        partner = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * emb.cos().to(x.dtype) + partner * emb.sin().to(x.dtype)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if opposite:
        sin = -sin
    if pairs == "halves":
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/positional_encoding.toml


# --- hidden checks ----------------------------------------------------------------------------


def _precision(fn, args, kwargs, want, what) -> None:
    """Name the right formula computed at float32 accuracy before a value comparison hides it in a number."""
    with case(f"float64 accuracy: {what}"):
        got = call_student(fn, *args, what=what, **kwargs)
        assert_tensor(got, f"The result of {what}")
        assert_dtype(got, want.dtype, f"The result of {what}")
        if got.shape == want.shape and is_close(got, want, 0, 1e-2) and not is_close(got, want, 1e-9, 1e-10) \
                and not explain_rounding(got, want):  # a rounded answer is not a float32 one: the comparison says so
            fail(f"{what} is close to the right answer but only to float32 accuracy (the largest error is "
                 f"{(got.double() - want.double()).abs().max().item():.3g}). When the inputs or the requested dtype "
                 "are float64, compute the frequencies and the angles in float64 too: a float32 tensor "
                 "(torch.arange(...).float(), or a float32 default) loses digits once the angles grow.")


@hidden
def check_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Against the reference in float64 for many shapes and bases; then float32, properties, errors."""
    f64 = {"dtype": torch.float64}
    _precision(sinusoidal_encoding, (200, 16), f64, _sinusoidal(200, 16, dtype=torch.float64),
               "sinusoidal_encoding(200, 16, dtype=torch.float64)")
    cases = [
        Case((50, 16), f64, "the default base"),
        Case((30, 8, 500.0), f64, "base = 500"),
        Case((7, 2), f64, "a single pair"),
        # Position 0 alone (sin 0, cos 0) and no position at all: almost any formula gives them; a small share.
        Case((1, 12), f64, "one position", weight=0.25),
        Case((2048, 64), f64, "a long sequence"),
        Case((20, 6, 3.0), f64, "base = 3"),
        Case((0, 4), f64, "no positions at all", weight=0.25),
    ]
    verify(sinusoidal_encoding, cases, _sinusoidal, exercise="sinusoidal_encoding",
           arg_names=("max_len", "d_model", "base"), outputs=None, mistakes=MISTAKES["sinusoidal_encoding"],
           rtol=1e-9, atol=1e-10)
    verify(sinusoidal_encoding, [Case((64, 32), label="the default dtype, float32")], _sinusoidal,
           exercise="sinusoidal_encoding", arg_names=("max_len", "d_model"), outputs=None, rtol=1e-5, atol=5e-5)
    with case("sinusoidal_encoding(500, 128): every entry in [-1, 1], sin^2 + cos^2 = 1 for every pair"):
        pe = call_student(sinusoidal_encoding, 500, 128, dtype=torch.float64,
                          what="sinusoidal_encoding(500, 128, dtype=torch.float64)")
        if pe.abs().max() > 1 + 1e-12:
            fail("Every entry of a sinusoidal encoding is a sine or a cosine, so it lies in [-1, 1]; "
                 f"yours reaches {pe.abs().max().item():.6g}.")
        pair_norm = pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2
        assert_close(pair_norm, torch.ones_like(pair_norm), "sin^2 + cos^2 of every pair of sinusoidal_encoding",
                     rtol=0, atol=1e-12, hint="Columns 2i and 2i+1 must be the sine and the cosine of the same angle.")
    for d_model in (3, 1, 65):
        expect_error(sinusoidal_encoding, 10, d_model, error=ValueError,
                     what=f"sinusoidal_encoding(10, {d_model})", why=f"d_model = {d_model} is odd: "
                     "sin/cos pairs need an even number of columns")


@hidden
def check_relative_shift_matrix(relative_shift_matrix) -> None:
    """Against the reference; then PE[pos + k] = M PE[pos] at every pos, orthogonality, composition."""
    f64 = {"dtype": torch.float64}
    cases = [
        Case((3, 8), f64, "k = 3"),
        Case((-5, 6, 250.0), f64, "a negative shift, base = 250"),
        Case((2, 16), f64, "k = 2"),
        Case((1, 4), f64, "k = 1"),
        Case((0, 10), f64, "k = 0: the identity", weight=0.25),  # any rotation by k * frequency gives it
        Case((37, 2), f64, "a single pair"),
        Case((-100, 32, 500.0), f64, "a large negative shift, base = 500"),
    ]
    _precision(relative_shift_matrix, (300, 16), f64, _shift_matrix(300, 16, dtype=torch.float64),
               "relative_shift_matrix(300, 16, dtype=torch.float64)")
    verify(relative_shift_matrix, cases, _shift_matrix, exercise="relative_shift_matrix",
           arg_names=("k", "d_model", "base"), outputs=None, mistakes=MISTAKES["relative_shift_matrix"],
           rtol=1e-9, atol=1e-10)
    verify(relative_shift_matrix, [Case((7, 12), label="the default dtype, float32")], _shift_matrix,
           exercise="relative_shift_matrix", arg_names=("k", "d_model"), outputs=None, rtol=1e-5, atol=1e-5)

    length, d_model = 300, 24
    pe = _sinusoidal(length, d_model, dtype=torch.float64)
    eye = torch.eye(d_model, dtype=torch.float64)
    for k in (1, 2, 7, 50, -1, -13, -120, 0):
        what = f"relative_shift_matrix({k}, {d_model}, dtype=torch.float64)"
        with case(f"M @ PE[pos] = PE[pos + k] and M @ M.T = I, k = {k}"):
            M = call_student(relative_shift_matrix, k, d_model, dtype=torch.float64, what=what)
            assert_tensor(M, f"The result of {what}")
            assert_shape(M, (d_model, d_model), f"The result of {what}")
            lo, hi = max(0, -k), length - max(0, k)
            shifted = pe[lo:hi] @ M.T  # row pos is M @ PE[pos]
            assert_close(shifted, pe[lo + k:hi + k], f"M @ PE[pos] for every pos in [{lo}, {hi}) with M = {what}",
                         rtol=1e-9, atol=1e-10, hint=f"Row r of this comparison is position {lo} + r; it should "
                         f"be PE[pos + {k}].")
            assert_close(M @ M.T, eye, f"M @ M.T for M = {what}", rtol=0, atol=1e-12,
                         hint="A shift matrix is a rotation, so it is orthogonal: M @ M.T = I.")
    with case("shifts compose: M_5 @ M_-9 = M_-4"):
        a = call_student(relative_shift_matrix, 5, d_model, dtype=torch.float64, what="relative_shift_matrix(5, ...)")
        b = call_student(relative_shift_matrix, -9, d_model, dtype=torch.float64,
                         what="relative_shift_matrix(-9, ...)")
        c = call_student(relative_shift_matrix, -4, d_model, dtype=torch.float64,
                         what="relative_shift_matrix(-4, ...)")
        assert_close(a @ b, c, "relative_shift_matrix(5) @ relative_shift_matrix(-9)", rtol=1e-9, atol=1e-10,
                     hint="Shifting by -9 then by 5 is shifting by -4: M_5 M_-9 = M_-4.")
    for d_model in (5, 1):
        expect_error(relative_shift_matrix, 2, d_model, error=ValueError,
                     what=f"relative_shift_matrix(2, {d_model})", why=f"d_model = {d_model} is odd")


def _rope_cases(seed: int) -> list[Case]:
    gen = generator(seed)
    long_positions = torch.tensor([3, 10, 0, 1, 100, 2, 5])
    return [
        Case((randn(2, 3, 5, 8, gen=gen), torch.arange(5)), label="two batch dimensions"),
        Case((randn(7, 6, gen=gen), long_positions), label="positions that are not 0, 1, 2, ..."),
        Case((randn(4, 9, 16, gen=gen), torch.arange(100, 109)), {"base": 500.0}, "base = 500, positions from 100"),
        Case((randn(3, 2, gen=gen), torch.tensor([0.5, 1.5, 2.25], dtype=torch.float64)),
             label="a single pair, fractional positions"),
        Case((randn(2, 1, 4, 32, gen=gen), torch.tensor([4000, 4001, 4002, 4003])), label="large positions"),
        Case((randn(5, 1, 4, gen=gen), torch.tensor([7])), label="one token"),
    ]


@hidden
def check_apply_rope(apply_rope) -> None:
    """Against the complex-number formulation; norm kept; scores depend only on m - n; errors."""
    gen = generator(600)
    x, positions = randn(2, 6, 8, gen=gen), torch.arange(1000, 1006)
    _precision(apply_rope, (x, positions), {}, _rope(x, positions),
               "apply_rope(x (2, 6, 8) float64, positions 1000..1005)")
    verify(apply_rope, _rope_cases(601), _rope, exercise="apply_rope", arg_names=("x", "positions"),
           outputs=None, mistakes=MISTAKES["apply_rope"], rtol=1e-9, atol=1e-10)
    gen = generator(602)
    x32 = randn(3, 10, 8, gen=gen, dtype=torch.float32)
    verify(apply_rope, [Case((x32, torch.arange(10)), label="float32")], _rope, exercise="apply_rope",
           arg_names=("x", "positions"), outputs=None, mistakes=MISTAKES["apply_rope"], rtol=1e-5, atol=1e-5)

    x = randn(6, 50, 16, gen=gen)
    positions = torch.randint(0, 10_000, (50,), generator=gen)
    with case("the norm of every rotated vector is kept"):
        y = call_student(apply_rope, x, positions, what="apply_rope(x (6, 50, 16), positions)")
        assert_close(y.norm(dim=-1), x.norm(dim=-1), "the norm of every rotated vector", rtol=1e-10, atol=1e-10,
                     hint="A rotation keeps lengths: ||apply_rope(x)|| must equal ||x|| for every token.")

    # Scores q_m . k_n for m, n in 0..T-1, then the same with every position moved by 1234:
    # a Toeplitz matrix (constant along diagonals) that does not change.
    T, d = 64, 16
    q, k = randn(d, gen=gen), randn(d, gen=gen)
    grid = torch.arange(T)
    relative = "the score of q at m and k at n depends on m - n only"
    scores = None
    with case(relative):
        qs = call_student(apply_rope, q.expand(T, d).clone(), grid, what="apply_rope(q repeated, arange(64))")
        ks = call_student(apply_rope, k.expand(T, d).clone(), grid, what="apply_rope(k repeated, arange(64))")
        scores = qs @ ks.T
        assert_close(scores[1:, 1:], scores[:-1, :-1], "the score (q at m) . (k at n) compared with m+1, n+1",
                     rtol=1e-9, atol=1e-9, hint="With RoPE the score must depend on m - n only.")
    with case("the scores do not change when every position moves by 1234"):
        needs(scores, relative)
        qs2 = call_student(apply_rope, q.expand(T, d).clone(), grid + 1234, what="apply_rope(q, arange(64) + 1234)")
        ks2 = call_student(apply_rope, k.expand(T, d).clone(), grid + 1234, what="apply_rope(k, arange(64) + 1234)")
        assert_close(qs2 @ ks2.T, scores, "the scores with every position moved by 1234", rtol=1e-9, atol=1e-9,
                     hint="Moving both the query and the key by the same amount must not change their score.")

    expect_error(apply_rope, randn(2, 4, 5, gen=gen), torch.arange(4), error=ValueError,
                 what="apply_rope(x (2, 4, 5), positions (4,))", why="the last dimension 5 is odd")
    expect_error(apply_rope, randn(2, 4, 6, gen=gen), torch.arange(3), error=ValueError,
                 what="apply_rope(x (2, 4, 6), positions (3,))", why="x has 4 tokens but positions has 3")
    expect_error(apply_rope, randn(2, 4, 6, gen=gen), torch.arange(8).reshape(2, 4), error=ValueError,
                 what="apply_rope(x (2, 4, 6), positions (2, 4))", why="positions must be 1-D, of length T")
