"""A throwaway copy of the course in which the tests release, submit and grade."""

from __future__ import annotations

import ast
import functools
import importlib
import re
import shutil
import symtable
from pathlib import Path

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

from autograder.course.repository import module_name, nbgrader
from autograder.course.settings import Settings
from autograder.engine import sandbox
from autograder.engine.graded_cells import graded_sources
from autograder.engine.source_check import definition_closure
from autograder.grader.diagnosis import Mistake
from autograder.grader.variation import source_of

from .notebook_code import ROOT, hidden_test_arguments, nbgrader_meta, source_notebook

SOLUTION_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*\n", re.M)


def make_course(tmp: Path, assignments: list[str]) -> Path:
    """Copy the config and the sources of ``assignments`` to ``tmp`` and generate them there."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp / "nbgrader_config.py")
    for name in assignments:
        shutil.copytree(ROOT / "source" / name, tmp / "source" / name)
        nbgrader("generate_assignment", name, "--force", "--log-level=WARN", root=tmp)
    return tmp


def released(course: Path, assignment: str) -> nbformat.NotebookNode:
    """The student version nbgrader generated in ``course``."""
    return nbformat.read(course / "build" / "release" / assignment / f"{assignment}.ipynb", as_version=4)


def reference_answers(assignment: str) -> dict[str, str]:
    """grade_id -> the reference answer cell as a student would submit it (markers removed)."""
    notebook = nbformat.read(ROOT / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    return {
        nbgrader_meta(c)["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
        for c in notebook.cells
        if nbgrader_meta(c).get("solution")
    }


def mistake_source(mistake: Mistake, exercise: str) -> str:
    """The mistake's code, renamed to the exercise, as a student would write it."""
    source = source_of(mistake.fn)
    return re.sub(rf"^(def|class) {mistake.fn.__name__}\b", rf"\1 {exercise}", source, count=1, flags=re.M)


def catalogue(assignment: str) -> dict[str, list[Mistake]]:
    """exercise -> the catalogued mistakes of ``assignment`` (its hidden module's ``MISTAKES``)."""
    return importlib.import_module(f"autograder.hidden.{module_name(assignment)}").MISTAKES


@functools.cache
def _reached(assignment: str, name: str) -> frozenset[str]:
    """The exercises that ``name`` reaches in the notebook answered with its references (its own cell included)."""
    answers = reference_answers(assignment)
    # what the graded kernel holds of the notebook answered with its references: its imports, the functions
    # and classes it gives, the answer cells (a demonstration cell is not there to reach an exercise)
    notebook = source_notebook(assignment)
    answered = fill(notebook, answers)
    cells = [graded.source for graded in graded_sources(answered, notebook)]
    defined = {s.name for s in definition_closure(cells, name) if isinstance(s, (ast.FunctionDef, ast.ClassDef))}
    return frozenset(defined & set(catalogue(assignment)))


def depends_on(assignment: str, exercise: str, mistake: Mistake) -> set[str]:
    """The other exercises whose answers decide what ``mistake`` (submitted as ``exercise``) is graded on.

    Those that the other names its hidden test cell hands to the check reach in the notebook,
    transitively (``check_generate(generate, TinyDecoder)`` runs the notebook's TinyDecoder,
    built on the student's DecoderBlock, decode_step and KVCache), and those the mistake's own
    code reaches.
    """
    names = set(hidden_test_arguments(assignment).get(exercise, [])) | globals_read(mistake_source(mistake, exercise))
    return set().union(*(_reached(assignment, name) for name in names - {exercise})) - {exercise}


def globals_read(source: str) -> set[str]:
    """The global names ``source`` reads: at its top level and in its functions (and their classes' methods)."""
    table = symtable.symtable(source, "<cell>", "exec")
    names = {symbol.get_name() for symbol in table.get_symbols() if symbol.is_referenced()}
    scopes = list(table.get_children())
    while scopes:
        scope = scopes.pop()
        scopes += scope.get_children()
        names |= {symbol.get_name() for symbol in scope.get_symbols() if symbol.is_global()}
    return names


def _bound(source: str) -> set[str]:
    """The names a cell binds at its top level (``def``, ``class``, imports, assignments, loop targets)."""
    names = set()
    for statement in ast.parse(source).body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in statement.names}
        else:
            names |= {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def without_demonstrations(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``notebook`` without the code cells nbgrader does not grade and no graded cell needs.

    What a student who deletes the notebook's demonstrations hands in: the answer and test
    cells stay, and every other code cell that defines a name they read (the imports, a class
    a check is given), transitively; the cells that only print, plot, time or train go. Their
    cost is most of a notebook's grading time (09 trains a model), and they grade nothing.
    """
    notebook = nbformat.from_dict(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    python = {id(c): TransformerManager().transform_cell(c.source) for c in code}  # %magics become calls
    try:
        bound = {id(c): _bound(python[id(c)]) for c in code}
        reads = {id(c): globals_read(python[id(c)]) for c in code}
    except SyntaxError:
        return notebook  # a cell Python cannot read: keep everything
    kept = {id(c) for c in code if nbgrader_meta(c)}
    needed = set().union(*(reads[k] for k in kept))
    while more := [c for c in code if id(c) not in kept and bound[id(c)] & needed]:
        for cell in more:
            kept.add(id(cell))
            needed |= reads[id(cell)]
    notebook.cells = [c for c in notebook.cells if c.cell_type != "code" or id(c) in kept]
    return notebook


@functools.cache
def mistake_submissions(assignment: str) -> list[dict[str, Mistake]]:
    """Every catalogued mistake of ``assignment`` placed in exactly one submission, several exercises at once.

    Submission k carries the k-th mistake still to place of every exercise (reference answers
    elsewhere), so a notebook needs about as many submissions as its longest catalogue, not one
    per mistake. Two mistakes that would change each other's grading never share a submission:
    one of them goes to a later one (the rule of :func:`depends_on`).
    """
    left = {exercise: list(mistakes) for exercise, mistakes in catalogue(assignment).items()}
    needs = {id(m): depends_on(assignment, exercise, m) for exercise, mistakes in left.items() for m in mistakes}
    submissions: list[dict[str, Mistake]] = []
    while any(left.values()):
        chosen: dict[str, Mistake] = {}
        for exercise, mistakes in left.items():
            for mistake in mistakes:
                if not needs[id(mistake)] & set(chosen) and not any(exercise in needs[id(m)] for m in chosen.values()):
                    chosen[exercise] = mistake
                    mistakes.remove(mistake)
                    break
        submissions.append(chosen)
    return submissions


def fill(notebook: nbformat.NotebookNode, answers: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of ``notebook`` whose answer cells ``answers`` names are replaced."""
    notebook = nbformat.from_dict(notebook)
    for cell in notebook.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if nbgrader_meta(cell).get("solution") and grade_id in answers:
            cell.source = answers[grade_id]
    return notebook


def submit(course: Path, assignment: str, student: str, notebook: nbformat.NotebookNode) -> Path:
    """Place ``notebook`` as ``student``'s submission of ``assignment``."""
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment}.ipynb"
    nbformat.write(notebook, path)
    return path


#: The time limits the tests grade under: ten and six times the course's (60 s a cell, 600 s a notebook), so that no
#: verdict depends on how busy the machine is. A test about a time limit sets its own; the course's own limits are
#: measured by `make bench-grading`, not judged here.
UNHURRIED = {"Execute.timeout": 600, "ResilientExecute.notebook_timeout": 3600}


def grading_settings(root: Path, flags: dict | None = None) -> Settings:
    """How the tests grade their own (trusted) submissions in the course at ``root``: in the sandbox where there is
    one, else without, under :data:`UNHURRIED` limits; ``flags`` as a command line's ("Class.trait": value).

    The hostile submissions are never graded without the sandbox: their test skips instead.
    """
    return Settings.load(root, {"Grading.sandbox": sandbox.mode() != "limits only", **UNHURRIED, **(flags or {})})
