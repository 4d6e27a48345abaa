"""The first run as a student and an instructor meet it, in a real browser (Playwright driving Debian's chromium).

A student opens JupyterLab from the student bundle (``course.py``), types a wrong
``scaled_dot_product_attention`` into notebook 01, runs its check and reads the message,
presses Validate and reads the dialog, fixes the answer and sees it pass, and opens the
Assignment List. An instructor grades a class of three and opens a feedback page offline,
with its named-mistake message whole and no hidden test source. A screenshot of each step is
kept in ``<the test's tmp folder>/screenshots/`` (printed when the test runs).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from autograder.course.bundle import TOP, write_bundle
from autograder.course.settings import Settings
from autograder.grading import feedback, grade
from autograder.shared.errors import CheckFailed

from ..course_copy import fill, make_course, mistake_source, reference_answers, released, submit
from . import case_records

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
ASSIGNMENT = "01_soft_lookup"
EXERCISE = "scaled_dot_product_attention"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - said in the skip reason
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed (pip install -e .)"),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/run does)"),
]


def no_scaling():
    hidden = importlib.import_module("autograder.hidden.soft_lookup")
    return next(m for m in hidden.MISTAKES[EXERCISE] if m.id == "soft_lookup/scaled_dot_product_attention/no-scaling")


class Steps:
    """Screenshots of each step, numbered, in one folder."""

    def __init__(self, page, folder: Path) -> None:
        self.page, self.folder, self.count = page, folder, 0
        folder.mkdir(parents=True, exist_ok=True)
        print(f"screenshots: {folder}")

    def shot(self, name: str) -> None:
        self.count += 1
        self.page.screenshot(path=str(self.folder / f"{self.count:02d}-{name}.png"), full_page=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"JupyterLab did not answer {url} in {seconds} s")


@pytest.fixture
def student_lab(tmp_path):
    """JupyterLab started by the bundle's course.py on an unpacked bundle; yields (base url, token, folder)."""
    with zipfile.ZipFile(write_bundle(tmp_path / "bundle.zip")) as archive:
        archive.extractall(tmp_path)
    folder = tmp_path / TOP
    # Every cell in the page (JupyterLab otherwise renders only the cells in view).
    settings = folder / "jupyter" / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), "browser-test"
    log = (tmp_path / "lab.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "course.py", "--python", sys.executable, "lab", "--no-browser", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}"],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/api/status?token={token}", process)
        yield base, token, folder
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def cell(page, grade_id_source: str):
    """The notebook cell whose editor starts with ``grade_id_source``."""
    return page.locator(".jp-Notebook .jp-Cell").filter(has=page.locator(".cm-content", has_text=grade_id_source)).first


def replace_source(page, target, source: str) -> None:
    """Click into the cell's editor, select everything and type ``source`` in its place."""
    target.locator(".cm-content").click()
    expect(target.locator(".cm-editor")).to_have_class(re.compile(r"\bcm-focused\b"), timeout=30_000)
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(source)


def save(page) -> None:
    """Save the open notebook and wait until JupyterLab shows it saved (no cell or tab marked dirty).

    As in ``run``, a key press can be lost on a loaded machine (CI once saw the notebook stay dirty
    for 30 s after one Control+S); saving twice is harmless, so the press is repeated while the
    notebook stays dirty. A dialog in the way (a save conflict, a kernel question) is named in the
    failure, since no key press gets past it.
    """
    dirty = page.locator(".jp-mod-dirty")
    for _ in range(4):
        page.keyboard.press("Control+s")
        try:
            expect(dirty).to_have_count(0, timeout=15_000)
            return
        except AssertionError:
            continue
    dialogs = page.locator(".jp-Dialog")
    shown = [dialogs.nth(i).inner_text() for i in range(dialogs.count())]
    raise AssertionError(f"the notebook stayed unsaved after four presses of Control+S; dialogs open: {shown}")


def run(page, target) -> None:
    """Run one cell and wait until it has run: its prompt shows a new execution count.

    On a loaded machine a key press can reach the page before the editor has focus and be
    lost (CI once ran a check with the imports cell never run: NameError for ``torch``);
    the press is repeated once if the prompt has not moved, and a cell that never runs
    fails here, by its prompt, rather than as a puzzling check message later.
    """
    prompt = target.locator(".jp-InputPrompt")
    before = prompt.inner_text().strip()
    for _ in range(2):
        target.locator(".cm-content").click()
        expect(target.locator(".cm-editor")).to_have_class(re.compile(r"\bcm-focused\b"), timeout=30_000)
        page.keyboard.press("Control+Enter")
        deadline = time.monotonic() + 10
        while prompt.inner_text().strip() == before and time.monotonic() < deadline:
            time.sleep(0.2)
        if prompt.inner_text().strip() != before:
            break
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=300_000)
    assert prompt.inner_text().strip() != before, f"the cell did not run (its prompt stayed {before!r})"


def no_overflow(locator) -> bool:
    """Every <pre> inside wraps: nothing runs off the right edge."""
    return locator.evaluate("el => [...el.querySelectorAll('pre')].every(p => p.scrollWidth <= p.clientWidth + 1)")


def test_student_first_run(student_lab, browser, tmp_path):
    base, token, folder = student_lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page, tmp_path / "screenshots")
    page.goto(f"{base}/lab/tree/{ASSIGNMENT}.ipynb?token={token}")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first).to_be_attached(timeout=120_000)
    steps.shot("notebook-open")
    # The student's JupyterLab has no instructor tools.
    page.get_by_text("Nbgrader", exact=True).first.click()
    menu = page.locator(".lm-Menu").last
    expect(menu).to_contain_text("Assignment List")
    assert "Formgrader" not in menu.inner_text() and "Course List" not in menu.inner_text()
    steps.shot("nbgrader-menu-without-instructor-tools")
    page.keyboard.press("Escape")
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{base}/formgrader?token={token}", timeout=10)

    # The bundle's set-up cell (nothing to do beside the course's folder), then the notebook's imports.
    for first in (cell(page, "# Set-up:"), cell(page, "import math")):
        run(page, first)
    exercise, check = cell(page, f"def {EXERCISE}"), cell(page, f"check_{EXERCISE}")
    mistake = no_scaling()
    replace_source(page, exercise, mistake_source(mistake, EXERCISE))
    steps.shot("wrong-answer-typed")
    run(page, exercise)
    run(page, check)
    output = check.locator(".jp-OutputArea-output")
    expect(output).to_contain_text("CheckFailed", timeout=120_000)
    visible = importlib.import_module("autograder.checks.soft_lookup")
    with pytest.raises(CheckFailed) as failure:
        visible.check_scaled_dot_product_attention(mistake.fn)
    shown = " ".join(output.inner_text().split())
    for line in str(failure.value).splitlines():
        assert " ".join(line.split()) in shown, f"{line!r} is not in the output, which reads: {shown!r}"
    assert no_overflow(check)
    steps.shot("check-message")

    # Validate: the dialog lists the failing cells, each message whole and wrapped.
    page.locator(".jp-Toolbar").get_by_text("Validate", exact=True).first.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("The following cell failed", timeout=300_000)
    text = " ".join(dialog.inner_text().split())
    assert " ".join(str(failure.value).splitlines()[-1].split()) in text
    assert "NotImplementedError" in text  # the exercises not written yet
    assert no_overflow(dialog)
    steps.shot("validate-dialog")
    dialog.get_by_role("button").last.click()

    replace_source(page, exercise, reference_answers(ASSIGNMENT)[EXERCISE])
    run(page, exercise)
    run(page, check)
    expect(check.locator(".jp-OutputArea-output")).to_contain_text("passes the visible checks", timeout=120_000)
    steps.shot("check-passes")

    page.get_by_text("Nbgrader", exact=True).first.click()
    page.locator(".lm-Menu").last.get_by_text("Assignment List").click()
    panel = page.locator(".nbgrader-assignment-list, #nbgrader-assignment-list").first
    expect(panel).to_contain_text("Released assignments", timeout=60_000)
    page.wait_for_timeout(2000)  # the lists load after the panel opens
    listing = panel.inner_text()
    assert "does not exist" not in listing and "rror" not in listing, listing
    assert (folder / "exchange").is_dir()
    steps.shot("assignment-list")


@pytest.fixture
def graded_class(tmp_path):
    """A class of three graded and given feedback: the reference, the no-scaling mistake, the untouched release."""
    (tmp_path / "course").mkdir()
    course = make_course(tmp_path / "course", [ASSIGNMENT])
    student_version = released(course, ASSIGNMENT)
    reference = reference_answers(ASSIGNMENT)
    submit(course, ASSIGNMENT, "reference", fill(student_version, reference))
    submit(course, ASSIGNMENT, "mistake", fill(student_version, dict(reference, **{
        EXERCISE: mistake_source(no_scaling(), EXERCISE)})))
    submit(course, ASSIGNMENT, "untouched", student_version)
    try:
        summary = grade.autograde([ASSIGNMENT], Settings.load(course, {"Grading.workers": 2}), progress=False)
    except grade.SandboxUnavailable:
        # This machine cannot sandbox; these three submissions are the course's own code.
        summary = grade.autograde([ASSIGNMENT], Settings.load(course, {"Grading.workers": 2, "Grading.sandbox": False}),
                                  progress=False)
    assert not summary.failed, str(summary)
    run = feedback.feedback([ASSIGNMENT], root=course)
    assert not run.broken, str(run)
    return course


def test_feedback_page_offline(graded_class, browser, tmp_path):
    page_file = graded_class / "feedback" / "mistake" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    requests = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    # What the page's Content-Security-Policy refused: MathJax must need none of it. MathJax's placeholder
    # font, MathJax_Blank, whose source is about:blank (it loads nothing, allowed or not), is the one exception.
    blocked = []
    page.on("console", lambda message: blocked.append(message.text)
            if "Content Security Policy" in message.text and "'about:blank'" not in message.text else None)
    steps = Steps(page, tmp_path / "screenshots")
    page.goto(page_file.as_uri())
    page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.Hub.queue.pending === 0 "
                           "&& document.querySelectorAll('.MathJax, .MathJax_Display').length > 0", timeout=60_000)
    assert page.locator("meta[http-equiv='Content-Security-Policy']").count() == 1
    assert not blocked, blocked
    steps.shot("feedback-top")
    mistake = no_scaling()
    target = page.locator(".output_area").filter(has_text=f"This looks like the mistake '{mistake.name}'").first
    target.scroll_into_view_if_needed()
    steps.shot("feedback-named-mistake")
    shown = " ".join(target.inner_text().split())
    assert " ".join(mistake.message().split()) in shown, shown
    assert no_overflow(target)
    body = page.locator("body").inner_text()
    assert "BEGIN HIDDEN TESTS" not in body and "autograder.hidden" not in body
    assert page.locator(".MathJax, .MathJax_Display").count() > 10
    assert not [u for u in requests if u.startswith(("http:", "https:"))], requests


@pytest.fixture
def instructor_lab(tmp_path):
    """``make lab``'s JupyterLab (course folder as root, every nbgrader tool) on a course copy with no exchange yet."""
    course = tmp_path / "course"
    course.mkdir()
    make_course(course, [ASSIGNMENT])
    shutil.rmtree(course / "exchange", ignore_errors=True)
    port, token = free_port(), "browser-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter"))  # not this machine's own settings
    settings = tmp_path / "jupyter" / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    log = (tmp_path / "lab.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--notebook-dir=.", "--ServerApp.default_url=/lab/tree/notebooks",
         "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/api/status?token={token}", process)
        yield base, token, course
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_instructor_lab_shows_no_error(instructor_lab, browser, tmp_path):
    """Formgrader, Course List and Assignment List of the instructor's lab open without an error."""
    base, token, course = instructor_lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page, tmp_path / "screenshots")
    page.goto(f"{base}/lab?token={token}")
    page.get_by_text("Nbgrader", exact=True).first.wait_for(timeout=120_000)
    for item, expected in (("Formgrader", "Manage Assignments"), ("Course List", "attention"),
                           ("Assignment List", "Released assignments")):
        page.get_by_text("Nbgrader", exact=True).first.click()
        page.locator(".lm-Menu").last.get_by_text(item, exact=True).click()
        panel = page.locator(".lm-DockPanel-widget:not(.lm-mod-hidden)").last
        frame = panel.frame_locator("iframe") if item == "Formgrader" else None
        target = frame.locator("body") if frame else panel
        expect(target).to_contain_text(expected, timeout=60_000)
        page.wait_for_timeout(2000)  # lists load after the panel opens
        text = target.inner_text()
        assert "rror" not in text and "does not exist" not in text, f"{item}: {text}"
        steps.shot(item.lower().replace(" ", "-"))
    assert (course / "exchange").is_dir()


def test_feedback_page_lists_every_exercise_and_case(browser, tmp_path):
    """The summary at the top of a feedback page, read in the browser: every exercise by name with its points, and
    under it every case; a student's HTML in a message is shown as text and runs nothing."""
    (tmp_path / "course").mkdir()
    course = make_course(tmp_path / "course", [ASSIGNMENT])
    notebook, scores = case_records.partly_right(released(course, ASSIGNMENT))
    case_records.place(course, ASSIGNMENT, "cases", notebook, scores)
    run = feedback.feedback([ASSIGNMENT], root=course)
    assert not run.broken, str(run)
    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    page.goto((course / "feedback" / "cases" / ASSIGNMENT / f"{ASSIGNMENT}.html").as_uri())
    summary = page.locator(".case-summary")
    expect(summary).to_be_visible(timeout=60_000)
    page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.Hub.queue.pending === 0 "
                           "&& document.querySelectorAll('.MathJax, .MathJax_Display').length > 0", timeout=60_000)
    assert summary.locator(".MathJax, .MathJax_Display").count() == 0  # "$n > m$" in a message is not maths
    Steps(page, tmp_path / "screenshots").shot("feedback-summary")
    exercises = [c.metadata["nbgrader"]["grade_id"] for c in released(course, ASSIGNMENT).cells
                 if c.metadata.get("nbgrader", {}).get("solution")]
    items = summary.locator("li.exercise")
    assert items.count() == len(exercises) == 4
    for item, exercise in zip(items.all(), exercises):  # in the notebook's order, each with its points
        assert re.match(rf"{re.escape(exercise)}: [\d.]+ / [\d.]+ points\n", item.inner_text()), item.inner_text()
    sdpa = items.filter(has_text=EXERCISE).inner_text()
    assert sdpa.startswith(f"{EXERCISE}: 4.25 / 5 points")
    for case in case_records.SDPA_CASES:
        assert case["name"] in sdpa, case["name"]
    assert "The mistake: no scaling" in sdpa and case_records.SDPA_CASES[3]["message"] in sdpa
    soft = items.filter(has_text="soft_lookup:").first.inner_text()
    for case in case_records.SOFT_LOOKUP_CASES:
        assert case["name"] in soft, case["name"]
    assert case_records.STOPPED in soft and case_records.HOSTILE in soft  # the message, as text
    assert "one query (hidden check, 0.67 points)" in soft  # a third of two points
    hard = items.filter(has_text="hard_lookup").inner_text()
    assert "FAILED visible checks" in " ".join(hard.split()) and case_records.RAISED in hard
    assert page.evaluate("() => window.pwned") is None
    assert summary.locator("script, img").count() == 0
    assert no_overflow(summary)
