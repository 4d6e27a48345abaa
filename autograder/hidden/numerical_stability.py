"""Hidden checks and mistake catalogue for notebook 04, numerical stability (instructor-only)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..grader.cases import case
from ..grader.diagnosis import Mistake, MistakeFound, by_id
from ..grader.inputs import generator, randn
from ..grader.student import attempt, expect_error
from ..grader.variation import decisions, variant
from ..grader.verify import Case, verify_each
from ..kernel.guard import SOFTMAX_BUILTINS, ForbiddenCall
from ..references.numerical_stability import (
    gradcheck_problem,
    input_changed_message,
    leaves_input_untouched,
    log_softmax_reference,
    log_tolerance,
    logsumexp_reference,
    online_reference,
    record_reductions,
    softmax_reference,
    softmax_tolerance_of,
    streaming_problem,
    with_minus_inf,
)
from ..shared.errors import fail
from . import hidden

INF = math.inf

OVERFLOW = "1. Where exp breaks: overflow and underflow"
SHIFT = "2. Shifting the scores changes nothing"
PER_ROW = "3. One shift per row"
EMPTY_ROWS = "4. Rows with nothing to attend to"
STABLE = "5. A softmax that never overflows"
LSE = "6. Log-sum-exp"
LOG_SOFTMAX = "7. Log-softmax"
HALF = "8. Half precision"
ONLINE = "9. Online softmax: one pass over blocks"


# --- the mistake catalogue: each mistake is a reference with one decision changed -----------------
# Apart from its one mistake each is a correct answer: per-row shift, rows entirely -inf handled.


@decisions("shift", "empty_rows", "dim_used", "detached", "in_place", "normalised_by")
def stable_softmax(x, dim=-1, *, shift="row max", empty_rows="zeros", dim_used=True, detached=False, in_place=False,
                   normalised_by="the sum"):
    """The stable softmax, with the decisions its mistakes get wrong."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"x of shape {tuple(x.shape)} has no dimension {dim}")
    dim = dim if dim_used else -1
    if detached:
        x = x.detach()
    if empty_rows == "uniform":
        x = torch.where(x == -math.inf, torch.finfo(x.dtype).min, x)
    if shift == "none":
        e = torch.exp(x)
    else:
        m = x.max() if shift == "global max" else x.amax(dim=dim, keepdim=True)
        if empty_rows == "zeros":
            m = torch.where(m == -math.inf, 0.0, m)
        if normalised_by == "the logsumexp":
            lse = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
            return torch.where(lse == -math.inf, 0.0, torch.exp(x - lse))
        if in_place:
            x -= m
        e = torch.exp(x) if in_place else torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / (torch.where(s == 0, 1.0, s) if empty_rows == "zeros" else s)


@decisions("shift", "empty_rows", "max_added_back", "dim_used", "keepdim")
def logsumexp(x, dim=-1, *, shift="row max", empty_rows="shift by 0", max_added_back=True, dim_used=True,
              keepdim=False):
    """The log-sum-exp, with the decisions its mistakes get wrong."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"x of shape {tuple(x.shape)} has no dimension {dim}")
    dim = dim if dim_used else -1
    if shift == "none":
        return torch.log(torch.exp(x).sum(dim=dim))
    m = x.max() if shift == "global max" else x.amax(dim=dim, keepdim=True)
    if empty_rows == "shift by 0":
        m = torch.where(m == -math.inf, 0.0, m)
    lse = torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
    lse = m + lse if max_added_back else lse
    return lse if keepdim else lse.squeeze(dim)


@decisions("shifted", "empty_rows", "max_added_back", "dim_used", "log_of_softmax")
def log_softmax(x, dim=-1, *, shifted=True, empty_rows="-inf", max_added_back=True, dim_used=True,
                log_of_softmax=False):
    """The log-softmax, with the decisions its mistakes get wrong."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"x of shape {tuple(x.shape)} has no dimension {dim}")
    dim = dim if dim_used else -1
    if not shifted:
        lse = torch.log(torch.exp(x).sum(dim=dim, keepdim=True))
    else:
        m = x.amax(dim=dim, keepdim=True)
        if empty_rows == "-inf":
            m = torch.where(m == -math.inf, 0.0, m)
        if log_of_softmax:
            e = torch.exp(x - m)
            s = e.sum(dim=dim, keepdim=True)
            return torch.log(e / torch.where(s == 0, 1.0, s))
        lse = torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
        lse = m + lse if max_added_back else lse
    return torch.where(lse == -math.inf, -math.inf, x - lse) if empty_rows == "-inf" else x - lse


@decisions("accumulator", "last_block", "rescale", "empty_blocks")
def online_softmax(x, block_size, *, accumulator="float32", last_block=True, rescale="exp(m - m_new)",
                   empty_blocks="shift by 0"):
    """The online softmax, with the decisions its mistakes get wrong."""
    if block_size < 1:
        raise ValueError(f"a block must hold at least one entry, not block_size = {block_size}")
    acc = torch.promote_types(x.dtype, torch.float32) if accumulator == "float32" else x.dtype
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=acc, device=x.device)
    s = torch.zeros(x.shape[:-1] + (1,), dtype=acc, device=x.device)
    for start in range(0, x.shape[-1] if last_block else x.shape[-1] - block_size + 1, block_size):
        block = x[..., start:start + block_size].to(acc)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = torch.where(m_new == -math.inf, 0.0, m_new) if empty_blocks == "shift by 0" else m_new
        if rescale == "exp(m - m_new)":
            s = s * torch.exp(m - shift)
        elif rescale == "exp(m_new - m)":
            s = s * torch.exp(shift - m)
        s = s + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    shift = torch.where(m == -math.inf, 0.0, m)
    return (torch.exp(x.to(acc) - shift) / torch.where(s == 0, 1.0, s)).to(x.dtype)


online_softmax_half_precision_sum = variant(online_softmax, accumulator="x's dtype")  # a test submits it by name


# Functions of their own: a check's message shows the line of the pasted copy that fails (no keepdim),
# or they are other algorithms than the reference (a built-in, one softmax per block, the whole row, two passes).


def stable_softmax_max_without_keepdim(x, dim=-1):
    m = x.amax(dim=dim)
    m = torch.where(m == -math.inf, 0.0, m)
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, 1.0, s)


def log_softmax_without_keepdim(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    lse = (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)
    return torch.where(lse == -math.inf, -math.inf, x - lse)


def stable_softmax_builtin(x, dim=-1):
    return torch.softmax(x, dim=dim)


def logsumexp_builtin(x, dim=-1):
    return torch.logsumexp(x, dim=dim)


def log_softmax_builtin(x, dim=-1):
    return F.log_softmax(x, dim=dim)


def online_softmax_builtin(x, block_size):
    return torch.softmax(x, dim=-1)


def online_softmax_blocks_normalised_separately(x, block_size):
    acc = torch.promote_types(x.dtype, torch.float32)
    pieces = []
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size].to(acc)
        m = block.amax(dim=-1, keepdim=True)
        m = torch.where(m == -math.inf, 0.0, m)
        e = torch.exp(block - m)
        s = e.sum(dim=-1, keepdim=True)
        pieces.append(e / torch.where(s == 0, 1.0, s))
    return torch.cat(pieces, dim=-1).to(x.dtype)


def online_softmax_whole_row(x, block_size):
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s == 0, 1.0, s)


def online_softmax_two_passes(x, block_size):
    acc = torch.promote_types(x.dtype, torch.float32)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=acc, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        m = torch.maximum(m, x[..., start:start + block_size].to(acc).amax(dim=-1, keepdim=True))
    shift = torch.where(m == -math.inf, 0.0, m)
    s = torch.zeros(x.shape[:-1] + (1,), dtype=acc, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        s = s + torch.exp(x[..., start:start + block_size].to(acc) - shift).sum(dim=-1, keepdim=True)
    return (torch.exp(x.to(acc) - shift) / torch.where(s == 0, 1.0, s)).to(x.dtype)


NO_SHIFT = (
    "exp of an entry above about 88.7 (float32; 11.1 in float16) is inf, and inf / inf is NaN; exp of entries all "
    "far below 0 is 0, and 0 / 0 is NaN. Subtract each row's max first: softmax(x) = softmax(x - c) for any c."
)
GLOBAL_MAX = (
    "the shift must be the max of each row (amax over dim with keepdim=True), not the max of the whole tensor: a "
    "row whose entries are all far below the global max underflows to exp(...) = 0 everywhere."
)
DIM_IGNORED = (
    "the dim argument must be used everywhere (max and sum over dim), not a hard-coded -1: with dim=0 the "
    "reduction runs down the columns."
)
X_MINUS_LSE = (
    "softmax(x) = exp(x - logsumexp(x)) holds exactly, but a float16 of about 1000 is a multiple of 0.5 (of 8 near "
    "1e4): lse is rounded by up to that much, x - lse with it, and exp turns the error into a factor on every "
    "probability (the rows no longer sum to 1). x - max is exact (the max is one of the entries): subtract the "
    "max, exponentiate, divide by the sum."
)
BUILTIN = "the exercise is to build it from exp, max, sum and log; PyTorch's built-in is only the referee."

MISTAKES: dict[str, list[Mistake]] = {
    "stable_softmax": [
        Mistake("no max shift", NO_SHIFT, SHIFT, variant(stable_softmax, shift="none"),
                id="numerical_stability/stable_softmax/no-max-shift"),
        Mistake("one global max instead of one per row", GLOBAL_MAX, PER_ROW, variant(stable_softmax, shift="global max"),
                id="numerical_stability/stable_softmax/one-global-max-instead-of-one-per-row"),
        Mistake("NaN on rows that are entirely -inf", "a row whose entries are all -inf has max -inf, and "
                "-inf - (-inf) is NaN. Such a row (a query with nothing to attend to) must give zeros: shift it "
                "by 0 instead and return 0 where the sum is 0.", EMPTY_ROWS, variant(stable_softmax, empty_rows="NaN"),
                id="numerical_stability/stable_softmax/nan-on-rows-that-are-entirely-inf"),
        Mistake("uniform weights on rows that are entirely -inf", "replacing -inf by a large negative number "
                "(-1e9, torch.finfo(dtype).min) turns a row with nothing to attend to into a uniform row: it "
                "attends to everything equally. Such a row must give zeros.", EMPTY_ROWS,
                variant(stable_softmax, empty_rows="uniform"),
                id="numerical_stability/stable_softmax/uniform-weights-on-rows-that-are-entirely-inf"),
        Mistake("the dim argument ignored", DIM_IGNORED, STABLE, variant(stable_softmax, dim_used=False),
                id="numerical_stability/stable_softmax/the-dim-argument-ignored"),
        Mistake("the max taken without keepdim", "x.amax(dim) drops the reduced dimension, so x - m lines the "
                "maxima up with the wrong axis (or fails to broadcast). Keep it: x.amax(dim=dim, keepdim=True).",
                STABLE, stable_softmax_max_without_keepdim,
                id="numerical_stability/stable_softmax/the-max-taken-without-keepdim"),
        Mistake("the result detached from autograd", "the gradient must flow from the result back to x: no "
                ".detach(), .item(), .numpy() or torch.no_grad() on the way.", STABLE, variant(stable_softmax, detached=True),
                id="numerical_stability/stable_softmax/the-result-detached-from-autograd"),
        Mistake("exp(x - logsumexp(x)) in half precision", X_MINUS_LSE, HALF,
                variant(stable_softmax, normalised_by="the logsumexp"),
                id="numerical_stability/stable_softmax/exp-of-x-minus-logsumexp-in-half-precision"),
        Mistake("a built-in softmax", BUILTIN, STABLE, stable_softmax_builtin,
                id="numerical_stability/stable_softmax/a-built-in-softmax"),
        Mistake("the input modified in place", "x -= m (or x.sub_(m), x[...] = ...) changes the caller's "
                "tensor. Write the shifted scores to a new tensor: x - m.", STABLE, variant(stable_softmax, in_place=True),
                id="numerical_stability/stable_softmax/the-input-modified-in-place"),
    ],
    "logsumexp": [
        Mistake("no max shift", "log(sum(exp(x))) overflows to inf when an entry is above about 88.7 (float32) "
                "and underflows to log(0) = -inf when all entries are far below 0. Use "
                "m + log(sum(exp(x - m))) with m the row's max.", LSE, variant(logsumexp, shift="none"),
                id="numerical_stability/logsumexp/no-max-shift"),
        Mistake("the max not added back", "log(sum(exp(x - m))) is the log-sum-exp of x - m; the log-sum-exp "
                "of x is m + log(sum(exp(x - m))).", LSE, variant(logsumexp, max_added_back=False),
                id="numerical_stability/logsumexp/the-max-not-added-back"),
        Mistake("one global max instead of one per row", GLOBAL_MAX, PER_ROW, variant(logsumexp, shift="global max"),
                id="numerical_stability/logsumexp/one-global-max-instead-of-one-per-row"),
        Mistake("NaN on rows that are entirely -inf", "a row whose entries are all -inf has max -inf, and "
                "-inf - (-inf) is NaN; its log-sum-exp is log(0) = -inf, as torch.logsumexp says. Shift such a "
                "row by 0 instead.", EMPTY_ROWS, variant(logsumexp, empty_rows="NaN"),
                id="numerical_stability/logsumexp/nan-on-rows-that-are-entirely-inf"),
        Mistake("the dim argument ignored", DIM_IGNORED, LSE, variant(logsumexp, dim_used=False),
                id="numerical_stability/logsumexp/the-dim-argument-ignored"),
        Mistake("the reduced dimension kept", "logsumexp reduces dim away, like torch.logsumexp (keepdim=False): "
                "x of shape (B, L) gives (B,).", LSE, variant(logsumexp, keepdim=True),
                id="numerical_stability/logsumexp/the-reduced-dimension-kept"),
        Mistake("a built-in logsumexp", BUILTIN, LSE, logsumexp_builtin,
                id="numerical_stability/logsumexp/a-built-in-logsumexp"),
    ],
    "log_softmax": [
        Mistake("no max shift", "log(sum(exp(x))) overflows to inf (or underflows to -inf), and every "
                "log-probability becomes -inf or NaN. Subtract a stable log-sum-exp: m + log(sum(exp(x - m))).",
                LSE, variant(log_softmax, shifted=False), id="numerical_stability/log_softmax/no-max-shift"),
        Mistake("the max not added back", "the log-sum-exp of x is m + log(sum(exp(x - m))); without the m the "
                "log-probabilities are off by the row's max.", LSE, variant(log_softmax, max_added_back=False),
                id="numerical_stability/log_softmax/the-max-not-added-back"),
        Mistake("the log of the softmax", "log(softmax(x)) is -inf wherever the softmax underflows to 0 (an entry "
                "more than about 745 below the row's max in float64, 104 in float32), although the log-softmax "
                "there is a perfectly finite x - logsumexp(x). Compute x - logsumexp(x) directly.", LOG_SOFTMAX,
                variant(log_softmax, log_of_softmax=True), id="numerical_stability/log_softmax/the-log-of-the-softmax"),
        Mistake("the log-sum-exp not kept as a column", "logsumexp(x, dim) has the dimension dim removed; put it "
                "back (unsqueeze(dim)) before subtracting it from x, or x - lse subtracts along the wrong axis "
                "(or fails to broadcast).", LOG_SOFTMAX, log_softmax_without_keepdim,
                id="numerical_stability/log_softmax/the-log-sum-exp-not-kept-as-a-column"),
        Mistake("NaN on rows that are entirely -inf", "a row whose entries are all -inf has log-sum-exp -inf, "
                "and -inf - (-inf) is NaN. Its softmax is a row of zeros, so its log-softmax is a row of -inf.",
                LOG_SOFTMAX, variant(log_softmax, empty_rows="NaN"),
                id="numerical_stability/log_softmax/nan-on-rows-that-are-entirely-inf"),
        Mistake("the dim argument ignored", DIM_IGNORED, LOG_SOFTMAX, variant(log_softmax, dim_used=False),
                id="numerical_stability/log_softmax/the-dim-argument-ignored"),
        Mistake("a built-in log_softmax", BUILTIN, LOG_SOFTMAX, log_softmax_builtin,
                id="numerical_stability/log_softmax/a-built-in-log-softmax"),
    ],
    "online_softmax": [
        Mistake("the running sum not rescaled", "when a block raises the running max from m to m_new, the sum "
                "so far was taken relative to m and must be multiplied by exp(m - m_new) before the new block's "
                "terms are added: s_new = s * exp(m - m_new) + sum(exp(block - m_new)).", ONLINE,
                variant(online_softmax, rescale="none"), id="numerical_stability/online_softmax/the-running-sum-not-rescaled"),
        Mistake("the rescale factor inverted", "the old sum is multiplied by exp(m - m_new) <= 1 (its terms "
                "shrink when the max grows), not by exp(m_new - m).", ONLINE, variant(online_softmax, rescale="exp(m_new - m)"),
                id="numerical_stability/online_softmax/the-rescale-factor-inverted"),
        Mistake("the last block dropped", "when the length is not a multiple of block_size the last block is "
                "shorter, and it still counts: loop with range(0, L, block_size) and slice "
                "x[..., start:start + block_size].", ONLINE, variant(online_softmax, last_block=False),
                id="numerical_stability/online_softmax/the-last-block-dropped"),
        Mistake("each block normalised on its own", "every entry is divided by the sum over the whole row, "
                "rescaled to the final max, not by the sum of its own block.", ONLINE,
                online_softmax_blocks_normalised_separately,
                id="numerical_stability/online_softmax/each-block-normalised-on-its-own"),
        Mistake("NaN when a whole block is -inf", "while every entry seen so far is -inf the running max is "
                "still -inf, and exp(m - m_new) = exp(-inf - (-inf)) is NaN. Shift by 0 while the running max is "
                "-inf (the running sum is 0 then anyway).", ONLINE, variant(online_softmax, empty_blocks="shift by m_new"),
                id="numerical_stability/online_softmax/nan-when-a-whole-block-is-inf"),
        Mistake("the running sum kept in half precision", "a float16 sum stops growing once its terms fall "
                "below half a unit in its last place (1 + 0.0003 is 1 in float16). Keep the running max and sum "
                "in float32 for float16 and bfloat16 inputs, as the kernels do, and return x's dtype.", HALF,
                online_softmax_half_precision_sum,
                id="numerical_stability/online_softmax/the-running-sum-kept-in-half-precision"),
        Mistake("the whole row reduced at once", "the online softmax never takes a max or a sum over more than "
                "one block of a row: it keeps a running max and a running sum and updates them block by block.",
                ONLINE, online_softmax_whole_row, id="numerical_stability/online_softmax/the-whole-row-reduced-at-once"),
        Mistake("two passes over the row", "a first pass for the max and a second for the sum reads the row "
                "twice; the online softmax updates the max and the rescaled sum together, in one pass.", ONLINE,
                online_softmax_two_passes, id="numerical_stability/online_softmax/two-passes-over-the-row"),
        Mistake("a built-in softmax", BUILTIN, ONLINE, online_softmax_builtin,
                id="numerical_stability/online_softmax/a-built-in-softmax"),
    ],
}

#: Mistakes named by a check of their own rather than by their output.
_BUILTIN = {"stable_softmax": "numerical_stability/stable_softmax/a-built-in-softmax",
            "logsumexp": "numerical_stability/logsumexp/a-built-in-logsumexp",
            "log_softmax": "numerical_stability/log_softmax/a-built-in-log-softmax",
            "online_softmax": "numerical_stability/online_softmax/a-built-in-softmax"}


def _by_output(exercise: str) -> list[Mistake]:
    """The mistakes a wrong output can be matched against (not those made only visible by the guard)."""
    return [m for m in MISTAKES[exercise] if m.id != _BUILTIN[exercise]]


def _named(ident: str, problem: str) -> None:
    raise MistakeFound(problem, [by_id((m for catalogue in MISTAKES.values() for m in catalogue), ident)])


@contextlib.contextmanager
def _builtins_named(exercise: str) -> Iterator[None]:
    """Add the catalogue's explanation to the guard's message when a built-in was called."""
    try:
        yield
    except ForbiddenCall as error:
        if error.builtin is None:  # the code got round the guard: no built-in to explain
            raise
        raise MistakeFound(str(error), [by_id(MISTAKES[exercise], _BUILTIN[exercise])]) from None


# --- inputs ------------------------------------------------------------------------------------


def _rows(gen: torch.Generator, offsets: list[float], length: int, spread: float = 3.0) -> torch.Tensor:
    """One row per offset: ``offset + spread * N(0, 1)``."""
    return randn(len(offsets), length, gen=gen) * spread + torch.tensor(offsets, dtype=torch.float64)[:, None]


def _empty_row_case(gen: torch.Generator, shape: tuple[int, ...], empty: list) -> torch.Tensor:
    """Random entries, some -inf, and the rows indexed by ``empty`` entirely -inf."""
    x = with_minus_inf(randn(*shape, gen=gen) * 3, gen)
    for index in empty:
        x[index] = -INF
    return x


def _softmax_like_cases(seed: int) -> list[Case]:
    """Cases for stable_softmax, logsumexp and log_softmax, in the order that names their mistakes."""
    gen = generator(seed)
    cases = [
        Case((_rows(gen, [1e4, 1e4 + 5, 1e4 - 3], 6),), label="every entry near 1e4"),
        Case((_rows(gen, [-1e4, -1e4 + 5, -1e4 - 3], 6),), label="every entry near -1e4"),
        Case((torch.cat([_rows(gen, [0.0, 1e4, -1e4, 500.0], 6),
                         randn(1, 6, gen=gen) * 1e-12]),),
             label="rows on very different scales: near 0, 1e4, -1e4, 500, and within 1e-12 of 0"),
        Case((torch.tensor([[0.0, -1000.0, 3.0, -750.0], [1e4, 0.0, -1e4, 9990.0]], dtype=torch.float64),),
             label="entries more than 745 below their row's max (their exp underflows to 0)"),
        Case((_empty_row_case(gen, (4, 5), [1]),), label="-inf entries, and row 1 entirely -inf"),
        Case((randn(5, 3, gen=gen) * 3,), {"dim": 0}, label="dim=0"),
        Case((_empty_row_case(gen, (2, 5, 3, 4), []).transpose(1, 2).contiguous(),), {"dim": 1},
             label="dim=1 of a 4-d tensor, with -inf entries"),
        Case((randn(2, 5, 3, 4, gen=gen) * 3,), {"dim": -2}, label="dim=-2"),
        Case((_empty_row_case(gen, (2, 3, 4, 7), [(0, 1, 2), (1, 2, 0)]),),
             label="two leading batch dimensions, some rows entirely -inf"),
        Case((randn(6, gen=gen) * 3,), {"dim": 0}, label="a 1-d tensor"),
        Case((randn(3, 1, gen=gen) * 3,), label="rows of one entry"),
        Case((randn(3, 5, gen=gen) * 1e300,), label="entries up to about 1e300"),
        Case((randn(3, 5, gen=gen) * 1e-300,), label="entries of about 1e-300"),
        Case((_rows(gen, [1e4, -1e4, 0.0], 8).float(),), label="float32, rows near 1e4, -1e4 and 0"),
        Case(((randn(3, 6, gen=gen) * 1e30).float(),), label="float32, entries up to about 1e30"),
        Case((_empty_row_case(gen, (3, 6), [2]).float(),), {"dim": -1}, label="float32, a row entirely -inf"),
        Case((_rows(gen, [0.0, 5.0, -5.0], 8).half(),), label="float16"),
        Case((_rows(gen, [1e4, -1e4, 30.0], 8, spread=1.0).half(),),
             label="float16, rows near 1e4, -1e4 and 30 (exp overflows in float16 above about 11.1)"),
        Case((_empty_row_case(gen, (3, 6), [0]).half(),), label="float16, -inf entries, row 0 entirely -inf"),
        Case((randn(4, 3, gen=gen).half() * 8,), {"dim": 0}, label="float16, dim=0"),
        Case(((randn(3, 6, gen=gen) * 1e30).bfloat16(),), label="bfloat16, entries up to about 1e30"),
        Case((_empty_row_case(gen, (3, 6), [1]).bfloat16(),), label="bfloat16, a row entirely -inf"),
        # Dimensions of size 1 beyond the reduced one: a .squeeze() or an index [0] must not remove them.
        Case((randn(4, 1, 3, gen=gen) * 3,), {"dim": 0}, label="dim=0 of a (4, 1, 3) tensor"),
        Case((randn(1, 5, gen=gen) * 3,), label="a single row of shape (1, 5)"),
    ]
    return cases


def _bad_dims(fn, exercise: str, gen: torch.Generator) -> None:
    for dim in (2, -3):
        expect_error(fn, randn(3, 4, gen=gen), dim=dim, error=ValueError,
                     what=f"{exercise}(x of shape (3, 4), dim={dim})", why=f"x has no dimension {dim}")


# --- hidden checks -----------------------------------------------------------------------------------


@hidden
def check_stable_softmax(stable_softmax) -> None:
    """Huge, tiny and -inf entries, every dim, four dtypes, against torch.softmax; gradcheck; no in-place."""
    gen = generator(401)
    with _builtins_named("stable_softmax"):
        with case("the input stays as it was"):
            if not leaves_input_untouched(stable_softmax, randn(3, 5, gen=gen), "stable_softmax"):
                _named("numerical_stability/stable_softmax/the-input-modified-in-place",
                       input_changed_message("stable_softmax"))
        verify_each(stable_softmax, _softmax_like_cases(402), softmax_reference, softmax_tolerance_of,
                    forbid=SOFTMAX_BUILTINS, exercise="stable_softmax", arg_names=("x",),
                    mistakes=_by_output("stable_softmax"))
        for x, dim in [(randn(3, 5, gen=gen) * 3, -1), (randn(4, 3, 2, gen=gen) * 3, 1),
                       (randn(4, 3, gen=gen) * 3, 0)]:
            with case(f"gradients (gradcheck), x {tuple(x.shape)}, dim={dim}"):
                problem = gradcheck_problem(stable_softmax, x, "stable_softmax", dim=dim)
                if problem:
                    leaf = x.detach().clone().requires_grad_(True)
                    outcome, _ = attempt(stable_softmax, (leaf,), {"dim": dim}, exercise="stable_softmax",
                                         forbid=SOFTMAX_BUILTINS)
                    if isinstance(outcome.value, torch.Tensor) and not outcome.value.requires_grad:
                        _named("numerical_stability/stable_softmax/the-result-detached-from-autograd", problem)
                    fail(problem)
        _bad_dims(stable_softmax, "stable_softmax", gen)


@hidden
def check_logsumexp(logsumexp) -> None:
    """Huge, tiny and -inf entries, every dim, four dtypes, against torch.logsumexp."""
    gen = generator(403)
    with _builtins_named("logsumexp"):
        verify_each(logsumexp, _softmax_like_cases(404), logsumexp_reference, log_tolerance,
                    forbid=SOFTMAX_BUILTINS, exercise="logsumexp", arg_names=("x",), mistakes=_by_output("logsumexp"))
        _bad_dims(logsumexp, "logsumexp", gen)


@hidden
def check_log_softmax(log_softmax) -> None:
    """Huge, far-apart and -inf entries, every dim, four dtypes, against F.log_softmax; gradcheck."""
    gen = generator(405)
    with _builtins_named("log_softmax"):
        with case("the input stays as it was"):
            if not leaves_input_untouched(log_softmax, randn(3, 5, gen=gen), "log_softmax"):
                fail(input_changed_message("log_softmax"))
        verify_each(log_softmax, _softmax_like_cases(406), log_softmax_reference, log_tolerance,
                    forbid=SOFTMAX_BUILTINS, exercise="log_softmax", arg_names=("x",), mistakes=_by_output("log_softmax"))
        for x, dim in [(randn(3, 5, gen=gen) * 3, -1), (randn(4, 3, 2, gen=gen) * 3, 1)]:
            with case(f"gradients (gradcheck), x {tuple(x.shape)}, dim={dim}"):
                problem = gradcheck_problem(log_softmax, x, "log_softmax", dim=dim)
                if problem:
                    fail(problem)
        _bad_dims(log_softmax, "log_softmax", gen)


def _online_cases(seed: int) -> list[Case]:
    gen = generator(seed)
    rising = torch.linspace(-4, 4, 10, dtype=torch.float64) + randn(3, 10, gen=gen)
    cases = [Case((rising, 3), label="rows of 10 whose max keeps rising, block_size 3")]
    for length, block in [(10, 1), (10, 7), (10, 10), (10, 25), (12, 4), (12, 5), (1, 1), (1, 3), (17, 16)]:
        cases.append(Case((randn(2, length, gen=gen) * 4, block), label=f"rows of {length}, block_size {block}"))
    masked = randn(4, 11, gen=gen) * 3
    masked[0, :6] = -INF
    masked[1] = -INF
    masked[2, 2:9] = -INF
    masked[3, 9:] = -INF
    cases += [
        Case((masked, 3), label="row 0 starts with two blocks of -inf, row 1 is entirely -inf, "
                                "rows 2 and 3 have -inf blocks later"),
        Case((masked, 1), label="the same with block_size 1"),
        Case((_rows(gen, [1e4, -1e4, 0.0], 9), 4), label="rows near 1e4, -1e4 and 0"),
        Case((randn(2, 3, 13, gen=gen) * 5, 5), label="two leading batch dimensions"),
        Case(((randn(2, 3, 13, gen=gen) * 30).float(), 6), label="float32"),
        Case(((randn(3, 10, gen=gen) * 4).half(), 3), label="float16"),
        Case(((randn(3, 10, gen=gen) * 4).bfloat16(), 4), label="bfloat16"),
    ]
    # One large term, then many small ones: a float16 (bfloat16) running sum never grows past 1.
    small16 = torch.cat([torch.zeros(1), torch.full((300,), -8.0)]).half()[None]
    small_bf = torch.cat([torch.zeros(1), torch.full((300,), -6.0)]).bfloat16()[None]
    cases += [
        Case((small16, 1), label="float16: one entry 0 then 300 entries -8, block_size 1"),
        Case((small_bf, 1), label="bfloat16: one entry 0 then 300 entries -6, block_size 1"),
        Case((randn(1, 1, 7, gen=gen) * 3, 3), label="a (1, 1, 7) tensor: dimensions of size 1 stay"),
    ]
    return cases


@hidden
def check_online_softmax(online_softmax) -> None:
    """Against torch.softmax for many block sizes, -inf blocks and dtypes; streams block by block."""
    gen = generator(407)
    exercise = "online_softmax"
    with _builtins_named(exercise):
        verify_each(online_softmax, _online_cases(408), online_reference, softmax_tolerance_of,
                    forbid=SOFTMAX_BUILTINS, exercise=exercise, arg_names=("x", "block_size"), mistakes=_by_output(exercise))
        for shape, block in [((2, 3, 20), 3), ((4, 30), 7)]:
            x = randn(*shape, gen=gen) * 3
            with case(f"streams block by block, x {shape}, block_size {block}"):
                problem = streaming_problem(record_reductions(online_softmax, x, block), shape[-1], block)
                if problem:
                    text, rule = problem
                    if rule == "whole row":
                        _named("numerical_stability/online_softmax/the-whole-row-reduced-at-once", text)
                    if rule == "two passes":
                        _named("numerical_stability/online_softmax/two-passes-over-the-row", text)
                    fail(text)
        for block in (0, -2):
            expect_error(online_softmax, randn(2, 5, gen=gen), block, error=ValueError,
                         what=f"online_softmax(x, block_size={block})", why="a block must hold at least one entry")
