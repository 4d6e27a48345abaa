"""Hidden checks and mistake catalogue for notebook 04, numerical stability (instructor-only)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..grader.cases import case
from ..grader.diagnosis import Mistake, MistakeFound, by_id, read_mistakes
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


MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/numerical_stability.toml

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
        Case((torch.cat([_rows(gen, [0.0, 1e4, -1e4, 500.0], 6), randn(1, 6, gen=gen) * 1e-12]),),
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
