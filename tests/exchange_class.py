"""A class on nbgrader's exchange without a hub: the instructor releases, students fetch, submit and fetch feedback.

Each step is nbgrader's own exchange code (``ExchangeReleaseAssignment``, ``ExchangeFetchAssignment``,
``ExchangeSubmit``, ``ExchangeFetchFeedback``), as the Assignment List calls it, each student with a
home and a cache of their own.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.exchange.default import ExchangeFetchAssignment, ExchangeFetchFeedback, ExchangeReleaseAssignment, ExchangeSubmit
from traitlets.config import Config

from autograder.course import settings

COURSE_ID = "attention"


def _config(exchange: Path, assignment: str, root: Path | None = None, student: str | None = None,
            cache: Path | None = None) -> Config:
    config = settings.course_config(root) if root is not None else Config()  # the instructor's: the course's
    config.CourseDirectory.course_id = COURSE_ID
    config.CourseDirectory.assignment_id = assignment
    if root is not None:
        config.CourseDirectory.root = str(root)
    if student is not None:
        config.CourseDirectory.student_id = student
    config.Exchange.root = str(exchange)
    if cache is not None:
        config.Exchange.cache = str(cache)
    return config


def _run(cls, config: Config):
    """One step of nbgrader's exchange (no working folder: the paths are in ``config``, so threads may run steps)."""
    step = cls(coursedir=CourseDirectory(config=config), authenticator=Authenticator(config=config), config=config)
    return step.start()


def release(course: Path, exchange: Path, assignment: str) -> None:
    """The instructor releases ``assignment`` (generated in ``course``) to the exchange."""
    exchange.mkdir(parents=True, exist_ok=True)
    _run(ExchangeReleaseAssignment, _config(exchange, assignment, root=course))


class Student:
    """A student with a home of their own, working through the exchange."""

    def __init__(self, name: str, home: Path, exchange: Path) -> None:
        self.name, self.home, self.exchange = name, home, exchange
        home.mkdir(parents=True, exist_ok=True)

    def _config(self, assignment: str) -> Config:
        config = _config(self.exchange, assignment, student=self.name, cache=self.home / ".nbgrader-cache")
        config.Exchange.assignment_dir = str(self.home)  # where the Assignment List's server runs
        return config

    def notebook_path(self, assignment: str) -> Path:
        return self.home / assignment / f"{assignment}.ipynb"

    def fetch(self, assignment: str) -> nbformat.NotebookNode:
        """Fetch the released assignment; its notebook."""
        _run(ExchangeFetchAssignment, self._config(assignment))
        return nbformat.read(self.notebook_path(assignment), as_version=4)

    def submit(self, assignment: str, notebook: nbformat.NotebookNode) -> None:
        """Save ``notebook`` as the assignment's notebook and submit it."""
        nbformat.write(notebook, self.notebook_path(assignment))
        _run(ExchangeSubmit, self._config(assignment))

    def fetch_feedback(self, assignment: str) -> dict[str, str]:
        """Fetch the feedback released so far: submission time -> the page of the assignment's notebook."""
        _run(ExchangeFetchFeedback, self._config(assignment))
        pages = {}
        for page in sorted((self.home / assignment / "feedback").glob(f"*/{assignment}.html")):
            pages[page.parent.name] = page.read_text(encoding="utf-8")
        return pages
