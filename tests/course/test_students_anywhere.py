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
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.course import student_versions
from autograder.course.bundle import TOP, write_bundle
from autograder.course.notebook_setup import notebook_link, package_address
from autograder.course.repository import assignments, module_name
from autograder.course.repository import pins as course_pins
from autograder.grader.diagnosis import MistakeFound, by_id
from autograder.shared.errors import CheckFailed

from .. import outputs_compared
from ..course_copy import fill, mistake_source, reference_answers
from ..student_env import CACHE, ENVIRONMENTS, Unavailable, environment, run_notebook

pytestmark = pytest.mark.xdist_group("bundle")

ASKED = set(os.environ.get("COURSE_TEST_VERSIONS", "").replace(",", " ").split())
#: Notebooks known to fail at an end, and why (strict: the day they pass, the test says so).
KNOWN: dict[tuple[str, str], str] = {}

#: Each end's executed notebooks, kept beside the environments.
RUNS = CACHE / "runs"
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
@pytest.mark.parametrize("name", ["colab", "oldest", "newest"])
def test_a_notebook_opened_alone_runs_its_checks_with_the_environments_torch(name, bundle_zip, tmp_path):
    """Colab-like: the first cell fetches the checks from the zip beside; references pass, a mistake fails.

    Also in each end's environment (the oldest on Python 3.12, as Colab's) where make test-versions made it.
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
@pytest.mark.parametrize("end", [pytest.param(end, marks=pytest.mark.xdist_group(f"end-{end}"))  # an end a worker
                                 for end in sorted(student_versions.ENDS)])
def test_every_notebook_at_both_ends_of_the_ranges(end, assignment, bundle_zip, tmp_path, request):
    """The bundle's notebook with the reference answers runs, every visible check passing, at ``end``, and each
    cell prints and draws what it does on the pinned releases, within tests/outputs_compared.py's tolerances."""
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
    (RUNS / end).mkdir(parents=True, exist_ok=True)
    shutil.copy(path, RUNS / end / path.name)  # what each cell printed at this end, kept to compare
    assert done["error"] is None, done
    assert json.loads(done["last"])["torch"].split("+")[0] == ENVIRONMENTS[end]["torch"]
    pinned = course_pins()["matplotlib"] == f"matplotlib=={ENVIRONMENTS[end]['matplotlib']}"
    differ = outputs_compared.differences(path, outputs_compared.SOLUTIONS / assignment / f"{assignment}.ipynb", pinned)
    assert not differ, (f"printed or drawn otherwise than on the pinned releases (the executed notebook: "
                        f"{RUNS / end / path.name}):\n" + "\n".join(map(str, differ)))


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
    python = _fake_environment(tmp_path / "env", {"torch": "2.15.0", "numpy": "1.26.4", "matplotlib": "3.9.4"})
    done = subprocess.run([sys.executable, "course.py", "--python", str(python), "setup"], cwd=course_folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "note" not in done.stdout, done.stdout + done.stderr


def test_course_py_names_the_range_an_environment_is_outside(course_folder, tmp_path):
    python = _fake_environment(tmp_path / "env", {"torch": "2.4.1", "numpy": "2.4.6"})
    done = subprocess.run([sys.executable, "course.py", "--python", str(python), "setup"], cwd=course_folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch 2.4.1 (the course runs with torch>=2.5,<2.16)" in done.stdout, done.stdout
    assert "matplotlib missing (the course runs with matplotlib>=3.9,<3.12)" in done.stdout
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


def _stand_in_index(folder, version: str) -> str:
    """A simple index (PEP 503) in ``folder`` holding one stand-in CPU wheel of torch ``version``; its URL."""
    import hashlib

    wheel = f"torch-{version}-py3-none-any.whl"
    files = {"torch/__init__.py": f"__version__ = {version!r}\nSTAND_IN = True\n",
             f"torch-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"torch-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: course-tests\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + f"torch-{version}.dist-info/RECORD,,\n"
    (folder / "torch").mkdir(parents=True)
    with zipfile.ZipFile(folder / "torch" / wheel, "w") as archive:
        for name, text in {**files, f"torch-{version}.dist-info/RECORD": record}.items():
            archive.writestr(name, text)
    digest = hashlib.sha256((folder / "torch" / wheel).read_bytes()).hexdigest()
    link = wheel.replace("+", "%2B")
    (folder / "torch" / "index.html").write_text(f'<a href="{link}#sha256={digest}">{wheel}</a>\n')
    (folder / "index.html").write_text('<a href="torch/">torch</a>\n')
    return folder.as_uri()


def _pip_cap(package: str) -> str | None:
    """The version ``package<=V`` of a constraint file in this machine's pip configuration, if there is one."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".constraint") and Path(value.strip("'\"")).is_file():
            for spec in Path(value.strip("'\"")).read_text().splitlines():
                if (found := re.fullmatch(rf"\s*{package}\s*<=\s*([\d.]+)\s*", spec)) is not None:
                    return found.group(1)
    return None


@pytest.mark.slow
def test_course_py_cpu_installs_torch_from_the_index_it_is_given(bundle_zip, tmp_path):
    """`python3 course.py --cpu --cpu-index URL setup` installs PyTorch from that index (here a folder holding a
    stand-in CPU wheel, newer than any torch of the range on PyPI: the one pip would pick from either), then
    requirements.txt beside it."""
    if not sys.platform.startswith("linux"):
        pytest.skip("--cpu changes what is installed on Linux only")
    major, minor = student_versions.version_tuple(student_versions.NEWEST["torch"])[:2]
    version = f"{major}.{minor}.99+cpu"
    if (cap := _pip_cap("torch")) is not None:  # a machine whose pip configuration caps torch: the newest it allows
        version = f"{cap}+standin"
    index = _stand_in_index(tmp_path / "simple", version)
    with zipfile.ZipFile(bundle_zip) as archive:
        archive.extractall(tmp_path)
    folder = tmp_path / TOP
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "course.py", "--cpu", "--cpu-index", index, "setup"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"installing PyTorch's CPU build from {index} ..." in done.stdout, done.stdout
    probe = "import torch; print(torch.__version__, getattr(torch, 'STAND_IN', False))"
    seen = subprocess.run([folder / ".venv" / "bin" / "python", "-c", probe], capture_output=True, text=True)
    assert seen.stdout.split() == [version, "True"], seen.stdout + seen.stderr
    assert (folder / ".venv" / ".installed").read_text().endswith(f"--cpu\n--cpu-index {index}\n")


def test_the_setup_cell_names_a_release_outside_the_ranges(course_folder, tmp_path):
    """In an environment with torch 2.4.1 the set-up cell says which range; inside them it prints nothing."""
    cell = "".join(json.loads((course_folder / "01_soft_lookup.ipynb").read_text())["cells"][0]["source"])
    for installed, said in (({"torch": "2.4.1", "numpy": "2.4.6", "matplotlib": "3.11.2"},
                             "note: this course runs with torch >= 2.5, < 2.16; this is 2.4.1\n"),
                            ({"torch": "2.15.0+cpu", "numpy": "1.26.4", "matplotlib": "3.9.4"}, "")):
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


def test_printed_numbers_are_compared_within_the_tolerance():
    """A float may move by RELATIVE plus one last digit; a count, a word, a number's presence may not."""
    assert outputs_compared.text_difference("loss 0.69315, 4 heads\n", "loss 0.69314, 4 heads\n") is None
    assert outputs_compared.text_difference("error 1.0001e-07\n", "error 1.0000e-07\n") is None
    assert "0.69400" in outputs_compared.text_difference("loss 0.69400, 4 heads\n", "loss 0.69314, 4 heads\n")
    assert "1.2e-07" in outputs_compared.text_difference("error 1.2e-07\n", "error 1.0e-07\n")
    assert "5 where" in outputs_compared.text_difference("loss 0.69314, 5 heads\n", "loss 0.69314, 4 heads\n")
    assert outputs_compared.text_difference("loss 0.69314, 4 layers\n", "loss 0.69314, 4 heads\n")
    assert outputs_compared.text_difference("took 3.2 ms elapsed\n", "took 9.9 ms elapsed\n") is None  # nbval's
    assert outputs_compared.text_difference("tensor([    0.5000,     nan])", "tensor([0.5000, nan])") is None
    assert outputs_compared.text_difference("tensor([0.5000,\n nan])", "tensor([0.5000, nan])") is None
    assert outputs_compared.text_difference("tensor([0.5000, inf])", "tensor([0.5000, nan])")
    assert outputs_compared.text_difference("tensor([0.5000, 1 2])", "tensor([0.5000, 12])")


def _figure(pixels) -> dict:
    """A display output holding ``pixels`` as a PNG, as a notebook shows a figure."""
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    return nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png.getvalue()).decode(),
                                                        "text/plain": "<Figure>"})


SOLUTION_01 = outputs_compared.SOLUTIONS / "01_soft_lookup" / "01_soft_lookup.ipynb"


def _compared(folder, executed=lambda cells: None, pinned=lambda cells: None,
              same_matplotlib: bool = True) -> list[tuple[str, str]]:
    """01's pinned solution against itself, each side changed by its function (of the cells by id)."""
    paths = []
    for side, edit in (("01_soft_lookup", executed), ("pinned", pinned)):
        notebook = nbformat.read(SOLUTION_01, as_version=4)
        edit({cell.get("id"): cell for cell in notebook.cells})
        (folder / side).mkdir(exist_ok=True)
        nbformat.write(notebook, folder / side / "01_soft_lookup.ipynb")
        paths.append(folder / side / "01_soft_lookup.ipynb")
    return [(d.cell, d.what) for d in outputs_compared.differences(*paths, same_matplotlib)]


def test_a_changed_cell_is_named_and_timings_are_not_compared(tmp_path):
    """01's pinned solution against itself changed: a number past the tolerance, a figure, a timing."""
    import numpy as np

    code = [cell for cell in nbformat.read(SOLUTION_01, as_version=4).cells if cell.cell_type == "code"]
    printing = next(c.id for c in code if "tensor([" in "".join(o.get("text", "") for o in c.outputs))
    drawn = next(c.id for c in code if any("image/png" in o.get("data", {}) for o in c.outputs))

    def times(by: float):
        def edit(cells):
            stream = next(o for o in cells[printing].outputs if o.output_type == "stream")
            first = outputs_compared.NUMBER.search(stream.text.partition("tensor([")[2]).group()
            stream.text = stream.text.replace(first, f"{float(first) * by:.4f}", 1)
        return edit

    assert _compared(tmp_path) == []
    assert _compared(tmp_path, times(1.00001)) == []
    [(cell, what)] = _compared(tmp_path, times(1.01))
    assert cell == printing and "beyond 0.0001 relative" in what

    blank = np.full((100, 100, 4), 255, dtype=np.uint8)
    flipped = blank.copy()
    flipped[:10, :30] = 0  # 3% of the pixels

    def draws(pixels):
        def edit(cells):
            cells[drawn].outputs = [_figure(pixels)]
        return edit

    assert _compared(tmp_path, draws(blank), draws(blank)) == []
    assert _compared(tmp_path, draws(flipped), draws(blank)) == [
        (drawn, "a figure with 3.0% of its pixels differing (at most 2%)")]
    # Another Matplotlib: the size only, within 3% of each side.
    assert _compared(tmp_path, draws(flipped[:97]), draws(blank), same_matplotlib=False) == []
    assert _compared(tmp_path, draws(blank[:96]), draws(blank), same_matplotlib=False) == [
        (drawn, "a figure of 100 x 96 pixels, not within 3% of 100 x 100")]
    def text_only(cells):
        cells[drawn].outputs = [o for o in cells[drawn].outputs if "image/png" not in o.get("data", {})]

    assert _compared(tmp_path, text_only, same_matplotlib=False) == [
        (drawn, "0 figures where the pinned releases draw 1")]

    def timing(cells):
        cells[printing].metadata.setdefault("tags", []).append(outputs_compared.VOLATILE_TAG)

    assert _compared(tmp_path, lambda cells: (timing(cells), times(2.0)(cells)), timing) == []
