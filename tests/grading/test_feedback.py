"""Feedback pages: nothing a student wrote runs, any text is written, one broken submission stops nothing.

Each test places graded notebooks in ``autograded/`` of a course copy (as nbgrader leaves them)
with their submission in the gradebook, and renders them with ``python -m autograder feedback``'s
function. The end-to-end test renders real graded submissions; this one feeds in what each
protection stops.
"""

from __future__ import annotations

import html
import json
import os
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import __main__ as cli
from autograder.course.repository import nbgrader
from autograder.course.settings import Settings
from autograder.engine.notes import Note, write_notes
from autograder.grading import feedback, grade

from ..course_copy import make_course, released
from . import case_records

#: One worker runs this module: its module-scoped fixtures are built once (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("feedback")

ASSIGNMENT = "01_soft_lookup"
PAYLOADS = {  # where a student can put HTML, and what it would do if it ran
    "markdown script": "<script>window.pwned = 'markdown script'</script>",
    "markdown onerror": "<img src=x onerror=\"window.pwned = 'markdown onerror'\">",
    "markdown link": "[click](javascript:window.pwned='markdown-link')",
}


class Elements(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def elements(page: Path) -> list[tuple[str, dict[str, str]]]:
    parser = Elements()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.tags


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    return make_course(tmp_path_factory.mktemp("feedback"), [ASSIGNMENT])


def graded(course: Path, student: str, notebook: nbformat.NotebookNode | bytes | None,
           notes: list[Note] | None = None) -> Path:
    """Put ``notebook`` where nbgrader leaves a graded notebook, with its submission in the gradebook."""
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(ASSIGNMENT, student)
    folder = course / "autograded" / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(notebook, bytes):
        (folder / f"{ASSIGNMENT}.ipynb").write_bytes(notebook)
    elif notebook is not None:
        # json.dumps escapes a lone surrogate as \\ud800, as a notebook file can hold it.
        (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(notebook))
    if notes is not None:
        write_notes(folder, notes)
    return folder


def page_of(course: Path, student: str) -> Path:
    return course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"


def hostile_notebook(course: Path) -> nbformat.NotebookNode:
    notebook = released(course, ASSIGNMENT)
    markdown = nbformat.v4.new_markdown_cell(
        "\n\n".join(PAYLOADS.values()) + "\n\nMaths and code stay intact: $a < b$, `x > 0 and y < 1`, $a \\& b$.")
    output_cell = nbformat.v4.new_code_cell("show()")
    hostile_outputs = {
        "text/html": "<b>bold</b><img src=x onerror=\"window.pwned = 'html output'\">",
        "application/javascript": "window.pwned = 'javascript output'",
        "image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg' onload=\"window.pwned = 'svg output'\"></svg>",
    }
    output_cell.outputs = [nbformat.v4.new_output("display_data", {mime: data, "text/plain": "<shown as text>"})
                           for mime, data in hostile_outputs.items()]
    raw = nbformat.v4.new_raw_cell("<script>window.pwned = 'raw cell'</script>", metadata={"format": "text/html"})
    notebook.cells[1:1] = [markdown, output_cell, raw]
    return notebook


@pytest.mark.slow
def test_nothing_a_student_wrote_can_run_in_the_page(course):
    graded(course, "hostile", hostile_notebook(course))
    run = feedback.feedback([ASSIGNMENT], root=course)
    assert not run.broken, str(run)
    page = page_of(course, "hostile")
    tags = elements(page)
    scripts = [attrs for tag, attrs in tags if tag == "script"]
    # Only MathJax, from the local copy (its configuration is a file of that copy, not an inline script).
    assert scripts == [{"src": feedback.MATHJAX_URL}], scripts
    handlers = [(tag, name) for tag, attrs in tags for name in attrs if name.lower().startswith("on")]
    assert not handlers, handlers
    urls = [v for _, attrs in tags for k, v in attrs.items() if k in ("href", "src") and "javascript:" in v.lower()]
    assert not urls, urls
    assert not any(tag in ("svg", "iframe", "object", "embed") for tag, _ in tags)
    text = page.read_text(encoding="utf-8")
    assert "window.pwned = &#x27;javascript output&#x27;" not in text and "window.pwned = 'javascript output'" not in text
    # Scripts are removed with what they hold; maths and code spans are not mangled by the cleaning.
    assert "window.pwned" not in text
    assert "<mo>&lt;</mo>" in text and "<code>x &gt; 0 and y &lt; 1</code>" in text and "&amp;lt;" not in text
    assert "<b>bold</b>" in text


def image_output(metadata: dict, execution_count=None) -> dict:
    """A PNG output (one transparent pixel) with ``metadata``, as a kernel would send it."""
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
    if execution_count is None:
        return nbformat.v4.new_output("display_data", {"image/png": pixel, "text/plain": "<Figure>"}, metadata=metadata)
    output = nbformat.v4.new_output("execute_result", {"image/png": pixel}, metadata=metadata)
    output["execution_count"] = execution_count
    return output


#: Output metadata and execution counts that nbconvert's template writes as markup, some of it unquoted.
HOSTILE_METADATA = [
    image_output({"width": "1 onload=alert(1)"}),
    image_output({"image/png": {"height": "2 onerror=alert(2)", "width": 300}}),
    image_output({"width": True, "height": float("nan")}),
    image_output({"filenames": {"image/png": "https://tracker.invalid/x.png\" onerror=\"alert(3)"}}),
    image_output({"image/png": "not a mapping"}),
    image_output({}, execution_count="<img src=x onerror=alert(4)>"),
    nbformat.v4.new_output("display_data", {"text/html": "<p>isolated</p>"}, metadata={"text/html": {"isolated": True}}),
]


@pytest.mark.slow
def test_output_metadata_is_numbers_or_nothing(course):
    """An image's width and height are written unquoted (width=1 onload=...): only plain numbers are kept; so is a count."""
    notebook = released(course, ASSIGNMENT)
    cell = nbformat.v4.new_code_cell("show()")
    cell.outputs = HOSTILE_METADATA
    notebook.cells.insert(1, cell)
    notebook.cells[1]["execution_count"] = "<img src=x onerror=alert(5)>"
    added = nbformat.v4.new_markdown_cell("mine", metadata={"nbgrader": {  # the template writes grade_id unescaped
        "grade": True, "grade_id": 'x"><img src=x onerror=alert(6)>', "points": 1, "solution": False, "locked": True}})
    notebook.cells.insert(2, added)
    graded(course, "metadata", json.loads(json.dumps(notebook, allow_nan=True)))
    run = feedback.feedback([ASSIGNMENT], root=course)
    assert not run.broken, str(run)
    page = page_of(course, "metadata")
    tags = elements(page)
    handlers = [(tag, name) for tag, attrs in tags for name in attrs if name.lower().startswith("on")]
    assert not handlers, handlers
    text = page.read_text(encoding="utf-8")
    assert "alert(" not in text and "tracker.invalid" not in text and "<iframe" not in text
    images = [attrs for tag, attrs in tags if tag == "img" and attrs.get("src", "").startswith("data:image/png")]
    assert len(images) == 6 and {"width": "300"}.items() <= images[1].items(), images
    assert all(set(attrs) <= {"src", "width", "height", "alt", "class"} for attrs in images), images
    assert "isolated" in text  # the HTML output is shown, in the page


@pytest.mark.slow
def test_the_sanitiser_is_what_stops_it(course):
    """Without SanitizeOutputs and the markdown cleaning, the same notebook's scripts are in the page."""
    graded(course, "hostile_unsafe", hostile_notebook(course))
    exporter = feedback.make_exporter(Settings.load(course), grade.db_url(Settings.load(course)))
    exporter._preprocessors = [p for p in exporter._preprocessors if not isinstance(p, feedback.SanitizeOutputs)]
    plain = nbformat.reads(json.dumps(hostile_notebook(course)), as_version=4)
    resources = {"nbgrader": {"student": "hostile_unsafe", "assignment": ASSIGNMENT, "notebook": ASSIGNMENT,
                              "db_url": grade.db_url(Settings.load(course))}}
    unsafe_output, _ = feedback.HTMLExporter.from_notebook_node(exporter, plain, resources=resources)
    assert "window.pwned = 'javascript output'" in unsafe_output
    assert "onerror=" in unsafe_output and "html output" in unsafe_output
    plain.cells.insert(1, nbformat.v4.new_code_cell("show()"))
    plain.cells[1].outputs = [nbformat.from_dict(image_output({"width": "1 onload=alert(1)"}))]
    unsafe_output, _ = feedback.HTMLExporter.from_notebook_node(exporter, plain, resources=resources)
    assert 'onload="alert(1)"' in unsafe_output  # the template wrote width=1 onload=alert(1)
    assert "<script>window.pwned = 'markdown script'</script>" in feedback.HTMLExporter.markdown2html(
        exporter, {"cell": {}}, PAYLOADS["markdown script"])


@pytest.mark.slow
def test_hidden_test_source_is_never_shown(course):
    notebook = released(course, ASSIGNMENT)
    test_cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("_hidden"))
    test_cell.source += "\n### BEGIN HIDDEN TESTS\nsecret_check()\n### END HIDDEN TESTS\n"
    graded(course, "hidden", notebook)
    feedback.feedback([ASSIGNMENT], root=course)
    text = page_of(course, "hidden").read_text(encoding="utf-8")
    assert "secret_check" not in text and "BEGIN HIDDEN TESTS" not in text


@pytest.mark.slow
def test_any_text_is_written(course):
    notebook = released(course, ASSIGNMENT)
    notebook.cells[0].source += "\nA lone surrogate: \ud800."
    cell = nbformat.v4.new_code_cell("print('\ud800')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="out \udfff put\n")]
    notebook.cells.insert(1, cell)
    graded(course, "surrogates", notebook, [Note("failed", "A note with \ud800 in it.")])
    run = feedback.feedback([ASSIGNMENT], root=course)
    page = page_of(course, "surrogates")
    text = page.read_bytes().decode("utf-8")  # strict: the page is valid UTF-8
    assert "A lone surrogate: \\ud800." in text and "out \\udfff put" in text and "A note with \\ud800 in it." in text
    assert "surrogates" not in " ".join(run.broken)


@pytest.mark.slow
def test_a_broken_submission_stops_nothing(course):
    """A notebook that cannot be read, and a student whose name is not UTF-8, get pages saying so; the next student too."""
    graded(course, "aaa_broken", b"{ this is not a notebook \xff")
    weird = os.fsdecode(b"bad\xffname")  # a folder name that is not UTF-8
    folder = course / "autograded" / weird / ASSIGNMENT
    folder.mkdir(parents=True)
    (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(released(course, ASSIGNMENT)))
    graded(course, "zzz_after", released(course, ASSIGNMENT))
    run = feedback.feedback([ASSIGNMENT], root=course)
    broken = page_of(course, "aaa_broken")
    assert "could not be shown" in broken.read_text(encoding="utf-8")
    assert any(line.startswith("aaa_broken / ") for line in run.broken)
    assert page_of(course, weird).stat().st_size > 0
    page_of(course, weird).read_bytes().decode("utf-8")
    after = page_of(course, "zzz_after").read_text(encoding="utf-8")
    assert "Score:" in after and "could not be shown" not in after
    for page in (course / "feedback").glob(f"*/{ASSIGNMENT}/*.html"):
        assert page.stat().st_size > 0, page
    assert not list((course / "feedback").rglob(".page-*")), "a temporary page was left behind"


@pytest.mark.slow
def test_notes_alone_get_a_page(course):
    graded(course, "no_notebook", None, [Note("missing", "01_soft_lookup.ipynb was not in your submission.")])
    feedback.feedback([ASSIGNMENT], root=course)
    assert "was not in your submission" in page_of(course, "no_notebook").read_text(encoding="utf-8")


@pytest.mark.slow
def test_maths_is_served_from_the_feedback_folder(course):
    graded(course, "maths", released(course, ASSIGNMENT))
    feedback.feedback([ASSIGNMENT], root=course)
    page = page_of(course, "maths")
    text = page.read_text(encoding="utf-8")
    assert "cdnjs" not in text and "https://" not in feedback.MATHJAX_MACRO
    script = (page.parent / feedback.MATHJAX_URL.split("?")[0]).resolve()
    assert script.is_file() and script.name == "MathJax.js"
    assert (script.parent / "fonts/HTML-CSS/STIX-Web/woff").is_dir()
    assert (script.parent / feedback.MATHJAX_CONFIG_FILE).read_text() == feedback.MATHJAX_CONFIG
    assert "white-space: pre-wrap" in text


def test_assignments_without_submissions_are_one_line_and_succeed(tmp_path, capsys, monkeypatch):
    """`make feedback` for assignments nobody submitted: one line, exit 0 (nbgrader exits 2 for each)."""
    render = feedback.feedback
    monkeypatch.setattr(feedback, "feedback", lambda names: render(names, root=tmp_path))
    assert cli.main(["feedback", "01_soft_lookup", "02_scaling", "03_masking"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["feedback: 0 pages written in feedback/",
                   "no graded submissions, so no feedback, for: 01_soft_lookup, 02_scaling, 03_masking"]


# -- the Content-Security-Policy of every page ---------------------------------------------------


def policy_of(text: str) -> dict[str, list[str]]:
    """The page's Content-Security-Policy (its directives), checking it comes before anything it governs."""
    parser = Elements()
    parser.feed(text)
    metas = [i for i, (tag, attrs) in enumerate(parser.tags)
             if tag == "meta" and attrs.get("http-equiv", "").lower() == "content-security-policy"]
    assert len(metas) == 1, f"{len(metas)} policies"
    governed = [i for i, (tag, _) in enumerate(parser.tags) if tag in ("script", "style", "link", "img", "body")]
    assert governed and metas[0] < min(governed), "the policy comes after what it governs"
    content = parser.tags[metas[0]][1]["content"]
    return {d.split()[0]: d.split()[1:] for d in content.split(";") if d.strip()}


def assert_inert_policy(policy: dict[str, list[str]], scripts: list[str]) -> None:
    """No source but the page's own (and inline images); scripts only as ``scripts`` says; no inline script."""
    assert policy.get("default-src") == ["'none'"], policy
    assert policy.get("script-src", policy["default-src"]) == scripts, policy
    for directive, sources in policy.items():
        assert set(sources) <= {"'self'", "'none'", "'unsafe-inline'", "data:"}, (directive, sources)
        if directive != "style-src":
            assert "'unsafe-inline'" not in sources, (directive, sources)
    assert policy.get("base-uri") == ["'none'"] and policy.get("form-action") == ["'none'"], policy


@pytest.mark.slow
def test_every_page_carries_a_policy_that_runs_only_the_local_mathjax(course):
    """The rendered page, the page of a notebook that could not be rendered, and a page of notes alone."""
    graded(course, "policy", released(course, ASSIGNMENT))
    graded(course, "policy_broken", b"{ not a notebook")
    graded(course, "policy_notes", None, [Note("missing", "01_soft_lookup.ipynb was not in your submission.")])
    feedback.feedback([ASSIGNMENT], root=course)
    for student in ("policy", "policy_broken", "policy_notes"):
        page = next((course / "feedback" / student / ASSIGNMENT).glob("*.html"))
        assert_inert_policy(policy_of(page.read_text(encoding="utf-8")), ["'self'"])
    # the one script it runs is that local file
    scripts = [attrs for tag, attrs in elements(page_of(course, "policy")) if tag == "script"]
    assert [(page_of(course, "policy").parent / s["src"].split("?")[0]).resolve().is_file() for s in scripts] == [True]


# -- the summary of every exercise and case at the top ---------------------------------------------


def summary_of(text: str) -> str:
    """The summary block of a page (what :func:`feedback.summary_html` wrote), by its first and last tags."""
    start = text.index('<div class="container case-summary tex2jax_ignore">')
    return text[start:text.index("</ol></div></div></div>", start)]


@pytest.mark.slow
def test_the_summary_lists_every_exercise_and_case_under_the_notes(course):
    notebook, scores = case_records.partly_right(released(course, ASSIGNMENT))
    hidden = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("_hidden"))
    hidden.source += "\n### BEGIN HIDDEN TESTS\nsecret_case_check()\n### END HIDDEN TESTS\n"
    folder = case_records.place(course, ASSIGNMENT, "cases", notebook, scores)
    write_notes(folder, [Note("renamed", "Your notebook was renamed.")])
    run = feedback.feedback([ASSIGNMENT], root=course)
    assert not [line for line in run.broken if line.startswith("cases /")], str(run)
    text = page_of(course, "cases").read_text(encoding="utf-8")
    summary = summary_of(text)
    # under the notes, above nbgrader's own panel (the notebook's score and its cells)
    assert text.index("Your notebook was renamed.") < text.index(summary) < text.index('<a name="top">')
    points = {}
    for cell in released(course, ASSIGNMENT).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            exercise = meta["grade_id"].removeprefix("test_").removesuffix("_hidden")
            points[exercise] = points.get(exercise, 0) + meta["points"]
    earned = {exercise: total for exercise, total in points.items()}
    earned["scaled_dot_product_attention"] -= 3 - scores["test_scaled_dot_product_attention_hidden"]
    earned["soft_lookup"] -= 2
    earned["hard_lookup"] -= 1
    for exercise, total in points.items():  # every exercise, by name, with the gradebook's score
        assert f'{exercise}</a></span>: <span class="exercise-score">{earned[exercise]:g} / {total:g} points' in summary
    assert earned["scaled_dot_product_attention"] == 4.25
    for case in case_records.SDPA_CASES + case_records.SOFT_LOOKUP_CASES:
        assert f'<span class="case-name">{html.escape(case["name"])}</span>' in summary, case["name"]
    assert ('<span class="case-result">FAILED</span> <span class="case-name">causal, n != m</span> '
            '<span class="case-kind">(hidden check, 0.75 points)</span><div class="case-message">'
            f'{html.escape(case_records.SDPA_CASES[3]["message"])}</div>'
            '<div class="case-mistake">The mistake: no scaling</div>') in summary
    assert f"No points for the hidden checks: {html.escape(case_records.STOPPED_ERROR)}" in summary
    # a test cell without a record: one line, passed or failed with its error's message
    assert ('<span class="case-result">FAILED</span> <span class="case-name">visible checks</span>'
            f'<div class="case-message">{html.escape(case_records.RAISED)}</div>') in summary
    assert summary.count('<span class="case-name">visible checks</span>') == len(points)
    assert summary.count('<span class="case-name">hidden checks</span>') == len(points) - 2
    # the hostile message is text; the hidden part of a cell's source is not shown anywhere
    tags = elements(page_of(course, "cases"))
    assert not [(tag, name) for tag, attrs in tags for name in attrs if name.lower().startswith("on")]
    assert [attrs for tag, attrs in tags if tag == "script"] == [{"src": feedback.MATHJAX_URL}]
    assert "secret_case_check" not in text and "BEGIN HIDDEN TESTS" not in text


def test_the_summary_escapes_every_text_it_writes():
    """A case's name, its message, the reason a cell stopped and an error's message can all hold a student's HTML."""
    hostile = case_records.HOSTILE
    cell = nbformat.v4.new_code_cell("check_x(x)", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "test_x_hidden", "points": 2, "score": 1.0}})
    cell.outputs, _ = case_records.judged("x", 2, [case_records.case(f"name {hostile}"),
                                                   case_records.case("second", f"message {hostile}", ("a/b/c",))],
                                          stopped=f"stopped {hostile}")
    visible = nbformat.v4.new_code_cell("check_x(x)", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "test_x", "points": 1, "score": 0.0}})
    visible.outputs = [case_records.error(f"error {hostile}", "ValueError")]
    summary = feedback.summary_html(nbformat.v4.new_notebook(cells=[visible, cell]))
    parser = Elements()
    parser.feed(summary)
    assert {tag for tag, _ in parser.tags} <= {"div", "h4", "ol", "ul", "li", "span", "a"}, parser.tags
    assert not [name for _, attrs in parser.tags for name in attrs if name.lower().startswith("on")]
    for where in ("name", "message", "stopped", "error"):
        assert f"{where} {html.escape(hostile)}" in summary, where
    assert "<script" not in summary and "<img" not in summary
    assert 'class="exercise-score">1 / 3 points' in summary


@pytest.mark.slow
def test_nbgraders_own_generate_feedback_writes_the_summary_with_the_gradebooks_scores(course):
    """What the hub hands back (``nbgrader generate_feedback``, nbgrader's converter with the course's exporter):
    the summary comes after GetGrades, so it holds the gradebook's partial score."""
    notebook, scores = case_records.partly_right(released(course, ASSIGNMENT))
    case_records.place(course, ASSIGNMENT, "hub_student", notebook, scores)
    nbgrader("generate_feedback", ASSIGNMENT, "--student", "hub_student", "--force", root=course)
    summary = summary_of(page_of(course, "hub_student").read_text(encoding="utf-8"))
    assert 'scaled_dot_product_attention</a></span>: <span class="exercise-score">4.25 / 5 points' in summary
    assert '<span class="case-name">causal, n != m</span>' in summary


def test_a_damaged_record_still_gives_a_summary():
    """Odd values in a record (a number for a name, no weights, an infinite one, mistakes that are not ids) are shown
    as well as they can be, never stop the page."""
    from autograder.engine.judge import CASES_KEY

    odd = [{"exercise": 3, "points": "two", "score": None, "stopped": ["x"], "cases": [
               {"name": 7, "weight": "heavy", "passed": "yes", "message": None, "mistakes": "no-scaling"},
               {"weight": float("inf"), "passed": False, "message": {"a": 1}, "mistakes": [None, 3, "x/y/z", "../../a/b"]},
               "not a case"]},
           {"points": float("nan"), "all_or_nothing": True, "cases": []}]
    cells = []
    for number, record in enumerate(odd):
        cell = nbformat.v4.new_code_cell("check(x)", metadata={"nbgrader": {
            "grade": True, "solution": False, "grade_id": f"test_x{number}_hidden", "points": 2, "score": None}})
        cell.outputs = [nbformat.v4.new_output("display_data", {"text/plain": ""}, metadata={CASES_KEY: record})]
        cells.append(cell)
    summary = feedback.summary_html(nbformat.v4.new_notebook(cells=cells))
    assert summary.count('class="exercise"') == 2 and "2 points" in summary
    assert '<span class="case-result">FAILED</span> <span class="case-name">7</span>' in summary  # "yes" is not True
    assert "(a case without a name)" in summary and "The mistakes: z, b" in summary and ">None<" not in summary
