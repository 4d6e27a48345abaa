"""nbval on ``solutions/``: the figures compared too, and each notebook's cells on one worker.

nbval compares a cell's text outputs and skips its images (unless asked to show failures with
nbdime, which this course does not install). The solutions' figures are part of what
``make release`` commits, and no other test runs the solutions (the drift test compares their
cells, not their outputs), so a figure is compared here by the digest of its PNG bytes: a
changed figure fails with two short digests, not two pages of base64.

A figure is compared pixel by pixel, within :data:`TOLERANCE`: the same size, and at most one
pixel in a thousand differing, by a few levels. Another CPU's arithmetic (AVX2 or AVX-512 sums
in another order) moves a curve by far less than a pixel, which changes the antialiasing of a
pixel or two by one level (one pixel of notebook 04's 359,700); a changed curve, legend or
colour changes far more.

What this does NOT protect: a change smaller than the tolerance (a digit of a label could be);
the pinned matplotlib is assumed, since another version draws other pixels; other image types
than PNG (none in the course) are still skipped.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io

import numpy as np
import pytest
from nbval.plugin import IPyNbCell
from PIL import Image

FIGURE = "image/png"


#: The share of a figure's pixels that may differ, and by how many levels (of 255) at most.
TOLERANCE = (0.001, 8)


def png_bytes(output: dict) -> bytes:
    """The PNG of a display output."""
    return base64.b64decode("".join(output["data"][FIGURE].split()))


def described(png: bytes) -> str:
    """A short text for a PNG: its size and the start of its digest."""
    return f"a PNG of {len(png)} bytes, sha256 {hashlib.sha256(png).hexdigest()[:16]}"


def difference(shown: bytes, committed: bytes) -> str | None:
    """None when the two PNGs agree within :data:`TOLERANCE`, else how they differ."""
    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.int16) for png in (shown, committed))
    if a.shape != b.shape:
        return f"{a.shape[1]} x {a.shape[0]} pixels, not {b.shape[1]} x {b.shape[0]}"
    levels = np.abs(a - b).max(axis=-1)
    share, most = TOLERANCE
    differing = int((levels > 0).sum())
    if differing <= share * levels.size and levels.max() <= most:
        return None
    return f"{differing} of {levels.size} pixels differ, by up to {levels.max()} levels"


def digest(outputs: list, like: list | None = None) -> list:
    """``outputs`` with each PNG replaced by a short text; with ``like`` (the committed outputs), a figure
    that agrees with the one at the same place there, within :data:`TOLERANCE`, reads as that one."""
    committed = [png_bytes(o) for o in like or [] if FIGURE in o.get("data", {})]
    digested, figures = [], 0
    for output in outputs:
        if FIGURE in output.get("data", {}):
            output = copy.deepcopy(output)
            png = png_bytes(output)
            text = described(png)
            if figures < len(committed):
                differs = difference(png, committed[figures])
                text = described(committed[figures]) if differs is None else f"{text} ({differs})"
            output["data"][FIGURE] = text
            figures += 1
        digested.append(output)
    return digested


def compare_figures(item: IPyNbCell) -> None:
    """Make nbval compare ``item``'s figures (within :data:`TOLERANCE`) with its text."""
    item.parent.skip_compare = tuple(key for key in item.parent.skip_compare if key != FIGURE)

    def compare_outputs(test, ref, skip_compare=None):
        return IPyNbCell.compare_outputs(item, digest(test, like=ref), digest(ref), skip_compare)

    item.compare_outputs = compare_outputs


def prepare(items: list[pytest.Item]) -> None:
    """nbval's cells: figures compared; a notebook's cells share one kernel, so one worker (``--dist loadgroup``)."""
    for item in items:
        if isinstance(item, IPyNbCell):
            compare_figures(item)
            item.add_marker(pytest.mark.xdist_group(f"nbval-{item.path.stem}"))
