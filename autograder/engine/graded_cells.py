"""What the graded kernel holds: the sources the grader loads into it, in order, and nothing else.

The test cells' calls of the student's functions go to a kernel of their own (the *graded kernel*,
:mod:`autograder.engine.graded_kernel`), not to the one that ran the whole notebook for the feedback.
:func:`graded_sources` lists what is loaded into it, in notebook order:

1. the release's own code: the ``import`` statements and top-level ``def``/``class`` statements of
   the released notebook's ordinary code cells (read from the release, never from the submission),
   each placed after the graded cell (answer or test) that precedes it in the release;
2. the ``import``/``from ... import`` statements of the student's ordinary code cells that stand
   where the release has an ordinary cell with imports (after the same graded cell): the imports
   cell written the student's way. Nothing else of those cells: no magic, no other statement;
3. the student's answer cells (nbgrader ``solution``), each whole, as IPython runs a cell.

A test cell sees the sources before it (:func:`before`). Every other cell of the notebook (a scratch
cell, a magic, a set-up, a plot, a patch) runs only in the notebook's own kernel, for the feedback.

What this does NOT protect: an answer cell is the student's code, loaded whole; it can still do in the
graded kernel whatever it could do in the notebook's (it is the student's answer). An import in the
imports cell runs the module it names (a file the submission ships among them).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from nbformat import NotebookNode

#: Where a source comes from (:attr:`GradedSource.kind`).
RELEASE, IMPORTS, ANSWER = "release", "imports", "answer"


@dataclass(frozen=True)
class GradedSource:
    """One source loaded into the graded kernel.

    ``index`` is the notebook cell it belongs after (an answer or imports cell: its own index; the
    release's code: the graded cell before it); ``name`` says which cell, for a message.
    """

    index: int
    kind: str
    name: str
    source: str


def _meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _python(source: str) -> ast.Module | None:
    """``source`` as IPython would run it, parsed (magics become calls); None when it does not parse."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# Each submission's cells are read for the release's code and for their imports, the release's cells for every
# submission: each source is read once per process (a grading process serves one submission).
@functools.lru_cache(maxsize=4096)
def _statements(source: str, kinds: tuple[type, ...]) -> str:
    """The top-level statements of ``source`` of ``kinds``, as source text (empty when none or unparsable)."""
    tree = _python(source)
    if tree is None:
        return ""
    try:
        return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, kinds))
    except RecursionError:
        return ""


def _ordinary(cell: NotebookNode) -> bool:
    return cell.cell_type == "code" and not _meta(cell).get("grade_id")


def _segments(notebook: NotebookNode) -> dict[str | None, list[NotebookNode]]:
    """Ordinary code cells by the grade id of the graded cell before them (None: before the first)."""
    found: dict[str | None, list[NotebookNode]] = {}
    anchor: str | None = None
    for cell in notebook.cells:
        gid = _meta(cell).get("grade_id")
        if gid:
            anchor = gid
        elif _ordinary(cell):
            found.setdefault(anchor, []).append(cell)
    return found


_IMPORTS = (ast.Import, ast.ImportFrom)
_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def graded_sources(notebook: NotebookNode, release: NotebookNode | None) -> list[GradedSource]:
    """Everything the graded kernel loads for ``notebook`` (the staged submission), in order (see the module doc).

    Without a ``release`` (a notebook graded outside a course), the imports of every ordinary cell
    stand in for the release's code.
    """
    release_code = {anchor: [s for s in (_statements(c.source, _DEFINITIONS) for c in cells) if s]
                    for anchor, cells in _segments(release).items()} if release is not None else {}
    import_anchors = ({anchor for anchor, cells in _segments(release).items()
                       if any(_statements(c.source, _IMPORTS) for c in cells)} if release is not None else None)
    found: list[GradedSource] = []

    def release_after(anchor: str | None, index: int) -> None:
        for number, source in enumerate(release_code.pop(anchor, [])):
            where = "the start" if anchor is None else anchor
            found.append(GradedSource(index, RELEASE, f"the notebook's own code after {where} ({number + 1})", source))

    release_after(None, -1)
    anchor: str | None = None
    for index, cell in enumerate(notebook.cells):
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if gid:
            anchor = gid
            if cell.cell_type == "code" and meta.get("solution"):
                found.append(GradedSource(index, ANSWER, f"the answer cell {gid}", cell.source))
            release_after(gid, index)
        elif _ordinary(cell) and (import_anchors is None or anchor in import_anchors):
            imports = _statements(cell.source, _IMPORTS)
            if imports:
                found.append(GradedSource(index, IMPORTS, f"the imports of cell {index + 1}", imports))
    for left in list(release_code):  # a graded cell the staged notebook lacks: its release code still loads
        release_after(left, len(notebook.cells))
    return found


def check_modules(notebook: NotebookNode) -> list[str]:
    """The package's modules the test cells of ``notebook`` import, and every one of the package they import in turn.

    Read from the source files (nothing is imported): the graded kernel holds the probes of these only
    (:func:`autograder.kernel.serve.hold_probes`), so that it imports no more than the checks need.
    """
    todo = [name for cell in notebook.cells if _meta(cell).get("grade") and not _meta(cell).get("solution")
            for name in imported_modules(_python(cell.source), "")]
    return sorted(package_closure(todo))


def package_closure(names: list[str]) -> set[str]:
    """The modules of the package among ``names``, and every one of the package they import in turn."""
    todo = list(names)
    found: set[str] = set()
    while todo:
        name = todo.pop()
        if name in found:
            continue
        imports = _package_imports(name)
        if imports is not None:
            found.add(name)
            todo += imports
    return found


@functools.cache
def _package_imports(name: str) -> tuple[str, ...] | None:
    """What the package's module ``name`` imports, read from its source file (None: not a module of the package).

    Kept for the process: the fork server reads every check's once (:func:`package_closure` of them all), and each
    submission's grading, forked from it, finds them read (the package's files are the grader's, not a student's).
    """
    root = Path(__file__).resolve().parents[1]
    path = root.parent.joinpath(*name.split(".")).with_suffix(".py")
    if name.split(".")[0] != "autograder" or not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return ()
    return tuple(imported_modules(tree, name.rpartition(".")[0]))


def imported_modules(tree: ast.Module | None, package: str) -> list[str]:
    """The modules ``tree`` imports (``from a import b``: ``a`` and ``a.b``), relative ones resolved in ``package``."""
    names: list[str] = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return names


def before(sources: list[GradedSource], index: int) -> list[GradedSource]:
    """The sources a test cell at ``index`` sees: those of the cells before it."""
    return [s for s in sources if s.index < index]
