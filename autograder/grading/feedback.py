"""``make feedback``: one HTML page per graded notebook, safe to open and readable offline.

nbgrader renders each page (its ``feedback`` template, ``GetGrades``, ``ClearHiddenTests``: the
hidden part of every test cell is gone before rendering), with the preprocessors and the
exporter named in ``nbgrader_config.py``. This module adds what ``nbgrader generate_feedback``
lacks:

- **one submission cannot stop another**: each notebook is rendered on its own; if it cannot
  be rendered its page says why, and every later notebook still gets its page;
- **any text can be written**: pages are written with ``errors="backslashreplace"`` (a lone
  surrogate such as ``"\\ud800"`` in a cell, an output, a note or a file name is written as the
  six characters ``\\ud800``), to a temporary file renamed into place, so no page is ever cut
  or empty;
- **nothing the student wrote runs when the page is opened**: the HTML of code outputs and raw
  cells is cleaned (:class:`SanitizeOutputs`, with ``nh3``), and markdown cells are cleaned after
  they are rendered to HTML (:class:`FeedbackExporter`), which keeps the maths and code spans
  intact where cleaning the markdown source would not; what the template writes from an
  output's metadata and a cell's execution count, some of it unquoted (an image's ``width`` and
  ``height``), is kept only when it is a plain number (:func:`inert_output`); and every page
  carries a Content-Security-Policy (:data:`PAGE_POLICY`) under which a browser runs no script
  but the local MathJax, no inline script or event handler, and loads nothing from elsewhere,
  should anything get past the cleaning;
- **maths without a network**: MathJax 2 from the ``jupyter-server-mathjax`` package is copied
  once to ``feedback/_mathjax/``, with the pages' MathJax configuration as a file of its own
  (an inline configuration would need the policy to allow inline scripts and ``eval``), and
  every page loads it from there (no CDN); the maths of markdown cells is also written as MathML
  (:mod:`.feedback_maths`), which a browser renders without MathJax: a page a student fetches
  through the exchange has no ``_mathjax/`` beside it;
- **long lines wrap** (a check's message is one long line), and the grading notes of a
  submission are shown at the top of each of its pages;
- **every exercise and every case at the top**: under the notes, :func:`summary_html` lists each
  exercise of the notebook with its points (the gradebook's, as nbgrader's ``GetGrades`` put them
  in the cells) and under it each case of its checks: passed, or failed with its message and the
  catalogued mistakes it fits, read from the grader's record (:mod:`.case_results`), never from a
  cell's source (a hidden case shows its name and message, never its code). Every text it writes
  is escaped: a message can quote what a student's code raised.
"""

from __future__ import annotations

import copy
import html
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nh3
from jinja2 import DictLoader
from nbconvert.exporters import HTMLExporter
from nbconvert.exporters.html import contextfilter
from nbconvert.preprocessors import Preprocessor
from nbconvert.preprocessors.sanitize import SanitizeHTML
from traitlets import default

from ..course.repository import ROOT, assignments
from ..course.settings import Settings
from ..engine import notes as grading_notes
from . import feedback_maths
from .case_results import Case, JudgedCell, is_test_cell, read_judged_cell

#: The folder of ``feedback/`` that holds the one copy of MathJax every page loads.
MATHJAX_FOLDER = "_mathjax"
#: The pages' MathJax configuration, a file of the local copy (MathJax's ``config/local/``).
MATHJAX_CONFIG_FILE = "config/local/feedback.js"
#: What a page at ``feedback/<student>/<assignment>/<notebook>.html`` loads MathJax from. ``Safe``
#: disables ``\\href{javascript:..}`` and friends inside maths; ``local/feedback`` is
#: :data:`MATHJAX_CONFIG`, loaded after the combined configuration, as MathJax documents.
MATHJAX_URL = f"../../{MATHJAX_FOLDER}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe,local/feedback"
#: The parts of jupyter-server-mathjax's MathJax that the pages use (no localisation, no other fonts).
MATHJAX_PARTS = ("MathJax.js", "LICENSE", "config", "extensions", "jax", "fonts/HTML-CSS/STIX-Web")

#: The pages' MathJax configuration. The package ships the STIX-Web fonts only, so HTML-CSS
#: output is told to use them. A file, not an inline ``text/x-mathjax-config`` script: MathJax
#: runs that one with ``eval``, which the pages' policy forbids.
MATHJAX_CONFIG = """MathJax.Hub.Config({
  tex2jax: {inlineMath: [['$','$'], ['\\\\(','\\\\)']], displayMath: [['$$','$$'], ['\\\\[','\\\\]']],
            processEscapes: true, processEnvironments: true},
  TeX: {equationNumbers: {autoNumber: "AMS", useLabelIds: true}},
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
               linebreaks: {automatic: true}},
  displayAlign: "center", messageStyle: "none"
});
MathJax.Ajax.loadComplete("[MathJax]/@FILE@");
""".replace("@FILE@", MATHJAX_CONFIG_FILE)

#: nbconvert's mathjax macro, pointed at the local copy.
MATHJAX_MACRO = """{%- macro mathjax(url="") -%}
<script src="@URL@"></script>
{%- endmacro %}
""".replace("@URL@", MATHJAX_URL)

#: What a feedback page may do, as a Content-Security-Policy: scripts only from files of the
#: page's own origin (the local MathJax, which loads its parts as scripts), so no inline script,
#: no event handler and no ``javascript:`` URL runs; styles inline or local (nbconvert's and
#: MathJax's); images inline (``data:``) or local; fonts local; nothing from another origin, no
#: frame, no plugin, no form, no ``<base>``. A page opened from disk counts files as its origin.
PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
               "font-src 'self'; base-uri 'none'; form-action 'none'")
#: Long lines wrap instead of running off the right edge (a check's message is one line).
WRAP_CSS = """<style type="text/css">
pre, .output_text pre, .output_error pre, .output_stream pre, div.output_area pre, .jp-OutputArea-output pre {
  white-space: pre-wrap; overflow-wrap: anywhere; word-break: normal;
}
div.output_area, div.output_subarea { overflow-x: visible; max-width: 100%; }
.grading-notes li { white-space: pre-wrap; overflow-wrap: anywhere; }
.case-summary .case-message { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0.2em 0 0.4em 1.5em; }
.case-summary .case-mistake { margin: 0 0 0.4em 1.5em; font-style: italic; }
.case-summary .case-passed .case-result { color: #2a7a2a; font-weight: bold; }
.case-summary .case-failed .case-result, .case-summary .cell-stopped { color: #b3261e; font-weight: bold; }
.case-summary ul.cases { list-style: none; padding-left: 1.2em; }
</style>
"""

# -- what a rendered markdown cell may contain ----------------------------------------------

MARKDOWN_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em", "h1", "h2",
    "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "samp", "span", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul",
})
MARKDOWN_ATTRIBUTES = frozenset({"class", "id", "title", "alt", "href", "src", "width", "height", "align",
                                 "colspan", "rowspan", "style", "start", "open"})
SAFE_IMAGES = ("data:image/png", "data:image/jpeg", "data:image/gif", "data:image/webp")
STYLES = frozenset({"text-align", "width", "height", "max-width", "color", "background-color", "font-weight",
                    "font-style"})


def _allowed_attribute(tag: str, name: str, value: str) -> str | None:
    """``value`` where the attribute may stay, else None (nh3's ``attribute_filter``)."""
    if name == "src":  # an image is an image: never a data: URL of another type
        safe = tag == "img" and (value.startswith(("http://", "https://")) or value.startswith(SAFE_IMAGES)
                                 or ":" not in value)
        return value if safe else None
    if name == "href":
        return None if value.strip().lower().startswith("data:") else value
    return value


def clean_html(fragment: str) -> str:
    """``fragment`` with every script, style sheet, event handler and unsafe URL removed (with ``nh3``)."""
    fragment = grading_notes.safe_text(fragment)  # nh3 takes text that encodes: a lone surrogate is written \\ud800
    return nh3.clean(fragment, tags=set(MARKDOWN_TAGS), attributes={"*": set(MARKDOWN_ATTRIBUTES)},
                     attribute_filter=_allowed_attribute, url_schemes={"http", "https", "mailto", "data"},
                     filter_style_properties=set(STYLES), strip_comments=True)


def _dimension(value: Any) -> bool:
    """Whether ``value`` is a plain positive number (what an image's width or height must be)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


#: Output metadata the template turns into markup of its own: written from outside the page
#: (``filenames``: images the page does not embed) or into another document (``isolated``: an
#: iframe); every page embeds its outputs, so they are dropped.
DROPPED_METADATA = ("filenames", "isolated")
#: Output metadata the template writes unquoted into a tag (``<img width=...>``): numbers only.
DIMENSIONS = ("width", "height")


def inert_output(output: dict) -> None:
    """Make what the template writes from ``output`` besides its data plain (in place).

    Its metadata (top level and per MIME type) keeps ``width`` and ``height`` only when they are
    plain positive numbers, loses :data:`DROPPED_METADATA`, and a per-MIME-type entry that is
    not a mapping; its execution count is a whole number or nothing; ``svg_filename`` is dropped.
    """
    metadata = output.get("metadata")
    if "metadata" in output and not isinstance(metadata, dict):
        output["metadata"] = metadata = {}
    for level in [metadata or {}, *[v for v in (metadata or {}).values() if isinstance(v, dict)]]:
        for key in DROPPED_METADATA:
            level.pop(key, None)
        for key in DIMENSIONS:
            if key in level and not _dimension(level[key]):
                del level[key]
    for key in [k for k, v in (metadata or {}).items() if "/" in str(k) and not isinstance(v, dict)]:
        del metadata[key]
    output.pop("svg_filename", None)
    if "execution_count" in output and not _count(output["execution_count"]):
        output["execution_count"] = None


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


#: What nbgrader's feedback template may write as a cell's ``grade_id``: it writes it as it is, in
#: an attribute and as text (staging gives every graded cell the release's id; this is the last word).
GRADE_ID = re.compile(r"[A-Za-z0-9_.-]+")


def inert_notebook(nb):
    """A copy of ``nb`` whose outputs are :func:`inert_output` and whose execution counts are numbers or nothing.

    Done before nbconvert validates the notebook, which refuses a count that is not a number
    (the student's page would then say only that it could not be shown). A cell whose ``grade_id``
    is not a plain name loses its grading metadata (it is shown as an ordinary cell).
    """
    nb = copy.deepcopy(nb)
    for cell in nb.get("cells", []):
        if "execution_count" in cell and not _count(cell["execution_count"]):
            cell["execution_count"] = None  # the template writes it as it is: "In [<img onerror=...>]"
        grading = (cell.get("metadata") or {}).get("nbgrader")
        if isinstance(grading, dict) and "grade_id" in grading and not GRADE_ID.fullmatch(str(grading["grade_id"])):
            del cell["metadata"]["nbgrader"]
        for output in cell.get("outputs", []) if isinstance(cell.get("outputs"), list) else []:
            if isinstance(output, dict):
                inert_output(output)
    return nb


class SanitizeOutputs(SanitizeHTML):
    """nbconvert's ``SanitizeHTML`` for code outputs and raw cells, cleaning with :func:`clean_html`.

    Markdown cells are left to :class:`FeedbackExporter`, which cleans them once rendered:
    cleaning the markdown source would escape ``<``, ``>`` and ``&`` inside maths and code spans.
    """

    def sanitize_html_tags(self, html_str):
        """The same cleaning as markdown's (nbconvert's own uses bleach, which its maintainers deprecated)."""
        return clean_html(html_str)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown":
            return cell, resources
        done = super().preprocess_cell(cell, resources, index)
        if done is None:  # a cell type nbformat does not know: show nothing of it
            cell.source = ""
            cell.pop("type", None)  # the template writes "unknown type {{ cell.type }}"
            return cell, resources
        return done


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback page: inert metadata, markdown cleaned after rendering, local MathJax, a policy, wrapping
    lines, and the summary of every exercise and case at the top (:class:`CaseSummary`)."""

    _summarising = False

    @default("extra_loaders")
    def _local_mathjax(self):
        # Searched before the templates: nbconvert's `mathjax.html.j2` macro loads MathJax from a CDN.
        return [DictLoader({"mathjax.html.j2": MATHJAX_MACRO})]

    @contextfilter
    def markdown2html(self, context, source):
        """Render the markdown as nbconvert does, remove whatever could run (see :func:`clean_html`), maths as MathML."""
        return feedback_maths.markdown2html(self, context, source, clean=clean_html)

    def from_notebook_node(self, nb, resources=None, **kw):
        if not self._summarising:
            # Registered at the first page, so it runs last: after the preprocessors nbgrader (or
            # make_exporter) registers, GetGrades among them, which puts each cell's score in the cell.
            self.register_preprocessor(CaseSummary(parent=self), enabled=True)
            self._summarising = True
        output, resources = super().from_notebook_node(inert_notebook(nb), resources, **kw)
        output = at_top(output, resources.get(CaseSummary.KEY, ""))
        output = TEST_CELL_LINK.sub(lambda m: f'<a href="#{m[1]}">{html.escape(summary_name(m[1]))}</a>', output)
        at = output.find("</head>")
        if at >= 0:
            output = output[:at] + WRAP_CSS + output[at:]
        return with_policy(output), resources


#: nbgrader's summary at the top of a page calls every test cell "Test cell".
TEST_CELL_LINK = re.compile(r'<a href="#([A-Za-z0-9_.-]+)">Test cell</a>')


def summary_name(grade_id: str) -> str:
    """The summary's name of a test cell: the exercise and which checks (the course's ids: ``test_<exercise>[_hidden]``)."""
    exercise = grade_id.removeprefix("test_")
    if exercise.endswith("_hidden"):
        return f"{exercise.removesuffix('_hidden')}: hidden checks"
    return f"{exercise}: checks"


# -- the summary of exercises and cases at the top of a page -------------------------------


class CaseSummary(Preprocessor):
    """Puts :func:`summary_html` of the notebook in ``resources[CaseSummary.KEY]`` (the exporter writes it at the top)."""

    KEY = "autograder_case_summary"

    def preprocess(self, nb, resources):
        resources[self.KEY] = summary_html(nb)
        return nb, resources


def _points(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _amount(points: float) -> str:
    """Points as the page writes them: at most two decimals (a third of a point is 0.33)."""
    return f"{round(points, 2):g}"


def _case_html(case: Case, cell: JudgedCell) -> str:
    e = html.escape
    kind = [("hidden check" if cell.hidden else "visible check")] if cell.recorded else []
    if case.points is not None:
        kind.append(f"{_amount(case.points)} point" + ("" if case.points == 1 else "s"))
    parts = [f'<li class="case case-{"passed" if case.passed else "failed"}">'
             f'<span class="case-result">{"passed" if case.passed else "FAILED"}</span> '
             f'<span class="case-name">{e(case.name)}</span>' + (f' <span class="case-kind">({", ".join(kind)})</span>'
                                                                  if kind else "")]
    if case.message:
        parts.append(f'<div class="case-message">{e(case.message)}</div>')
    if case.mistakes:
        label = "The mistake" if len(case.mistakes) == 1 else "The mistakes"
        parts.append(f'<div class="case-mistake">{label}: {e(", ".join(case.mistakes))}</div>')
    return "".join(parts) + "</li>"


def _cell_html(cell: JudgedCell, points: float | None) -> str:
    e = html.escape
    checks = "hidden checks" if cell.hidden else "visible checks"
    notes = []
    if cell.stopped:
        notes.append(f'<li class="cell-stopped">No points for the {checks}: {e(cell.stopped)}</li>')
    if cell.recorded and cell.all_or_nothing:
        whole = f" ({_amount(points)} points)" if points is not None else ""
        notes.append(f'<li class="cell-all-or-nothing">The {checks} count all or nothing{whole}: '
                     "every case must pass.</li>")
    return "".join(notes) + "".join(_case_html(case, cell) for case in cell.cases)


def summary_html(nb) -> str:
    """Every exercise of the graded notebook ``nb`` with its points, and under it every case of its checks (escaped).

    An exercise's score and points are its test cells' (``metadata.nbgrader.score`` and ``points``, which
    nbgrader's ``GetGrades`` reads from the gradebook); its cases are read by :func:`read_judged_cell`.
    """
    e = html.escape
    exercises: dict[str, list[tuple[JudgedCell, float | None, float | None]]] = {}
    for cell in nb.get("cells", []):
        if is_test_cell(cell):
            meta = cell["metadata"]["nbgrader"]
            judged = read_judged_cell(cell)
            exercises.setdefault(judged.exercise, []).append((judged, _points(meta.get("score")),
                                                              _points(meta.get("points"))))
    if not exercises:
        return ""
    items = []
    for exercise, cells in exercises.items():
        scores, points = [s for _, s, _ in cells], [p for _, _, p in cells]
        total = f"{_amount(sum(points))} points" if None not in points else "points not known"
        score = f"{_amount(sum(scores))} / {total}" if None not in scores and None not in points else total
        anchor = e(cells[0][0].grade_id) if GRADE_ID.fullmatch(cells[0][0].grade_id) else ""
        name = f'<a href="#{anchor}">{e(exercise)}</a>' if anchor else e(exercise)
        items.append(f'<li class="exercise"><span class="exercise-name">{name}</span>: '
                     f'<span class="exercise-score">{score}</span><ul class="cases">'
                     + "".join(_cell_html(cell, p) for cell, _, p in cells) + "</ul></li>")
    # tex2jax_ignore: MathJax leaves the summary as it is written (a message's "$" is not maths).
    return ('<div class="container case-summary tex2jax_ignore"><div class="panel panel-default"><div class="panel-heading">'
            "<h4>Your exercises and their checks</h4></div><div class=\"panel-body\"><ol class=\"exercises\">"
            + "".join(items) + "</ol></div></div></div>")


def with_policy(page: str, policy: str = PAGE_POLICY) -> str:
    """``page`` with ``policy`` as its Content-Security-Policy, first in its ``<head>`` (before anything it governs)."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy, quote=False)}">'  # no " in a policy
    start = page.find("<head")
    at = page.find(">", start) + 1 if start >= 0 else 0
    if start < 0:  # no head at all: a page of our own always has one, so this is a fragment
        return meta + page
    return page[:at] + meta + page[at:]


# -- writing the pages ---------------------------------------------------------------------


@dataclass
class FeedbackRun:
    """What :func:`feedback` wrote."""

    pages: list[Path] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # "student / assignment / notebook: why" (a page says why)
    without_submissions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"feedback: {len(self.pages)} pages written in feedback/"
                 + (f", {len(self.broken)} of them saying why the notebook could not be shown" if self.broken else "")]
        if self.without_submissions:
            lines.append("no graded submissions, so no feedback, for: " + ", ".join(self.without_submissions))
        lines += [f"  could not render {line}" for line in self.broken]
        return "\n".join(grading_notes.inert_text(line) for line in lines)


def write_text(path: Path, text: str, mode: int = 0o644, owner: int | None = None) -> None:
    """Write ``text`` to ``path`` whole or not at all; characters UTF-8 cannot hold are written escaped.

    ``mode`` and ``owner`` (a uid; None: the writer) are the file's from its first moment under ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".page-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
        if owner is not None:
            os.chown(temporary, owner, -1)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def install_mathjax(feedback_dir: Path) -> Path:
    """Copy MathJax from the ``jupyter-server-mathjax`` package to ``feedback_dir/_mathjax`` (once)."""
    import jupyter_server_mathjax

    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    target = feedback_dir / MATHJAX_FOLDER
    stamp = target / ".source"
    if stamp.is_file() and stamp.read_text() == str(source):
        write_text(target / MATHJAX_CONFIG_FILE, MATHJAX_CONFIG)
        return target
    if target.is_symlink() or target.is_file():
        target.unlink()
    shutil.rmtree(target, ignore_errors=True)
    for part in MATHJAX_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, target / part)
        else:
            (target / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / part, target / part)
    write_text(target / MATHJAX_CONFIG_FILE, MATHJAX_CONFIG)
    stamp.write_text(str(source))
    return target


def make_exporter(course: Settings, db_url: str) -> HTMLExporter:
    """The exporter nbgrader's ``generate_feedback`` would use for the course of ``course``."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    config = course.config()
    config.CourseDirectory.db_url = db_url
    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    exporter = converter.exporter_class(parent=converter, config=converter.config)
    if not isinstance(exporter, FeedbackExporter):
        raise RuntimeError("nbgrader_config.py must set c.GenerateFeedback.exporter_class to "
                           "autograder.grading.feedback.FeedbackExporter")
    for preprocessor in converter.preprocessors:
        exporter.register_preprocessor(preprocessor, enabled=True)
    return exporter


def _notes_block(folder: Path) -> str:
    try:
        notes = grading_notes.read_notes(folder)
    except Exception as error:  # noqa: BLE001 - a damaged notes file is itself worth a note
        notes = [grading_notes.Note(grading_notes.NoteKind.FAILED,
                                    f"The grading notes of this submission could not be read ({error}).")]
    return grading_notes.notes_html(notes) if notes else ""


def at_top(page: str, block: str) -> str:
    """``page`` with ``block`` first in its body (the notes, put there last, come above the summary)."""
    if not block:
        return page
    start = page.find("<body")
    at = page.find(">", start) + 1 if start >= 0 else 0
    return page[:at] + block + page[at:]


def _standalone(title: str, body: str) -> str:
    return with_policy(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                       f"{WRAP_CSS}</head><body>{body}</body></html>")


def render(exporter: HTMLExporter, notebook: Path, assignment: str, student: str, db_url: str) -> str:
    """The feedback page of one graded notebook (raises if it cannot be rendered)."""
    import nbformat

    # Read as bytes: text nbformat cannot decode is replaced, not fatal.
    node = nbformat.reads(notebook.read_bytes().decode("utf-8", "replace"), as_version=4)
    name = notebook.stem
    resources = {"unique_key": name, "output_files_dir": f"{name}_files",
                 "nbgrader": {"student": student, "assignment": assignment, "notebook": name, "db_url": db_url}}
    output, _ = exporter.from_notebook_node(node, resources=resources)
    return output


def submission_pages(exporter: HTMLExporter, root: Path, assignment: str, folder: Path, db_url: str,
                     run: FeedbackRun) -> None:
    """Write every page of one graded submission (``autograded/<student>/<assignment>``)."""
    student = folder.parent.name
    target = root / "feedback" / student / assignment
    block = _notes_block(folder)
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file() and not p.is_symlink())
    for notebook in notebooks:
        try:
            page = render(exporter, notebook, assignment, student, db_url)
        except Exception as error:  # noqa: BLE001 - this page says why; the others go on
            reason = f"{type(error).__name__}: {error}"
            run.broken.append(f"{student} / {assignment} / {notebook.name}: {reason}")
            page = _standalone(notebook.stem, "<h1>This notebook's feedback could not be shown</h1>"
                                              f"<p>{html.escape(reason)}</p>")
        write_text(target / f"{notebook.stem}.html", at_top(page, block))
        run.pages.append(target / f"{notebook.stem}.html")
    if not notebooks:
        body = block or "<p>No notebook of this submission was graded.</p>"
        write_text(target / f"{assignment}.html", _standalone(assignment, body))
        run.pages.append(target / f"{assignment}.html")


def feedback(names: list[str] | None = None, root: Path = ROOT, db_url: str | None = None) -> FeedbackRun:
    """Write ``feedback/<student>/<assignment>/<notebook>.html`` for every graded submission of ``names``."""
    from .grade import db_url as course_db_url

    course = Settings.load(root)
    db_url = db_url or course_db_url(course)
    run = FeedbackRun()
    exporter = None
    for assignment in names or assignments(root):
        folders = sorted(p for p in (root / "autograded").glob(f"*/{assignment}") if p.is_dir() and not p.is_symlink())
        if not folders:
            run.without_submissions.append(assignment)
            continue
        if exporter is None:
            exporter = make_exporter(course, db_url)
            install_mathjax(root / "feedback")
        for folder in folders:
            try:
                submission_pages(exporter, root, assignment, folder, db_url, run)
            except OSError as error:  # a page that cannot be written at all: the others still are
                run.broken.append(f"{folder.parent.name} / {assignment}: {error}")
    return run


if __name__ == "__main__":
    import sys

    print(feedback(sys.argv[1:] or None))
