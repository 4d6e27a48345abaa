"""``make gradescope``: a Gradescope autograder per notebook, and what it runs for each submission.

**Building** (:func:`build`, ``make gradescope``) writes ``dist/gradescope/<NN_name>.zip`` in the
format Gradescope documents for autograders (gradescope-autograders.readthedocs.io, "Autograder
Specifications"): at the root of the zip

- ``setup.sh``: run once, as root, when Gradescope builds the image: the image's own Python when it
  is 3.11 to 3.14 (else 3.13 from the deadsnakes archive), bubblewrap and the exact pins of
  ``pyproject.toml`` that grading needs, in ``/autograder/venv``;
- ``run_autograder``: run for each submission; it calls :func:`run`;
- ``autograder/``: the whole package, the hidden checks and the grading tools included (Gradescope
  never shows ``/autograder/source`` to students; the student bundle never holds them);
- ``course/``: what nbgrader needs to grade the assignment: ``nbgrader_config.py``, the source
  notebook (hidden tests included), the release generated from it and a gradebook in which the
  assignment is recorded (both made by ``nbgrader generate_assignment`` when the zip is built);
- ``gradescope.json``: the assignment, the visibility of the hidden checks' results and the
  time limit of a notebook.

**Grading one submission** (:func:`run`, Gradescope's ``run_autograder``), as root:

1. a private course is laid out in ``<root>/grading/`` (mode 0700: the student's code, which runs
   in the sandbox or as ``nobody``, can neither read nor write it) and the submitted files are put
   in it as ``submitted/student/<NN_name>/``;
2. :func:`autograder.grading.grade.autograde` grades it exactly as ``make autograde`` does: the
   student's cells in a bubblewrap sandbox where one can be made, else with the resource limits
   only and as ``nobody`` (a container that forbids namespaces); it refuses where the student's
   code would run with the grader's rights;
3. once nbgrader and the kernel are gone, the scores are read from the gradebook (a check's
   partial credit included: such a test's ``status`` is ``failed``, ``passed`` being full points)
   and the checks' messages from the graded notebook (a test cell's outputs, never its source), and
   ``results.json`` is written: one test per graded cell, whose ``output`` lists each case of its
   checks, passed or failed with its message (:mod:`.case_results`), the total, and the grading
   notes as the top-level ``output``. It is written to a new file that then replaces ``results.json`` (a file
   or link planted there is replaced, never followed). A submission that could not be graded
   (nbgrader failed, the time ran out) gets no ``results.json`` at all: Gradescope then says the
   autograder failed and the instructor grades it again, as ``make autograde`` lists it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .. import INSTRUCTOR_ONLY
from ..course.repository import ROOT, assignments, distribution_files, nbgrader, pins
from ..course.settings import Settings
from ..engine import notes as grading_notes
from ..engine import sandbox
from ..engine.judge import case_record
from . import grade
from .case_results import case_line, is_test_cell, read_judged_cell

#: Gradescope's folder; AUTOGRADER_GRADESCOPE_ROOT moves it (the tests use a temporary one).
GRADESCOPE_ROOT = Path("/autograder")
ROOT_VARIABLE = "AUTOGRADER_GRADESCOPE_ROOT"
#: Where the two scripts Gradescope needs are kept (copied to the root of each zip).
FILES = Path(__file__).with_name("gradescope_files")
SCRIPTS = ("setup.sh", "run_autograder")
CONFIG = "gradescope.json"
#: Pins of pyproject.toml that grading does not need (the developer's tools); setup.sh installs all the others.
NOT_FOR_GRADING = ("nbval", "pytest", "pytest-xdist", "ruff", "psycopg2-binary", "jupyter-server-mathjax", "playwright",
                   "dask", "distributed", "copydetect", "jupyterhub", "sphinx", "myst-parser")
#: Gradescope's visibility settings (its specification, "Controlling Test Case Visibility").
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
HIDDEN_VISIBILITY = "after_published"
#: What the top-level output tells the student about the hidden checks' results, per visibility.
WHEN_SHOWN = {
    "hidden": "The hidden checks' results are shown to the instructor only, and Gradescope shows no total.",
    "after_due_date": "The hidden checks' results are shown after the due date; until then Gradescope shows no total.",
    "after_published": ("The hidden checks' results are shown when the grades are published; until then Gradescope "
                        "shows no total."),
}
#: Seconds a notebook may take: below Gradescope's default limit of 10 minutes, so results are written.
NOTEBOOK_TIMEOUT = 420
#: The student id of the one submission in the private course.
STUDENT = "student"
RESULTS = "results.json"
#: Longest output of one test in results.json (a check's message is far shorter).
MAX_OUTPUT = 20_000
HIDDEN_MARKER = "BEGIN HIDDEN TESTS"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


# -- building the zip ----------------------------------------------------------------------


def grading_pins(root: Path = ROOT) -> list[str]:
    """The exact pins of pyproject.toml that grading needs (``torch==2.13.0``, ...), in its order."""
    return [pin for name, pin in pins(root).items() if name not in NOT_FOR_GRADING]


def setup_script(root: Path = ROOT) -> str:
    """``setup.sh`` with :func:`grading_pins` written into its ``pip install``."""
    return (FILES / "setup.sh").read_text().replace("@PINS@", " ".join(f'"{pin}"' for pin in grading_pins(root)))


def course_files(assignment: str, root: Path, work: Path) -> dict[str, Path]:
    """Archive name -> file, for ``course/``: the config, the source, and the release and gradebook made from it in ``work``."""
    shutil.copy(root / "nbgrader_config.py", work / "nbgrader_config.py")
    shutil.copytree(root / "source" / assignment, work / "source" / assignment,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    done = nbgrader("generate_assignment", assignment, "--force", "--log-level=ERROR",
                    f"--db=sqlite:///{work / 'gradebook.db'}", root=work, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {assignment} failed: {done.stderr.strip()[-500:]}")
    files = {"course/nbgrader_config.py": work / "nbgrader_config.py", "course/gradebook.db": work / "gradebook.db"}
    for folder in (work / "source" / assignment, work / "build" / "release" / assignment):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files[f"course/{path.relative_to(work).as_posix()}"] = path
    return files


def package_files(root: Path) -> dict[str, bytes]:
    """Archive name -> content, for the whole ``autograder`` package (hidden checks and grading tools included)
    and the metadata that registers its entry points where it is not installed (:func:`distribution_files`)."""
    package = root / "autograder"
    # the modules, and the package data pyproject.toml ships with them (the mistake catalogues the hidden checks read)
    paths = sorted([*package.rglob("*.py"), *package.glob("hidden/mistakes/*.toml")])
    files = {f"autograder/{p.relative_to(package).as_posix()}": p.read_bytes() for p in paths}
    return {**files, **distribution_files(root)}


def add_file(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    """Write ``data`` to ``archive`` as ``name``: readable by all (the sandbox user reads the package), a fixed date."""
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build_one(assignment: str, output: Path, root: Path = ROOT, hidden_visibility: str = HIDDEN_VISIBILITY,
              notebook_timeout: int = NOTEBOOK_TIMEOUT) -> Path:
    """Write the Gradescope autograder of ``assignment`` to ``output`` (a zip) and return its path."""
    if hidden_visibility not in VISIBILITIES:
        raise ValueError(f"hidden visibility must be one of {', '.join(VISIBILITIES)}, not {hidden_visibility!r}")
    config = {"assignment": assignment, "hidden_visibility": hidden_visibility, "notebook_timeout": notebook_timeout}
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gradescope-build-") as work:
        course = course_files(assignment, root, Path(work))
        with zipfile.ZipFile(output, "w") as archive:
            add_file(archive, "setup.sh", setup_script(root).encode(), executable=True)
            add_file(archive, "run_autograder", (FILES / "run_autograder").read_bytes(), executable=True)
            add_file(archive, CONFIG, (json.dumps(config, indent=1) + "\n").encode())
            for name, data in {**package_files(root), **{n: p.read_bytes() for n, p in course.items()}}.items():
                add_file(archive, name, data)
    return output


def build(names: list[str] | None = None, folder: Path | None = None, root: Path = ROOT,
          hidden_visibility: str = HIDDEN_VISIBILITY, notebook_timeout: int = NOTEBOOK_TIMEOUT) -> list[Path]:
    """``dist/gradescope/<NN_name>.zip`` for each named assignment (all when none); returns the zips."""
    folder = folder or root / "dist" / "gradescope"
    return [build_one(a, folder / f"{a}.zip", root, hidden_visibility, notebook_timeout) for a in names or assignments(root)]


# -- grading one submission ----------------------------------------------------------------


@dataclass
class Cell:
    """A graded cell of the assignment, as results.json names it."""

    grade_id: str
    exercise: str
    hidden: bool
    number: str


def graded_cells(source: nbformat.NotebookNode) -> list[Cell]:
    """The graded cells of a source notebook in order, each with its exercise and whether it holds hidden tests."""
    cells: list[Cell] = []
    exercise, order, count = "", [], 0
    for cell in source.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if meta.get("solution") and meta.get("grade_id"):
            exercise, count = meta["grade_id"], 0
            order.append(exercise)
        elif meta.get("grade") and meta.get("grade_id"):
            gid = meta["grade_id"]
            name = exercise or gid.removeprefix("test_").removesuffix("_hidden")
            count += 1
            cells.append(Cell(gid, name, HIDDEN_MARKER in cell.source, f"{len(order) or 1}.{count}"))
    return cells


def _private_folder(path: Path) -> Path:
    """``path`` made anew, empty, owned by the grader and closed to everyone else."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


def _submitted_folder(submission: Path) -> tuple[Path, list[str]]:
    """The folder of the submission that holds its notebooks (a zip upload may put them one level down)."""
    if not submission.is_dir() or any(submission.glob("*.ipynb")):
        return submission, []
    found = set()
    for dirpath, dirnames, filenames in os.walk(submission, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != ".ipynb_checkpoints"]
        if any(n.endswith(".ipynb") and not os.path.islink(os.path.join(dirpath, n)) for n in filenames):
            found.add(Path(dirpath))
    if len(found) == 1:
        folder = found.pop()
        return folder, [f"Your notebook was in the folder {folder.relative_to(submission)}; it was graded from there."]
    return submission, []


def prepare(root: Path, config: dict) -> tuple[Path, list[str]]:
    """Lay out the private course in ``<root>/grading`` with the submission in it; returns it and extra notes."""
    course = _private_folder(root / "grading")
    shutil.copytree(root / "source" / "course", course, dirs_exist_ok=True)
    folder, lines = _submitted_folder(root / "submission")
    target = course / "submitted" / STUDENT / config["assignment"]
    if folder.is_dir():
        shutil.copytree(folder, target, symlinks=True, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    else:
        target.mkdir(parents=True)  # nothing submitted: graded as a submission without a notebook
    return course, lines


def settings(course: Path, config: dict) -> Settings:
    """The private ``course``'s settings, read once for the run: one submission at a time, in the sandbox where one
    can be made; else with the limits only, if the student's code then runs as another user.

    Raises :class:`~autograder.grading.grade.SandboxUnavailable` where the student's code would run
    with the grader's own rights (it could then change the checks, the gradebook and results.json).
    """
    flags = {"Grading.workers": 1, "ResilientExecute.notebook_timeout": int(config.get("notebook_timeout",
                                                                                      NOTEBOOK_TIMEOUT))}
    made = Settings.load(course, flags)
    wanted = grade.bubblewrap(made)
    if sandbox.mode(wanted) != "limits only":
        return made
    if sandbox.sandbox_owner(wanted) is not None:
        return Settings.load(course, {**flags, "Grading.sandbox": False})
    raise grade.SandboxUnavailable(
        "No sandbox can be made here and the student's code would run as the grader's own user "
        f"({sandbox.why_not(wanted)}); run the autograder as root, or install bubblewrap.")


def _shown(text: str) -> str:
    """``text`` without colours, cut at :data:`MAX_OUTPUT` characters, inert (its lines kept)."""
    text = _ANSI.sub("", text).strip()
    if len(text) > MAX_OUTPUT:
        text = text[:MAX_OUTPUT] + f"\n[output cut: longer than {MAX_OUTPUT} characters]"
    return grading_notes.inert_text(text, lines=True)


def cell_output(cell: nbformat.NotebookNode, errors: bool = True) -> str:
    """What a graded cell showed: its printed text and (``errors``) its error's message, never its source or a
    traceback."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(str(out.get("text", "")))
        elif out.get("output_type") == "error" and errors:
            parts.append(f"{out.get('ename', 'Error')}: {out.get('evalue', '')}\n")
    return _shown("".join(parts))


def case_output(cell: nbformat.NotebookNode) -> str:
    """A test's ``output`` in results.json: each case of its checks (passed, or failed with its message and the
    mistakes it fits), then what was printed while they ran. A cell without the grader's record of its cases
    (a visible check) is one case: :func:`cell_output`, its printed text and its error's message."""
    if not is_test_cell(cell) or case_record(cell) is None:
        return cell_output(cell)
    judged = read_judged_cell(cell)
    lines = [f"No points for these checks: {judged.stopped}"] if judged.stopped else []
    if judged.all_or_nothing:
        lines.append("These checks count all or nothing: every case must pass.")
    lines += [case_line(case) for case in judged.cases]
    printed = cell_output(cell, errors=False)
    return _shown("\n".join(lines) + (f"\n\nPrinted while the checks ran:\n{printed}" if printed else ""))


def results(private: Settings, config: dict, seconds: float, protection: str, extra: list[str] | None = None) -> dict:
    """results.json in Gradescope's format, from the gradebook and the graded notebooks of the private course."""
    from nbgrader.api import Gradebook

    course = private.root
    assignment = config["assignment"]
    visibility = config.get("hidden_visibility", HIDDEN_VISIBILITY)
    folder = course / "autograded" / STUDENT / assignment
    tests = []
    with Gradebook(grade.db_url(private)) as gb:
        for source_path in sorted((course / "source" / assignment).glob("*.ipynb")):
            name = source_path.stem
            scores = {g.name: g for g in gb.find_submission_notebook(assignment, name, STUDENT).grades}
            graded = folder / f"{name}.ipynb"
            outputs = {}
            if graded.is_file():
                for cell in nbformat.read(graded, as_version=4).cells:
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if gid:
                        outputs[gid] = case_output(cell)
            for cell in graded_cells(nbformat.read(source_path, as_version=4)):
                entry = scores[cell.grade_id]
                # The gradebook's score, partial credit included; Gradescope's "passed" is full points only.
                score, max_score = float(entry.score or 0.0), float(entry.max_score or 0.0)
                passed = score >= max_score
                text = outputs.get(cell.grade_id) or ("Passed." if passed else
                                                      "No points: this test did not pass (see the notes above).")
                tests.append({
                    "name": f"{cell.exercise} ({'hidden' if cell.hidden else 'visible'} checks)",
                    "number": cell.number,
                    "score": score,
                    "max_score": max_score,
                    "status": "passed" if passed else "failed",
                    "output": text,
                    "output_format": "text",
                    "visibility": visibility if cell.hidden else "visible",
                    "extra_data": {"grade_id": cell.grade_id, "notebook": name},
                })
    total, possible = sum(t["score"] for t in tests), sum(t["max_score"] for t in tests)
    # One line each, whatever a note quotes (a file or folder name): none can pass for a line of this output.
    messages = [note.message for note in grading_notes.read_notes(folder)] + list(extra or [])
    notes = [grading_notes.inert_text(message) for message in messages]
    lines = [f"{assignment}: {total:g} / {possible:g} points."]
    if any(t["visibility"] != "visible" for t in tests):
        lines.append(WHEN_SHOWN[visibility])
    if notes:
        lines += ["", "How this submission was graded:"] + [f"- {n}" for n in notes]
    lines += ["", f"Protection: {protection}."]
    return {
        "score": total,
        "execution_time": round(seconds),
        "output": grading_notes.inert_text("\n".join(lines), lines=True),
        "output_format": "text",
        "test_output_format": "text",
        "test_name_format": "text",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def write_results(folder: Path, data: dict | None) -> Path:
    """Put ``data`` in ``folder/results.json`` (None: make sure there is none), never through a planted link."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / RESULTS
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    if data is None:
        if target.is_symlink() or target.exists():
            target.unlink()
        return target
    fd, temporary = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, ensure_ascii=False)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)  # replaces a file or link planted at the target; never writes through it
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return target


def _protect(root: Path) -> None:
    """The instructor-only part of the package and the course: the grader's only (as setup.sh leaves them)."""
    for part in [*(f"autograder/{p}" for p in INSTRUCTOR_ONLY), "course"]:
        path = root / "source" / part
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o700)


def run(root: Path) -> int:
    """Grade ``<root>/submission`` and write ``<root>/results/results.json``; the exit code (0: graded)."""
    started = time.monotonic()
    results_folder = root / "results"
    write_results(results_folder, None)  # whatever was there is not this run's
    written = False
    try:
        os.environ.pop("NBGRADER_DB_URL", None)  # always the private course's own gradebook
        config = json.loads((root / "source" / CONFIG).read_text())
        _protect(root)
        course, extra = prepare(root, config)
        private = settings(course, config)
        summary = grade.autograde([config["assignment"]], private, progress=False)
        print(summary)
        if summary.failed or not summary.graded:
            print("run_autograder: this submission could not be graded; no results.json was written (grade it again).")
            return 1
        data = results(private, config, time.monotonic() - started, summary.protection, extra)
        path = write_results(results_folder, data)
        written = True
        print(f"{path}: {data['score']:g} points; graded in {course}")
        return 0
    except (grade.SandboxUnavailable, OSError, RuntimeError, ValueError) as error:
        print(f"run_autograder: could not grade this submission: {error}")
        return 1
    finally:
        if not written:
            write_results(results_folder, None)  # no score rather than a forged or partial one


def doctor(root: Path) -> int:
    """What ``setup.sh`` prints at the end of the image's build: the package found and the sandbox there."""
    config = json.loads((root / "source" / CONFIG).read_text())
    print(f"autograder for {config['assignment']}: package {Path(__file__).resolve().parents[1]}, "
          f"sandbox here: {sandbox.mode()} ({sandbox.why_not() or 'available'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``build [NN_name ...]``, ``run --root ROOT`` (Gradescope's run_autograder) or ``doctor --root ROOT``."""
    parser = argparse.ArgumentParser(prog="python -m autograder.grading.gradescope", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="write dist/gradescope/<NN_name>.zip")
    make.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    make.add_argument("--output", type=Path, default=None, help="folder of the zips (default: dist/gradescope)")
    make.add_argument("--hidden-visibility", default=HIDDEN_VISIBILITY, choices=VISIBILITIES,
                      help="when students see the hidden checks' results (default: %(default)s)")
    make.add_argument("--notebook-timeout", type=int, default=NOTEBOOK_TIMEOUT,
                      help="seconds a notebook may take on Gradescope (default: %(default)s)")
    default_root = Path(os.environ.get(ROOT_VARIABLE) or GRADESCOPE_ROOT)
    for name in ("run", "doctor"):
        sub = commands.add_parser(name)
        sub.add_argument("--root", type=Path, default=default_root, help="Gradescope's folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "build":
        for path in build(args.assignments, args.output, hidden_visibility=args.hidden_visibility,
                          notebook_timeout=args.notebook_timeout):
            print(path)
        return 0
    return run(args.root.resolve()) if args.command == "run" else doctor(args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
