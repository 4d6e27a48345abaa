"""What the grading service knows, kept in one JSON file that survives its restart.

One :class:`Record` per submission (by its inbound folder's name) says what became of it. The
file is rewritten whole after every change (a temporary file renamed over it, flushed to disk), so
a crash leaves the old state or the new one, never half of one. A record left ``grading`` by a
service that stopped mid-grading is queued again when the state is loaded: its grading never
finished, so its result was never released, and it is graded once.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from pathlib import Path


class Status(StrEnum):
    """What became of a submission. The values are what the state file holds."""

    QUEUED = "queued"  # to be graded
    GRADING = "grading"  # being graded now
    GRADED = "graded"  # graded officially; its feedback released
    WAITING = "waiting"  # the student's quota for the day is used up: graded tomorrow or at the final grading
    SUPERSEDED = "superseded"  # a later submission of the same assignment arrived before this one was graded
    LATE = "late"  # arrived after the due date: kept, not graded
    FAILED = "failed"  # could not be graded (not the student's doing), retries used up: for the instructor
    REFUSED = "refused"  # not a submission the service can grade (see its reason)


#: Statuses that the queue still has to act on.
PENDING = (Status.QUEUED, Status.WAITING)


@dataclass
class Record:
    """What the service knows of one submission."""

    key: str
    student: str
    assignment: str
    time: str  # ISO 8601, UTC: when it arrived
    status: Status = Status.QUEUED
    graded_at: str = ""  # ISO 8601, UTC: when its official grading started
    attempts: int = 0  # gradings that could not finish
    reason: str = ""  # why it is refused, failed, waiting or superseded
    final: bool = False  # graded as the assignment's final grade (the last submission before the due date)
    notified: str = ""  # the status the student was last told of (a page released for it)

    @property
    def arrived(self) -> datetime:
        return datetime.fromisoformat(self.time)

    def graded_on(self) -> date | None:
        """The UTC day of its official grading, if it was graded."""
        if self.status != Status.GRADED or not self.graded_at:
            return None
        return datetime.fromisoformat(self.graded_at).astimezone(UTC).date()


class State:
    """Every :class:`Record`, loaded from and saved to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, Record] = {}
        if path.is_file():
            for raw in json.loads(path.read_text(encoding="utf-8")):
                record = Record(**{**raw, "status": Status(raw["status"])})
                if record.status == Status.GRADING:  # the service stopped while grading it
                    record.status = Status.QUEUED
                self.records[record.key] = record

    def save(self) -> None:
        """Write every record, atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".state-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump([asdict(r) for r in self.records.values()], handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def add(self, record: Record) -> bool:
        """Keep ``record`` unless its submission is known already; whether it was new."""
        if record.key in self.records:
            return False
        self.records[record.key] = record
        return True

    def graded_today(self, student: str, assignment: str, today: date) -> int:
        """Official gradings of ``student``'s ``assignment`` on the UTC day ``today`` (the final one not counted)."""
        return sum(1 for r in self.records.values()
                   if r.student == student and r.assignment == assignment and not r.final and r.graded_on() == today)

    def of(self, student: str, assignment: str) -> list[Record]:
        """The records of one student's assignment, oldest first."""
        return sorted((r for r in self.records.values() if r.student == student and r.assignment == assignment),
                      key=lambda r: (r.arrived, r.key))
