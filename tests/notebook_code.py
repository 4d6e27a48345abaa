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


def solution_namespace(assignment: str) -> types.SimpleNamespace:
    """Execute the notebook's imports and answer cells; return the names they define."""
    namespace: dict = {}
    exec(compile(imports_of(assignment), f"<{assignment} imports>", "exec"), namespace)
    for grade_id, source in answer_cells(assignment).items():
        exec(compile(source, f"<{assignment}:{grade_id}>", "exec"), namespace)
    return types.SimpleNamespace(**{k: v for k, v in namespace.items() if not k.startswith("__")})
