"""``make collect-zip``: the submissions of a learning platform's zip put where nbgrader grades them.

nbgrader's ``zip_collect`` does the work; this module says how the platform names its files.
What it does *not* do: check the notebooks (grading's staging does), or match a Canvas user to a
student id beyond the file name (``make grades`` reads the same names back).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .course import ROOT, nbgrader

#: How a learning platform names the files of a "download all submissions" zip, as a regular
#: expression for nbgrader's ``FileNameCollectorPlugin.named_regexp`` (matched against the
#: whole path of each extracted file). The default is Canvas's
#: ``<name>_[LATE_]<user id>_<submission id>_<file name>[-<n>].ipynb``, for example
#: ``doejane_1234_567890_01_soft_lookup.ipynb`` or ``doejane_LATE_1234_567891_01_soft_lookup-1.ipynb``
#: (``-1``: a resubmission); the student id is the name part. A student id must start with a
#: letter or digit, so no file name can point outside ``submitted/``.
LMS_PATTERN = (r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9.-]*)_(?:LATE_)?[0-9]+_[0-9]+_"
               r"(?P<file_id>[A-Za-z0-9_ .()-]+?)(?:-[0-9]+)?\.ipynb$")


def collect_zip(assignment: str, archive: Path, pattern: str = LMS_PATTERN, root: Path = ROOT) -> list[str]:
    """Put the submissions of an LMS zip into ``submitted/`` with nbgrader's ``zip_collect``.

    Returns every student with a submission of ``assignment`` afterwards.


    The zip is copied to ``downloaded/<assignment>/archive/`` and extracted there by nbgrader;
    each ``.ipynb`` whose name matches ``pattern`` (see :data:`LMS_PATTERN`) becomes
    ``submitted/<student_id>/<assignment>/<file>.ipynb``. Files that do not match are skipped
    (nbgrader logs them).
    """
    target = root / "downloaded" / assignment / "archive"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, target / Path(archive).name)
    done = nbgrader("zip_collect", assignment, "--force", "--log-level=WARN",
                    f"--FileNameCollectorPlugin.named_regexp={pattern}", root=root, check=False)
    if done.returncode != 0:
        raise RuntimeError(" | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
    return sorted(p.parent.name for p in (root / "submitted").glob(f"*/{assignment}"))
