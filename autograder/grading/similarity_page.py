"""``make similarity``'s pages: ``report/similarity/index.html`` and one page per assignment.

The index lists each assignment with its pairs at or above the threshold and its matches with
the reference solution. An assignment's page has, per exercise, a histogram of the similarities
of all its pairs of students (inline SVG: what is usual for that exercise), the pairs at or above
the threshold, highest first, matches with the reference solution flagged as such, and each
pair's two answers side by side with the regions that match marked; then the submissions that
could not be read.

Everything a submission holds (its folder name, its code) is hostile: it is escaped before it is
written, and every page carries a Content-Security-Policy that forbids scripts, so nothing a
student wrote can run when the page is opened. The pages use no script at all.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import numpy as np

from ..course.repository import ROOT
from .feedback import with_policy, write_text
from .similarity import MAX_ANSWER, SHOWN, THRESHOLD, Assignment, Exercise, Pair, compare

#: Every page's Content-Security-Policy: no script, no request anywhere, styles written in the page only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; form-action 'none'"
REFERENCE = "reference solution"
BINS = 20

CSS = """body { font-family: sans-serif; max-width: 90em; margin: 1em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em;
text-align: left; vertical-align: top; } td { overflow-wrap: anywhere; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; margin-bottom: 2em; }
.pair h4 { grid-column: 1 / 3; margin: 0.5em 0 0; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f6; padding: 0.5em; margin: 0;
font-size: 0.85em; border: 1px solid #ddd; }
mark { background: #ffd479; } .reference { color: #a00; font-weight: bold; }
.note { color: #555; } svg text { font-size: 11px; font-family: sans-serif; }"""


def _head(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>")


def page_name(assignment: str) -> str:
    """The file of an assignment's page, in ``report/similarity/``."""
    return f"{assignment}.html"


def _who(student: str | None) -> str:
    return f"<span class='reference'>{REFERENCE}</span>" if student is None else html.escape(student)


def _marked(text: str, regions: list[tuple[int, int]]) -> str:
    """``text`` escaped, with the matching ``regions`` in ``<mark>`` (copydetect's highlighter)."""
    from copydetect.utils import highlight_overlap

    if not regions:
        return html.escape(text)
    slices = np.array([[a for a, _ in regions], [b for _, b in regions]])
    marked, _ = highlight_overlap(text, slices, "<mark>", "</mark>", escape_html=True)
    return marked


def histogram(values: np.ndarray, threshold: float, width: int = 520, height: int = 150) -> str:
    """Inline SVG: how many pairs have each similarity (bins of 1/BINS, log-scaled heights), the threshold dashed."""
    counts = np.histogram(np.clip(values, 0, 1), bins=BINS, range=(0, 1))[0] if len(values) else np.zeros(BINS, int)
    left, bottom, plot_w, plot_h = 40, 30, width - 50, height - 45
    top = max(1, int(counts.max()))
    bars = []
    for i, count in enumerate(counts):
        if not count:
            continue
        h = plot_h * math.log10(1 + count) / math.log10(1 + top)
        x = left + i * plot_w / BINS
        low, high = i / BINS, (i + 1) / BINS
        bars.append(f"<rect x='{x:.1f}' y='{height - bottom - h:.1f}' width='{plot_w / BINS - 1:.1f}' height='{h:.1f}' "
                    f"fill='{'#c33' if low >= threshold else '#4477aa'}'><title>{count} pairs with a similarity "
                    f"from {low:.2f} to {high:.2f}</title></rect>"
                    f"<text x='{x + plot_w / BINS / 2:.1f}' y='{height - bottom - h - 2:.1f}' text-anchor='middle'>"
                    f"{count}</text>")
    tx = left + threshold * plot_w
    ticks = "".join(f"<text x='{left + t * plot_w:.1f}' y='{height - bottom + 14}' text-anchor='middle'>{t:g}</text>"
                    for t in (0, 0.25, 0.5, 0.75, 1))
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' class='histogram'>"
            f"<line x1='{left}' y1='{height - bottom}' x2='{left + plot_w}' y2='{height - bottom}' stroke='#333'/>"
            f"{''.join(bars)}{ticks}"
            f"<line x1='{tx:.1f}' y1='8' x2='{tx:.1f}' y2='{height - bottom}' stroke='#c33' stroke-dasharray='4 3'/>"
            f"<text x='{tx + 3:.1f}' y='16'>threshold {threshold:g}</text>"
            f"<text x='{left + plot_w / 2:.1f}' y='{height - 2}' text-anchor='middle'>similarity of a pair of students' "
            f"answers (bar heights: number of pairs, log scale)</text></svg>")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _spread(values: np.ndarray) -> str:
    return (f"{len(values)} pairs: median {np.median(values):.2f}, 99th percentile {np.percentile(values, 99):.2f}, "
            f"highest {values.max():.2f}")


def _pair_html(exercise: Exercise, pair: Pair, anchor: str) -> str:
    second = exercise.reference or "" if pair.second is None else exercise.answers[pair.second]
    return (f"<div class='pair' id='{anchor}'><h4>{_who(pair.first)} and {_who(pair.second)}: similarity "
            f"{pair.similarity:.2f}</h4>"
            f"<div><div class='note'>{_who(pair.first)}</div><pre>{_marked(exercise.answers[pair.first], pair.slices[0])}"
            f"</pre></div><div><div class='note'>{_who(pair.second)}</div><pre>{_marked(second, pair.slices[1])}</pre>"
            "</div></div>")


def exercise_html(exercise: Exercise, threshold: float, number: int) -> str:
    e = html.escape
    values = exercise.pair_values()
    parts = [f"<h2 id='exercise-{number}'>{e(exercise.name)}</h2>"]
    parts.append(f"<p>{_count(len(exercise.compared), 'answer')} compared.</p>")
    for students, what in ((exercise.unanswered, "left as released"),
                           (exercise.too_short, "too short to compare once the released cell is taken out"),
                           (exercise.too_long, f"too long to compare (over {MAX_ANSWER:,} characters)"),
                           (exercise.missing, "without this answer cell")):
        if students:
            parts.append(f"<details><summary>{len(students)} {what}</summary><p>{e(', '.join(students))}</p></details>")
    if exercise.failed:
        parts.append(f"<details><summary>{len(exercise.failed)} could not be fingerprinted</summary><ul>"
                     + "".join(f"<li>{e(s)}: {e(why)}</li>" for s, why in exercise.failed) + "</ul></details>")
    if exercise.reference is None:
        parts.append("<p class='note'>source/ has no reference solution for this exercise.</p>")
    parts.append(f"<p>{_spread(values)}.</p>{histogram(values, threshold)}" if len(values) else
                 "<p>No two answers to compare.</p>")
    if not exercise.pairs:
        parts.append(f"<p>No pair at or above {threshold:g}.</p>")
        return "\n".join(parts)
    shown = len(exercise.pairs)
    total = exercise.above + exercise.above_reference
    parts.append(f"<p>At or above {threshold:g}: {_count(exercise.above_reference, 'answer')} with the reference "
                 f"solution, {_count(exercise.above, 'pair')} of students"
                 + (f"; the {shown} highest are shown" if shown < total else "") + ".</p>")
    rows = []
    for k, pair in enumerate(exercise.pairs):
        percentile = 100.0 * float(np.mean(values < pair.similarity)) if len(values) else 100.0
        rows.append(f"<tr><td>{k + 1}</td><td>{_who(pair.first)}</td><td>{_who(pair.second)}</td>"
                    f"<td>{pair.similarity:.2f}</td><td>{percentile:.1f}%</td><td>{pair.others}</td>"
                    f"<td><a href='#pair-{number}-{k}'>side by side</a></td></tr>")
    parts.append("<table><thead><tr><th>rank</th><th>answer</th><th>and</th><th>similarity</th>"
                 "<th>higher than (pairs of this exercise)</th><th>other students alike with either</th><th></th>"
                 "</tr></thead><tbody>"
                 + "".join(rows) + "</tbody></table>")
    parts += [_pair_html(exercise, pair, f"pair-{number}-{k}") for k, pair in enumerate(exercise.pairs)]
    return "\n".join(parts)


HOW_TO_READ = (
    "<p>Each exercise's answers are compared two by two, and each with the reference solution, by "
    "copydetect's fingerprints (MOSS's winnowing over tokens: names, comments and spacing do not count; "
    "the released cell is left out). A pair's similarity is the share of each answer's fingerprints found in "
    "the other, averaged over the two. The histogram shows what is usual for the exercise: a short answer is similar for "
    "everyone. Among pairs equally alike, those whose answers are alike with the fewest other students come "
    "first: an answer alike with many is a common answer. <strong>A high similarity is a reason to look at the "
    "two answers, not a verdict</strong>: two honest students can write the same short answer, and a copy "
    "rewritten in another style is not found. A match with the reference solution may mean it has leaked.</p>")


def assignment_page(assignment: Assignment) -> str:
    e = html.escape
    parts = [_head(f"Similar answers: {assignment.name}"), f"<h1>Similar answers: {e(assignment.name)}</h1>",
             "<p><a href='index.html'>All assignments</a></p>", HOW_TO_READ,
             f"<p>{len(assignment.students)} submissions read; threshold {assignment.threshold:g}.</p><ul>"]
    parts += [f"<li><a href='#exercise-{i}'>{e(x.name)}</a>: {x.above_reference} with the reference, {x.above} pairs</li>"
              for i, x in enumerate(assignment.exercises)]
    parts.append("</ul>")
    parts += [exercise_html(x, assignment.threshold, i) for i, x in enumerate(assignment.exercises)]
    parts.append("<h2>Submissions that could not be read</h2>")
    if assignment.unreadable:
        parts.append("<table><thead><tr><th>student</th><th>why</th></tr></thead><tbody>" + "".join(
            f"<tr><td>{e(s)}</td><td>{e(why)}</td></tr>" for s, why in assignment.unreadable) + "</tbody></table>")
    else:
        parts.append("<p>None.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def index_page(found: list[Assignment], threshold: float) -> str:
    e = html.escape
    parts = [_head("Similar answers"), "<h1>Similar answers, exercise by exercise</h1>", HOW_TO_READ,
             f"<p>Threshold {threshold:g}.</p>"]
    if not found:
        parts.append("<p>No submission in submitted/.</p>")
    else:
        rows = []
        for a in found:
            rows.append(f"<tr><td><a href='{e(quote(page_name(a.name)))}'>{e(a.name)}</a></td><td>{len(a.students)}</td>"
                        f"<td>{sum(x.above_reference for x in a.exercises)}</td><td>{sum(x.above for x in a.exercises)}</td>"
                        f"<td>{len(a.unreadable)}</td></tr>")
        parts.append("<table><thead><tr><th>assignment</th><th>submissions read</th><th>answers matching the reference "
                     "solution</th><th>pairs of students at or above the threshold</th><th>could not be read</th></tr>"
                     "</thead><tbody>" + "".join(rows) + "</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def summary(found: list[Assignment], threshold: float) -> str:
    """One line for the terminal."""
    pairs = sum(x.above for a in found for x in a.exercises)
    reference = sum(x.above_reference for a in found for x in a.exercises)
    unreadable = sum(len(a.unreadable) for a in found)
    submissions = sum(len(a.students) for a in found)
    return (f"similarity: report/similarity/index.html: {submissions} submissions of {len(found)} assignments; "
            f"{pairs} pairs at or above {threshold:g}, {reference} answers matching the reference solution, "
            f"{unreadable} could not be read")


def write(names: Iterable[str] | None = None, root: Path = ROOT, threshold: float = THRESHOLD,
          shown: int = SHOWN) -> list[Assignment]:
    """Compare the submissions of ``names`` (default: all) and write ``report/similarity/``; return what it shows."""
    found = compare(names, root, threshold, shown)
    folder = root / "report" / "similarity"
    for assignment in found:
        write_text(folder / page_name(assignment.name), with_policy(assignment_page(assignment), CSP))
    write_text(folder / "index.html", with_policy(index_page(found, threshold), CSP))
    return found
