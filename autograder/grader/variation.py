"""A mistake as one declared variation of a reference, not a copy of it.

A reference that has catalogued mistakes names its decisions with :func:`decisions`: for a
function, keyword-only parameters with the right choice as their default (where the running max
starts, which causal alignment, whether the last partial block is kept); for a class, class
attributes that its methods read through ``self``. :func:`variant` makes the reference with some
decisions changed, as a real function or class with the reference's own signature, whose source is
the reference's with each decision written as a constant at the top of its body: the code a student
would write, which the end-to-end tests paste into a notebook as the student's answer (the reference
must therefore be self-contained: torch, math, ``F`` and ``nn`` only). The reference with no
decision changed is the reference.

Because the decisions are declared, :func:`combined` can make two mistakes at once (the diagnosis
tries such pairs when no single mistake fits, :mod:`autograder.grader.diagnosis`).

What it does not do: a mistake that is another algorithm (autograd instead of the derivation, a loop
over the whole sequence instead of the cache) is no variation of the reference and stays a function
of its own (an ``autograd.Function``'s static methods, which have no ``self``, read the class's
decisions through its own name, which a variant keeps). A mistake whose message quotes a line of its
own code (a traceback into the pasted answer) keeps its own function: a variant's lines are the
reference's.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import linecache
import math
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_count = itertools.count()


@dataclass(frozen=True)
class Variation:
    """What a variant is: its reference and the decisions changed (as written, for the pasted source)."""

    reference: Any
    changed: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the variant's code, as a student would write it


def decisions(*names: str) -> Callable[[Any], Any]:
    """Declare the decisions of a reference: keyword-only parameters of a function, class attributes of a class."""
    def declare(reference: Any) -> Any:
        if inspect.isclass(reference):
            missing = [n for n in names if n not in vars(reference)]
        else:
            parameters = inspect.signature(reference).parameters
            missing = [n for n in names if n not in parameters or parameters[n].kind is not inspect.Parameter.KEYWORD_ONLY
                       or parameters[n].default is inspect.Parameter.empty]
        if missing:
            raise TypeError(f"{reference.__qualname__}: {missing} are not keyword-only parameters with a default "
                            "(a function) or class attributes (a class)")
        reference.__decisions__ = tuple(names)
        return reference
    return declare


def _literal(value: Any) -> ast.expr:
    """``value`` as an expression a student could write (``float("-inf")`` for infinities)."""
    if isinstance(value, float) and math.isinf(value):
        return ast.parse(f'float("{"-" if value < 0 else ""}inf")', mode="eval").body
    if isinstance(value, bool | int | float | str | type(None)):
        return ast.Constant(value)
    if isinstance(value, tuple | list):
        node = ast.Tuple if isinstance(value, tuple) else ast.List
        return node(elts=[_literal(v) for v in value], ctx=ast.Load())
    raise TypeError(f"a decision's value must be a plain constant, not {value!r}")


def _body_start(body: list[ast.stmt]) -> int:
    """Where the code of a body starts, after its docstring."""
    first = body[0] if body else None
    return 1 if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str) else 0


def _written_function(node: ast.FunctionDef, names: tuple[str, ...], changed: Mapping[str, Any]) -> None:
    """Drop the decisions from the signature; assign each at the top of the body (its default, or its change)."""
    args = node.args
    values: dict[str, ast.expr] = {}
    kept, defaults = [], []
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if arg.arg in names:
            values[arg.arg] = _literal(changed[arg.arg]) if arg.arg in changed else default
        else:
            kept.append(arg)
            defaults.append(default)
    args.kwonlyargs, args.kw_defaults = kept, defaults
    assignments = [ast.Assign(targets=[ast.Name(name, ast.Store())], value=values[name]) for name in names]
    node.body[:_body_start(node.body)] = assignments  # the reference's docstring speaks of its decisions: not kept


def _written_class(node: ast.ClassDef, names: tuple[str, ...], changed: Mapping[str, Any]) -> None:
    """Write each changed decision's new value where the class sets it."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id in changed:
            statement.value = _literal(changed[statement.targets[0].id])
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and statement.target.id in changed:
            statement.value = _literal(changed[statement.target.id])


def variant(reference: Any, **changed: Any) -> Any:
    """``reference`` with the decisions ``changed``: a function or class of its own, with the reference's signature.

    Its source (:func:`source_of`) is the reference's with the decisions written into it, and
    ``__variation__`` says what it is.
    """
    names = getattr(reference, "__decisions__", None)
    if names is None:
        raise TypeError(f"{reference.__qualname__} declares no decisions (@decisions(...))")
    unknown = sorted(set(changed) - set(names))
    if unknown:
        raise TypeError(f"{reference.__qualname__} has no decision {unknown}; its decisions: {list(names)}")
    tree = ast.parse(textwrap.dedent(inspect.getsource(reference)))
    node = tree.body[0]
    node.decorator_list = []
    if isinstance(node, ast.ClassDef):
        _written_class(node, names, changed)
    else:
        _written_function(node, names, changed)
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    filename = f"<variant {next(_count)} of {reference.__qualname__}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = dict(vars(sys.modules[reference.__module__]))  # the reference's module, left as it is
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the catalogue's own code, rewritten
    made = namespace[reference.__name__]
    made.__module__ = reference.__module__
    made.__variation__ = Variation(reference, dict(changed), source)
    return made


def source_of(fn: Any) -> str:
    """The code of a catalogued mistake as a student would write it: a variant's own, else its source in its module.

    (``inspect.getsource`` finds a function's variant through its code object, but a class's through its module,
    where only the reference is written.)
    """
    variation = getattr(fn, "__variation__", None)
    return variation.source if variation is not None else inspect.getsource(fn)


def wrapping(wrap: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Mark ``wrap`` (a function of a mistake that returns how a check runs it) so that pairs survive it.

    A check that runs every mistake through a wrapper (a scenario of calls on a class, a result flattened)
    hands the diagnosis wrappers, not variants; :func:`combined` combines what they wrap and wraps the pair.
    """
    @functools.wraps(wrap)
    def marked(fn: Any) -> Any:
        made = wrap(fn)
        made.__wrapped__, made.__rewrap__ = fn, marked
        return made
    return marked


def combined(first: Any, second: Any) -> Any | None:
    """The variant that makes both variants' mistakes at once, or None (other references, or one decision twice)."""
    rewrap = getattr(first, "__rewrap__", None)
    if rewrap is not None:  # both run through the same wrapper of a check: combine what it wraps
        if getattr(second, "__rewrap__", None) is not rewrap:
            return None
        inner = combined(first.__wrapped__, second.__wrapped__)
        return None if inner is None else rewrap(inner)
    a, b = getattr(first, "__variation__", None), getattr(second, "__variation__", None)
    if a is None or b is None or a.reference is not b.reference or set(a.changed) & set(b.changed):
        return None
    return variant(a.reference, **a.changed, **b.changed)
