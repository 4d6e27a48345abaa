"""Read code out of the source notebooks: the reference solutions the tests feed to the checks."""

from __future__ import annotations

import types
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def source_notebook(assignment: str) -> nbformat.NotebookNode:
    """The nbgrader source notebook of ``assignment``."""
    return nbformat.read(ROOT / "source" / assignment / f"{assignment}.ipynb", as_version=4)


def nbgrader_meta(cell: nbformat.NotebookNode) -> dict:
    """The cell's nbgrader metadata (empty for an ordinary cell)."""
    return cell.metadata.get("nbgrader", {})


def answer_cells(assignment: str) -> dict[str, str]:
    """grade_id -> source of every autograded-answer cell, solution included."""
    return {
        nbgrader_meta(c)["grade_id"]: c.source
        for c in source_notebook(assignment).cells
        if nbgrader_meta(c).get("solution")
    }


def imports_of(assignment: str) -> str:
    """The notebook's import lines (the code the answer cells rely on)."""
    lines = []
    for cell in source_notebook(assignment).cells:
        if cell.cell_type == "code" and not nbgrader_meta(cell):
            lines += [ln for ln in cell.source.splitlines() if ln.startswith(("import ", "from "))]
    return "\n".join(lines)


def provided_definitions(assignment: str) -> str:
    """The functions and classes the notebook itself provides (its ordinary cells' top-level ``def`` and ``class``)."""
    import ast

    found = []
    for cell in source_notebook(assignment).cells:
        if cell.cell_type == "code" and not nbgrader_meta(cell):
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                continue
            found += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return "\n\n".join(found)


def solution_namespace(assignment: str) -> types.SimpleNamespace:
    """Execute the notebook's imports, its own definitions and its answer cells; return the names they define."""
    namespace: dict = {}
    exec(compile(imports_of(assignment), f"<{assignment} imports>", "exec"), namespace)
    exec(compile(provided_definitions(assignment), f"<{assignment} definitions>", "exec"), namespace)
    for grade_id, source in answer_cells(assignment).items():
        exec(compile(source, f"<{assignment}:{grade_id}>", "exec"), namespace)
    return types.SimpleNamespace(**{k: v for k, v in namespace.items() if not k.startswith("__")})


def cell_arguments(assignment: str, hidden: bool = True) -> dict[str, list[str]]:
    """exercise -> the names its hidden (or visible) test cell passes to the check, in order (``check_x(x, KVCache)``)."""
    import ast

    suffix = "_hidden" if hidden else ""
    found = {}
    for cell in source_notebook(assignment).cells:
        gid = nbgrader_meta(cell).get("grade_id", "")
        exercise = gid[len("test_"):len(gid) - len(suffix)]
        if not (gid.startswith("test_") and gid.endswith(suffix)) or exercise.endswith("_hidden"):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                found[exercise] = [a.id for a in node.args if isinstance(a, ast.Name)]
    return found


def hidden_test_arguments(assignment: str) -> dict[str, list[str]]:
    """exercise -> the names its hidden test cell passes to the check, in order (``check_x(x, KVCache)``)."""
    return cell_arguments(assignment, hidden=True)
