"""nbgrader's execution as grading runs it (:mod:`autograder.engine.execute`), one kernel, no sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder.engine.execute import ResilientExecute
from autograder.engine.notes import TIMEOUT


@pytest.mark.slow
def test_a_cell_run_in_the_kernel_that_times_out_shows_an_error():
    """nbgrader scores a test cell from its error output: one stopped for its time must carry one.

    The interrupt's KeyboardInterrupt is replaced by the timeout's message, which nbgrader's own
    ``on_cell_executed`` records from the reply: a hook that replaced nbgrader's left the cell without
    any error, and a test cell run in the kernel (``checks_in_grader = False``) that loops got its points.
    """
    notebook = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("while True:\n    pass"),
                                   new_code_cell("print(x + 1)")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    graded, _ = ResilientExecute(timeout=2, sandbox=False, checks_in_grader=False).preprocess(notebook, {})
    stopped = graded.cells[1].outputs
    assert [o.get("ename") for o in stopped if o.get("output_type") == "error"] == [TIMEOUT], stopped
    assert "stopped after running for 2 s" in stopped[-1]["evalue"]
    assert graded.cells[2].outputs[0]["text"] == "2\n"  # the kernel goes on: the next cell runs


def test_a_kernel_without_the_sandbox_talks_through_files_in_a_folder_removed_after():
    """No TCP port: jupyter_client picks free ports that the kernel binds a moment later, and a kernel started beside
    it can take one first ("Address already in use": seen when the tests' plain kernels started two at a time)."""
    code = ("import json\nfrom ipykernel.connect import get_connection_file\n"
            "info = json.load(open(get_connection_file()))\nprint(info['transport'], get_connection_file())")
    notebook = new_notebook(cells=[new_code_cell(code)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    graded, _ = ResilientExecute(timeout=60, sandbox=False, checks_in_grader=False).preprocess(notebook, {})
    transport, connection_file = graded.cells[0].outputs[0]["text"].split()
    assert transport == "ipc"
    assert not Path(connection_file).parent.exists(), "the kernel's folder is left"


def test_what_a_cell_prints_is_one_output_whatever_the_kernel_flushes():
    """The kernel sends what a cell prints on a timer: prints a moment apart came as one output or as two, and two
    gradings of one submission gave different notebooks. Text after a figure or on stderr stays apart."""
    code = ("import sys, time\nprint('first')\nsys.stdout.flush()\ntime.sleep(0.5)\nprint('second')\n"
            "sys.stdout.flush()\nsys.stderr.write('warned\\n')\nsys.stderr.flush()\ntime.sleep(0.5)\nprint('third')")
    notebook = new_notebook(cells=[new_code_cell(code)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    graded, _ = ResilientExecute(timeout=60, sandbox=False, checks_in_grader=False).preprocess(notebook, {})
    assert [(o["name"], o["text"]) for o in graded.cells[0].outputs] == [
        ("stdout", "first\nsecond\n"), ("stderr", "warned\n"), ("stdout", "third\n")]
