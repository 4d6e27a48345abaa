"""The student bundle holds no solution code, no hidden test and no mistake catalogue."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import tomllib
import zipfile

import pytest

import autograder
from autograder.course.bundle import write_bundle
from autograder.course.repository import assignments, module_name
from autograder.course.student_versions import inside
from autograder.grader.variation import source_of

from ..notebook_code import ROOT, answer_cells

#: One worker runs this module: its module-scoped fixtures are built once (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("bundle")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    path = write_bundle(tmp_path_factory.mktemp("bundle") / "course.zip")
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name).decode() for name in archive.namelist()}


def solution_regions(assignment):
    """The stripped, non-empty lines of every solution region of the assignment."""
    regions = []
    for source in answer_cells(assignment).values():
        inside = False
        for line in source.splitlines():
            if "### BEGIN SOLUTION" in line:
                inside, region = True, []
            elif "### END SOLUTION" in line:
                inside = False
                regions.append(region)
            elif inside and line.strip():
                region.append(line.strip())
    return regions


def flatten(bundle):
    return "\n".join(ln.strip() for text in bundle.values() for ln in text.splitlines() if ln.strip())


def test_bundle_has_the_notebooks_and_public_checks(bundle):
    names = set(bundle)
    for assignment in assignments():
        assert f"attention-course/{assignment}.ipynb" in names
        assert f"attention-course/autograder/checks/{module_name(assignment)}.py" in names
    assert not [n for n in names if n.split("/")[1:2] == ["autograder"] and n.split("/")[2] in autograder.INSTRUCTOR_ONLY]


@pytest.mark.parametrize("marker", ["BEGIN HIDDEN TESTS", "BEGIN SOLUTION", "autograder.hidden", "MISTAKES"])
def test_no_hidden_marker(bundle, marker):
    leaks = [name for name, text in bundle.items() if marker in text]
    assert not leaks, f"{marker!r} found in {leaks}"


@pytest.mark.parametrize("assignment", assignments())
def test_no_solution_code(bundle, assignment):
    """No whole solution region, and no long (distinctive) solution line, is in the bundle."""
    flat = flatten(bundle)
    for region in solution_regions(assignment):
        assert "\n".join(region) not in flat, f"a solution of {assignment} is in the bundle"
        long_lines = [line for line in region if len(line) > 40 and not line.startswith(("#", "raise ValueError"))]
        leaks = [line for line in long_lines if line in flat]
        assert not leaks, f"solution lines of {assignment} found in the bundle: {leaks[:5]}"


@pytest.mark.parametrize("assignment", assignments())
def test_no_mistake_code(bundle, assignment):
    flat = flatten(bundle)
    mistakes = importlib.import_module(f"autograder.hidden.{module_name(assignment)}").MISTAKES
    for catalogue in mistakes.values():
        for mistake in catalogue:
            variation = getattr(mistake.fn, "__variation__", None)  # a variant: its code, and its reference's as written
            for code in (source_of(mistake.fn), *([inspect.getsource(variation.reference)] if variation else [])):
                body = "\n".join(ln.strip() for ln in code.splitlines()[1:] if ln.strip())
                assert body not in flat, f"the code of the mistake {mistake.name!r} is in the bundle"


def test_bundle_sets_itself_up(bundle):
    """A README with the one setup command, nbgrader in the requirements, and the setup script itself."""
    readme = bundle["attention-course/README.md"]
    for step in ("python3 course.py", "Validate", "Submit", "Restart Kernel and Run All Cells", "01_soft_lookup"):
        assert step in readme, step
    requirements = bundle["attention-course/requirements.txt"].split()
    pins = {d.split("==")[0]: d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    # The notebooks' packages in their ranges (the grader's pins inside them), the tools pinned as the grader's.
    assert requirements == ["torch>=2.5,<2.16", "numpy>=1.26,<2.5", "matplotlib>=3.9,<3.12",
                            pins["jupyterlab"], pins["nbgrader"]]
    for package in ("torch", "numpy", "matplotlib"):
        assert inside(package, pins[package].split("==")[1]), f"the grader's {pins[package]} is outside the range"
    compile(bundle["attention-course/course.py"], "course.py", "exec")
    compile(bundle["attention-course/nbgrader_config.py"], "nbgrader_config.py", "exec")


def test_every_notebook_starts_with_the_setup_cell(bundle):
    """The set-up cell first, then the notebook as released: nothing else changed."""
    for assignment in assignments():
        bundled = json.loads(bundle[f"attention-course/{assignment}.ipynb"])["cells"]
        released = json.loads((ROOT / "notebooks" / f"{assignment}.ipynb").read_text())["cells"]
        assert bundled[0]["cell_type"] == "code" and "".join(bundled[0]["source"]).startswith("# Set-up:")
        assert [c["source"] for c in bundled[1:]] == [c["source"] for c in released]


def test_a_published_course_links_each_notebook_to_colab(tmp_path):
    """With StudentBundle.notebooks_url set: an Open-in-Colab line on top, the set-up cell fetching the archive."""
    import shutil

    for name in ("nbgrader_config.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "source" / "01_soft_lookup", tmp_path / "source" / "01_soft_lookup")
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "01_soft_lookup.ipynb", tmp_path / "notebooks")
    with open(tmp_path / "nbgrader_config.py", "a") as config:
        config.write('\nc.StudentBundle.notebooks_url = "https://github.com/someone/attention/blob/v1/course"\n')
    with zipfile.ZipFile(write_bundle(tmp_path / "course.zip", root=tmp_path)) as archive:
        cells = json.loads(archive.read("attention-course/01_soft_lookup.ipynb"))["cells"]
        readme = archive.read("attention-course/README.md").decode()
    colab = "https://colab.research.google.com/github/someone/attention/blob/v1/course/01_soft_lookup.ipynb"
    assert cells[0]["cell_type"] == "markdown" and f"[Open in Colab]({colab})" in "".join(cells[0]["source"])
    assert "url='https://github.com/someone/attention/archive/v1.zip'" in "".join(cells[1]["source"])
    assert f"[`01_soft_lookup`]({colab})" in readme


def test_student_lab_has_no_instructor_tools(bundle):
    page = json.loads(bundle["attention-course/jupyter/labconfig/page_config.json"])["disabledExtensions"]
    assert {k for k, v in page.items() if v} == {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                                                 "@jupyter/nbgrader:course-list"}
    server = json.loads(bundle["attention-course/jupyter/jupyter_server_config.json"])
    assert server["ServerApp"]["jpserver_extensions"] == {"nbgrader.server_extensions.formgrader": False,
                                                          "nbgrader.server_extensions.course_list": False}
    assert "white-space: pre-wrap" in bundle["attention-course/jupyter/custom/custom.css"]


def test_student_config_matches_the_course(bundle, tmp_path):
    """The bundle's nbgrader settings: the instructor's validator width and cell limit, an exchange that exists."""
    from autograder.course.settings import course_config as load_config

    (tmp_path / "nbgrader_config.py").write_text(bundle["attention-course/nbgrader_config.py"])
    student, instructor = load_config(tmp_path), load_config(ROOT)
    assert student.Validator.width == instructor.Validator.width
    assert student.Execute.timeout == instructor.Execute.timeout
    assert student.CourseDirectory.course_id == instructor.CourseDirectory.course_id
    assert student.KernelManager.transport_encryption == "auto"
    assert (tmp_path / "exchange").is_dir()


def _older_python() -> str | None:
    """A Python 3 older than 3.11 on this machine (PATH, or pyenv's versions), if there is one."""
    import glob
    import shutil
    import subprocess

    found = [shutil.which(f"python3.{minor}") for minor in range(6, 11)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[6-9].*/bin/python3"))
                    + glob.glob(os.path.expanduser("~/.pyenv/versions/3.10.*/bin/python3")))
    for python in filter(None, found):
        probe = subprocess.run([python, "-c", "import sys; print(sys.version_info < (3, 11))"], capture_output=True, text=True)
        if probe.stdout.strip() == "True":
            return python
    return None


def test_course_py_refuses_an_older_python_in_one_line(bundle, tmp_path):
    """Python 3.10 or older: one line that says which versions and what to run, not a traceback."""
    import subprocess

    python = _older_python()
    if python is None:
        pytest.skip("no Python older than 3.11 on this machine to try course.py with")
    (tmp_path / "course.py").write_text(bundle["attention-course/course.py"])
    done = subprocess.run([python, "course.py", "setup"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and not (tmp_path / ".venv").exists()
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "needs Python 3.11 to 3.14" in done.stderr and "Traceback" not in done.stderr
