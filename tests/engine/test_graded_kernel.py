"""The graded kernel: the checks call the student's functions where only what is graded was loaded.

Notebook 01 is graded here as grading runs it (:class:`~autograder.engine.execute.ResilientExecute`,
test cells in the grader) with the honest habits that once cost an exercise (an autoreload magic in
the imports cell, a help query, a plotting set-up, the imports written another way, a scratch cell
that redefines an answer) and with ordinary cells that try to earn what the answer cells do not: the
habits keep every point, the ordinary cells earn nothing (:mod:`autograder.engine.graded_cells`).
"""

from __future__ import annotations

import copy

import nbformat
import pytest
from nbformat.v4 import new_code_cell
from traitlets.config import Config

from autograder.engine import graded_cells, source_check, zygote
from autograder.engine.execute import ResilientExecute, is_test_cell
from autograder.engine.graded_cells import ANSWER, IMPORTS, RELEASE, graded_sources

from .. import forked_kernels
from ..notebook_code import ROOT, nbgrader_meta, source_notebook

A = "01_soft_lookup"
IMPORTS_ANOTHER_WAY = "%load_ext autoreload\n%autoreload 2\nimport math, torch\nfrom torch.nn import functional as F\n" \
                      "import matplotlib.pyplot as plt\nSCRATCH = 1"
HABITS = ["torch.softmax?", "import matplotlib\nmatplotlib.rcParams['figure.dpi'] = 80",
          "def scaled_dot_product_attention(Q, K, V):\n    return Q, Q  # a scratch version, left below the answer"]


def release() -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / f"{A}.ipynb", as_version=4)


def instructor_notebook() -> nbformat.NotebookNode:
    """The notebook as autograde runs it: reference answers, visible and hidden tests; no demonstration cells."""
    notebook = source_notebook(A)
    notebook.cells = [c for c in notebook.cells if c.cell_type != "code" or nbgrader_meta(c)
                      or c.source.startswith("import")]
    return notebook


def index_of(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if nbgrader_meta(c).get("grade_id") == grade_id)


def with_habits(notebook):
    """``notebook`` with its imports cell written another way and the habit cells after the last answer."""
    notebook = copy.deepcopy(notebook)
    first = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and not nbgrader_meta(c))
    notebook.cells[first].source = IMPORTS_ANOTHER_WAY
    at = index_of(notebook, "scaled_dot_product_attention") + 1
    notebook.cells[at:at] = [new_code_cell(h) for h in HABITS]
    return notebook


# -- what is loaded -----------------------------------------------------------------------------------


def test_only_the_release_code_the_imports_and_the_answer_cells_are_loaded_in_notebook_order():
    notebook = with_habits(instructor_notebook())
    sources = graded_sources(notebook, release())
    text = "\n".join(s.source for s in sources)
    for habit in HABITS + ["SCRATCH", "load_ext", "autoreload", "softmax?", "rcParams"]:
        assert habit not in text
    answers = [s.name for s in sources if s.kind == ANSWER]
    assert answers == [f"the answer cell {g}" for g in ("hard_lookup", "soft_lookup", "nadaraya_watson",
                                                       "scaled_dot_product_attention")]
    student_imports = next(s for s in sources if s.kind == IMPORTS)
    assert student_imports.source == "import math, torch\nfrom torch.nn import functional as F\nimport matplotlib.pyplot as plt"
    assert sources[0].kind == RELEASE and "import torch.nn.functional as F" in sources[0].source
    assert [s.index for s in sources] == sorted(s.index for s in sources)
    test = index_of(notebook, "test_soft_lookup")
    assert [s.name for s in graded_cells.before(sources, test) if s.kind == ANSWER] == \
        ["the answer cell hard_lookup", "the answer cell soft_lookup"]


def test_the_source_reader_reads_exactly_what_the_graded_kernel_loads(monkeypatch):
    notebook = with_habits(instructor_notebook())
    executor = ResilientExecute(sandbox=False)
    executor.nb = notebook
    executor._graded_sources = graded_sources(notebook, release())
    executor._forbidden = {}
    executor._index = index_of(notebook, "test_scaled_dot_product_attention")
    read = []
    monkeypatch.setattr(source_check, "forbidden_use", lambda sources, *rest: read.append(sources))
    executor.forbidden_use("scaled_dot_product_attention", (), "scaled_dot_product_attention")
    assert read == [[s.source for s in graded_cells.before(executor._graded_sources, executor._index)]]
    assert not any(h in s for s in read[0] for h in HABITS)


# -- graded ---------------------------------------------------------------------------------------------


def grade(notebook, tmp_path) -> dict[str, list]:
    """``notebook`` graded as grading grades it (sandboxed, the kernels forked from a zygote, where grading forks
    them: :mod:`tests.forked_kernels`; else in plain kernels): grade id -> the test cell's outputs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = Config()
    config.CourseDirectory.root = str(ROOT)
    executor = ResilientExecute(timeout=120, sandbox=zygote.usable(), config=forked_kernels.config(config))
    graded, _ = executor.preprocess(notebook, {"metadata": {"path": str(tmp_path)},
                                               "nbgrader": {"assignment": A, "notebook": A}})
    return {nbgrader_meta(c)["grade_id"]: c.outputs for c in graded.cells if is_test_cell(c)}


def errors(outputs: list) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]


@pytest.mark.slow
def test_honest_habits_keep_every_point_and_ordinary_cells_earn_nothing(tmp_path):
    honest = grade(with_habits(instructor_notebook()), tmp_path / "honest")
    assert {g: errors(o) for g, o in honest.items() if errors(o)} == {}

    # the answer cells are left unwritten; ordinary cells below them define the reference answers
    stubs = copy.deepcopy(instructor_notebook())
    answers = {}
    for cell in stubs.cells:
        if nbgrader_meta(cell).get("solution"):
            answers[nbgrader_meta(cell)["grade_id"]] = cell.source
            head = cell.source.split("\n", 1)[0]
            cell.source = f"{head}\n    raise NotImplementedError"
    stubs.cells += [new_code_cell(a) for a in answers.values()]
    elsewhere = grade(stubs, tmp_path / "stubs")
    assert all(errors(o) for o in elsewhere.values()), {g: errors(o) for g, o in elsewhere.items()}


@pytest.mark.slow
def test_an_answer_cell_that_fails_to_load_is_named_and_a_crash_is_survived(tmp_path):
    notebook = instructor_notebook()
    hard = notebook.cells[index_of(notebook, "hard_lookup")]
    hard.source += "\nraise ValueError('a check of my own')\n"
    soft = notebook.cells[index_of(notebook, "soft_lookup")]
    soft.source = "def soft_lookup(query, keys, values, temperature=1.0):\n    import os\n    os._exit(3)\n"
    notebook.cells.insert(index_of(notebook, "nadaraya_watson"), new_code_cell("undefined_name_in_a_scratch_cell"))
    outcome = grade(notebook, tmp_path)
    # hard_lookup was defined before the error: its checks pass
    assert errors(outcome["test_hard_lookup"]) == []
    assert any("stopped while this check ran your code" in e for e in errors(outcome["test_soft_lookup"]))
    for later in ("test_nadaraya_watson", "test_nadaraya_watson_hidden", "test_scaled_dot_product_attention",
                  "test_scaled_dot_product_attention_hidden"):
        assert errors(outcome[later]) == [], later
    broken = copy.deepcopy(instructor_notebook())
    cell = broken.cells[index_of(broken, "nadaraya_watson")]
    cell.source = "raise ValueError('before the definition')\n" + cell.source
    failed = errors(grade(broken, tmp_path / "broken")["test_nadaraya_watson"])
    assert failed and "the answer cell nadaraya_watson: ValueError: before the definition" in failed[0]
