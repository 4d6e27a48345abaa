"""The Gradescope autograder: the zip ``make gradescope`` writes, and its ``run_autograder`` on real submissions.

Gradescope's harness is played as its specification describes it: the zip unpacked into
``<root>/source``, ``run_autograder`` copied to ``<root>/run_autograder``, the student's files in
``<root>/submission``, ``<root>/results`` made beforehand, ``run_autograder`` run as the grader from
``<root>`` (``AUTOGRADER_GRADESCOPE_ROOT=<root>``, this machine's venv as ``AUTOGRADER_PYTHON``) with
its output kept in ``results/stdout``. Every ``results.json`` is validated against
``gradescope_results.schema.json``, written from Gradescope's documentation.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_output

from autograder import INSTRUCTOR_ONLY
from autograder.course import bundle
from autograder.course.repository import module_name
from autograder.course.settings import Settings
from autograder.engine import notes as grading_notes
from autograder.engine import sandbox
from autograder.grading import case_results, gradescope

from ..course_copy import fill, make_course, mistake_source, reference_answers, released
from ..notebook_code import ROOT, nbgrader_meta, source_notebook
from . import case_records

#: One worker runs this module: its module-scoped fixtures are built once (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("gradescope")

ASSIGNMENT = "01_soft_lookup"
SCHEMA = json.loads((Path(__file__).parents[1] / "gradescope_results.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
WRONG_EXERCISE = "scaled_dot_product_attention"


def schema_errors(document: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(document)]


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    return gradescope.build_one(ASSIGNMENT, tmp_path_factory.mktemp("dist") / f"{ASSIGNMENT}.zip")


@pytest.fixture(scope="module")
def unpacked(autograder_zip, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(autograder_zip) as archive:
        archive.extractall(folder)
    return folder


def hidden_code_lines() -> list[str]:
    """Every line of code of the hidden test cells (what must never reach a student)."""
    lines = []
    for cell in source_notebook(ASSIGNMENT).cells:
        if nbgrader_meta(cell).get("grade") and gradescope.HIDDEN_MARKER in cell.source:
            body = cell.source.split(gradescope.HIDDEN_MARKER, 1)[1]
            lines += [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert lines
    return lines


# -- the zip ---------------------------------------------------------------------------------------


def test_zip_has_gradescopes_two_scripts_at_its_root(autograder_zip, unpacked):
    with zipfile.ZipFile(autograder_zip) as archive:
        infos = {i.filename: i for i in archive.infolist()}
    for script in gradescope.SCRIPTS:
        assert script in infos, f"{script} is not at the root of the zip"
        mode = infos[script].external_attr >> 16
        assert mode & 0o111 == 0o111, f"{script} is not executable in the zip ({oct(mode)})"
        assert (unpacked / script).read_text().startswith("#!/usr/bin/env bash\n")
        check = subprocess.run(["bash", "-n", str(unpacked / script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script} is not valid bash: {check.stderr}"


def test_setup_installs_the_pinned_environment(unpacked):
    setup = (unpacked / "setup.sh").read_text()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in pins and '"torch==2.13.0"' in setup
    for pin in pins:
        needed = pin.split("==")[0] not in gradescope.NOT_FOR_GRADING
        assert (f'"{pin}"' in setup) == needed, f"setup.sh {'does not install' if needed else 'installs'} {pin}"
    assert {"nbgrader", "nbclient", "ipykernel", "psutil"} <= {p.split("==")[0] for p in gradescope.grading_pins()}
    assert "apt-get install" in setup and "bubblewrap" in setup and '"$PYTHON" -m venv "$VENV"' in setup


def _pythons(*minors: int) -> dict[int, str]:
    """pyenv's interpreters of these 3.x versions on this machine (skip the test when one is missing)."""
    import glob
    import os

    found = {}
    for minor in minors:
        paths = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
        if not paths:
            pytest.skip(f"no Python 3.{minor} on this machine (pyenv) to choose between")
        found[minor] = paths[-1]
    return found


@pytest.mark.parametrize("image, chosen", [({"python3": 12}, "python3"),  # Ubuntu 24.04: the image's own
                                           ({"python3": 13}, "python3"),  # Debian 13
                                           ({"python3": 10, "python3.12": 12}, "python3.12"),  # 22.04 with one added
                                           ({"python3": 10}, None)])  # 22.04: deadsnakes
def test_setup_uses_the_images_own_python_when_the_course_supports_it(unpacked, tmp_path, image, chosen):
    """setup.sh --which-python on an image whose python3 is 3.10, 3.12 or 3.13: the image's own, else a supported one."""
    import subprocess

    pythons = _pythons(*set(image.values()))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, minor in image.items():
        (bin_dir / name).symlink_to(pythons[minor])
    done = subprocess.run(["/bin/bash", str(unpacked / "setup.sh"), "--which-python"], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)}, timeout=60)  # the image: these Pythons only
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (str(bin_dir / chosen) if chosen else ""), done.stdout


def test_zip_holds_the_whole_package_and_the_course(unpacked):
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autograder").rglob("*.py")}
    shipped = {p.relative_to(unpacked).as_posix() for p in (unpacked / "autograder").rglob("*.py")}
    assert shipped == package
    assert f"autograder/hidden/{module_name(ASSIGNMENT)}.py" in shipped
    source = unpacked / "course" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    release = unpacked / "course" / "build" / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert gradescope.HIDDEN_MARKER in source.read_text()
    assert gradescope.HIDDEN_MARKER not in release.read_text()
    assert release.read_bytes() == (ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb").read_bytes()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{unpacked / 'course' / 'gradebook.db'}") as gb:
        recorded = {g.name for g in gb.find_notebook(ASSIGNMENT, ASSIGNMENT).grade_cells}
    assert recorded == {c.grade_id for c in gradescope.graded_cells(source_notebook(ASSIGNMENT))}
    config = json.loads((unpacked / gradescope.CONFIG).read_text())
    assert config["assignment"] == ASSIGNMENT and config["hidden_visibility"] == "after_published"


def test_the_unpacked_package_registers_its_kernel_provisioner(unpacked):
    """Gradescope puts the package on sys.path, a Dask worker too: no pip install records its entry points.

    The metadata shipped beside it does, or jupyter_client could not find the provisioner the grading
    kernels' spec names, and no submission could be graded.
    """
    from importlib.metadata import distributions

    from autograder.engine.provisioner import NAME, SandboxProvisioner

    found = [ep for d in distributions(path=[str(unpacked)]) for ep in d.entry_points
             if ep.group == "jupyter_client.kernel_provisioners"]
    assert [ep.name for ep in found] == [NAME]
    assert found[0].load() is SandboxProvisioner


def test_hidden_checks_stay_out_of_the_student_bundle():
    private = [name for name in bundle.bundle_files()
               if name.split("/")[1:2] == ["autograder"] and name.split("/")[2] in INSTRUCTOR_ONLY]
    assert not private


def test_build_refuses_an_unknown_visibility(tmp_path):
    with pytest.raises(ValueError, match="after_published"):
        gradescope.build_one(ASSIGNMENT, tmp_path / "x.zip", hidden_visibility="sometimes")


# -- the format ------------------------------------------------------------------------------------


def test_schema_accepts_the_documented_examples_and_rejects_what_gradescope_does_not_read():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    documented = {  # the example of "Output format" in Gradescope's specification, as JSON
        "score": 44.0, "execution_time": 136, "output": "Text relevant to the entire submission",
        "output_format": "simple_format", "test_output_format": "text", "test_name_format": "text",
        "visibility": "after_due_date", "stdout_visibility": "visible", "extra_data": {},
        "tests": [{"score": 2.0, "max_score": 2.0, "status": "passed", "name": "Your name here", "name_format": "text",
                   "number": "1.1", "output": "Giant multiline string", "output_format": "text",
                   "tags": ["tag1", "tag2", "tag3"], "visibility": "visible", "extra_data": {}}],
        "leaderboard": [{"name": "Accuracy", "value": .926}, {"name": "Time", "value": 15.1, "order": "asc"},
                        {"name": "Stars", "value": "*****"}],
    }
    assert schema_errors(documented) == []
    status_only = {"tests": [{"name": "Compilation check", "status": "passed"},
                             {"name": "Test 3", "score": 5, "max_score": 10, "status": "passed"}]}
    assert schema_errors(status_only) == []
    wrong = [
        {"output": "no score and no tests"},
        {"tests": [{"name": "neither a score nor a status"}]},
        {"score": "10"},
        {"score": 1, "visibility": "sometimes"},
        {"score": 1, "visiblity": "visible"},
        {"score": 1, "tests": [{"score": 1, "status": "ok"}]},
        {"score": 1, "output_format": "rtf"},
        {"score": 1, "tests": [{"score": 1, "number": 1.1}]},
        {"score": 1, "leaderboard": [{"name": "Time", "value": 1, "order": "up"}]},
    ]
    for document in wrong:
        assert schema_errors(document), f"the schema accepts {document}"


def test_a_test_output_is_the_message_never_the_source_or_a_traceback():
    cell = new_code_cell("from autograder.hidden.soft_lookup import check\ncheck(secret_reference)")
    cell.outputs = [new_output("stream", name="stdout", text="\x1b[31mprinted\x1b[0m\n"),
                    new_output("error", ename="CheckFailed", evalue="the weights do not sum to 1",
                               traceback=['File "autograder/hidden/soft_lookup.py", line 3, in check'])]
    assert gradescope.cell_output(cell) == "printed\nCheckFailed: the weights do not sum to 1"


def test_a_test_output_steers_no_terminal_and_keeps_its_lines():
    """What a check printed keeps its lines; an escape sequence, a carriage return or a bidi override is shown, not obeyed."""
    cell = new_code_cell("check(fn)")
    cell.outputs = [new_output("stream", name="stdout", text="line one\n\x1b]0;new title\x07\x1b[2Jtwo\rthree \u202eevil\n")]
    text = gradescope.cell_output(cell)
    # colours and other CSI sequences are dropped, as before; the rest is escaped
    assert text == "line one\n\\x1b]0;new title\\x07two\\rthree \\u202eevil", repr(text)


# -- writing results.json --------------------------------------------------------------------------


def test_results_replace_what_was_planted_and_never_follow_a_link(tmp_path):
    results, outside = tmp_path / "results", tmp_path / "elsewhere.json"
    results.mkdir()
    outside.write_text("untouched")
    (results / gradescope.RESULTS).symlink_to(outside)
    real = {"score": 3.0, "tests": []}
    path = gradescope.write_results(results, real)
    assert not path.is_symlink() and json.loads(path.read_text()) == real
    assert outside.read_text() == "untouched"
    path.unlink()
    (results / gradescope.RESULTS).mkdir()
    assert json.loads(gradescope.write_results(results, real).read_text()) == real
    (results / gradescope.RESULTS).write_text('{"score": 999}')
    gradescope.write_results(results, None)  # a run that could not grade leaves no score, forged or not
    assert not (results / gradescope.RESULTS).exists()
    assert sorted(p.name for p in results.iterdir()) == []


# -- run_autograder on real submissions ------------------------------------------------------------

FORGER = r'''
import json as _json, os as _os, subprocess as _subprocess, sys as _sys
_FORGED = _json.dumps({"score": 999, "output": "forged", "tests": []})
_tried = {}
for _path in [RESULTS_PATH, "/autograder/results/results.json", "../results/results.json",
              "results/results.json", "results.json"]:
    try:
        with open(_path, "w") as _file:
            _file.write(_FORGED)
        _tried[_path] = "written"
    except Exception as _error:
        _tried[_path] = type(_error).__name__
print("FORGE " + _json.dumps(_tried))
# A process that keeps forging after the kernel is gone, if it can outlive it.
_LOOP = ("import sys, time\nfor _ in range(600):\n    try:\n        open(sys.argv[1], 'w').write(sys.argv[2])\n"
         "    except OSError:\n        pass\n    time.sleep(0.2)\n")
_subprocess.Popen([_sys.executable, "-c", _LOOP, RESULTS_PATH, _FORGED, MARKER], start_new_session=True,
                  stdout=_subprocess.DEVNULL, stderr=_subprocess.DEVNULL)
'''


def forging_answer(root: Path, marker: str) -> str:
    reference = reference_answers(ASSIGNMENT)["hard_lookup"]
    return reference + "\n" + FORGER.replace("RESULTS_PATH", repr(str(root / "results" / gradescope.RESULTS))).replace(
        "MARKER", repr(marker))


def gradescope_root(tmp: Path, autograder_zip: Path, files: dict[str, nbformat.NotebookNode]) -> Path:
    """A folder laid out as Gradescope lays out /autograder, with ``files`` (path -> notebook) submitted."""
    root = tmp / "autograder"
    for folder in ("source", "submission", "results"):
        (root / folder).mkdir(parents=True)
    with zipfile.ZipFile(autograder_zip) as archive:
        archive.extractall(root / "source")
    for info in zipfile.ZipFile(autograder_zip).infolist():
        os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    for name, notebook in files.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, root / "submission" / name)
    return root


def run_autograder(root: Path, **env: str) -> tuple[int, str]:
    environment = dict(os.environ, AUTOGRADER_GRADESCOPE_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable, **env)
    environment.pop("NBGRADER_DB_URL", None)
    with open(root / "results" / "stdout", "w") as stdout:
        code = subprocess.run([str(root / "run_autograder")], cwd=root, env=environment, stdout=stdout,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=1200).returncode
    return code, (root / "results" / "stdout").read_text()


def nobody_runs_kernels() -> bool:
    """Whether a root grader's kernels can run as nobody here, without bubblewrap (as on Gradescope).

    A kernel is started by an exec from a process already running as nobody, so nobody must be able
    to reach this Python (it cannot where it lives under a folder closed to others, such as /root).
    """
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return False
    code = "import os, sys; os.execv(sys.executable, [sys.executable, '-S', '-c', 'pass'])"
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--"]
    return subprocess.run([*as_nobody, sys.executable, "-S", "-c", code], capture_output=True).returncode == 0


def forgers_alive(marker: str) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in (proc.info["cmdline"] or []):
            alive.append(proc)
    return alive


@pytest.fixture(scope="module")
def graded(autograder_zip, tmp_path_factory):
    """The four submissions, each through run_autograder: student -> (root, exit code, stdout, results.json)."""
    release = nbformat.read(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb", as_version=4)
    reference = reference_answers(ASSIGNMENT)
    mistake = importlib.import_module(f"autograder.hidden.{module_name(ASSIGNMENT)}").MISTAKES[WRONG_EXERCISE][0]
    marker = f"gradescope-forger-{uuid.uuid4().hex}"
    roots = {}
    for student in ("reference", "untouched", "wrong", "forger"):
        tmp = tmp_path_factory.mktemp(student)
        root = tmp / "autograder"
        files = {
            "reference": {f"{ASSIGNMENT}.ipynb": fill(release, reference)},
            # A browser that renames a second download: graded as the assignment's notebook, with a note.
            "untouched": {f"{ASSIGNMENT} (1).ipynb": release},
            # A zip upload whose notebook is one folder down.
            "wrong": {f"hand-in/{ASSIGNMENT}.ipynb": fill(release, dict(reference, **{
                WRONG_EXERCISE: mistake_source(mistake, WRONG_EXERCISE)}))},
            "forger": {f"{ASSIGNMENT}.ipynb": fill(release, dict(reference, hard_lookup=forging_answer(root, marker)))},
        }[student]
        roots[student] = gradescope_root(tmp, autograder_zip, files)
    # Gradescope's container: root, and no namespaces for bubblewrap. Where that can be played here the
    # forger is graded that way (its code runs as nobody, with the file system in view); else in the sandbox.
    envs: dict[str, dict[str, str]] = {s: {} for s in roots}
    if nobody_runs_kernels():
        envs["forger"] = {"AUTOGRADER_SANDBOX": "off"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {s: pool.submit(run_autograder, roots[s], **envs[s]) for s in roots}
        done = {s: f.result() for s, f in runs.items()}
    time.sleep(2)  # time for a surviving forger to write again
    alive = forgers_alive(marker)
    for proc in alive:
        proc.kill()
    out = {}
    for student, (code, stdout) in done.items():
        if code != 0 and "own user" in stdout:
            pytest.skip(f"run_autograder refuses to run student code here: {stdout.strip()[-300:]}")
        assert code == 0, f"run_autograder failed for {student}:\n{stdout}"
        path = roots[student] / "results" / gradescope.RESULTS
        out[student] = (roots[student], stdout, json.loads(path.read_text()))
    out["forgers_alive"] = alive
    out["forger_as_nobody"] = bool(envs["forger"])
    return out


def by_grade_id(results: dict) -> dict[str, dict]:
    return {t["extra_data"]["grade_id"]: t for t in results["tests"]}


def points() -> dict[str, float]:
    return {nbgrader_meta(c)["grade_id"]: float(nbgrader_meta(c)["points"])
            for c in source_notebook(ASSIGNMENT).cells if nbgrader_meta(c).get("grade")}


@pytest.mark.slow
@pytest.mark.parametrize("student", ["reference", "untouched", "wrong", "forger"])
def test_results_follow_gradescopes_format(graded, student):
    root, _, results = graded[student]
    assert schema_errors(results) == []
    cells = gradescope.graded_cells(source_notebook(ASSIGNMENT))
    assert [t["extra_data"]["grade_id"] for t in results["tests"]] == [c.grade_id for c in cells]
    for cell, test in zip(cells, results["tests"]):
        assert test["name"].startswith(cell.exercise)
        assert test["max_score"] == points()[cell.grade_id]
        assert test["visibility"] == ("after_published" if cell.hidden else "visible")
        assert test["status"] == ("passed" if test["score"] == test["max_score"] else "failed")
        assert test["output"].strip()
    assert results["score"] == sum(t["score"] for t in results["tests"])
    text = json.dumps(results)
    for secret in ["BEGIN HIDDEN TESTS", "autograder.hidden", *hidden_code_lines()]:
        assert secret not in text, f"{secret!r} reached results.json"
    written = root / "results" / gradescope.RESULTS
    assert stat.S_ISREG(written.lstat().st_mode) and written.lstat().st_uid == os.geteuid()


@pytest.mark.slow
def test_reference_scores_full_marks(graded):
    _, stdout, results = graded["reference"]
    assert results["score"] == sum(points().values()) > 0
    assert all(t["status"] == "passed" for t in results["tests"])
    assert "graded 1, could not be graded 0" in stdout


@pytest.mark.slow
def test_untouched_scores_zero_and_the_renamed_notebook_is_noted(graded):
    root, _, results = graded["untouched"]
    assert results["score"] == 0
    assert all(t["status"] == "failed" and "NotImplementedError" in t["output"] for t in results["tests"])
    notes = grading_notes.read_notes(root / "grading" / "autograded" / gradescope.STUDENT / ASSIGNMENT)
    assert any(n.kind == "renamed" for n in notes)
    for note in notes:
        assert note.message in results["output"]


@pytest.mark.slow
def test_wrong_answer_loses_its_points_and_names_the_mistake(graded):
    """The hidden checks earn the share of the cases the mistake gets right, as the gradebook holds it, and list them."""
    root, _, results = graded["wrong"]
    mistake = importlib.import_module(f"autograder.hidden.{module_name(ASSIGNMENT)}").MISTAKES[WRONG_EXERCISE][0]
    tests = by_grade_id(results)
    hidden = tests[f"test_{WRONG_EXERCISE}_hidden"]
    assert hidden["score"] < hidden["max_score"] and hidden["status"] == "failed"
    assert mistake.name in hidden["output"]
    notebook = nbformat.read(root / "grading" / "autograded" / gradescope.STUDENT / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                             as_version=4)
    cell = next(c for c in notebook.cells if nbgrader_meta(c).get("grade_id") == f"test_{WRONG_EXERCISE}_hidden")
    judged = case_results.read_judged_cell(cell)
    assert judged.recorded and judged.failed, "the grader wrote no record of the hidden checks' cases"
    for case in judged.cases:  # every case, as the grader's record has it
        assert case_results.case_line(case).split("\n")[0] in hidden["output"], case.name
    others = [t for gid, t in tests.items() if WRONG_EXERCISE not in gid]
    assert others and all(t["status"] == "passed" for t in others)
    assert results["score"] < sum(points().values())
    assert "hand-in" in results["output"]  # graded from the folder the zip upload made


@pytest.mark.slow
def test_hidden_visibility_is_configurable(graded):
    root, _, _ = graded["reference"]
    config = json.loads((root / "source" / gradescope.CONFIG).read_text())
    course = root / "grading"
    for visibility in ("hidden", "after_due_date"):
        results = gradescope.results(Settings.load(course), dict(config, hidden_visibility=visibility), 1.0, "p")
        assert schema_errors(results) == []
        assert {t["visibility"] for t in results["tests"] if t["name"].endswith("(hidden checks)")} == {visibility}
        assert {t["visibility"] for t in results["tests"] if t["name"].endswith("(visible checks)")} == {"visible"}


@pytest.mark.slow
def test_a_note_cannot_pass_for_a_line_of_the_output(graded):
    """A folder name (the notes quote it) with escapes and newlines followed by lines like the output's own."""
    root, _, _ = graded["reference"]
    config = json.loads((root / "source" / gradescope.CONFIG).read_text())
    forged = "Your notebook was in the folder x\x1b]0;t\x07\n- forged note\nProtection: none.\n\x1b[2J"
    output = gradescope.results(Settings.load(root / "grading"), config, 1.0, "p", [forged])["output"]
    lines = output.split("\n")
    assert [line for line in lines if line.startswith("Protection:")] == ["Protection: p."], lines
    assert not [line for line in lines if line.startswith("- forged")], lines
    assert "\x1b" not in output and "x\\x1b]0;t\\x07\\n- forged note\\nProtection: none." in output


@pytest.mark.slow
def test_a_submission_cannot_forge_results(graded):
    root, stdout, results = graded["forger"]
    # right answers, but an answer cell that starts processes and writes files leaves the exercise whose code is
    # read (scaled_dot_product_attention) unverifiable: every other point is earned, none is forged
    unread = {name: p for name, p in points().items() if "scaled_dot_product_attention" in name}
    assert results["score"] == sum(points().values()) - sum(unread.values()) != 999, "the forged score survived"
    assert "Cannot verify scaled_dot_product_attention" in json.dumps(results)
    assert "forged" not in json.dumps(results)
    assert sorted(p.name for p in (root / "results").iterdir()) == [gradescope.RESULTS, "stdout"]
    assert not graded["forgers_alive"], "a process the submission started outlived grading"
    # The kernel itself could not reach the real results folder (the sandbox, or the user nobody).
    notebook = nbformat.read(root / "grading" / "autograded" / gradescope.STUDENT / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                             as_version=4)
    printed = "".join(o.get("text", "") for c in notebook.cells if nbgrader_meta(c).get("grade_id") == "hard_lookup"
                      for o in c.get("outputs", []))
    tried = json.loads(printed.split("FORGE ", 1)[1].splitlines()[0])
    real = str(root / "results" / gradescope.RESULTS)
    if graded["forger_as_nobody"]:
        assert "limits only" in results["output"]
    if graded["forger_as_nobody"] or sandbox.mode() != "limits only":
        assert tried[real] != "written", tried


@pytest.mark.slow
def test_partial_credit_is_the_gradebooks_and_each_test_lists_its_cases(tmp_path):
    """A check right but for one case: its share of the points in results.json, status failed, every case listed."""
    course = make_course(tmp_path, [ASSIGNMENT])
    notebook, scores = case_records.partly_right(released(course, ASSIGNMENT))
    case_records.place(course, ASSIGNMENT, gradescope.STUDENT, notebook, scores)
    results = gradescope.results(Settings.load(course), {"assignment": ASSIGNMENT}, 1.0, "p")
    assert schema_errors(results) == []
    tests = by_grade_id(results)
    partial = tests["test_scaled_dot_product_attention_hidden"]
    assert (partial["score"], partial["max_score"], partial["status"]) == (2.25, 3.0, "failed")
    cases = case_records.SDPA_CASES
    assert partial["output"] == "\n".join([
        *(f"passed  {c['name']}" for c in cases[:3]),
        f"FAILED  {cases[3]['name']}: {cases[3]['message']}", "        The mistake: no scaling",
        "", "Printed while the checks ran:", "printed by the answer"])
    stopped = tests["test_soft_lookup_hidden"]
    assert (stopped["score"], stopped["status"]) == (0.0, "failed")
    assert stopped["output"].startswith(f"No points for these checks: {case_records.STOPPED_ERROR}\npassed  one query\n")
    assert f"FAILED  the error for a bad <mask>: {case_records.HOSTILE}" in stopped["output"]
    # a test cell without a record of cases: its message, as before
    assert tests["test_hard_lookup"]["output"] == case_records.RAISED
    assert tests["test_hard_lookup"]["status"] == "failed"
    full = [t for gid, t in tests.items() if gid not in scores]
    assert full and all(t["status"] == "passed" and t["score"] == t["max_score"] for t in full)
    assert results["score"] == sum(points().values()) - (3 - 2.25) - 2 - 1


def test_the_package_shipped_to_graders_holds_its_package_data():
    """The package that Gradescope's autograder and a cluster's workers run holds every file pyproject.toml ships
    with it as package data (the mistake catalogues): without them the hidden checks cannot be imported there."""
    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    expected = {f"{package.replace('.', '/')}/{p.relative_to(root / package.replace('.', '/')).as_posix()}"
                for package, patterns in data.items() for pattern in patterns
                for p in (root / package.replace(".", "/")).glob(pattern)}
    assert expected, "pyproject.toml ships no package data: this test reads nothing"
    assert expected <= set(gradescope.package_files(root))
