"""``make release``: student notebooks and executed solutions, generated from ``source/``.

nbgrader does the work (``generate_assignment`` and ``generate_solution``); this module
only places the results where the course keeps them and strips what would change from
one run to the next, so that releasing twice leaves ``git status`` clean.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nbformat

from .repository import ROOT, assignments, nbgrader

VOLATILE_TAG = "nbval-ignore-output"


def merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) pieces: how a print is split depends on timing."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            output.output_type == "stream"
            and last is not None
            and last.output_type == "stream"
            and last.name == output.name
        ):
            last.text += output.text
        else:
            merged.append(output)
    return merged


def normalise(path: Path) -> None:
    """Make an executed notebook reproducible: drop run-dependent metadata and volatile outputs."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
        if cell.cell_type == "code" and VOLATILE_TAG in cell.metadata.get("tags", []):
            # Timings differ on every run: keep the cell, not its numbers.
            cell.outputs = []
    nb.metadata.pop("widgets", None)
    # The patch version of the Python that ran the release (3.11.2, 3.11.7, ...): not the course's.
    nb.metadata.get("language_info", {}).pop("version", None)
    nbformat.write(nb, path)


#: ``generate_solution``'s steps without ``Execute`` (nbgrader's default list, ``GenerateSolution.preprocessors``).
UNEXECUTED = [f"--GenerateSolution.preprocessors=nbgrader.preprocessors.{name}"
              for name in ("IncludeHeaderFooter", "LockCells", "ClearOutput", "ClearMarkScheme")]


def release_one(assignment: str, root: Path = ROOT, execute: bool = True) -> None:
    """Generate ``notebooks/<assignment>.ipynb`` and ``solutions/<assignment>/`` from source.

    ``execute=False`` leaves the solutions without outputs (the drift test: nbval checks the outputs).
    """
    try:
        nbgrader("generate_assignment", assignment, "--force", "--log-level=WARN", root=root)
        nbgrader("generate_solution", assignment, "--force", "--log-level=WARN", *([] if execute else UNEXECUTED),
                 root=root)
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"nbgrader failed on {assignment}:\n{error.stdout}\n{error.stderr}") from None
    student = root / "build" / "release" / assignment / f"{assignment}.ipynb"
    (root / "notebooks").mkdir(exist_ok=True)
    shutil.copyfile(student, root / "notebooks" / f"{assignment}.ipynb")
    for notebook in (root / "solutions" / assignment).glob("*.ipynb"):
        normalise(notebook)


def release(names: list[str] | None = None, root: Path = ROOT) -> None:
    """Release the named assignments (all of them when ``names`` is empty)."""
    for assignment in names or assignments(root):
        release_one(assignment, root)
        print(f"released {assignment}: notebooks/{assignment}.ipynb, solutions/{assignment}/")
