"""Environments like a student's, made once and kept between runs, and a notebook run in one of them.

Each is a virtual environment of its own Python with PyTorch, NumPy and Matplotlib of given versions,
and what runs a notebook there (ipykernel, nbclient), as Colab and Kaggle have: no nbgrader, no
JupyterLab, not the course's package. They are kept in ``$COURSE_STUDENT_ENVS`` (default
``~/.cache/attention-course/student-envs``, outside the repository), so only the first run pays for
the installation: PyTorch from its CPU index where that answers (about 0.2 GB), else PyPI's Linux
build with its NVIDIA libraries (about 3 GB; measured 3.06 GB for torch 2.5.0 on Python 3.12).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

from autograder.course.student_versions import ENDS

CACHE = Path(os.environ.get("COURSE_STUDENT_ENVS") or Path.home() / ".cache" / "attention-course" / "student-envs")
#: Like Colab's: a Python environment other than the course's, with other releases than the course's pins installed
#: first (torch 2.14.1 for Python 3.11 lies on this machine's disk: no download here; elsewhere about 3 GB from PyPI).
COLAB = {"python": "3.11", "torch": "2.14.1", "numpy": "2.2.6", "matplotlib": "3.10.9"}
ENVIRONMENTS = {"colab": COLAB, **ENDS}
#: What runs a notebook in the environment, as on Colab and Kaggle.
HARNESS = ("ipykernel", "nbclient")
STAMP = ".course-env.json"
#: PyTorch's index of CPU-only wheels: where it answers, torch comes from it (about 0.2 GB, where PyPI's Linux
#: build with its NVIDIA libraries is about 3 GB); elsewhere from PyPI.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class Unavailable(Exception):
    """The environment cannot be made here (its Python is missing, or pip could not install its packages)."""


def find_python(version: str) -> str | None:
    """A Python ``version`` ("3.12") on PATH or among pyenv's, if this machine has one."""
    found = [shutil.which(f"python{version}")]
    found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    for python in filter(None, found):  # a pyenv shim of a version not selected is on PATH, and does not run
        probe = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return python
    return None


def spec(name: str) -> dict[str, str]:
    return {**ENVIRONMENTS[name], "harness": " ".join(HARNESS)}


#: Why an environment could not be made in this process: tried once, not once per test.
_FAILED: dict[str, Unavailable] = {}


def environment(name: str, build: bool = True) -> Path:
    """The Python of environment ``name`` (:data:`ENVIRONMENTS`), made on first use unless not ``build``;
    :class:`Unavailable` if it cannot be (or is not made yet, and not ``build``)."""
    wanted = spec(name)
    folder = CACHE / name
    python = folder / "bin" / "python"
    stamp = folder / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted and python.exists():
        return python
    if not build:
        raise Unavailable(f"the {name} environment is not made yet (make test-versions ENDS={name} makes it)")
    if name in _FAILED:
        raise _FAILED[name]
    try:
        return _make(name, wanted, folder)
    except Unavailable as why:
        _FAILED[name] = why
        raise


def _make(name: str, wanted: dict[str, str], folder: Path) -> Path:
    python, stamp = folder / "bin" / "python", folder / STAMP
    base = find_python(wanted["python"])
    if base is None:
        raise Unavailable(f"no Python {wanted['python']} on this machine for the {name} environment")
    shutil.rmtree(folder, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([base, "-m", "venv", str(folder)], capture_output=True, text=True)
    if made.returncode:
        raise Unavailable(f"{base} could not make a virtual environment: {made.stderr.strip()[-300:]}")
    packages = [f"{p}=={wanted[p]}" for p in ("torch", "numpy", "matplotlib")] + list(HARNESS)
    # Asked once here: pip would retry an index that does not answer for every package, minutes in all.
    cpu = ["--extra-index-url", CPU_INDEX] if _answers(f"{CPU_INDEX}/torch/") else []
    log = CACHE / f"{name}.log"
    with log.open("w") as out:
        done = subprocess.run([str(python), "-m", "pip", "install", "--progress-bar", "off", *cpu, *packages],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        lines = log.read_text().strip().splitlines()
        said = [line for line in lines if line.startswith("ERROR")][:2] or lines[-3:]
        raise Unavailable(f"pip could not install {' '.join(packages)} for Python {wanted['python']}: "
                          f"{' / '.join(said)} (all of pip's output: {log})")
    stamp.write_text(json.dumps(wanted))
    return python


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return True
    except OSError:
        return False


#: Run in the environment: execute the notebook in its folder, write it back with its outputs, print one JSON
#: line (the error, if a cell raised, and the last cell's output).
RUNNER = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
path = sys.argv[1]
notebook = nbformat.read(path, as_version=4)
client = NotebookClient(notebook, timeout=int(sys.argv[2]), kernel_name="python3",
                        resources={"metadata": {"path": sys.argv[3]}})
result = {"error": None}
try:
    client.execute()
except CellExecutionError as error:
    result["error"] = {"ename": error.ename, "evalue": error.evalue}
    for index, cell in enumerate(notebook.cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            result["error"]["cell"] = index
nbformat.write(notebook, path)  # executed, its outputs kept for the comparison with the pinned versions
last = notebook.cells[-1]
result["last"] = "".join(o.get("text", "") for o in last.get("outputs", []) if o.get("output_type") == "stream")
print(json.dumps(result))
"""


def run_notebook(python: Path, path: Path, timeout: int = 900) -> dict:
    """Execute the notebook at ``path`` in its own folder with the environment of ``python``.

    Returns ``{"error": None or {"ename", "evalue", "cell"}, "last": the last cell's printed text}``; the
    notebook at ``path`` is left executed, with its outputs.
    Nothing of the course's environment leaks in: no PYTHONPATH, no Jupyter paths, the environment's
    ``bin`` first on PATH (its kernel is its own Python).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["JUPYTER_DATA_DIR"] = str(path.parent / ".jupyter-data")
    done = subprocess.run([str(python), "-c", RUNNER, str(path), str(timeout), str(path.parent)], cwd=path.parent,
                          env=env, capture_output=True, text=True, timeout=timeout + 120)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"the runner failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1])
