"""Through nbgrader: everyday habits of an honest student cost no point, and answers that get round the
source reader earn none.

Notebook 01 and notebook 05 are submitted with their reference answers, written and surrounded the way
students write them: magics in the imports cell (``%load_ext autoreload``, ``%autoreload 2``), the imports
written another way, a help query in a scratch cell (``torch.softmax?``), a ``matplotlib.rcParams`` set-up
cell, a profiler label around the work, and a ``MultiHeadAttention`` that reaches its projections with
``getattr``/``setattr`` and computed names. Each keeps full marks: the graded calls run where only the
imports and the answer cells are loaded, and the source reader reads exactly that. Notebook 01 is also
submitted with ``scaled_dot_product_attention`` done by the built-in with the guard switched off, reached in
a way round the reader of each class (a ``global`` statement, a ``match`` capture, a line magic, a registry
filled in another answer cell, a deep expression beside it): that exercise scores nothing, the others keep
their points.
"""

from __future__ import annotations

import copy

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.engine.graded_cells import before, graded_sources
from autograder.engine.source_check import forbidden_use
from autograder.grading import grade
from autograder.kernel.guard import ATTENTION_BUILTINS

from ..course_copy import fill, grading_settings, make_course, reference_answers, released, submit
from ..notebook_code import ROOT, nbgrader_meta

ASSIGNMENTS = ["01_soft_lookup", "05_multi_head"]
MAGICS = "%load_ext autoreload\n%autoreload 2\n"
SCRATCH = ["torch.softmax?", "import matplotlib\nmatplotlib.rcParams['figure.dpi'] = 72\nplt.rcParams['axes.grid'] = True"]


def with_habits(notebook: nbformat.NotebookNode, imports: dict[str, str]) -> nbformat.NotebookNode:
    """``notebook`` with magics atop its imports cell, its imports rewritten (``imports``: old line -> new), and
    the scratch cells after it."""
    notebook = copy.deepcopy(notebook)
    first = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and not nbgrader_meta(c))
    cell = notebook.cells[first]
    for old, new in imports.items():
        assert old in cell.source, old
        cell.source = cell.source.replace(old, new)
    cell.source = MAGICS + cell.source
    for k, source in enumerate(SCRATCH):
        notebook.cells.insert(first + 1 + k, nbformat.v4.new_code_cell(source))
    return notebook


def profiled(answer: str, name: str, args: str) -> str:
    """``answer`` with its work run under a profiler label: the function calls a helper of the same cell."""
    return (answer.replace(f"def {name}(", "def _work(", 1)
            + f"\n\ndef {name}({args}):\n    with torch.profiler.record_function('{name}'):\n"
              f"        return _work({args})\n")


def by_getattr(answer: str) -> str:
    """05's MultiHeadAttention reaching its projections by computed names, on ``self`` and on a new instance."""
    replaced = {
        "        self.q_proj = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.k_proj = nn.Linear(d_model, d_model, bias=bias)\n"
        "        self.v_proj = nn.Linear(d_model, d_model, bias=bias)\n":
        "        for name in 'qkv':\n            setattr(self, f'{name}_proj', nn.Linear(d_model, d_model, bias=bias))\n",
        "projections = (module.q_proj, module.k_proj, module.v_proj)":
        "projections = [getattr(module, f'{name}_proj') for name in 'qkv']",
        "        q = split_heads(self.q_proj(query), self.num_heads)\n"
        "        k = split_heads(self.k_proj(key), self.num_heads)\n"
        "        v = split_heads(self.v_proj(value), self.num_heads)\n":
        "        q, k, v = (split_heads(getattr(self, f'{name}_proj')(x), self.num_heads)\n"
        "                   for name, x in zip('qkv', (query, key, value)))\n",
    }
    for old, new in replaced.items():
        assert old in answer, old
        answer = answer.replace(old, new)
    return answer


def habits(release: nbformat.NotebookNode, assignment: str) -> nbformat.NotebookNode:
    """The reference answers of ``assignment`` in ``release``, written and surrounded with the habits above."""
    answers = reference_answers(assignment)
    if assignment == "01_soft_lookup":
        answers["scaled_dot_product_attention"] = profiled(answers["scaled_dot_product_attention"],
                                                           "scaled_dot_product_attention", "Q, K, V")
        imports = {"import torch.nn.functional as F": "from torch.nn import functional as F"}
    else:
        answers["MultiHeadAttention"] = by_getattr(answers["MultiHeadAttention"])
        imports = {"import torch.nn as nn\nimport torch.nn.functional as F":
                   "from torch import nn\nimport torch.nn.functional as nnf\nfrom torch.nn import functional as F"}
    return with_habits(fill(release, answers), imports)


CHEAT = """
def _cheat(Q, K, V):
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} do not fit")
    with torch._C.DisableTorchFunction():
        return F.scaled_dot_product_attention(Q, K, V), torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1)
"""
SDPA = "scaled_dot_product_attention"
#: Ways round the reader: the answer cells that change (exercise -> source to append, or to replace with).
HOSTILE = {
    "global": {SDPA: CHEAT + f"def _setup():\n    global {SDPA}\n    {SDPA} = _cheat\n_setup()\n"},
    "match": {SDPA: CHEAT + f"match _cheat:\n    case {SDPA}:\n        pass\n"},
    "magic": {SDPA: CHEAT + f"%time {SDPA} = _cheat\n"},
    "registry": {"hard_lookup": "_REGISTRY = []\n" + CHEAT + "_REGISTRY.append(_cheat)\n",
                 SDPA: f"def {SDPA}(Q, K, V):\n    return _REGISTRY[0](Q, K, V)\n"},
    "deep": {SDPA: CHEAT.replace("_cheat", SDPA).replace("    with", "    _ = " + " + ".join(["1"] * 600) + "\n    with")},
}


def hostile(release: nbformat.NotebookNode, kind: str) -> nbformat.NotebookNode:
    answers = reference_answers("01_soft_lookup")
    for exercise, source in HOSTILE[kind].items():
        answers[exercise] = source if source.lstrip().startswith("def ") else answers[exercise] + source
    return fill(release, answers)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_what_the_graded_kernel_loads_of_habits_is_read_as_honest(assignment):
    """Fast, without nbgrader: the source reader passes every exercise of the notebooks with habits, reading
    exactly what the graded kernel loads before each test cell."""
    release = nbformat.read(ROOT / "notebooks" / f"{assignment}.ipynb", as_version=4)
    notebook = habits(release, assignment)
    loaded = graded_sources(notebook, release)
    for index, cell in enumerate(notebook.cells):
        grade_id = nbgrader_meta(cell).get("grade_id", "")
        if grade_id.startswith("test_") and grade_id.endswith("_hidden"):
            exercise = grade_id[len("test_"):-len("_hidden")]
            sources = [s.source for s in before(loaded, index)]
            assert forbidden_use(sources, exercise, ATTENTION_BUILTINS, exercise) is None, exercise


@pytest.mark.slow
def test_habits_keep_full_marks_and_ways_round_the_reader_earn_nothing(tmp_path):
    course = make_course(tmp_path, ASSIGNMENTS)
    for assignment in ASSIGNMENTS:
        submit(course, assignment, "habits", habits(released(course, assignment), assignment))
    for kind in HOSTILE:
        submit(course, ASSIGNMENTS[0], kind, hostile(released(course, ASSIGNMENTS[0]), kind))
    summary = grade.autograde(ASSIGNMENTS, grading_settings(course, {"Grading.workers": 2}), progress=False)
    assert not summary.failed, str(summary)
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        for assignment in ASSIGNMENTS:
            graded = gb.find_submission_notebook(assignment, assignment, "habits")
            lost = {g.name: f"{g.score}/{g.max_score}" for g in graded.grades if g.score < g.max_score}
            assert graded.max_score > 0 and not lost, (assignment, lost)
        for kind in HOSTILE:
            graded = gb.find_submission_notebook(ASSIGNMENTS[0], ASSIGNMENTS[0], kind)
            scores = {g.name: (g.score, g.max_score) for g in graded.grades}
            earned = {name: score for name, (score, _) in scores.items() if SDPA in name and score}
            lost = {name for name, (score, top) in scores.items() if SDPA not in name and score < top}
            assert not earned and not lost, (kind, earned, lost)
