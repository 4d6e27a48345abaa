"""The student's objects seen from the grader: proxies whose calls run in the student's kernel."""

from __future__ import annotations


class Remote:
    """A student's object that lives in another process (filled in by the grading model)."""
