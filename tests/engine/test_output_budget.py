"""The output kept for a whole notebook is bounded, not only each cell's (:mod:`autograder.engine.execute`).

Many cells that each write just under a cell's share once grew a graded notebook, and the grading process
holding it, without bound: the notebook's budget caps what all cells keep together.
"""

from __future__ import annotations

import json

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder.engine.execute import ResilientExecute
from autograder.engine.notes import OUTPUT_CUT

CELL, NOTEBOOK, CELLS = 4000, 20000, 12


def _run(**budget):
    # each cell prints just under a cell's share, then the last one fails with a long message
    cells = [new_code_cell(f"print('x' * {CELL - 200})") for _ in range(CELLS)]
    cells.append(new_code_cell("raise ValueError('y' * 5000)"))
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    graded, _ = ResilientExecute(sandbox=False, checks_in_grader=False, max_output_bytes=CELL,
                                 **budget).preprocess(notebook, {})
    return graded


@pytest.mark.slow
def test_the_notebook_keeps_at_most_its_budget_and_says_so():
    graded = _run(max_notebook_output_bytes=NOTEBOOK)
    printed = [cell for cell in graded.cells[:CELLS]]
    kept = [c for c in printed if any("x" * 100 in o.get("text", "") for o in c.outputs)]
    cut = [c for c in printed if any(OUTPUT_CUT in o.get("text", "") for o in c.outputs)]
    assert 0 < len(kept) <= NOTEBOOK // (CELL - 200), len(kept)
    assert len(kept) + len(cut) == CELLS
    assert all("the notebook's cells together wrote more than 20000 bytes" in c.outputs[-1]["text"] for c in cut)
    assert sum(len(json.dumps(c.outputs)) for c in printed) < NOTEBOOK + CELLS * 300
    error = [o for o in graded.cells[-1].outputs if o.get("output_type") == "error"]
    assert error and error[0]["ename"] == "ValueError" and len(error[0]["evalue"]) <= 1000  # still scored as failed


@pytest.mark.slow
def test_each_cell_keeps_its_share_when_the_notebook_budget_is_large():
    graded = _run(max_notebook_output_bytes=10**9)
    assert all(any("x" * 100 in o.get("text", "") for o in c.outputs) for c in graded.cells[:CELLS])
    assert not any(OUTPUT_CUT in o.get("text", "") for c in graded.cells[:CELLS] for o in c.outputs)
    error = [o for o in graded.cells[-1].outputs if o.get("output_type") == "error"]
    assert error[0]["ename"] == "ValueError" and error[0]["evalue"].startswith("y" * 100)
