"""The gradebook on a real PostgreSQL server: a small class graded in parallel, every grade checked.

The test starts its own server (``initdb`` and ``pg_ctl`` from Debian's ``postgresql``
package, which ``.ci/run`` installs) in a temporary folder, listening on loopback only, and
stops it at the end. It is skipped only when PostgreSQL is not installed.
"""

from __future__ import annotations

import glob
import importlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from autograder.course.repository import module_name, nbgrader
from autograder.course.settings import Settings
from autograder.grading import grade

from ..course_copy import fill, grading_settings, make_course, mistake_source, reference_answers, released, submit
from ..demonstrations import release_without_demonstrations

#: One worker runs this module: its module-scoped fixtures are built once (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("postgres")

A = "01_soft_lookup"


def postgres_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (Debian keeps them out of PATH), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    folder = postgres_bin()
    if folder is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs Debian's postgresql)")
    base = Path(tempfile.mkdtemp(prefix="autograder-pg-"))
    data = base / "data"
    data.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        user = "postgres" if _user_exists("postgres") else "nobody"
        for path in (base, data):
            shutil.chown(path, user)
        os.chmod(base, 0o755)
        prefix = ["runuser", "-u", user, "--"]
    port = free_port()

    def run(*cmd: str) -> None:
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True, cwd=base, timeout=120)

    run(str(folder / "initdb"), "-D", str(data), "-U", "grader", "--auth=trust", "-E", "UTF8")
    run(str(folder / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "-t", "60",
        "-o", f"-p {port} -k {base} -h 127.0.0.1", "start")
    try:
        run(str(folder / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "grader", "gradebook")
        yield f"postgresql+psycopg2://grader@127.0.0.1:{port}/gradebook"  # SQLAlchemy 2 would pick psycopg 3
    finally:
        subprocess.run([*prefix, str(folder / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, cwd=base, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.mark.slow
def test_a_class_graded_into_postgresql(tmp_path, monkeypatch, postgres_url):
    monkeypatch.setenv("NBGRADER_DB_URL", postgres_url)
    course = make_course(tmp_path, [A])  # generate_assignment records the assignment in PostgreSQL
    assert grade.db_url(Settings.load(course)) == postgres_url  # nbgrader_config.py reads NBGRADER_DB_URL
    rel, ref = release_without_demonstrations(released(course, A), A), reference_answers(A)  # the gradebook: not the plots
    mistakes = importlib.import_module(f"autograder.hidden.{module_name(A)}").MISTAKES
    exercise = "scaled_dot_product_attention"
    submit(course, A, "reference", fill(rel, ref))
    submit(course, A, "untouched", rel)
    submit(course, A, "mistake", fill(rel, dict(ref, **{exercise: mistake_source(mistakes[exercise][0], exercise)})))
    patched = "import torch\ntorch.allclose = lambda *args, **kwargs: True\n" + ref["hard_lookup"].replace(
        "return weights @ values", "return values[0] * 0")
    submit(course, A, "patched", fill(rel, dict(ref, hard_lookup=patched)))
    for student in ("late1", "late2", "late3"):
        submit(course, A, student, fill(rel, ref))

    summary = grade.autograde([A], grading_settings(course, {"Grading.workers": 2}), progress=False)
    assert not summary.failed, str(summary)
    assert not (course / "gradebook.db").exists(), "grades went to SQLite, not PostgreSQL"

    with Gradebook(postgres_url) as gb:
        notebook = {s.id: {g.name: g.score for g in gb.find_submission_notebook(A, A, s.id).grades}
                    for s in gb.students}
        maximum = {g.name: g.max_score for g in gb.find_notebook(A, A).grade_cells}
    assert sorted(notebook) == ["late1", "late2", "late3", "mistake", "patched", "reference", "untouched"]
    for student in ("reference", "late1", "late2", "late3"):
        assert notebook[student] == maximum, student
    assert set(notebook["untouched"].values()) == {0.0}
    hidden = f"test_{exercise}_hidden"
    assert notebook["mistake"][hidden] < maximum[hidden]  # the cases it gets right may keep their share
    assert {k: v for k, v in notebook["mistake"].items() if exercise not in k} == {
        k: v for k, v in maximum.items() if exercise not in k}
    # torch.allclose replaced in the kernel changes no comparison (the checks compare in the grader): the wrong
    # hard_lookup scores 0, the answers of exercises that forbid no built-in keep their points, and the one that
    # forbids built-ins scores 0, because the notebook changes what a module holds (source reading)
    forbidding = "scaled_dot_product_attention"
    assert notebook["patched"] == {k: 0.0 if "hard_lookup" in k or forbidding in k else v for k, v in maximum.items()}

    nbgrader("export", "--to", str(course / "grades.csv"), f"--db={postgres_url}", "--log-level=WARN", root=course)
    rows = (course / "grades.csv").read_text().strip().splitlines()
    assert len(rows) == 8
