"""nbval on ``solutions/``: the figures compared too, and each notebook's cells on one worker.

nbval compares a cell's text outputs and skips its images (unless asked to show failures with
nbdime, which this course does not install). The solutions' figures are part of what
``make release`` commits, and no other test runs the solutions (the drift test compares their
cells, not their outputs), so a figure is compared here by the digest of its PNG bytes: a
changed figure fails with two short digests, not two pages of base64.

What this does NOT protect: a figure is compared byte for byte, which holds on one platform with
the pinned matplotlib; other image types than PNG (none in the course) are still skipped.
"""

from __future__ import annotations

import base64
import copy
import hashlib

import pytest
from nbval.plugin import IPyNbCell

FIGURE = "image/png"


def digest(outputs: list) -> list:
    """``outputs`` with each PNG replaced by the digest of its bytes."""
    digested = []
    for output in outputs:
        if FIGURE in output.get("data", {}):
            output = copy.deepcopy(output)
            png = base64.b64decode("".join(output["data"][FIGURE].split()))
            output["data"][FIGURE] = f"a PNG of {len(png)} bytes, sha256 {hashlib.sha256(png).hexdigest()[:16]}"
        digested.append(output)
    return digested


def compare_figures(item: IPyNbCell) -> None:
    """Make nbval compare ``item``'s figures (by digest) with its text."""
    item.parent.skip_compare = tuple(key for key in item.parent.skip_compare if key != FIGURE)

    def compare_outputs(test, ref, skip_compare=None):
        return IPyNbCell.compare_outputs(item, digest(test), digest(ref), skip_compare)

    item.compare_outputs = compare_outputs


def prepare(items: list[pytest.Item]) -> None:
    """nbval's cells: figures compared; a notebook's cells share one kernel, so one worker (``--dist loadgroup``)."""
    for item in items:
        if isinstance(item, IPyNbCell):
            compare_figures(item)
            item.add_marker(pytest.mark.xdist_group(f"nbval-{item.path.stem}"))
