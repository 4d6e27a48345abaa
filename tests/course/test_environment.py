"""The environment: pins (environment.yml pins exactly what pyproject.toml pins), and what make test relies on."""

from __future__ import annotations

import re
import tomllib

from ..notebook_code import ROOT


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


def _png(gray: int, odd: int | None = None) -> bytes:
    """A 40 x 40 grey PNG; ``odd``: the grey of its first pixel, if another."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = 40
    rows = [bytes([0] + [gray] * side) for _ in range(side)]
    if odd is not None:
        rows[0] = bytes([0, odd] + [gray] * (side - 1))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + \
        chunk(b"IEND", b"")


def _figure_notebook(shown: bytes, committed: bytes):
    """A notebook whose cells share a name (one kernel), then show a PNG: ``committed`` is the one its output holds."""
    import base64

    import nbformat

    cells = [nbformat.v4.new_code_cell("x = 1")]
    cells += [nbformat.v4.new_code_cell("x += 1\nprint(x)", outputs=[nbformat.v4.new_output(
        "stream", name="stdout", text=f"{k}\n")]) for k in range(2, 8)]
    cells.append(nbformat.v4.new_code_cell(
        f"from IPython.display import Image, display\ndisplay(Image(data={shown!r}))",
        outputs=[nbformat.v4.new_output("display_data", data={
            "image/png": base64.b64encode(committed).decode(), "text/plain": "<IPython.core.display.Image object>"})]))
    for count, cell in enumerate(cells, 1):
        cell.execution_count = count
    return nbformat.v4.new_notebook(cells=cells)


def test_nbval_compares_figures_and_keeps_a_notebook_on_one_worker(tmp_path):
    """make test runs the solutions with nbval in its own session (tests/nbval_figures.py): a notebook's cells must
    share one kernel on one worker, and a figure that changed must fail (plain nbval skips images), while one that
    differs by another CPU's rounding passes."""
    import os
    import subprocess
    import sys

    import nbformat

    nbformat.write(_figure_notebook(shown=_png(10), committed=_png(10)), tmp_path / "same.ipynb")
    # one pixel of 1600 one level off: another CPU's rounding, within the tolerance
    nbformat.write(_figure_notebook(shown=_png(10, odd=11), committed=_png(10)), tmp_path / "rounding.ipynb")
    nbformat.write(_figure_notebook(shown=_png(10, odd=200), committed=_png(10)), tmp_path / "spot.ipynb")
    nbformat.write(_figure_notebook(shown=_png(10), committed=_png(200)), tmp_path / "changed.ipynb")
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom tests import nbval_figures\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(items):\n    nbval_figures.prepare(items)\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          "--nbval", "-rf", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    failed = re.findall(r"^FAILED (.*?)(?:@| - |$)", run.stdout, re.M)
    assert sorted(failed) == ["changed.ipynb::Cell 7", "spot.ipynb::Cell 7"], run.stdout[-3000:]
    assert "a PNG of" in run.stdout and "sha256" in run.stdout, run.stdout[-3000:]
    assert "1600 of 1600 pixels differ, by up to 190 levels" in run.stdout, run.stdout[-3000:]
    assert "1 of 1600 pixels differ, by up to 190 levels" in run.stdout, run.stdout[-3000:]
    assert "30 passed" in run.stdout, run.stdout[-3000:]


def test_a_test_worker_runs_pytorch_on_one_thread():
    """tests/conftest.py: as in grading; with a thread per core, two workers on two cores spin against each other
    (the checks' tests: 111 s instead of 34 s on this machine)."""
    import torch

    assert torch.get_num_threads() == 1


def test_the_scripts_run_by_name_are_executable():
    """CI calls `.ci/run`, Gradescope `setup.sh` and `run_autograder`: each must carry its execute bit."""
    import os

    scripts = [ROOT / ".ci" / "run", *(ROOT / "autograder" / "grading" / "gradescope_files").iterdir()]
    assert [s.relative_to(ROOT).as_posix() for s in scripts if not os.access(s, os.X_OK)] == []
