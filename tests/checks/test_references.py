"""One reference per exercise: a notebook's visible and hidden checks share its references module.

The hidden checks never import the visible ones (the engine is in the core of the package, what
is right for a notebook in ``autograder.references``), and the references are public: nothing in
them comes from the instructor-only part.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import autograder
from autograder.course.repository import assignments, module_name

PACKAGE = Path(autograder.__file__).parent
NOTEBOOKS = [module_name(a) for a in assignments()]
#: Notebooks whose exercises have no built-in to compare with: the visible checks compare with tables
#: worked out by hand, the hidden ones with solutions, which stay hidden. Nothing is shared.
NOTHING_SHARED = {"positional_encoding"}


def imported_modules(path: Path) -> set[str]:
    """The modules a file of the package imports, as absolute names."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_hidden_checks_never_import_the_visible_ones(notebook):
    imports = imported_modules(PACKAGE / "hidden" / f"{notebook}.py")
    assert not [m for m in imports if m.startswith("autograder.checks")], imports


@pytest.mark.parametrize("notebook", sorted(set(NOTEBOOKS) - NOTHING_SHARED))
def test_visible_and_hidden_checks_share_the_notebooks_references(notebook):
    for part in ("checks", "hidden"):
        assert f"autograder.references.{notebook}" in imported_modules(PACKAGE / part / f"{notebook}.py"), part


@pytest.mark.parametrize("path", sorted((PACKAGE / "references").glob("*.py")), ids=lambda p: p.stem)
def test_references_are_public(path):
    instructor_only = [m for m in imported_modules(path)
                       if m.split(".")[:2] in [["autograder", part] for part in autograder.INSTRUCTOR_ONLY]]
    assert not instructor_only
    assert "references" not in autograder.INSTRUCTOR_ONLY


def test_the_sdpa_referee_of_notebook_01_is_one_function():
    """The visible and the hidden check of scaled_dot_product_attention compare with the same reference."""
    from autograder.references.soft_lookup import sdpa_reference

    for part in ("checks", "hidden"):
        module = importlib.import_module(f"autograder.{part}.soft_lookup")
        assert module.sdpa_reference is sdpa_reference
        assert "def reference(" not in inspect.getsource(module)
