"""What each cell of a notebook prints on other releases, compared with what the pinned releases print.

The pinned releases' outputs are the executed solutions (``solutions/NN_name/NN_name.ipynb``, nbval's
reference, written by ``make release``); a cell is matched by its id (the bundle's set-up cell and a
test's own last cell have none there, and are not compared). A cell's text (what it prints, its
result, its Markdown) is sanitized as nbval sanitizes it (``tests/nbval_sanitize.cfg``), then split
into numbers and the words between them:

- the words must be the same, spaces and line breaks aside (PyTorch pads a tensor's columns, and so
  breaks its lines, otherwise in some releases);
- a whole number must be the same (a count, a shape, a seed);
- a number with a point or an exponent may differ by :data:`RELATIVE` of its size, plus one unit of
  its last printed digit (a difference far below the tolerance can carry the rounding of that digit
  over).

A cell must draw as many figures. Drawn by the pinned Matplotlib, a figure must have the same size in
pixels, with at most :data:`FIGURE_SHARE` of its pixels differing (another PyTorch moves a curve by far
less than a pixel; a changed curve, legend or axis moves far more). Drawn by another Matplotlib, which
places its text and ticks a little differently (measured at Matplotlib 3.9.4: up to 11% of a figure's
pixels, 31 figures a few pixels off in size, a side by up to 2.6%), only its size is compared, within
:data:`FIGURE_SIZE` of each side.

Not compared: the test cells whose hidden tests the release takes out, the cells nbval does not
compare (tagged ``nbval-ignore-output``: timings), what a cell writes to stderr (warnings, whose
wording is each release's own), and the cells of :data:`VARIES`, each with why.

What this does NOT protect: a difference within the tolerances; the releases between the two ends; what a
figure draws where the Matplotlib is not the pinned one (its size only).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import numpy as np
from nbval.plugin import get_sanitize_patterns
from PIL import Image

from autograder.course.release import VOLATILE_TAG

from .nbval_figures import FIGURE, png_bytes

SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")
SOLUTIONS = Path(__file__).parent.parent / "solutions"
#: How far a printed number with a point or an exponent may move between releases, relative to its size: the
#: notebooks compute in float64 where they print a result, and PyTorch's kernels change their order of summing
#: between releases (far below 1e-4 in float64).
RELATIVE = 1e-4
#: The share of a figure's pixels that may differ, drawn by the pinned Matplotlib.
FIGURE_SHARE = 0.02
#: How far each side of a figure drawn by another Matplotlib may be from the pinned one's, relative to it (measured:
#: 2.6% at Matplotlib 3.9.4, a figure of 10 whose title is wider than its axes, its text drawn a little narrower).
FIGURE_SIZE = 0.03
#: Cells whose printed numbers are expected to differ between releases: (notebook, cell id) -> why.
VARIES: dict[tuple[str, str], str] = {
    ("03_masking", "cell-001"): "prints torch.__version__ (the release the notebook's set-up cell imports)",
    ("03_masking", "cell-009"): "prints PyTorch's own error message (c10::Half in 2.13, at::Half in 2.5)",
    ("03_masking", "cell-033"): "prints PyTorch's own error message about broadcasting, worded anew in each release",
    ("04_numerical_stability", "cell-035"): "prints PyTorch's own error message (c10::Half in 2.13, at::Half in 2.5)",
}

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Difference:
    """A cell whose output differs from the pinned releases' beyond the tolerances."""

    notebook: str
    cell: str
    what: str

    def __str__(self) -> str:
        return f"{self.notebook} {self.cell}: {self.what}"


def _sanitized(text: str) -> str:
    for regex, replace in get_sanitize_patterns(SANITIZE.read_text()):
        text = re.sub(regex, replace, text)
    return text


def _texts(outputs: list) -> str:
    """What a cell shows as text: its stdout, its results' and displays' text (Markdown where it has some)."""
    shown = []
    for output in outputs:
        if output.get("output_type") == "stream":
            if output.get("name") == "stdout":
                shown.append(output.get("text", ""))
        elif output.get("output_type") in ("execute_result", "display_data"):
            data = output.get("data", {})
            if FIGURE not in data:
                shown.append(data.get("text/markdown") or data.get("text/plain", ""))
        elif output.get("output_type") == "error":
            shown.append(f"{output.get('ename')}: {output.get('evalue')}")
    return "".join(shown)


def _last_digit(token: str) -> float:
    """One unit of ``token``'s last printed digit: ``"0.125"`` -> 0.001, ``"1.5e-03"`` -> 1e-4."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def number_difference(shown: str, pinned: str) -> str | None:
    """None when the two printed numbers agree (see the module's rules), else how they differ."""
    if shown == pinned:  # float64's largest, printed rounded up, reads back as inf
        return None
    if not re.search(r"[.eE]", pinned):
        return None if shown == pinned else f"{shown} where the pinned releases print {pinned}"
    a, b = float(shown), float(pinned)
    allowed = RELATIVE * abs(b) + _last_digit(pinned) * (1 + 1e-9)
    if abs(a - b) <= allowed:
        return None
    return f"{shown} where the pinned releases print {pinned} (beyond {RELATIVE:g} relative and one last digit)"


def text_difference(shown: str, pinned: str) -> str | None:
    """None when two texts agree once sanitized (the same words, each number within the tolerance), else the
    first difference."""
    shown, pinned = _sanitized(shown), _sanitized(pinned)
    words, pinned_words = ([re.sub(r"\s+", "", word) for word in NUMBER.split(text)] for text in (shown, pinned))
    numbers, pinned_numbers = NUMBER.findall(shown), NUMBER.findall(pinned)
    if words != pinned_words or len(numbers) != len(pinned_numbers):
        return f"prints {shown.strip()[:300]!r} where the pinned releases print {pinned.strip()[:300]!r}"
    for a, b in zip(numbers, pinned_numbers):
        differs = number_difference(a, b)
        if differs:
            return differs
    return None


def figure_difference(shown: bytes, pinned: bytes, same_matplotlib: bool = True) -> str | None:
    """None when two PNGs agree: the same size and at most :data:`FIGURE_SHARE` of their pixels differing, or
    (not ``same_matplotlib``) each side within :data:`FIGURE_SIZE`."""
    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.int16) for png in (shown, pinned))
    if not same_matplotlib:
        if all(abs(x - y) <= FIGURE_SIZE * y for x, y in zip(a.shape[:2], b.shape[:2])):
            return None
        return (f"a figure of {a.shape[1]} x {a.shape[0]} pixels, not within {FIGURE_SIZE:.0%} of "
                f"{b.shape[1]} x {b.shape[0]}")
    if a.shape != b.shape:
        return f"a figure of {a.shape[1]} x {a.shape[0]} pixels, not {b.shape[1]} x {b.shape[0]}"
    differing = float((np.abs(a - b).max(axis=-1) > 0).mean())
    if differing <= FIGURE_SHARE:
        return None
    return f"a figure with {differing:.1%} of its pixels differing (at most {FIGURE_SHARE:.0%})"


def cell_differences(shown: list, pinned: list, same_matplotlib: bool = True) -> list[str]:
    """How a cell's outputs differ from the pinned releases' beyond the tolerances."""
    found = [text_difference(_texts(shown), _texts(pinned))]
    figures, pinned_figures = ([png_bytes(o) for o in outputs if FIGURE in o.get("data", {})]
                               for outputs in (shown, pinned))
    if len(figures) != len(pinned_figures):
        found.append(f"{len(figures)} figures where the pinned releases draw {len(pinned_figures)}")
    found += [figure_difference(a, b, same_matplotlib) for a, b in zip(figures, pinned_figures)]
    return [difference for difference in found if difference]


def differences(executed: Path, solution: Path, same_matplotlib: bool = True) -> list[Difference]:
    """Every cell of the ``executed`` notebook whose outputs differ from the same cell's in ``solution``
    (``same_matplotlib``: drawn by the Matplotlib that drew the solution)."""
    pinned = {cell.get("id"): cell for cell in nbformat.read(solution, as_version=4).cells if cell.cell_type == "code"}
    name = solution.stem
    found = []
    for cell in nbformat.read(executed, as_version=4).cells:
        reference = pinned.get(cell.get("id"))
        if cell.cell_type != "code" or reference is None or (name, cell.id) in VARIES:
            continue
        if VOLATILE_TAG in reference.metadata.get("tags", []):  # as nbval: timings
            continue
        if cell.metadata.get("nbgrader", {}).get("grade") and cell.source != reference.source:
            continue  # a test cell without its hidden tests: what they print is the grader's, not the student's
        found += [Difference(name, cell.id, what)
                  for what in cell_differences(cell.outputs, reference.outputs, same_matplotlib)]
    return found
