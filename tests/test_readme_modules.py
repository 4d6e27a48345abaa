"""README's "Where things are" names every module of the package, and only modules that exist."""

from __future__ import annotations

import re

from .notebook_code import ROOT

PER_NOTEBOOK = ("checks", "hidden", "references")


def where_things_are() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Where things are", 1)[1].split("\n## ", 1)[0]


def test_every_module_has_its_line():
    listed = set(re.findall(r"`(autograder/[\w/<>.]+\.py)`", where_things_are()))
    package = ROOT / "autograder"
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        if parts[0] in PER_NOTEBOOK:
            modules.add(f"autograder/{parts[0]}/<name>.py")  # one line for the notebooks' modules
        elif path.name != "__init__.py" or path.parent == package:
            if "gradescope_files" not in parts:
                modules.add(path.relative_to(ROOT).as_posix())
    modules.discard("autograder/__init__.py")
    assert sorted(modules - listed) == [], "modules README's 'Where things are' does not list"
    assert sorted(listed - modules) == [], "README's 'Where things are' lists modules that do not exist"
