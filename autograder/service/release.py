"""Releasing a feedback page to one student, where nbgrader's *Fetch Feedback* finds it.

``nbgrader release_feedback`` writes the page of a submission to
``<exchange>/<course>/feedback/<md5(secret + notebook id)>.html``, where the secret is the one
``nbgrader submit`` wrote in the submission (``submission_secret.txt``) and kept in the student's
own cache; ``nbgrader fetch_feedback`` computes the same name from that cache and copies the page
into ``<assignment>/feedback/<time>/<notebook>.html``. The folder can be entered but not listed
by students, so only the student who holds the secret can find the page. This module writes a page
under that name (:func:`release`), with nbgrader's ``notebook_hash``.
"""

from __future__ import annotations

import html
import os
import pwd
import stat
from pathlib import Path

from nbgrader.utils import notebook_hash

from ..grading.feedback import with_policy, write_text

#: The exchange's feedback folder: enter (not list) for everyone, as ``nbgrader release_feedback`` makes it.
FOLDER_MODE = stat.S_IRWXU | stat.S_IXGRP | stat.S_IXOTH


def feedback_folder(exchange: Path, course_id: str) -> Path:
    """``<exchange>/<course>/feedback``, made as nbgrader makes it when missing."""
    folder = exchange / course_id / "feedback"
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, FOLDER_MODE)
    return folder


def release(exchange: Path, course_id: str, secret: str, notebook_id: str, page: str, student: str = "") -> Path:
    """Write ``page`` as the feedback of notebook ``notebook_id`` of the submission whose secret is ``secret``.

    A root service gives the page to ``student``'s Linux user, readable by that user and the service's group
    (the instructor's) only; elsewhere (one user's exchange, no such user) it is readable by all, as
    ``nbgrader release_feedback`` leaves it, and only its unguessable name keeps it from the others.
    """
    path = feedback_folder(exchange, course_id) / f"{notebook_hash(secret=secret, notebook_id=notebook_id)}.html"
    owner = _linux_user(student) if os.geteuid() == 0 else None
    # 0640, not 0440: Fetch Feedback copies every page again, over the copies it made before, keeping their mode
    write_text(path, page, 0o640 if owner is not None else 0o644, owner)  # whole or not at all
    return path


def _linux_user(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid if name else None
    except KeyError:
        return None


def message_page(title: str, lines: list[str]) -> str:
    """A small page of its own (no notebook): a submission not graded, or not gradable, and why."""
    items = "".join(f"<p>{html.escape(line)}</p>" for line in lines)
    return with_policy(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
                       f"<body><h1>{html.escape(title)}</h1>{items}</body></html>")


def with_lines(page: str, lines: list[str]) -> str:
    """``page`` with ``lines`` (the service's own: the quota, what is shown) in a box at the top of its body."""
    if not lines:
        return page
    block = ('<div class="grading-service" style="border:2px solid #06c;padding:0.5em 1em;margin:1em;">'
             + "".join(f"<p>{html.escape(line)}</p>" for line in lines) + "</div>")
    start = page.find("<body")
    at = page.find(">", start) + 1 if start >= 0 else 0
    return page[:at] + block + page[at:]
