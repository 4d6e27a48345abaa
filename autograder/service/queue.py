"""The fair queue: which submissions to grade now, within each student's daily quota.

Before an assignment's due date, each student's newest submission not yet graded is graded, at
most ``quota`` times per student per assignment per day (UTC): an older one still waiting is
*superseded* (kept, never graded: the student's later work replaced it, and grading it would spend
the quota on work they no longer stand by); beyond the quota the newest *waits* for the next day
or for the final grading. After the due date nothing is graded early any more: the last submission
before it is graded once as the assignment's final grade, whatever the quota; one after it is
*late* (kept, not graded). The submissions that may be graded now are ordered fairly: a student
with a grading under way, then one already graded today, goes after those who have not, so a
flood of submissions from one student (which supersede each other) cannot delay the others.

Everything here is a pure function of the state and the time, so it is tested without grading.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from .state import PENDING, Record, State, Status


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def plan(state: State, now: datetime, quota: int, due: dict[str, datetime | None],
         busy: set[tuple[str, str]]) -> list[Record]:
    """Update the statuses of pending submissions for ``now``; the records to grade, in the order to grade them.

    ``due``: each assignment's due date (aware, UTC; None: none). ``busy``: (student, assignment)
    pairs being graded now, which get nothing more until that grading ends. A record returned
    with ``final`` set is the final grading of its assignment.
    """
    ready: list[Record] = []
    groups = sorted({(r.student, r.assignment) for r in state.records.values()})
    for student, assignment in groups:
        if (student, assignment) in busy:
            continue
        records = state.of(student, assignment)
        deadline = due.get(assignment)
        if deadline is not None and now >= deadline:
            ready += _after_due(records, deadline)
            continue
        pending = [r for r in records if r.status in PENDING]
        if not pending:
            continue
        newest = pending[-1]
        for older in pending[:-1]:
            older.status = Status.SUPERSEDED
            older.reason = f"your submission of {_when(newest.arrived)} replaced it before it was graded"
        if state.graded_today(student, assignment, now.date()) >= quota:
            newest.status = Status.WAITING
            newest.reason = (f"you have had your {quota} official gradings of {assignment} today (UTC): this one is "
                             "graded tomorrow, or as your final grade at the due date, if you submit nothing newer")
        else:
            newest.status = Status.QUEUED
            newest.reason = ""
            ready.append(newest)
    return fair_order(ready, state, now, busy)


def _after_due(records: list[Record], deadline: datetime) -> list[Record]:
    """After the due date: late ones marked, and the last one before it to grade as the final grade (once)."""
    for record in records:
        if record.arrived > deadline and record.status in PENDING:
            record.status = Status.LATE
            record.reason = f"it arrived after the due date ({_when(deadline)}); it is kept, not graded"
    finals = [r for r in records if r.final]
    if finals:  # chosen already: graded, or to be graded again after a grading that could not finish
        return [r for r in finals if r.status == Status.QUEUED]
    before = [r for r in records if r.arrived <= deadline and r.status not in (Status.REFUSED, Status.FAILED)]
    if not before:
        return []
    last = before[-1]
    for record in before[:-1]:
        if record.status in PENDING:
            record.status = Status.SUPERSEDED
            record.reason = f"your submission of {_when(last.arrived)} is the last before the due date: it is graded"
    last.final = True
    last.status = Status.QUEUED
    last.reason = ""
    return [last]


def fair_order(ready: list[Record], state: State, now: datetime, busy: set[tuple[str, str]]) -> list[Record]:
    """``ready`` ordered: students with fewer gradings under way, then fewer today, first; then the oldest first."""
    running = Counter(student for student, _ in busy)
    today = Counter(r.student for r in state.records.values() if r.graded_on() == now.date())
    return sorted(ready, key=lambda r: (running[r.student], today[r.student], r.arrived, r.key))
