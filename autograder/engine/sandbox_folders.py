"""The sandbox's writable folders: what is copied into them, and who owns them.

A sandboxed kernel sees a *copy* of its submission's folder (regular files only, no notebooks,
no links, at most :data:`MAX_WORKDIR_BYTES`), a home with the grader's matplotlib font cache, and
a ``tmp``; where the sandboxed code runs as ``nobody``, ``nobody`` owns them.

What this does NOT protect: the size cap counts the files copied in, not what the code writes
later (the sandbox's ``tmpfs`` sizes and ``file_mb`` limit that); a file the grader's folder gains
while it is being copied may be copied or not.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: Largest copy of a submission folder's other files given to the kernel.
MAX_WORKDIR_BYTES = 100 * 2**20


def prepare_scratch(workdir: str | None, into: Path, owner: int | None) -> None:
    """Copy the regular files of ``workdir`` (no notebooks, no links) to ``into``, capped in size."""
    into.mkdir(parents=True, exist_ok=True)
    total = 0
    if workdir and os.path.isdir(workdir):
        for dirpath, dirnames, filenames in os.walk(workdir, followlinks=False):
            rel = os.path.relpath(dirpath, workdir)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            target = into / rel
            target.mkdir(parents=True, exist_ok=True)
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name.endswith(".ipynb") or not os.path.isfile(path) or os.path.islink(path):
                    continue
                total += os.path.getsize(path)
                if total <= MAX_WORKDIR_BYTES:
                    shutil.copyfile(path, target / name)
    if owner is not None:
        chown_tree(into, owner)


def chown_tree(path: Path, owner: int) -> None:
    """Give ``path`` and everything in it to ``owner`` (the sandbox user)."""
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, owner, owner)


def copy_font_cache(home: Path) -> None:
    """Give matplotlib in the sandbox the grader's font cache, so it need not rebuild it each time."""
    base = os.environ.get("MPLCONFIGDIR") or os.path.join(os.path.expanduser("~"), ".cache", "matplotlib")
    target = home / ".matplotlib"
    target.mkdir(parents=True, exist_ok=True)
    (home / ".ipython").mkdir(exist_ok=True)
    (home.parent / "tmp").mkdir(exist_ok=True)
    if os.path.isdir(base):
        for name in os.listdir(base):
            if name.startswith("fontlist") and name.endswith(".json"):
                shutil.copyfile(os.path.join(base, name), target / name)
