"""Hidden checks and mistake catalogue for notebook 03, causal and padding masks (instructor-only)."""

from __future__ import annotations

import math

import torch

from ..grader.cases import case
from ..grader.diagnosis import MistakeFound, read_mistakes
from ..grader.inputs import generator, randn
from ..grader.student import call_student, expect_error, probe
from ..grader.variation import decisions
from ..grader.verify import Case, verify
from ..kernel.guard import ATTENTION_BUILTINS
from ..references.masking import (
    INF,
    allowed_keys,
    assert_exact_zeros,
    causal_reference,
    default_device_problem,
    masked_attention_reference,
    padding_mask_off_the_default_device,
    padding_reference,
    same_off_the_default_device,
)
from . import hidden

# --- the mistake catalogue: each mistake is a reference with one decision changed -----------------


@decisions("fill", "inverted", "dtype_used")
def to_additive_mask(mask, dtype, *, fill="-inf", inverted=False, dtype_used=True):
    """The additive mask, with the decisions its mistakes get wrong."""
    if mask.dtype != torch.bool:
        raise ValueError("the mask must be boolean (a float mask is already additive)")
    value = torch.finfo(dtype).min if fill == "finfo(dtype).min" else float("-inf")
    zeros = torch.zeros(mask.shape, dtype=dtype if dtype_used else None, device=mask.device)
    return zeros.masked_fill(mask if inverted else ~mask, value)


# Functions of their own: other formulas than the reference's, not one of its decisions changed.


def to_additive_mask_minus_1e9(mask, dtype):
    return torch.where(mask, 0.0, -1e9).to(dtype)


def to_additive_mask_cast(mask, dtype):
    return mask.to(dtype)


def to_additive_mask_zero_times_inf(mask, dtype):
    return (~mask).to(dtype) * float("-inf")


@decisions("boolean", "align_used", "shift", "diagonal_kept", "triangle", "inverted")
def causal_mask(n, m=None, *, align="top_left", device=None, boolean=True, align_used=True, shift="m - n",
                diagonal_kept=True, triangle="lower", inverted=False):
    """The causal mask, with the decisions its mistakes get wrong."""
    m = n if m is None else m
    if align not in ("top_left", "bottom_right"):
        raise ValueError(f"align must be 'top_left' or 'bottom_right', not {align!r}")
    offset = 0 if align == "top_left" or not align_used else m - n if shift == "m - n" else n - m
    ones = torch.ones(n, m, dtype=torch.bool if boolean else None, device=device)
    mask = ones.tril(diagonal=offset if diagonal_kept else offset - 1) if triangle == "lower" else ones.triu(offset)
    return ~mask if inverted else mask


@decisions("on_lengths_device", "first_position", "real", "transposed", "boolean")
def padding_mask(lengths, max_len, *, on_lengths_device=True, first_position=0, real="j < L", transposed=False,
                 boolean=True):
    """The padding mask, with the decisions its mistakes get wrong."""
    if lengths.dim() != 1 or bool((lengths < 0).any()) or bool((lengths > max_len).any()):
        raise ValueError(f"lengths {lengths.tolist()} do not fit in max_len = {max_len}")
    j = torch.arange(first_position, max_len + first_position, device=lengths.device if on_lengths_device else None)
    j, L = (j[:, None], lengths[None, :]) if transposed else (j, lengths[:, None])
    mask = {"j < L": j < L, "j <= L": j <= L, "j < L - 1": j < L - 1, "j >= L": j >= L}[real]
    return mask if boolean else mask.float()


@decisions("scaled", "masked", "bool_mask", "inverted", "fill", "float_mask", "empty_rows")
def masked_attention(Q, K, V, mask=None, *, scaled=True, masked="scores", bool_mask="selects", inverted=False,
                     fill="-inf", float_mask="added", empty_rows="zeros"):
    """Masked attention, with the decisions its mistakes get wrong."""
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q and K have different d_k ({Q.shape[-1]} and {K.shape[-1]})")
    scores = Q @ K.transpose(-2, -1)
    if scaled:
        scores = scores / math.sqrt(Q.shape[-1])
    if mask is not None and (mask.dim() > scores.dim() or any(
            a not in (1, b) for a, b in zip(mask.shape[::-1], scores.shape[::-1]))):
        raise ValueError(f"a mask of shape {tuple(mask.shape)} does not broadcast to the scores {tuple(scores.shape)}")
    if mask is not None and masked == "weights":
        weights = torch.softmax(scores, dim=-1)
        weights = weights.masked_fill(~mask, 0.0) if mask.dtype == torch.bool else weights * torch.exp(mask)
        return weights @ V, weights
    if mask is not None and mask.dtype == torch.bool and bool_mask == "selects":
        fills = {"-inf": float("-inf"), "-1e9": -1e9, "finfo(dtype).min": torch.finfo(scores.dtype).min}
        scores = scores.masked_fill(mask if inverted else ~mask, fills[fill])
    elif mask is not None and float_mask == "as bool()":
        scores = scores.masked_fill(~mask.bool(), float("-inf"))
    elif mask is not None and float_mask == "its -inf only":
        scores = scores.masked_fill(mask == float("-inf"), float("-inf"))
    elif mask is not None:
        scores = scores + mask
    if empty_rows != "zeros":
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
    no_key = (scores == float("-inf")).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(no_key, 0.0), dim=-1).masked_fill(no_key, 0.0)
    return weights @ V, weights


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/masking.toml


# --- hidden checks ------------------------------------------------------------------------


@hidden
def check_to_additive_mask(to_additive_mask) -> None:
    """Many shapes and every floating dtype; -inf in float16 and bfloat16 too."""
    gen = generator(310)
    cases = []
    for shape, dtype in [((4, 6), torch.float32), ((2, 1, 3, 5), torch.float64), ((7,), torch.float16),
                         ((3, 3), torch.bfloat16), ((2, 0, 4), torch.float32)]:
        mask = torch.rand(shape, generator=gen) < 0.6
        cases.append(Case((mask, dtype), label=f"a {shape} mask, {str(dtype).removeprefix('torch.')}"))
    cases.append(Case((torch.ones(2, 3, dtype=torch.bool), torch.float32), label="everything allowed"))
    cases.append(Case((torch.zeros(2, 3, dtype=torch.bool), torch.float16), label="nothing allowed, float16"))
    cases.sort(key=lambda case: case.args[1] in (torch.float16, torch.bfloat16))  # full precision first
    cases.append(Case((torch.empty(3, 1, 4, dtype=torch.bool, device="meta"), torch.float64),
                      label="a mask on the meta device: the result is on the mask's device"))

    def reference(mask, dtype):
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -INF)

    verify(to_additive_mask, cases, reference, exercise="to_additive_mask", arg_names=("mask", "dtype"),
           outputs=None, mistakes=MISTAKES["to_additive_mask"], rtol=0.0, atol=0.0)
    expect_error(to_additive_mask, torch.zeros(2, 3), torch.float32, error=ValueError,
                 what="to_additive_mask(a float32 mask, torch.float32)",
                 why="the mask must be boolean (a float mask is already additive)")


# n == m first, then n < m, then n > m: the simplest case that fails names the mistake.
# One query and one key (1, 1) is allowed under every rule: almost any answer passes it, so it earns a small share.
CAUSAL_SIZES = [(1, 1), (4, 4), (2, 2), (3, 7), (1, 6), (5, 8), (7, 3), (6, 1), (8, 5)]


@hidden
def check_causal_mask(causal_mask) -> None:
    """n < m, n > m, n == m, both alignments; the mask itself against SDPA's and causal_lower_right's."""
    cases = [Case((6,), label="m left out: m = n")]
    cases += [Case((n, m), {"align": align}, label=f"n = {n}, m = {m}, {align}", weight=0.25 if n == m == 1 else 1.0)
              for n, m in CAUSAL_SIZES for align in ("top_left", "bottom_right")]
    cases += [Case((3, 5), {"align": align, "device": device}, label=f"{align} on the device {device!r}")
              for align in ("top_left", "bottom_right") for device in ("meta", torch.device("meta"))]
    verify(causal_mask, cases, causal_reference, exercise="causal_mask", arg_names=("n", "m"), outputs=None,
           mistakes=MISTAKES["causal_mask"], rtol=0.0, atol=0.0)
    for bad in ("bottom-right", "lower_right", "top_right"):
        expect_error(causal_mask, 3, 5, align=bad, error=ValueError, what=f"causal_mask(3, 5, align={bad!r})",
                     why="align must be 'top_left' or 'bottom_right'")


@hidden
def check_padding_mask(padding_mask) -> None:
    """Random lengths including 0 and max_len, one sequence, a long batch; against pad_sequence; on the device of
    lengths whatever the default device."""
    gen = generator(320)
    cases = [
        Case((torch.tensor([5, 2, 3]), 5), label="lengths 5, 2, 3"),
        Case((torch.tensor([1]), 1), label="one sequence of one token"),
        Case((torch.tensor([0, 0]), 3), label="two empty sequences"),
        Case((torch.tensor([3, 3]), 6), label="every sequence shorter than max_len"),
        Case((torch.randint(0, 13, (9,), generator=gen), 12 + 1), label="9 random lengths"),
    ]
    verify(padding_mask, cases, padding_reference, exercise="padding_mask", arg_names=("lengths", "max_len"),
           outputs=None, mistakes=MISTAKES["padding_mask"], rtol=0.0, atol=0.0)
    expect_error(padding_mask, torch.tensor([3, 8, 1]), 7, error=ValueError, what="padding_mask(tensor([3, 8, 1]), 7)",
                 why="a length of 8 does not fit in max_len = 7")
    expect_error(padding_mask, torch.tensor([3, -1]), 7, error=ValueError, what="padding_mask(tensor([3, -1]), 7)",
                 why="a length cannot be negative")
    expect_error(padding_mask, torch.tensor([[3, 1]]), 7, error=ValueError,
                 what="padding_mask(lengths of shape (1, 2), 7)", why="lengths must have shape (B,)")
    lengths, max_len = [2, 0, 6, 3], 6
    with case("the default device set to meta: the mask is on the device of lengths"):
        record = probe(padding_mask_off_the_default_device, padding_mask, torch.tensor(lengths), max_len,
                       what=f"padding_mask(tensor({lengths}), {max_len}) with the default device set to meta")
        problem = default_device_problem(record, lengths, max_len)
        if problem:
            raise MistakeFound(problem, same_off_the_default_device(MISTAKES["padding_mask"], record, lengths, max_len))



def _padded_causal(lengths: list[int], n: int) -> torch.Tensor:
    """(B, 1, n, n): causal and key padding on the left (pads first), as in batched generation."""
    positions = torch.arange(n)
    real = positions[None, :] >= (n - torch.tensor(lengths))[:, None]
    return (real[:, None, :] & torch.ones(n, n, dtype=torch.bool).tril())[:, None]


def _masked_cases(gen: torch.Generator) -> list[Case]:
    def qkv(batch, n, m, d_k, d_v, dtype=torch.float64):
        return (randn(*batch, n, d_k, gen=gen, dtype=dtype), randn(*batch, m, d_k, gen=gen, dtype=dtype),
                randn(*batch, m, d_v, gen=gen, dtype=dtype))

    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    lower_right = torch.ones(3, 6, dtype=torch.bool).tril(diagonal=3)
    additive = torch.zeros(3, 6, dtype=torch.float64).masked_fill(~lower_right, -INF)
    distance = (torch.arange(4)[:, None] - torch.arange(7)[None, :] - 3).abs().double()
    alibi = torch.stack([-0.5 * distance, -0.25 * distance])  # (2 heads, 4, 7): finite biases
    alibi = alibi.masked_fill(~torch.ones(4, 7, dtype=torch.bool).tril(diagonal=3), -INF)
    key_padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
    heads_padding = key_padding[:, None, None, :]
    left = _padded_causal([6, 3], 6)
    all_minus_inf = torch.zeros(4, 5, dtype=torch.float64)
    all_minus_inf[1] = -INF
    all_minus_inf[3, ::2] = -INF
    return [
        Case(qkv((2,), 5, 5, 8, 8), {"mask": causal}, "a boolean causal mask (5, 5)"),
        Case(qkv((), 4, 5, 3, 2), label="no mask"),
        Case(qkv((2,), 3, 6, 4, 5), {"mask": additive}, "a float 0/-inf mask (3, 6), n < m"),
        Case(qkv((3,), 4, 6, 4, 4), {"mask": key_padding[:, None, :]}, "a (B, 1, m) key padding mask"),
        Case(qkv((3, 2), 5, 6, 8, 3), {"mask": heads_padding}, "a (B, 1, 1, m) mask over 2 heads"),
        Case(qkv((2, 3, 2), 5, 5, 4, 6), {"mask": causal}, "3 leading batch dimensions, a (5, 5) mask"),
        Case(qkv((3, 2), 4, 7, 5, 5), {"mask": alibi}, "a float mask with finite biases (ALiBi) and -inf"),
        Case(qkv((2, 1), 6, 6, 4, 3), {"mask": left},
             "causal and left padding: rows 0, 1, 2 of batch 1 have no allowed key"),
        Case(qkv((), 4, 5, 3, 3), {"mask": all_minus_inf}, "a float mask whose row 1 is all -inf"),
        Case(qkv((2,), 5, 3, 4, 4), {"mask": torch.ones(5, 3, dtype=torch.bool).tril(diagonal=-2)},
             "n > m bottom-right causal: rows 0 and 1 have no key"),
        # Dimensions of size 1 beyond the reduced one: a .squeeze() or an index [0] must not remove them.
        Case(qkv((2, 1), 1, 4, 3, 1), {"mask": torch.tensor([[True, False, True, True]])},
             "a single query (n = 1), values of one feature, a batch dimension of 1"),
        Case(qkv((3,), 2, 1, 4, 2), {"mask": torch.tensor([[True], [False]])},
             "a single key (m = 1); query 1 may not attend to it"),
    ]


LOW_PRECISION = {torch.float16: 1e-2, torch.bfloat16: 4e-2}


def _exact_zeros(masked_attention, cases: list[Case]) -> None:
    """A case per input with a row that may attend to no key: that row's weights and output are exactly 0."""
    for input_case in cases:
        mask = input_case.kwargs.get("mask")
        weights = masked_attention_reference(*input_case.args, **input_case.kwargs)[1]
        if not bool((~allowed_keys(mask, weights.shape).any(dim=-1)).any()):
            continue  # every row has a key: nothing must be exactly zero
        with case(f"exact zeros where no key is allowed, {input_case.label}"):
            result = call_student(masked_attention, *input_case.args, **input_case.kwargs,
                                  what="masked_attention(...)", forbid=ATTENTION_BUILTINS)
            assert_exact_zeros(result, mask, f"masked_attention with {input_case.label}")


@hidden
def check_masked_attention(masked_attention) -> None:
    """Against SDPA with attn_mask (math backend, float64); exact zeros on rows with no key; half precision."""
    cases = _masked_cases(generator(330))
    verify(masked_attention, cases, masked_attention_reference, exercise="masked_attention",
           arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS, mistakes=MISTAKES["masked_attention"],
           rtol=1e-9, atol=1e-11)
    _exact_zeros(masked_attention, cases)
    for dtype, tol in LOW_PRECISION.items():
        low = []
        for full in (cases[0], cases[6], cases[7]):
            mask = full.kwargs["mask"]
            mask = mask if mask.dtype == torch.bool else mask.to(dtype)
            low.append(Case(tuple(t.to(dtype) for t in full.args), {"mask": mask}, f"{dtype} inputs, {full.label}"))
        verify(masked_attention, low, masked_attention_reference, exercise="masked_attention",
               arg_names=("Q", "K", "V"), forbid=ATTENTION_BUILTINS, mistakes=MISTAKES["masked_attention"],
               rtol=tol, atol=tol)
        _exact_zeros(masked_attention, low)
    gen = generator(331)
    expect_error(masked_attention, randn(2, 3, 4, gen=gen), randn(2, 5, 4, gen=gen), randn(2, 5, 4, gen=gen),
                 mask=torch.ones(2, 5, dtype=torch.bool), error=ValueError,
                 what="masked_attention(Q (2, 3, 4), K (2, 5, 4), V, mask (2, 5))",
                 why="a (2, 5) key padding mask does not broadcast to the (2, 3, 5) scores: it needs shape (2, 1, 5)")
    expect_error(masked_attention, randn(3, 4, gen=gen), randn(5, 6, gen=gen), randn(5, 4, gen=gen), error=ValueError,
                 what="masked_attention(Q (3, 4), K (5, 6), V (5, 4))", why="Q and K have different d_k (4 and 6)")
