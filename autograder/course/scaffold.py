"""``make new-notebook NAME=10_name``: the files of a new notebook, with one worked exercise, all passing.

A notebook of the course is six files that must agree: the source notebook (prose, reference
solution, visible and hidden test cells), its references (:mod:`autograder.references`, public),
its visible checks (:mod:`autograder.checks`, public), its hidden checks (:mod:`autograder.hidden`,
instructor-only), their mistake catalogue (data: ``autograder/hidden/mistakes/``) and its tests.
:func:`create` writes all six for one example exercise, ``row_softmax``, whose referee is
``torch.softmax``, and an empty catalogue: the test suite passes on them as they are (every generic
test runs over every notebook of ``source/``), and ``make release`` then generates the student version and the executed solution.
The author replaces the example with the notebook's own exercises, in the same shape.

What this does *not* do: write the teaching, or choose what a check compares against; and it
never overwrites a file (an existing one is an error naming it).
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .repository import ROOT, module_name

#: What a notebook's name must look like: two digits, an underscore, a Python identifier in lower case.
NAME = re.compile(r"^(?P<number>[0-9]{2})_(?P<module>[a-z][a-z0-9_]*)$")
EXERCISE = "row_softmax"

REFERENCES = '''"""What is right in notebook $number, $title: ``torch.softmax`` as the referee."""

from __future__ import annotations

import torch


def row_softmax_reference(scores):
    """Softmax over the last axis (PyTorch's own)."""
    return torch.softmax(scores, dim=-1)
'''

CHECKS = '''"""Visible checks for notebook $number, $title."""

from __future__ import annotations

import torch

from ..grader.verify import Case, verify
from ..references.$module import row_softmax_reference

#: The notebook module whose mistake catalogue the grader uses to name mistakes in these checks.
NOTEBOOK = "$module"


def check_row_softmax(row_softmax) -> None:
    """Softmax over the last axis of a small matrix, compared with torch.softmax."""
    scores = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    verify(row_softmax, [Case((scores,), label="two rows of three scores")], row_softmax_reference,
           exercise="row_softmax", notebook=NOTEBOOK, arg_names=("scores",), outputs=None)
    print("row_softmax passes the visible checks.")
'''

HIDDEN = '''"""Hidden checks and mistake catalogue for notebook $number, $title (instructor-only)."""

from __future__ import annotations

from ..grader.diagnosis import read_mistakes
from ..grader.inputs import generator, randn
from ..grader.verify import Case, verify
from ..references.$module import row_softmax_reference
from . import hidden

MISTAKES = read_mistakes(globals())  # the catalogue: mistakes/$module.toml


@hidden
def check_row_softmax(row_softmax) -> None:
    """Random scores of several shapes, large ones too, in float64 and float32."""
    gen = generator($number)
    cases = [
        Case((randn(4, 5, gen=gen),), label="a 4 x 5 matrix"),
        Case((randn(2, 3, 6, gen=gen) * 50,), label="large scores in a batch"),
        Case((randn(3, 1, gen=gen).float(),), label="float32, one score per row"),
    ]
    verify(row_softmax, cases, row_softmax_reference, exercise="row_softmax", arg_names=("scores",),
           mistakes=MISTAKES["row_softmax"], outputs=None)
'''

CATALOGUE = '''# The mistake catalogue of the hidden checks in autograder/hidden/$module.py: per exercise, its mistakes
# in the order they are tried. How to add one: docs/architecture.md (the mistake catalogue). For example:
#
# [[row_softmax]]
# id = "$module/row_softmax/softmax-over-the-wrong-axis"
# name = "softmax over the wrong axis"
# section = "1. A first exercise"
# variant = 'row_softmax_reference(dim=0)'   # a decision the reference declares with @decisions("dim")
# explanation = "each row of weights must sum to 1."

row_softmax = []
'''

TESTS = '''"""Notebook $number, $title: what is specific to it (the generic tests run over every notebook)."""

from __future__ import annotations

import inspect

from autograder.hidden.$module import MISTAKES

from ..notebook_code import solution_namespace

ASSIGNMENT = "$name"
SIGNATURES = {"row_softmax": "(scores)"}
#: Mistakes this notebook must catalogue, by exercise (none yet).
REQUIRED: dict[str, set[str]] = {"row_softmax": set()}


def test_exercises_keep_their_signatures():
    solution = solution_namespace(ASSIGNMENT)
    for exercise, signature in SIGNATURES.items():
        assert str(inspect.signature(getattr(solution, exercise))) == signature, exercise


def test_the_required_mistakes_are_catalogued():
    for exercise, names in REQUIRED.items():
        assert names <= {m.name for m in MISTAKES[exercise]}, exercise
'''


def _markdown(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(text.strip())


def _graded(source: str, grade_id: str, *, solution: bool, points: int = 0) -> nbformat.NotebookNode:
    meta = {"grade": not solution, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if not solution:
        meta["points"] = points
    return new_code_cell(source.strip(), metadata={"nbgrader": meta})


def notebook(name: str, title: str) -> nbformat.NotebookNode:
    """The source notebook: question, setup, one section with its exercise and checks, what to remember."""
    number, module = name[:2], module_name(name)
    cells = [
        _markdown(f"# {number} · {title}\n\n**The question.** What does this notebook answer? Say it in one "
                  "sentence a student would ask.\n\nIn this notebook you will\n\n1. ...\n2. ..."),
        new_code_cell("import math\n\nimport matplotlib.pyplot as plt\nimport torch\n\n"
                      "torch.set_printoptions(precision=4, sci_mode=False)"),
        _markdown("## 1. A first exercise\n\nThe intuition first, then the maths, every step:\n\n"
                  "$$\\operatorname{softmax}(s)_j = \\frac{e^{s_j}}{\\sum_k e^{s_k}}.$$\n\n"
                  "**Exercise.** Write `row_softmax(scores)`: the softmax of each row (the last axis)."),
        _graded('def row_softmax(scores):\n    """Softmax over the last axis of ``scores``."""\n'
                "    ### BEGIN SOLUTION\n    return torch.softmax(scores, dim=-1)\n    ### END SOLUTION",
                EXERCISE, solution=True),
        _graded(f"from autograder.checks.{module} import check_row_softmax\n\ncheck_row_softmax(row_softmax)",
                f"test_{EXERCISE}", solution=False, points=1),
        _graded("# Hidden tests run here when your notebook is graded.\n### BEGIN HIDDEN TESTS\n"
                f"from autograder.hidden.{module} import check_row_softmax as hidden_check_row_softmax\n\n"
                "hidden_check_row_softmax(row_softmax)\n### END HIDDEN TESTS",
                f"test_{EXERCISE}_hidden", solution=False, points=2),
        new_code_cell("weights = row_softmax(torch.tensor([[1.0, 2.0, 3.0]]))\n"
                      "plt.bar(range(3), weights[0])\nplt.title('softmax of 1, 2, 3')\nplt.show()"),
        _markdown("## What to remember\n\n- ..."),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                   "language_info": {"name": "python", "version": "3.11"}}
    return nb


def _parts(name: str) -> re.Match:
    match = NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a notebook name: two digits, an underscore and a lower-case Python "
                         "identifier, e.g. 10_linear_attention")
    return match


def files(name: str, title: str, root: Path = ROOT) -> dict[Path, str]:
    """Every file of the new notebook ``name``, by path, with its text."""
    match = _parts(name)
    module, number = match["module"], match["number"]
    values = {"name": name, "module": module, "number": str(int(number)), "title": title}
    return {
        root / "source" / name / f"{name}.ipynb": nbformat.writes(notebook(name, title)) + "\n",
        root / "autograder" / "references" / f"{module}.py": Template(REFERENCES).substitute(values),
        root / "autograder" / "checks" / f"{module}.py": Template(CHECKS).substitute(values),
        root / "autograder" / "hidden" / f"{module}.py": Template(HIDDEN).substitute(values),
        root / "autograder" / "hidden" / "mistakes" / f"{module}.toml": Template(CATALOGUE).substitute(values),
        root / "tests" / "checks" / f"test_notebook_{name}.py": Template(TESTS).substitute(values),
    }


def create(name: str, title: str | None = None, root: Path = ROOT) -> list[Path]:
    """Write the files of the new notebook ``name``; refuse, writing nothing, if any exists or the module is taken."""
    title = title or _parts(name)["module"].replace("_", " ").capitalize()
    planned = files(name, title, root)
    taken = [p for p in planned if p.exists()]
    taken += [p for p in (root / "source").glob(f"*_{module_name(name)}") if p.name != name]
    if taken:
        raise FileExistsError(f"new-notebook {name} would overwrite or clash with: "
                              + ", ".join(str(p.relative_to(root)) for p in taken))
    for path, text in planned.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(planned)
