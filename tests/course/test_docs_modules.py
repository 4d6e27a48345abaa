"""The manual's "Where things are" (docs/architecture.md) lists every module of the package, and only modules that exist.

Its lists are autosummary's, which prints each module's docstring summary and links its API page;
a module left out of them would have no page and no line in the manual's map of the package.
"""

from __future__ import annotations

import ast
import re

from ..notebook_code import ROOT

PAGE = ROOT / "docs" / "architecture.md"


def listed_modules(text: str) -> list[str]:
    """The modules named in the page's ``.. autosummary::`` directives, in order."""
    names = []
    for block in re.findall(r"^\.\. autosummary::\n((?:[ \t]+.*\n|\n)*)", text, re.M):
        names += [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith(":")]
    return names


def package_modules() -> set[str]:
    """Every module and package of ``autograder``, by dotted name (Gradescope's scripts are not modules)."""
    package = ROOT / "autograder"
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "gradescope_files" in parts or "__pycache__" in parts:
            continue
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_the_page_names_modules_in_autosummary_lists():
    names = listed_modules(PAGE.read_text())
    assert "autograder.engine.sandbox" in names and "autograder" in names, names[:5]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_every_module_has_its_line():
    listed = set(listed_modules(PAGE.read_text()))
    modules = package_modules()
    assert sorted(modules - listed) == [], "modules docs/architecture.md does not list (add each to its layer's autosummary)"
    assert sorted(listed - modules) == [], "docs/architecture.md lists modules that do not exist"


def test_a_module_left_out_is_found():
    """The rule sees a module missing from the page: the page without one line of its lists fails it."""
    text = PAGE.read_text()
    assert "   autograder.engine.zygote_main\n" in text
    left_out = set(listed_modules(text.replace("   autograder.engine.zygote_main\n", "")))
    assert "autograder.engine.zygote_main" in package_modules() - left_out


def plain(text: str) -> str:
    return " ".join(re.sub(r"[`*]", "", text).split())


def test_no_page_repeats_a_docstring():
    """The pages say what a module does through autosummary and autodoc, never by a copy that would drift from it."""
    pages = {page.name: plain(page.read_text()) for page in (ROOT / "docs").glob("*.md")}
    for module in sorted(package_modules()):
        parts = module.split(".")
        path = ROOT.joinpath(*parts).with_suffix(".py")
        path = path if path.is_file() else ROOT.joinpath(*parts, "__init__.py")
        summary = plain((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0])
        if len(summary) < 40:  # "The course's autograder."
            continue
        assert not [name for name, text in pages.items() if summary in text], (module, summary)
