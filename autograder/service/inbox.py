"""The exchange watcher: the submissions in nbgrader's ``inbound/`` folder, and collecting one into ``submitted/``.

``nbgrader submit`` (the Assignment List's *Submit*) copies the student's folder to
``<exchange>/<course>/inbound/<student>+<assignment>+<timestamp>+<random>/`` with ``timestamp.txt``
and ``submission_secret.txt`` (the secret names the student's feedback file). :func:`scan` lists
them; a folder whose name is not of that form, names an assignment the course does not have, or
lacks its secret is listed as :attr:`Submission.problem`, never guessed at.

What this does *not* protect: the inbound folder is the student's own (nbgrader makes it
writable by everyone so that the instructor can remove it), so what is graded is what it holds
when it is collected. Its time is when the folder last changed (``st_ctime``, which a user
cannot set back; ``nbgrader submit`` changes it last, when it sets its mode), not the time in its
name, which a student could write: a late submission cannot be made to look early, nor an old one
to look like the newest. Who submitted is the folder's owner: a submission in another
student's name (``Submission.owner``) is refused by :mod:`~autograder.service.serve`.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nbgrader.utils import parse_utc

SECRET_FILE = "submission_secret.txt"
TIMESTAMP_FILE = "timestamp.txt"
#: A student id that is safe as a folder name of the course (nbgrader makes folders of it).
NAME = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]{0,99}")
#: nbgrader's secrets are 128 hexadecimal digits; anything much longer was not made by it.
MAX_SECRET = 1024


@dataclass(frozen=True)
class Submission:
    """One folder of ``inbound/``: who, which assignment, when, and where."""

    key: str  # the folder's name, unique in the exchange
    student: str
    assignment: str
    time: datetime  # aware, UTC: when it arrived (see the module doc)
    path: Path
    owner: str  # the user that owns the folder
    problem: str = ""  # why it cannot be graded ("" when it can)

    def secret(self) -> str:
        """The submission's secret, which names its feedback file (read now: the folder may have changed).

        Read without following a link or blocking on a pipe the student put there; raises OSError
        when it is not a small regular file.
        """
        fd = os.open(self.path / SECRET_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise OSError(f"{SECRET_FILE} is not a file")
            secret = handle.read(MAX_SECRET + 1).decode("utf-8", "replace").strip()
        if not secret or len(secret) > MAX_SECRET:
            raise OSError(f"{SECRET_FILE} is empty or longer than {MAX_SECRET} characters")
        return secret


def _owner(info: os.stat_result) -> str:
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        return str(info.st_uid)


def _lstat_mode(path: Path) -> int:
    try:
        return path.lstat().st_mode
    except OSError:
        return 0


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse(path: Path, assignments: set[str]) -> Submission:
    """The :class:`Submission` the inbound folder ``path`` holds (its ``problem`` says what is wrong with it)."""
    info = path.lstat()
    changed = datetime.fromtimestamp(info.st_ctime, UTC)
    parts = path.name.split("+")
    student, assignment = (parts + ["", ""])[:2]
    problem = ""
    if len(parts) not in (3, 4) or not student or not assignment:
        problem = "its folder's name is not <student>+<assignment>+<time>[+<random>] (nbgrader submit's)"
    elif not NAME.fullmatch(student):
        problem = f"the student id {student!r} is not a plain name (letters, digits, . _ @ -, not starting with .)"
    elif assignment not in assignments:
        problem = f"the course has no assignment {assignment!r}"
    else:
        try:
            _aware(parse_utc(parts[2]))  # nbgrader's format, though the folder's own time is used
        except Exception:  # noqa: BLE001 - any unreadable time is the same problem
            problem = f"its time {parts[2]!r} is not a time"
    if not problem and (path.is_symlink() or not path.is_dir()):
        problem = "it is not a folder"
    elif not problem and not stat.S_ISREG(_lstat_mode(path / SECRET_FILE)):
        problem = f"it has no {SECRET_FILE} (it was not made by nbgrader submit)"
    return Submission(path.name, student, assignment, changed, path, _owner(info), problem)


def scan(inbound: Path, assignments: set[str]) -> list[Submission]:
    """Every submission in ``inbound`` (oldest first); none when the folder does not exist."""
    if not inbound.is_dir():
        return []
    found = []
    for path in inbound.iterdir():
        try:
            found.append(parse(path, assignments))
        except OSError:  # removed while we looked: the next scan sees what is there
            continue
    return sorted(found, key=lambda s: (s.time, s.key))


def _special(folder: str, names: list[str]) -> set[str]:
    """The entries of ``folder`` that are neither files, folders nor links (a pipe would block the copy)."""
    return {name for name in names if not (stat.S_ISREG(mode := _lstat_mode(Path(folder) / name))
                                           or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))}


def collect(submission: Submission, root: Path) -> Path:
    """Copy the submission to ``root/submitted/<student>/<assignment>/`` (replacing what was there), as ``nbgrader collect``.

    Links are copied as links (never followed: staging then leaves them out with a note), pipes,
    sockets and devices are left out (reading a pipe would wait for ever), and
    ``timestamp.txt`` says the time of :attr:`Submission.time`, which late penalties use.
    """
    target = root / "submitted" / submission.student / submission.assignment
    partial = target.with_name(f".{target.name}.collecting")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(submission.path, partial, symlinks=True, ignore=_special)
    stamp = partial / TIMESTAMP_FILE
    if stamp.is_symlink() or stamp.exists():
        stamp.unlink() if not stamp.is_dir() or stamp.is_symlink() else shutil.rmtree(stamp)
    stamp.write_text(submission.time.strftime("%Y-%m-%d %H:%M:%S.%f %Z"), encoding="utf-8")
    if target.exists() or target.is_symlink():
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    os.replace(partial, target)
    return target
