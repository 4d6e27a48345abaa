"""Name the mistake a wrong answer makes.

Each exercise has a catalogue of :class:`Mistake`\\ s: a name, an explanation, the
section of the notebook that teaches the right idea, and an implementation that makes
exactly that mistake. A wrong answer is run on the same input as every mistake in the
catalogue; the mistakes that produce the same result (or raise the same error) are named
in the message, all of them when several give that result. When none does, pairs of
mistakes declared as variations of one reference (:mod:`autograder.grader.variation`) are tried,
within :data:`PAIR_BUDGET` and once a judged check, and the first pair that gives the result is named.

The catalogue is instructor-only: the grader has it, the student's bundle does not. Its
entries are data, a file per hidden module that :func:`read_mistakes` reads (an entry it
cannot read is a :class:`CatalogueError` naming the file, the entry and the problem).
:func:`catalogue` finds it when it is there, so that the visible checks name catalogued
mistakes at grading time, while in the bundle only the generic diagnoses of
:mod:`autograder.grader.diagnoses` speak.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..kernel.call import Outcome, copy_argument, mutated_arguments
from ..kernel.guard import Forbidden, ForbiddenCall, Guard
from ..shared.errors import CheckFailed
from .cases import first_pair_search
from .compare import is_close
from .variation import combined, variant, wrapping


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to solve an exercise.

    ``id`` names it for the grading pipeline, never for the student: stable when its words
    change, unique in the course (``<notebook>/<exercise>/<slug>``), the same for several
    implementations of one mistake.
    """

    name: str
    explanation: str
    section: str
    fn: Callable[..., Any]
    id: str = ""
    #: The catalogued mistakes this one makes at once (:func:`together`); empty for a catalogued mistake.
    parts: tuple[Mistake, ...] = ()

    def message(self) -> str:
        """The paragraph a student reads when their answer makes this mistake."""
        if self.parts:
            first, second = self.parts
            return (f"This looks like two mistakes at once. The mistake '{first.name}': {first.explanation} "
                    f"Section '{first.section}' of this notebook explains it. And the mistake '{second.name}': "
                    f"{second.explanation} Section '{second.section}' explains it.")
        return (
            f"This looks like the mistake '{self.name}': {self.explanation} "
            f"Section '{self.section}' of this notebook explains it."
        )


#: The most pairs of catalogued mistakes tried on one failing answer when no single mistake fits it: each costs
#: one more call like a mistake's (a count, not a time, so that a verdict never depends on the machine's speed).
PAIR_BUDGET = 40


@functools.cache
def together(first: Mistake, second: Mistake) -> Mistake | None:
    """The two mistakes made at once, when both are variations of one reference's different decisions; else None."""
    both = combined(first.fn, second.fn)
    if both is None:
        return None
    return Mistake(f"{first.name} and {second.name}", f"{first.explanation} {second.explanation}", first.section,
                   both, f"{first.id}+{second.id}", (first, second))


def pairs(mistakes: Sequence[Mistake], budget: int | None = None) -> list[Mistake]:
    """The first ``budget`` (default :data:`PAIR_BUDGET`) pairs of ``mistakes`` that can be made at once, in order."""
    budget = PAIR_BUDGET if budget is None else budget
    found: list[Mistake] = []
    for first, second in itertools.combinations(mistakes, 2):
        if len(found) == budget:
            break
        pair = together(first, second) if not _same_mistake(first, second) else None
        if pair is not None:
            found.append(pair)
    return found


class MistakeFound(CheckFailed):
    """A failure whose answer is what catalogued mistakes give: the message names them.

    The grader records their ids (:mod:`autograder.engine.judge`), so that the class report
    counts mistakes by id, never by the words of a message.
    """

    def __init__(self, problem: str, mistakes: Sequence[Mistake]) -> None:
        self.mistakes = tuple(mistakes)
        super().__init__(f"{problem}\n{name_mistakes(self.mistakes)}" if self.mistakes else problem)


#: The error type of a mistake that called a built-in its exercise forbids.
FORBIDDEN = ForbiddenCall.__name__


def run(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None,
        forbid: Sequence[Forbidden] = ()) -> Outcome:
    """Call ``fn`` on copies of the tensor arguments; record its result or its error and what it changed in place.

    Never raises, and never changes ``args``: a mistake that works in place must not change
    the inputs the next mistake, or the next case, is run on. Under ``forbid``, a call of a
    forbidden built-in is recorded as the error :data:`FORBIDDEN`.
    """
    kwargs = kwargs or {}
    copies, kw_copies = [copy_argument(a) for a in args], {k: copy_argument(v) for k, v in kwargs.items()}
    guard = Guard(tuple(forbid), "a catalogued mistake")
    try:
        with guard if forbid else contextlib.nullcontext():
            value = fn(*copies, **kw_copies)
    except Exception as error:  # noqa: BLE001 - a mistake may fail, that is its signature
        return Outcome(error=(FORBIDDEN if guard.violations else type(error).__name__, str(error)))
    if guard.violations:
        return Outcome(error=(FORBIDDEN, guard.violations[0]))
    return Outcome(value=value, mutated=mutated_arguments(args, kwargs, copies, kw_copies))


def matching(
    student: Outcome,
    mistakes: Sequence[Mistake],
    args: Sequence[Any],
    kwargs: dict | None = None,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    same_mutation: bool = False,
    right: Callable[[Any], bool] | None = None,
    forbid: Sequence[Forbidden] = (),
    same: Callable[[Any, Any], bool] | None = None,
) -> list[Mistake]:
    """Every mistake whose outcome on ``args`` equals the student's, one per mistake, in catalogue order.

    With ``same_mutation``, a mistake must also change the same inputs in place (for an answer
    whose only fault is that it changed them). ``right(value)`` says whether a value passes the
    check: a mistake that happens to give a right answer on this input names nothing (an
    imprecise answer must not be told it scaled by sqrt(d_v) on an input where d_v = d_k). A mistake
    that calls a built-in of ``forbid`` is named by the guard, never by its result: the student's
    code could not have called it. ``same(student's value, mistake's value)`` says when two values are
    the same answer (default: tensors equal within ``rtol`` and ``atol``).
    """
    same = same or (lambda a, b: is_close(a, b, rtol, atol))

    def fits(mistake: Mistake) -> bool:
        theirs = run(mistake.fn, args, kwargs, forbid)
        if theirs.error is not None and theirs.error[0] == FORBIDDEN:
            return False
        if student.error is not None or theirs.error is not None:
            return student.error == theirs.error
        if same_mutation and tuple(theirs.mutated) != tuple(student.mutated):
            return False
        if not same_mutation and right is not None and _is_right(right, theirs.value):
            return False
        return same(student.value, theirs.value)

    found: list[Mistake] = []
    for mistake in mistakes:
        if not any(_same_mistake(m, mistake) for m in found) and fits(mistake):
            found.append(mistake)
    # No single mistake fits: two at once, when the catalogue declares them as variations of one reference.
    if not found and first_pair_search():
        found = next(([pair] for pair in pairs(mistakes) if fits(pair)), [])
    return found


def through(mistakes: Iterable[Mistake], wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[Mistake]:
    """``mistakes`` as a check runs them: each through ``wrap`` (a scenario of calls, a result flattened), as the
    student's answer is run. Pairs of them are still tried: made as variations first, then wrapped."""
    marked = wrapping(wrap)
    return [replace(m, fn=marked(m.fn)) for m in mistakes]


def by_id(mistakes: Iterable[Mistake], ident: str) -> Mistake:
    """The mistake of ``mistakes`` whose id is ``ident`` (a catalogue's own checks name mistakes by id)."""
    for mistake in mistakes:
        if mistake.id == ident:
            return mistake
    raise KeyError(f"no mistake {ident!r} in the catalogue")


def _same_mistake(a: Mistake, b: Mistake) -> bool:
    """Two implementations of one mistake (one id; without ids, one name)."""
    return a.id == b.id if a.id and b.id else a.name == b.name


def _is_right(right: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(right(value))
    except Exception:  # noqa: BLE001 - a value the comparison cannot even read is not right
        return False


def diagnose(
    student: Outcome,
    mistakes: Sequence[Mistake],
    args: Sequence[Any],
    kwargs: dict | None = None,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-8,
) -> Mistake | None:
    """The first mistake whose outcome on ``args`` equals the student's, or None."""
    found = matching(student, mistakes, args, kwargs, rtol=rtol, atol=atol)
    return found[0] if found else None


def name_mistakes(mistakes: Sequence[Mistake]) -> str:
    """The paragraph naming the mistakes that fit: one message, or every one when several give the same result."""
    if len(mistakes) == 1:
        return mistakes[0].message()
    if not mistakes:
        return ""
    return ("More than one known mistake gives exactly this result on this input:\n"
            + "\n".join(f"- {m.message()}" for m in mistakes))


def catalogue(notebook: str, exercise: str) -> tuple[Mistake, ...]:
    """The catalogued mistakes of ``exercise`` in notebook module ``notebook``, when this installation has them.

    The grader has the instructor-only ``hidden`` package; the student's bundle does not, and
    there the answer is ``()``. The catalogue is the module's dict from exercise names to lists
    of :class:`Mistake`.
    """
    try:
        module = importlib.import_module(f"..hidden.{notebook}", __package__)
    except ImportError:
        return ()
    for value in vars(module).values():
        if isinstance(value, dict) and exercise in value and isinstance(value[exercise], list | tuple) \
                and all(isinstance(m, Mistake) for m in value[exercise]):
            return tuple(value[exercise])
    return ()


class CatalogueError(ValueError):
    """A mistake catalogue's data file that cannot be read; the message names the file, the entry and the problem."""


#: The keys of a catalogued mistake in its data file; it has ``variant`` or ``function``, not both.
ENTRY_KEYS = ("id", "name", "explanation", "section", "variant", "function")


def read_mistakes(namespace: dict[str, Any]) -> dict[str, list[Mistake]]:
    """The catalogue of the hidden module whose globals are ``namespace``, from ``mistakes/<module>.toml`` beside it.

    Each exercise is an array of tables, one per mistake, in the order they are tried: ``id``, ``name``,
    ``explanation``, ``section`` (the title of the notebook's section that explains it) and either ``variant``, a
    reference of the module called with the decisions it changes (``"flash_forward(start_max=-inf)"``: Python
    constants, and ``inf``), or ``function``, the name of the module's own function or class that makes the
    mistake (another algorithm). A list of either gives several implementations of one mistake, tried in order.
    Anything else is a :class:`CatalogueError`.
    """
    import tomllib  # only the grader reads a catalogue (3.11 and later); the student's side never does
    from pathlib import Path

    module = Path(namespace["__file__"])
    path = module.parent / "mistakes" / f"{module.stem}.toml"
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CatalogueError(f"{path}: {error}") from None
    mistakes: dict[str, list[Mistake]] = {}
    ids: set[str] = set()
    for exercise, entries in data.items():
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise CatalogueError(f"{path}: '{exercise}' is not a list of mistakes: write each one as [[{exercise}]]")
        mistakes[exercise] = []
        for number, entry in enumerate(entries, 1):
            where = f"{path}, [[{exercise}]] number {number}" + (f" ({entry['id']})" if isinstance(entry.get("id"), str) else "")
            try:
                made = _entry_mistakes(entry, f"{module.stem}/{exercise}/", namespace)
            except (CatalogueError, TypeError) as error:
                raise CatalogueError(f"{where}: {error}") from None
            if made[0].id in ids:
                raise CatalogueError(f"{where}: the id is also another mistake's: give several implementations of one "
                                     "mistake as a list in one entry")
            ids.add(made[0].id)
            mistakes[exercise] += made
    return mistakes


def _entry_mistakes(entry: dict[str, Any], prefix: str, namespace: dict[str, Any]) -> list[Mistake]:
    """The mistakes of one entry of a catalogue's data file (one per implementation)."""
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    missing = [key for key in ENTRY_KEYS[:4] if key not in entry]
    if unknown or missing:
        raise CatalogueError(f"unknown keys {unknown}" if unknown else f"missing {missing}")
    if ("variant" in entry) == ("function" in entry):
        raise CatalogueError("give either variant (a reference with decisions changed) or function (a function or "
                             "class of the module), one of them")
    bad = [key for key in ENTRY_KEYS[:4] if not isinstance(entry[key], str) or not entry[key].strip()]
    if bad:
        raise CatalogueError(f"{bad} must be text")
    if not entry["id"].startswith(prefix):
        raise CatalogueError(f"the id must start with '{prefix}' (notebook module/exercise/)")
    kind = "variant" if "variant" in entry else "function"
    written = entry[kind] if isinstance(entry[kind], list) else [entry[kind]]
    if not written or not all(isinstance(text, str) for text in written):
        raise CatalogueError(f"{kind} must be text, or a list of texts (several implementations of one mistake)")
    made = [_variant(text, namespace) if kind == "variant" else _function(text, namespace) for text in written]
    return [Mistake(entry["name"], entry["explanation"], entry["section"], fn, id=entry["id"]) for fn in made]


def _variant(text: str, namespace: dict[str, Any]) -> Any:
    """``"reference(decision=value, ...)"`` made with :func:`~autograder.grader.variation.variant`."""
    try:
        call = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise CatalogueError(f"variant {text!r} is not Python: {error.msg}") from None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args \
            or any(k.arg is None for k in call.keywords):
        raise CatalogueError(f"variant {text!r} must be a reference called with decisions: reference(decision=value)")
    reference = namespace.get(call.func.id)
    if reference is None:
        raise CatalogueError(f"variant {text!r}: the module has no reference {call.func.id!r}")
    if not call.keywords:
        raise CatalogueError(f"variant {text!r} changes no decision: that is the reference, not a mistake")
    changed = {}
    for keyword in call.keywords:
        try:
            changed[keyword.arg] = _constant(keyword.value)
        except ValueError:
            raise CatalogueError(f"variant {text!r}: the value of {keyword.arg} is not a constant "
                                 "(a number, inf, -inf, text, True, False, None, or a tuple of them)") from None
    return variant(reference, **changed)


def _constant(node: ast.expr) -> Any:
    """A decision's value as written in a catalogue: a Python constant, or ``inf`` and ``-inf``."""
    if isinstance(node, ast.Name) and node.id == "inf":
        return math.inf
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Name) and node.operand.id == "inf":
        return -math.inf
    return ast.literal_eval(node)


def _function(text: str, namespace: dict[str, Any]) -> Any:
    """The module's own function or class named ``text`` (a mistake that is another algorithm)."""
    fn = namespace.get(text)
    if not text.isidentifier() or not callable(fn) or getattr(fn, "__module__", None) != namespace["__name__"]:
        raise CatalogueError(f"function {text!r} is no function or class of this module")
    if hasattr(fn, "__decisions__"):
        raise CatalogueError(f"function {text!r} is a reference with declared decisions: a mistake is a variant of it, "
                             f"variant = \"{text}(decision=value)\"")
    return fn
