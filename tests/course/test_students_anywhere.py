"""A student anywhere: a notebook opened alone (Colab, Kaggle), another PyTorch, the ranges at both ends.

The Colab-like test makes its environment once (tests/student_env.py: another Python environment,
torch, NumPy and Matplotlib of other releases than the pins installed first, no nbgrader), then
costs a notebook's run. ``make test-versions`` runs every released notebook at both ends of the
ranges (:data:`autograder.course.student_versions.ENDS`); elsewhere those runs skip.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

import nbformat
import pytest

from autograder.course import student_versions
from autograder.course.bundle import TOP, write_bundle
from autograder.course.notebook_setup import notebook_link, package_address
from autograder.course.repository import assignments, module_name
from autograder.grader.diagnosis import MistakeFound, by_id
from autograder.shared.errors import CheckFailed

from ..course_copy import fill, mistake_source, reference_answers
from ..student_env import ENVIRONMENTS, Unavailable, environment, run_notebook

pytestmark = pytest.mark.xdist_group("bundle")

ASKED = set(os.environ.get("COURSE_TEST_VERSIONS", "").replace(",", " ").split())
#: Notebooks known to fail at an end, and why (strict: the day they pass, the test says so).
KNOWN: dict[tuple[str, str], str] = {}

REPORT = ("import json, sys, torch, autograder\n"
          "print(json.dumps({'python': sys.executable, 'torch': torch.__version__, 'autograder': autograder.__file__}))")


@pytest.fixture(scope="module")
def bundle_zip(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("published") / "attention-course.zip")


def student_environment(name: str, build: bool = True):
    try:
        return environment(name, build)
    except Unavailable as why:
        pytest.skip(str(why))


def opened_alone(bundle_zip, folder, assignment: str, answers: dict[str, str]):
    """The bundle's notebook, answered, alone in ``folder`` with the bundle's zip beside it (as uploaded to Colab)."""
    folder.mkdir()
    shutil.copy(bundle_zip, folder / "attention-course.zip")
    with zipfile.ZipFile(bundle_zip) as archive:
        notebook = nbformat.reads(archive.read(f"{TOP}/{assignment}.ipynb").decode(), as_version=4)
    notebook = fill(notebook, answers)
    notebook.cells.append(nbformat.v4.new_code_cell(REPORT))
    path = folder / f"{assignment}.ipynb"
    nbformat.write(notebook, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["colab", "oldest"])
def test_a_notebook_opened_alone_runs_its_checks_with_the_environments_torch(name, bundle_zip, tmp_path):
    """Colab-like: the first cell fetches the checks from the zip beside; references pass, a mistake fails.

    Also in the oldest end's environment (Python 3.12, as Colab's) where make test-versions made it.
    """
    python = student_environment(name, build=name == "colab" or name in ASKED)
    bare = subprocess.run([str(python), "-c", "import autograder"], cwd=tmp_path, capture_output=True)
    assert bare.returncode != 0, "the environment must not have the course's package"
    assert subprocess.run([str(python), "-c", "import nbgrader"], capture_output=True).returncode != 0

    assignment = "01_soft_lookup"
    path = opened_alone(bundle_zip, tmp_path / "content", assignment, reference_answers(assignment))
    done = run_notebook(python, path)
    assert done["error"] is None, done
    seen = json.loads(done["last"])
    assert seen["torch"].split("+")[0] == ENVIRONMENTS[name]["torch"] and seen["python"].startswith(str(python.parent))
    assert seen["autograder"].startswith(str(path.parent / "autograder")), seen

    hidden = importlib.import_module(f"autograder.hidden.{module_name(assignment)}")
    mistake = by_id(hidden.MISTAKES["scaled_dot_product_attention"], "soft_lookup/scaled_dot_product_attention/no-scaling")
    wrong = dict(reference_answers(assignment),
                 scaled_dot_product_attention=mistake_source(mistake, "scaled_dot_product_attention"))
    path = opened_alone(bundle_zip, tmp_path / "wrong", assignment, wrong)
    done = run_notebook(python, path)
    assert done["error"] and done["error"]["ename"] in (CheckFailed.__name__, MistakeFound.__name__), done
    failed = nbformat.read(path, as_version=4).cells[done["error"]["cell"]]
    assert "check_scaled_dot_product_attention(" in failed.source, failed.source  # the exercise's own check


@pytest.mark.slow
def test_the_setup_cell_says_what_to_do_without_the_checks(bundle_zip, tmp_path):
    """Opened alone with no zip beside and no published address: one error that says what to upload."""
    python = student_environment("colab")
    path = opened_alone(bundle_zip, tmp_path / "content", "01_soft_lookup", {})
    (path.parent / "attention-course.zip").unlink()
    done = run_notebook(python, path)
    assert done["error"] == {"ename": "RuntimeError", "cell": 0, "evalue": done["error"]["evalue"]}, done
    assert "upload attention-course.zip" in done["error"]["evalue"]




@pytest.mark.slow
@pytest.mark.parametrize("assignment", assignments())
@pytest.mark.parametrize("end", sorted(student_versions.ENDS))
def test_every_notebook_at_both_ends_of_the_ranges(end, assignment, bundle_zip, tmp_path, request):
    """The bundle's notebook with the reference answers runs, every visible check passing, at ``end``."""
    if end not in ASKED:
        pytest.skip(f"make test-versions runs it (COURSE_TEST_VERSIONS={end}): its environment downloads PyTorch "
                    "once, about 3 GB from PyPI (0.2 GB where PyTorch's CPU index answers)")
    if (end, assignment) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[end, assignment], strict=True))
    python = student_environment(end)
    with zipfile.ZipFile(bundle_zip) as archive:
        archive.extractall(tmp_path)
    path = tmp_path / TOP / f"{assignment}.ipynb"
    notebook = fill(nbformat.read(path, as_version=4), reference_answers(assignment))
    notebook.cells.append(nbformat.v4.new_code_cell(REPORT))
    nbformat.write(notebook, path)
    done = run_notebook(python, path, timeout=1800)
    assert done["error"] is None, done
    assert json.loads(done["last"])["torch"].split("+")[0] == ENVIRONMENTS[end]["torch"]


def test_the_ranges_hold_the_newest_releases_and_each_need():
    """The bundle's requirements are the ranges; each end is inside them; the oldest end is each range's floor."""
    for package in student_versions.PACKAGES:
        oldest, newest = (student_versions.ENDS[end][package] for end in ("oldest", "newest"))
        assert student_versions.inside(package, oldest) and student_versions.inside(package, newest)
        assert student_versions.version_tuple(oldest)[:2] == student_versions.version_tuple(
            student_versions.oldest(package))[:2]
        assert not student_versions.inside(package, "0.1") and not student_versions.inside(package, "99.0")
    assert student_versions.requirement("torch") == "torch>=2.5,<2.16"  # enable_gqa: 2.5


def test_links_and_the_published_zip():
    github = "https://github.com/someone/attention-course/blob/main/notebooks"
    assert notebook_link(github, "01_soft_lookup.ipynb") == \
        "https://colab.research.google.com/github/someone/attention-course/blob/main/notebooks/01_soft_lookup.ipynb"
    assert package_address(github, "") == "https://github.com/someone/attention-course/archive/main.zip"
    assert notebook_link("https://course.example.org/nb", "02_scaling.ipynb") == "https://course.example.org/nb/02_scaling.ipynb"
    assert package_address("https://course.example.org/nb", "") == ""
    assert package_address(github, "https://course.example.org/attention-course.zip").endswith("/attention-course.zip")


def _fake_environment(folder, installed: dict[str, str]):
    """A bare virtual environment whose metadata says ``installed`` (package -> version) is there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next((folder / "lib").glob("python3*/site-packages"))
    for name, version in installed.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def course_folder(bundle_zip, tmp_path_factory):
    folder = tmp_path_factory.mktemp("student")
    with zipfile.ZipFile(bundle_zip) as archive:
        archive.extractall(folder)
    return folder / TOP


def test_course_py_accepts_an_environment_inside_the_ranges(course_folder, tmp_path):
    python = _fake_environment(tmp_path / "env", {"torch": "2.15.0", "numpy": "1.26.4", "matplotlib": "3.8.4"})
    done = subprocess.run([sys.executable, "course.py", "--python", str(python), "setup"], cwd=course_folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "note" not in done.stdout, done.stdout + done.stderr


def test_course_py_names_the_range_an_environment_is_outside(course_folder, tmp_path):
    python = _fake_environment(tmp_path / "env", {"torch": "2.4.1", "numpy": "2.4.6"})
    done = subprocess.run([sys.executable, "course.py", "--python", str(python), "setup"], cwd=course_folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch 2.4.1 (the course runs with torch>=2.5,<2.16)" in done.stdout, done.stdout
    assert "matplotlib missing (the course runs with matplotlib>=3.8,<3.12)" in done.stdout
    assert "numpy" not in done.stdout


def test_validate_says_it_needs_nbgrader(course_folder, tmp_path):
    python = _fake_environment(tmp_path / "env", {"torch": "2.15.0", "numpy": "2.4.6", "matplotlib": "3.11.2"})
    done = subprocess.run([sys.executable, "course.py", "--python", str(python), "validate", "01_soft_lookup.ipynb"],
                          cwd=course_folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "validate needs nbgrader" in done.stdout and "pip install nbgrader==" in done.stdout, done.stdout


@pytest.mark.slow
def test_course_py_cpu_asks_pytorchs_cpu_index_and_says_when_it_cannot(bundle_zip, tmp_path):
    """`python3 course.py --cpu` on Linux installs torch from PyTorch's CPU index; offline, one clear line, no torch."""
    if not sys.platform.startswith("linux"):
        pytest.skip("--cpu changes what is installed on Linux only")
    with zipfile.ZipFile(bundle_zip) as archive:
        archive.extractall(tmp_path)
    folder = tmp_path / TOP
    # No index and no local wheels: what a student without a network meets, made sure on any machine.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "no-wheels"), PIP_CONFIG_FILE=os.devnull)
    done = subprocess.run([sys.executable, "course.py", "--cpu", "setup"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "installing PyTorch's CPU build from https://download.pytorch.org/whl/cpu" in done.stdout, done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("could not install PyTorch from https://download.pytorch.org/whl/cpu")
    assert "Traceback" not in done.stderr
    venv = folder / ".venv" / "bin" / "python"
    assert subprocess.run([venv, "-c", "import torch"], capture_output=True).returncode != 0
    assert not (folder / ".venv" / ".installed").exists()


def test_the_setup_cell_names_a_release_outside_the_ranges(course_folder, tmp_path):
    """In an environment with torch 2.4.1 the set-up cell says which range; inside them it prints nothing."""
    cell = "".join(json.loads((course_folder / "01_soft_lookup.ipynb").read_text())["cells"][0]["source"])
    for installed, said in (({"torch": "2.4.1", "numpy": "2.4.6", "matplotlib": "3.11.2"},
                             "note: this course runs with torch >= 2.5, < 2.16; this is 2.4.1\n"),
                            ({"torch": "2.15.0+cpu", "numpy": "1.26.4", "matplotlib": "3.8.4"}, "")):
        python = _fake_environment(tmp_path / installed["torch"], installed)
        done = subprocess.run([python, "-c", cell], cwd=course_folder, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == said, done.stdout + done.stderr


@pytest.mark.slow
def test_a_notebook_from_colab_is_graded_in_full(bundle_zip, tmp_path):
    """What a Colab student hands in (the bundle's notebook, its set-up cell run there) earns every point."""
    from nbgrader.api import Gradebook

    from autograder.course.settings import Settings
    from autograder.grading import grade

    from ..course_copy import grading_settings, make_course, submit

    assignment = "01_soft_lookup"
    course = make_course(tmp_path, [assignment])
    with zipfile.ZipFile(bundle_zip) as archive:
        notebook = nbformat.reads(archive.read(f"{TOP}/{assignment}.ipynb").decode(), as_version=4)
    notebook = fill(notebook, reference_answers(assignment))
    notebook.cells[0].outputs = [nbformat.v4.new_output(  # as the cell leaves it on Colab
        "stream", name="stdout", text="the checks: /content/autograder, from /content/attention-course.zip\n")]
    submit(course, assignment, "colab", notebook)
    summary = grade.autograde([assignment], grading_settings(course), progress=False)
    assert not summary.failed, str(summary)
    with Gradebook(grade.db_url(Settings.load(course))) as gradebook:
        graded = gradebook.find_submission(assignment, "colab")
        assert graded.max_score > 0 and graded.score == graded.max_score, (graded.score, graded.max_score)
