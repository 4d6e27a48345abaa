"""Before and after nbgrader: what a submission did to its notebook, and whether to trust its scores.

Before grading, :func:`stage` copies a submission into a private folder that nbgrader reads
instead of ``submitted/`` (the student's files are never changed):

- only regular files are copied (no symbolic links, devices or oversized files);
- a notebook under another name is graded as the assignment's notebook when there is no
  doubt which one it is; a missing or unreadable notebook is recorded;
- the notebook is put back into the shape nbgrader expects: the locked test cells of the
  release are restored where they belong (right after their exercise), even when they were
  deleted, moved, edited or had their metadata (points, ``grade_id``, ``locked``) changed,
  and added cells lose any nbgrader metadata (they run, they earn nothing).

After grading, :func:`scan` reads the student's code for what could tamper with the checks
(monkeypatching, IPython hooks, introspection, tensor subclasses); such a submission is run
again by :mod:`autograder.pipeline.recheck` in a sandbox, and :func:`reconcile` sets to zero,
in nbgrader's gradebook, every test cell nbgrader passed that the re-check did not, with the
reason in the feedback.

Every finding is a :class:`Note`, shown to the student in the feedback and to the instructor
in the summary of ``make autograde``.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import secrets
import shutil
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from . import sandbox

#: Largest single file and whole submission copied for grading.
MAX_FILE_BYTES = 50 * 2**20
MAX_SUBMISSION_BYTES = 200 * 2**20
#: The ename of the error outputs this module adds to test cells it set to zero.
INTEGRITY = "IntegrityCheck"
#: Where the notes of a graded submission are kept, in its ``autograded/`` folder.
NOTES_FILE = ".grading-notes.json"


@dataclass(frozen=True)
class Note:
    """Something the student (and the instructor) should know about how a submission was graded."""

    kind: str
    message: str


# -- notebooks of the release --------------------------------------------------------------


def release_folder(root: Path, assignment: str) -> Path:
    """The folder holding the released notebooks of ``assignment`` (nbgrader's release, else notebooks/)."""
    folder = root / "build" / "release" / assignment
    return folder if folder.is_dir() else root / "notebooks"


def release_notebooks(root: Path, assignment: str) -> dict[str, NotebookNode]:
    """Notebook name -> released notebook, for every notebook of ``assignment``."""
    folder = root / "build" / "release" / assignment
    if folder.is_dir():
        return {p.stem: nbformat.read(p, as_version=4) for p in sorted(folder.glob("*.ipynb"))}
    fallback = root / "notebooks" / f"{assignment}.ipynb"
    return {assignment: nbformat.read(fallback, as_version=4)} if fallback.is_file() else {}


def _meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _locked(cell: NotebookNode) -> bool:
    meta = _meta(cell)
    return bool(meta.get("locked") or (meta.get("grade") and not meta.get("solution")))


# -- staging -------------------------------------------------------------------------------


@dataclass
class Staged:
    """A submission copied for grading: the notebooks found and what was noticed."""

    notebooks: list[str]
    notes: list[Note]


def stage(root: Path, assignment: str, student: str, staging: Path) -> Staged:
    """Copy ``submitted/<student>/<assignment>`` to ``staging/<student>/<assignment>``, cleaned up."""
    source = root / "submitted" / student / assignment
    target = staging / student / assignment
    target.mkdir(parents=True, exist_ok=True)
    notes: list[Note] = []
    total = 0
    found_notebooks: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        rel = Path(dirpath).relative_to(source)
        for name in sorted(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                notes.append(Note("link", f"{rel / name} is a symbolic link; it was not used."))
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and d not in (".ipynb_checkpoints", "__pycache__"))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            shown = rel / name
            if path.is_symlink() or not path.is_file():
                notes.append(Note("link", f"{shown} is a symbolic link or not a regular file; it was not used."))
                continue
            size = path.stat().st_size
            total += size
            if size > MAX_FILE_BYTES or total > MAX_SUBMISSION_BYTES:
                notes.append(Note("size", f"{shown} is too large ({size} bytes); it was not used."))
                continue
            if name.endswith(".ipynb") and rel == Path("."):
                found_notebooks[path.stem] = path
                continue
            (target / rel).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / rel / name)

    releases = release_notebooks(root, assignment)
    readable: dict[str, NotebookNode] = {}
    for name, path in found_notebooks.items():
        try:
            readable[name] = nbformat.read(path, as_version=4)
        except Exception as error:  # noqa: BLE001 - any unreadable file is reported, not fatal
            notes.append(Note("unreadable", f"{path.name} could not be read as a notebook ({type(error).__name__}); "
                                            "it was not graded."))
    graded = []
    unclaimed = {n: nb for n, nb in readable.items() if n not in releases}
    for name, release in releases.items():
        notebook = readable.get(name)
        if notebook is None:
            notebook, other = _pick_renamed(unclaimed, release)
            if notebook is None:
                notes.append(Note("missing", f"{name}.ipynb was not in your submission, so it scores 0."))
                continue
            unclaimed.pop(other)
            notes.append(Note("renamed", f"Your notebook was named {other}.ipynb instead of {name}.ipynb; "
                                         f"it was graded as {name}.ipynb."))
        normalized, cell_notes = normalize(notebook, release)
        notes += cell_notes
        nbformat.write(normalized, target / f"{name}.ipynb")
        graded.append(name)
    for other in unclaimed:
        notes.append(Note("ignored", f"{other}.ipynb is not part of this assignment; it was not graded."))
    return Staged(graded, notes)


def _pick_renamed(candidates: dict[str, NotebookNode], release: NotebookNode) -> tuple[NotebookNode | None, str]:
    """The one candidate notebook that is clearly ``release`` under another name (most grade ids shared)."""
    wanted = {_meta(c).get("grade_id") for c in release.cells} - {None}
    scored = sorted(
        ((len(wanted & {_meta(c).get("grade_id") for c in nb.cells}), name) for name, nb in candidates.items()),
        reverse=True,
    )
    if scored and scored[0][0] > 0 and (len(scored) == 1 or scored[1][0] < scored[0][0]):
        return candidates[scored[0][1]], scored[0][1]
    return None, ""


def normalize(submitted: NotebookNode, release: NotebookNode) -> tuple[NotebookNode, list[Note]]:
    """``submitted`` with the release's locked cells and nbgrader metadata restored (see the module doc)."""
    notes: list[Note] = []
    by_id = {_meta(c)["grade_id"]: c for c in release.cells if _meta(c).get("grade_id")}
    order = [_meta(c)["grade_id"] for c in release.cells if _meta(c).get("grade_id")]
    locked_sources: dict[str, list[str]] = {}
    for gid in order:
        if _locked(by_id[gid]):
            locked_sources.setdefault(by_id[gid].source.strip(), []).append(gid)

    matched: dict[str, NotebookNode] = {}
    restored: set[int] = set()  # id() of the locked cells taken from the release
    cells: list[NotebookNode] = []
    for original in submitted.cells:
        cell = copy.deepcopy(original)
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if gid not in by_id or gid in matched:
            twin = next((g for g in locked_sources.get(cell.source.strip(), []) if g not in matched), None)
            if twin is None:
                if meta.get("grade") or meta.get("points"):
                    notes.append(Note("added", f"A cell you added claims to be graded ({meta.get('grade_id') or 'no id'}, "
                                               f"{meta.get('points', 0)} points); it was run as an ordinary cell."))
                cell.metadata.pop("nbgrader", None)
                cells.append(cell)
                continue
            gid = twin
            notes.append(Note("metadata", f"The test cell {twin} had lost or changed its grading metadata; "
                                          "it was restored."))
        reference = by_id[gid]
        changed = [k for k in ("points", "grade", "solution", "locked") if meta.get(k) != _meta(reference).get(k)]
        if changed and meta.get("grade_id") == gid:
            notes.append(Note("metadata", f"The metadata of cell {gid} was changed ({', '.join(changed)}); "
                                          "the original was restored."))
        if _locked(reference):
            if cell.source.strip() != reference.source.strip():
                notes.append(Note("edited", f"The locked cell {gid} was edited; the original was run instead."))
            cell = copy.deepcopy(reference)
            restored.add(id(cell))
        else:
            cell.metadata["nbgrader"] = copy.deepcopy(_meta(reference))
            if cell.cell_type != reference.cell_type:
                cell = _retype(cell, reference.cell_type)
        matched[gid] = cell
        cells.append(cell)

    # Which exercise did each locked cell follow? (for the "moved" note)
    seen_order = [_meta(c).get("grade_id") for c in submitted.cells if _meta(c).get("grade_id") in matched]
    present = [g for g in order if g in matched]
    moved = {g for g in present if _locked(by_id[g]) and g in seen_order
             and _exercise_before(seen_order, g, by_id) != _exercise_before(present, g, by_id)}

    result = [c for c in cells if id(c) not in restored]
    anchor = _initial_anchor(release, order)
    for gid in order:
        reference = by_id[gid]
        if not _locked(reference):
            if gid in matched:
                anchor = next(i for i, c in enumerate(result) if c is matched[gid])
            continue
        if gid not in matched:
            notes.append(Note("deleted", f"The test cell {gid} was missing from your notebook; it was put back and run."))
        elif gid in moved:
            notes.append(Note("moved", f"The test cell {gid} had been moved; it was put back after its exercise."))
        anchor = min(anchor + 1, len(result))
        result.insert(anchor, copy.deepcopy(reference))
    notebook = copy.deepcopy(submitted)
    notebook.nbformat, notebook.nbformat_minor = release.nbformat, release.nbformat_minor
    notebook.cells = [_clean(c, i, release.nbformat_minor) for i, c in enumerate(result)]
    notebook.metadata = copy.deepcopy(release.metadata)
    return notebook, _unique(notes)


def _exercise_before(sequence: list[str], gid: str, by_id: dict[str, NotebookNode]) -> str | None:
    """The last answer (unlocked) cell before ``gid`` in ``sequence``."""
    earlier = sequence[: sequence.index(gid)]
    return next((g for g in reversed(earlier) if not _locked(by_id[g])), None)


def _initial_anchor(release: NotebookNode, order: list[str]) -> int:
    """Where a first locked cell with no exercise before it goes: after as many cells as in the release."""
    if not order:
        return -1
    first = next(i for i, c in enumerate(release.cells) if _meta(c).get("grade_id") == order[0])
    return first - 1


def _retype(cell: NotebookNode, cell_type: str) -> NotebookNode:
    if cell_type == "code":
        return nbformat.v4.new_code_cell(cell.source, metadata=cell.metadata)
    return nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata)


def _clean(cell: NotebookNode, index: int, minor: int) -> NotebookNode:
    """A fresh copy of ``cell``: no outputs, and a cell id that depends only on its position."""
    cell = copy.deepcopy(cell)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    allowed = ("cell_type", "metadata", "source") + (("outputs", "execution_count") if cell.cell_type == "code"
                                                       else ("attachments",))
    for key in [k for k in cell if k not in allowed]:
        cell.pop(key)
    if minor >= 5:
        cell["id"] = f"cell-{index:04d}"
    return cell


def _unique(notes: list[Note]) -> list[Note]:
    seen, out = set(), []
    for note in notes:
        if note not in seen:
            seen.add(note)
            out.append(note)
    return out


# -- what the student's code does ----------------------------------------------------------

SAFE_IMPORTS = {
    "math", "cmath", "numbers", "typing", "itertools", "collections", "dataclasses", "functools", "random", "time",
    "numpy", "matplotlib", "matplotlib.pyplot", "einops", "torch", "torch.nn", "torch.nn.functional",
    "torch.nn.init", "torch.linalg", "torch.special", "torch.fft", "torch.nn.attention", "torch.nn.attention.bias",
    "IPython.display",
}
RISKY_NAMES = {
    "exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr", "globals", "locals", "vars",
    "breakpoint", "get_ipython", "__builtins__", "memoryview", "In", "Out", "_ih", "_oh", "_dh",
}
RISKY_ATTRIBUTES = {
    "sys", "os", "builtins", "gc", "ctypes", "inspect", "importlib", "subprocess", "threading", "signal", "modules",
    "overrides", "library", "testing", "utils", "ops", "_getframe", "settrace", "setprofile", "f_globals", "f_locals",
    "f_back", "gi_frame", "tb_frame", "set_custom_exc", "input_transformers_post", "events", "register",
}
SAFE_DUNDERS = {"__init__", "__name__", "__class__", "__doc__", "__len__", "__repr__", "__str__", "__call__",
                "__getitem__", "__iter__", "__post_init__"}


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[str] = []

    def flag(self, what: str) -> None:
        self.found.append(what)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in SAFE_IMPORTS:
                self.flag(f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or (node.module or "") not in SAFE_IMPORTS:
            self.flag(f"from {'.' * node.level}{node.module or ''} import ...")
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if alias.name.startswith("_") or (full not in SAFE_IMPORTS and alias.name in RISKY_ATTRIBUTES):
                self.flag(f"from {node.module} import {alias.name}")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in RISKY_NAMES and not getattr(node, "harmless", False):
            self.flag(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if isinstance(node.ctx, (ast.Store, ast.Del)) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            self.flag(f"assignment to {ast.unparse(node)}")
        if attr.startswith("__") and attr.endswith("__") and (attr not in SAFE_DUNDERS or isinstance(node.ctx, ast.Store)):
            self.flag(ast.unparse(node))
        elif attr.startswith("_") and not attr.startswith("__"):
            self.flag(ast.unparse(node))
        elif attr in RISKY_ATTRIBUTES or attr.startswith("register_module") or attr.startswith("set_default"):
            self.flag(ast.unparse(node))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            text = ast.unparse(base)
            if text.rsplit(".", 1)[-1] in {"Tensor", "Parameter", "TorchFunctionMode", "TorchDispatchMode", "type",
                                           "ModuleType", "Function"}:
                self.flag(f"class {node.name}({text})")
        if node.keywords:
            self.flag(f"class {node.name} with keywords")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name.startswith("__") and node.name.endswith("__") and node.name not in SAFE_DUNDERS:
            self.flag(f"def {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3:
            self.flag("type(name, bases, namespace)")
        if (isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                and not node.args[1].value.startswith("_") and node.args[1].value not in RISKY_ATTRIBUTES):
            node.func.harmless = True  # getattr(x, "dtype", default): reading a plain attribute
        self.generic_visit(node)


def python_source(source: str) -> str:
    """A cell's source as Python (IPython's magics and shell escapes become ``get_ipython()`` calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - the raw source is scanned instead
        return source


# CPython 3.11 counts the depth of its AST conversion in state shared by all threads
# (python/cpython#106905): two grading threads parsing at once can fail with
# "SystemError: AST constructor recursion depth mismatch". Parsing is quick; it takes turns.
_PARSE_LOCK = threading.Lock()


def parse_cell(source: str) -> ast.Module:
    """The syntax tree of a code cell's source (magics included); raises ``SyntaxError``."""
    text = python_source(source)
    with _PARSE_LOCK:
        return ast.parse(text)


def scan(notebook: NotebookNode, release: NotebookNode) -> list[str]:
    """What in the student's code could tamper with the checks: ``["cell 7: import sys", ...]``."""
    trusted = {c.source.strip() for c in release.cells if c.cell_type == "code"}
    findings = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or cell.source.strip() in trusted or _locked(cell):
            continue
        try:
            tree = parse_cell(cell.source)
        except SyntaxError:
            continue  # a cell that does not parse runs nothing
        scanner = _Scanner()
        scanner.visit(tree)
        where = _meta(cell).get("grade_id") or f"cell {index + 1}"
        findings += [f"{where}: {what}" for what in dict.fromkeys(scanner.found)]
    return findings


# -- the re-check --------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The re-check's result for one test cell."""

    ok: bool
    reason: str


RUNTIME_ERRORS = {"KernelDied", "CellTimeoutError", "NotRun"}


def recheck(notebook: NotebookNode, assignment: str, root: Path, cell_timeout: int, timeout: float
            ) -> tuple[dict[str, Verdict], str]:
    """Run ``notebook`` (nbgrader's graded copy, hidden tests included) again in the sandbox.

    Returns a verdict per test cell that the re-check reached, and a problem with the
    re-check itself ("" when it ran to the end).
    """
    cells, preload = [], {"autograder.errors", "autograder.compare", "autograder.guard", "autograder.diagnosis",
                          "autograder.student", "autograder.verify", "autograder.inputs"}
    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if any(o.get("output_type") == "error" and o.get("ename") in RUNTIME_ERRORS for o in cell.get("outputs", [])):
            continue  # it crashed or hung nbgrader's kernel and scored 0 there: left out, as nbgrader's restart did
        if _meta(cell).get("grade") and not _meta(cell).get("solution"):
            cells.append({"kind": "test", "grade_id": _meta(cell)["grade_id"], "source": cell.source})
            tree = parse_cell(cell.source)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autograder"):
                    preload.add(node.module)
                elif isinstance(node, ast.Import):
                    preload.update(a.name for a in node.names if a.name.startswith("autograder"))
        else:
            cells.append({"kind": "code", "source": cell.source})
    nonce = secrets.token_hex(16)
    spec = {"nonce": nonce, "cells": cells, "preload": sorted(preload), "cell_timeout": cell_timeout}
    hidden = sandbox.hidden_modules_for(assignment, root) | {
        m.split(".")[2] for m in preload if m.startswith("autograder.hidden.") and m.count(".") >= 2}
    pipeline = sandbox.PACKAGE / "pipeline"
    code, out, err = sandbox.run(
        [sys.executable, "-m", "autograder.pipeline.recheck"],
        stdin=json.dumps(spec).encode(),
        timeout=timeout,
        hidden=sandbox.hidden_modules_for("", None) | hidden,
        extra_files=[pipeline / "__init__.py", pipeline / "recheck.py"],
    )
    verdicts: dict[str, Verdict] = {}
    done = False
    for line in out.decode(errors="replace").splitlines():
        if not line.startswith(nonce + " "):
            continue
        record = json.loads(line[len(nonce) + 1:])
        if record.get("done"):
            done = True
        elif "grade_id" in record and record["grade_id"] not in verdicts:
            verdicts[record["grade_id"]] = Verdict(bool(record["ok"]), str(record.get("reason", "")))
    if done:
        problem = ""
    elif code is None:
        problem = f"the re-run of your notebook took longer than {timeout:.0f} s and was stopped"
    else:
        problem = f"the re-run of your notebook stopped early ({sandbox_exit(code)})"
    return verdicts, problem


def sandbox_exit(code: int) -> str:
    from .execute import describe_exit

    return describe_exit(code)


def reconcile(db_url: str, assignment: str, student: str, notebook_name: str, notebook: NotebookNode,
              verdicts: dict[str, Verdict], problem: str) -> tuple[list[Note], list[str]]:
    """Zero, in the gradebook, each test cell nbgrader passed that the re-check did not confirm.

    Returns the notes for the student and the grade ids set to zero; the notebook's test
    cells get an error output saying why.
    """
    from nbgrader.api import Gradebook

    notes: list[Note] = []
    zeroed: list[str] = []
    with Gradebook(db_url) as gb:
        submission = gb.find_submission_notebook(notebook_name, assignment, student)
        for grade in submission.grades:
            if grade.auto_score is None or grade.auto_score <= 0 or grade.cell_type != "code":
                continue
            verdict = verdicts.get(grade.name)
            if verdict is not None and verdict.ok:
                continue
            reason = verdict.reason if verdict is not None else (problem or "it was not reached")
            grade.auto_score = 0.0
            zeroed.append(grade.name)
            message = (f"This test passed in nbgrader's run but failed when the notebook was run again where your "
                       f"code cannot change the checks: {reason}. It scores 0.")
            for cell in notebook.cells:
                if _meta(cell).get("grade_id") == grade.name:
                    cell.outputs.append(nbformat.v4.new_output(
                        "error", ename=INTEGRITY, evalue=message, traceback=[f"{INTEGRITY}: {message}"]))
        gb.db.commit()
    if zeroed:
        first = next((v.reason for g, v in verdicts.items() if not v.ok), problem)
        notes.append(Note("tampering", f"{len(zeroed)} test cell(s) ({', '.join(zeroed)}) passed in the first run "
                                       f"but not in the protected re-run ({first}); they score 0."))
    return notes, zeroed


# -- notes on disk and in the feedback -----------------------------------------------------


def runtime_notes(notebook: NotebookNode) -> list[Note]:
    """Notes for the cells that crashed, hung, were skipped or flooded their output."""
    notes = []
    for index, cell in enumerate(notebook.cells):
        where = _meta(cell).get("grade_id") or f"cell {index + 1}"
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") in RUNTIME_ERRORS | {INTEGRITY}:
                if out.get("ename") != INTEGRITY:
                    notes.append(Note(out["ename"], f"{where}: {out['evalue']}"))
            elif out.get("output_type") == "stream" and "[output cut:" in out.get("text", ""):
                notes.append(Note("output", f"{where}: its output was cut (too long)."))
    return _unique(notes)


def write_notes(folder: Path, notes: list[Note]) -> None:
    """Keep ``notes`` with the graded submission (never following a link planted there)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NOTES_FILE
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as handle:
        json.dump([asdict(n) for n in notes], handle, indent=1)


def read_notes(folder: Path) -> list[Note]:
    """The notes kept by :func:`write_notes` (none when there are none)."""
    path = folder / NOTES_FILE
    if not path.is_file() or path.is_symlink():
        return []
    return [Note(**n) for n in json.loads(path.read_text())]


def notes_html(notes: list[Note]) -> str:
    """The notes as an HTML block for the top of the feedback."""
    import html

    items = "".join(f"<li>{html.escape(n.message)}</li>" for n in notes)
    return (
        '<div class="grading-notes" style="border:2px solid #c60;padding:0.5em 1em;margin:1em;">'
        f"<h2>How this submission was graded</h2><ul>{items}</ul></div>"
    )
