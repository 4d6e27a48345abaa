"""How ``make test`` hands tests to its workers: the longest first, one per worker.

``make test`` runs ``pytest -n 2 --dist loadgroup --no-loadscope-reorder tests``:
xdist gives each worker the next test (or group, ``xdist_group``) in collection order as it frees
up. A test that grades a whole class takes minutes; started last it would run alone at the end. So
the tests that grade through nbgrader start first, the longest (measured with ``--durations``) on one
worker while the other takes the class of every notebook, one notebook at a time, and everything
else fills the time beside them. Only the order and the
placement change, never what runs. nbval's notebooks (``make test`` passes ``solutions`` with
``--nbval``) run in the same session, each as one group (:mod:`tests.nbval_figures`: a notebook's
cells share one kernel and must run in order on one worker), started beside the slow tests.
"""

from __future__ import annotations

import pytest
import torch
from nbval.plugin import IPyNbCell

from . import nbval_figures

#: The longest tests, longest first (each grades a class through nbgrader; a parametrized one, each of its cases).
LONGEST = (
    "test_hostile_submissions.py::test_a_hostile_class",  # one test: started first, the other worker takes the next
    "test_grading_end_to_end.py::test_a_class_of_every_notebook",  # a test per notebook: both workers share them
)


def _rank(item: pytest.Item) -> tuple[int, int]:
    for rank, name in enumerate(LONGEST):
        if item.nodeid.split("[")[0].endswith(name):  # each of a parametrized test's cases
            return 0, rank
    return (1 if item.get_closest_marker("slow") or isinstance(item, IPyNbCell) else 2), 0


# One PyTorch thread in each worker, as in grading (the fork server, the kernels): the same sums as there, and
# two workers on two cores do not spin against each other's threads (the checks' tests took three times the CPU).
# Only this process: nbval's kernels run the solutions as `make release` did.
torch.set_num_threads(1)

#: Notebooks the tests read (some break on purpose); nbval never runs them.
collect_ignore = ["fixtures"]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    nbval_figures.prepare(items)
    items.sort(key=_rank)  # stable: the rest keep their order (a notebook's cells too)
