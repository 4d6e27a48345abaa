"""The environment: pins (environment.yml pins exactly what pyproject.toml pins), and what make test relies on."""

from __future__ import annotations

import re
import tomllib

from .notebook_code import ROOT


def test_conda_pins_agree_with_pip_pins():
    pip = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    conda = re.findall(r"^\s+- ([A-Za-z0-9_.-]+==\S+)\s*$", (ROOT / "environment.yml").read_text(), re.M)
    assert sorted(pip) == sorted(conda)
    assert "torch==2.13.0" in pip


def test_every_dependency_is_pinned_exactly():
    pip = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", d) for d in pip), pip


def test_nbformat_does_not_build_the_iri_parsers():
    """make setup removes rfc3987-syntax: with it, importing nbformat costs every nbgrader process 2 s of CPU."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", "import sys, nbformat; print('rfc3987_syntax' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", "rfc3987-syntax is installed: run `make setup` (it uninstalls it)"


GROUPED = """
import os, pytest
pytestmark = pytest.mark.xdist_group("one")

@pytest.mark.parametrize("k", range(6))
def test_where(k):
    with open(os.environ["WHERE"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    """make test shares a module's costly fixtures by grouping its tests (``xdist_group``, ``--dist loadgroup``):
    pytest 9 with pytest-xdist 3.8 ignores the groups and builds those fixtures on every worker."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "workers.txt"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", str(tmp_path / "test_grouped.py")],
                         capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, WHERE=str(where)))
    assert run.returncode == 0, run.stdout + run.stderr
    workers = where.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
