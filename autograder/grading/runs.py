"""A grading run's traces, and the clean-up of a run that was stopped.

Every call of :func:`autograder.grading.grade.autograde` (``make autograde``, Gradescope, the grading
service) is a *run*. It registers in ``<course>/.grading-runs/<id>`` a file that it holds locked
(``flock``) for as long as it lives, which names its temporary folder; every process it starts carries
``AUTOGRADER_RUN=<id>:...`` in its environment (the fork server, each nbgrader process, and outside
each sandbox bubblewrap itself), and everything they write to a temporary folder is under the run's
own (``TMPDIR``): a root grader's is closed to every user but ``nobody``'s group, which may pass
through it (not list it) to reach the kernels' own folders
(:func:`~autograder.engine.sandbox.open_to_sandbox_user`). A run that is stopped, even by ``SIGKILL``
or a power cut, leaves its file unlocked: the next run, before it grades anything, kills what is
left of it and removes its folder.
Runs at the same time (the service beside ``make autograde``) leave each other alone: a locked file
is a live run, unless the record says it was written on this machine by a process that has ended (its
pid and start time). A lock outlives its run where a process the run forked still holds the file: a
child between ``fork`` and ``exec``, killed with the run but not yet scheduled to die on a busy machine
(seen in ``make test`` under load: a killed run's record and folder left).

What this does not do: undo what the stopped run had written. nbgrader writes a submission's grades in
one transaction and the next run grades (``--force``) every submission it is asked to, so the grades
end as an uninterrupted run's. A Dask worker's leftovers are on its own machine: the worker's
temporary folder is removed by the worker (:mod:`autograder.grading.cluster`), not from here.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from ..engine.sandbox import RUN_VARIABLE, kill_leftovers, open_to_sandbox_user

#: Where a course's runs register, and the prefix of their temporary folders.
REGISTRY = ".grading-runs"
FOLDER_PREFIX = "autograder-grading-"


@dataclass
class Run:
    """A live run: its id, its temporary folder, and the locked file that says it is alive."""

    ident: str
    folder: Path
    handle: IO[str]
    record: Path

    def token(self) -> str:
        """A new mark for the processes of one submission: ``<run>:<submission>``."""
        return f"{self.ident}:{uuid.uuid4().hex}"

    def environment(self, env: dict[str, str], token: str | None = None) -> dict[str, str]:
        """``env`` for a process of this run: its mark and its temporary folder."""
        return dict(env, **{RUN_VARIABLE: token or f"{self.ident}:run", "TMPDIR": str(self.folder)})

    def close(self) -> None:
        """The run ended: its folder and its record go (what it started has already ended)."""
        kill_leftovers(f"{self.ident}:", RUN_VARIABLE, prefix=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.record.unlink(missing_ok=True)
        self.handle.close()


def start(root: Path) -> Run:
    """Register a new run of the course at ``root``, after cleaning up the runs that were stopped."""
    registry = root / REGISTRY
    registry.mkdir(exist_ok=True)
    clean_stopped(root)
    ident = uuid.uuid4().hex
    folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    open_to_sandbox_user(folder)  # each kernel's folder is made in it (TMPDIR), and the sandbox must reach its own
    record = registry / ident
    handle = open(record, "w")  # noqa: SIM115 - held open, and locked, for the run's whole life
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    me = psutil.Process()
    json.dump({"folder": str(folder), "pid": me.pid, "started": me.create_time(), "host": socket.gethostname()}, handle)
    handle.flush()
    return Run(ident, folder, handle, record)


def clean_stopped(root: Path) -> list[str]:
    """Kill what is left of every stopped run of the course and remove its folder; return their ids."""
    registry = root / REGISTRY
    cleaned = []
    for record in sorted(registry.iterdir()) if registry.is_dir() else []:
        try:
            handle = open(record)  # noqa: SIM115 - closed below, after the lock tells whether its run lives
        except OSError:
            continue
        with handle:
            try:
                facts = json.loads(handle.read() or "{}")
            except ValueError:
                facts = {}
            facts = facts if isinstance(facts, dict) else {}
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                if not _ended(facts):
                    continue  # locked: a live run
            kill_leftovers(f"{record.name}:", RUN_VARIABLE, prefix=True)
            folder = Path(str(facts.get("folder", "")))
            # Only a folder this module made: a record is a file in the course, not to be trusted with rmtree.
            if folder.name.startswith(FOLDER_PREFIX) and folder.parent == Path(tempfile.gettempdir()):
                shutil.rmtree(folder, ignore_errors=True)
            record.unlink(missing_ok=True)
            cleaned.append(record.name)
    return cleaned


def _ended(facts: dict) -> bool:
    """Whether the record ``facts`` names a run's process on this machine that has ended (False when it cannot tell:
    a record of another machine, or of an older version, without its process's start time)."""
    pid, started = facts.get("pid"), facts.get("started")
    if facts.get("host") != socket.gethostname() or not isinstance(pid, int) or not isinstance(started, float):
        return False
    try:
        return abs(psutil.Process(pid).create_time() - started) > 0.01  # that pid is now another process's
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
