"""The course on a real JupyterHub: hub, proxy, grading service and Linux users, driven in chromium.

``hub/jupyterhub_config.py`` is started as ``make hub`` starts it, on a copy of the course, with
three Linux users made for the test (an instructor and two students, removed after) and an
exchange of its own. A student logs in, fetches ``01_soft_lookup`` in the Assignment List (which
has no Formgrader), writes ``scaled_dot_product_attention`` with a catalogued mistake in the
notebook, submits, fetches the feedback the service released and reads the mistake named (no
hidden source); fixes it, submits again and sees full marks. Meanwhile a second student, in a
shell of their own, fetches, answers and submits with nbgrader's command line, and is graded too.
The instructor then sees both in Formgrader, and ``make grades``'s export has both. A screenshot of
each step is kept in ``<the test's tmp folder>/screenshots/``.

It skips, saying why, where this machine cannot make Linux users (not root, no ``useradd``), has
no chromium, no sandbox (the service refuses to grade without one), or cannot install the proxy
(``npm ci`` in ``hub/``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from autograder.engine import sandbox
from autograder.grading import export

from ..course_copy import make_course, mistake_source, reference_answers
from ..exchange_class import release
from ..grading.test_browser import CHROMIUM, EXERCISE, Steps, cell, free_port, no_scaling, replace_source
from ..notebook_code import ROOT
from .user_env import user_python

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - said in the skip reason
    sync_playwright = None

A = "01_soft_lookup"
HUB = ROOT / "hub"
PROXY = HUB / "node_modules" / ".bin" / "configurable-http-proxy"
BIN = Path(sys.executable).parent


def why_not() -> str | None:
    """Why the hub cannot run here, or None."""
    if sync_playwright is None:
        return "the playwright package is not installed (pip install -e .)"
    if CHROMIUM is None:
        return "no chromium on PATH (Debian: apt-get install chromium; .ci/run does)"
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("chpasswd"):
        return "making the Linux users of a hub needs root and useradd/chpasswd"
    if sandbox.mode() == "limits only":
        return f"no sandbox here, so the grading service refuses to grade students' code ({sandbox.why_not()})"
    if not PROXY.exists():
        if not shutil.which("npm"):
            return "no npm to install configurable-http-proxy (Node.js 20 and npm: apt-get install nodejs npm)"
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HUB, capture_output=True, text=True)
        if done.returncode != 0:
            return f"npm ci in hub/ failed: {done.stderr.strip()[-300:]}"
    return None


pytestmark = [pytest.mark.slow]


class Users:
    """Linux users made for the test (unique names), removed with their homes and processes after."""

    def __init__(self) -> None:
        self.passwords: dict[str, str] = {}
        self.tag = secrets.token_hex(3)

    def make(self, role: str) -> str:
        name = f"hub{role}{self.tag}"
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
        password = secrets.token_urlsafe(12)
        subprocess.run(["chpasswd"], input=f"{name}:{password}", text=True, check=True, capture_output=True)
        self.passwords[name] = password
        return name

    def remove(self) -> None:
        for name in self.passwords:
            for process in psutil.process_iter(["username"]):
                if process.info["username"] == name:
                    try:
                        process.kill()
                    except psutil.Error:
                        pass
            subprocess.run(["userdel", "--remove", name], capture_output=True)


def as_user(name: str, *command: str, cwd: Path, python: Path) -> subprocess.Popen:
    """``command`` run as the Linux user ``name`` in ``cwd``, with ``python``'s folder first on PATH."""
    return subprocess.Popen(["runuser", "-u", name, "--", "env", f"PATH={python.parent}:/usr/bin:/bin", f"HOME={cwd}",
                             "PYTHONWARNINGS=ignore", *command], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_until(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise TimeoutError(f"{what} did not happen in {seconds:.0f} s")


@pytest.fixture
def hub(tmp_path):
    """The course on a hub: yields a namespace with its url, users, course, exchange, and the service's state."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="course-hub-", dir="/tmp"))  # every user's server must reach the exchange
    base.chmod(0o755)
    users = Users()
    process = log = None
    try:
        (base / "course").mkdir()
        course = make_course(base / "course", [A])
        with open(course / "nbgrader_config.py", "a") as config:
            config.write("\nc.GradingService.poll_seconds = 0.5\n")
        exchange = base / "exchange"
        exchange.mkdir(mode=0o777)
        exchange.chmod(0o777)  # as nbgrader's documentation makes /srv/nbgrader/exchange
        release(course, exchange, A)
        instructor, alice, bob = users.make("prof"), users.make("alice"), users.make("bob")
        subprocess.run(["chown", "-R", f"{instructor}:{instructor}", str(course)], check=True)
        # JupyterLab renders every cell (not only those in view), so the test can find the exercise's cell.
        settings = Path(f"/home/{alice}/.jupyter/lab/user-settings/@jupyterlab/notebook-extension")
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        subprocess.run(["chown", "-R", f"{alice}:{alice}", f"/home/{alice}/.jupyter"], check=True)

        python = user_python(base / "user-env")
        port = free_port()
        env = dict(os.environ, COURSE_ROOT=str(course), COURSE_STUDENTS=f"{alice},{bob}", COURSE_INSTRUCTORS=instructor,
                   NBGRADER_EXCHANGE=str(exchange), HUB_STATE=str(base / "hub-state"),
                   HUB_URL=f"http://127.0.0.1:{port}", HUB_API_PORT=str(free_port()),
                   HUB_PROXY_API_PORT=str(free_port()), PATH=f"{BIN}:{os.environ['PATH']}",
                   HUB_USER_PYTHON=str(python))
        log = (tmp_path / "hub.log").open("w")
        print(f"hub log: {tmp_path / 'hub.log'}")
        process = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(HUB / "jupyterhub_config.py")], cwd=base,
                                   env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"jupyterhub exited with {process.returncode}: see {tmp_path / 'hub.log'}")
            try:
                with urllib.request.urlopen(f"{url}/hub/api", timeout=5):
                    return True
            except OSError:
                return False

        wait_until(answers, 120, "the hub answering")
        state = course / "autograded" / ".grading-service" / "state.json"
        yield type("Hub", (), dict(url=url, users=users, instructor=instructor, alice=alice, bob=bob, course=course,
                                   exchange=exchange, python=python, state=state))
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if log is not None:
            log.close()
        users.remove()
        shutil.rmtree(base, ignore_errors=True)


def records(hub) -> list[dict]:
    try:
        return json.loads(hub.state.read_text())
    except (OSError, ValueError):
        return []


def graded(hub, student: str) -> int:
    return sum(1 for r in records(hub) if r["student"] == student and r["status"] == "graded")


def log_in(page, hub, name: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.locator("#username_input").fill(name)
    page.locator("#password_input").fill(hub.users.passwords[name])
    page.locator("#login_submit").click()
    page.locator(".jp-LabShell, #jp-main-dock-panel").first.wait_for(timeout=180_000)


def assignment_list(page):
    page.get_by_text("Nbgrader", exact=True).first.click()
    menu = page.locator(".lm-Menu").last
    expect(menu).to_contain_text("Assignment List")
    entries = menu.inner_text()
    page.locator(".lm-Menu").last.get_by_text("Assignment List").click()
    panel = page.locator(".nbgrader-assignment-list, #nbgrader-assignment-list").first
    expect(panel).to_contain_text("Released assignments", timeout=60_000)
    return panel, entries


def write_answers(page, hub, answers: dict[str, str]) -> None:
    """Open the notebook, put each answer in its exercise's cell (by the function's name), save."""
    page.goto(f"{hub.url}/user/{hub.alice}/lab/tree/{A}/{A}.ipynb")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    for name, source in answers.items():
        replace_source(page, cell(page, f"def {name}"), source)
    page.keyboard.press("Control+s")
    expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=30_000)


def submit_and_read_feedback(page, hub, steps: Steps, name: str) -> str:
    """Submit in the Assignment List, wait for the official grading, fetch its feedback; the page's text."""
    before = graded(hub, hub.alice)
    panel, _ = assignment_list(page)
    downloaded = panel.locator("#fetched_assignments_list, .nbgrader-fetched-assignments").first
    downloaded.get_by_role("button", name="Submit").first.click()
    steps.shot(f"{name}-submitted")
    wait_until(lambda: graded(hub, hub.alice) > before, 240, "the official grading")
    panel.get_by_role("button", name="Fetch Feedback").first.click()
    home = Path(f"/home/{hub.alice}") / A / "feedback"
    wait_until(lambda: len(list(home.glob(f"*/{A}.html"))) > before, 60, "the feedback fetched")
    newest = max(p.parent.name for p in home.glob(f"*/{A}.html"))
    page.goto(f"{hub.url}/user/{hub.alice}/files/{A}/feedback/{newest}/{A}.html")
    page.wait_for_load_state()
    steps.shot(f"{name}-feedback")
    return " ".join(page.locator("body").inner_text().split())


def test_a_class_on_jupyterhub(hub, tmp_path):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            steps = Steps(page, tmp_path / "screenshots")
            log_in(page, hub, hub.alice)
            steps.shot("student-logged-in")
            panel, entries = assignment_list(page)
            assert "Formgrader" not in entries and "Course List" not in entries, entries
            expect(panel).to_contain_text(A, timeout=60_000)
            panel.get_by_role("button", name="Fetch").first.click()
            wait_until(lambda: Path(f"/home/{hub.alice}/{A}/{A}.ipynb").is_file(), 60, "the assignment fetched")
            steps.shot("assignment-fetched")

            # The second student, in a shell of their own: fetch, answer, submit (nbgrader's command line).
            home = Path(f"/home/{hub.bob}")
            (home / "answer.py").write_text(
                "import json\n"
                "import nbformat\n"
                f"path = '{A}/{A}.ipynb'\n"
                "nb = nbformat.read(path, as_version=4)\n"
                f"answers = json.loads({json.dumps(json.dumps(reference_answers(A)))})\n"
                "for c in nb.cells:\n"
                "    meta = c.metadata.get('nbgrader', {})\n"
                "    if meta.get('solution') and meta.get('grade_id') in answers:\n"
                "        c.source = answers[meta['grade_id']]\n"
                "nbformat.write(nb, path)\n")
            bob = as_user(hub.bob, "sh", "-c", f"python -m nbgrader fetch_assignment {A} --course attention "
                          f"--Exchange.root={hub.exchange} && python answer.py && python -m nbgrader submit {A} "
                          f"--course attention --Exchange.root={hub.exchange}", cwd=home, python=hub.python)

            reference = reference_answers(A)
            write_answers(page, hub, dict(reference, **{EXERCISE: mistake_source(no_scaling(), EXERCISE)}))
            steps.shot("mistake-written")
            text = submit_and_read_feedback(page, hub, steps, "mistake")
            assert "no scaling" in text and "sqrt(d_k)" in text, text[:2000]
            assert "BEGIN HIDDEN TESTS" not in text and "hidden_check" not in text
            assert "official gradings of 01_soft_lookup today (UTC) used" in text
            score = re.search(r"Score: ([\d.]+) / ([\d.]+)", text)
            assert score and float(score[1]) < float(score[2]), text[:500]
            total = score[2]

            write_answers(page, hub, {EXERCISE: reference[EXERCISE]})
            text = submit_and_read_feedback(page, hub, steps, "fixed")
            assert f"Score: {total} / {total}" in text, text[:500]

            assert bob.wait(timeout=240) == 0, bob.stdout.read()
            wait_until(lambda: graded(hub, hub.bob) == 1, 240, "the second student's grading")
            assert all(r["status"] == "graded" for r in records(hub)), records(hub)

            instructor = browser.new_page(viewport={"width": 1400, "height": 1000})
            teacher = Steps(instructor, tmp_path / "screenshots" / "instructor")
            log_in(instructor, hub, hub.instructor)
            instructor.goto(f"{hub.url}/user/{hub.instructor}/formgrader/manage_submissions/{A}")
            expect(instructor.locator("body")).to_contain_text(hub.bob, timeout=120_000)
            expect(instructor.locator("body")).to_contain_text(hub.alice)
            teacher.shot("formgrader-submissions")
        finally:
            browser.close()
    done = export.export(root=hub.course)  # make grades, on the hub's course
    grades = (hub.course / "grades.csv").read_text() if (hub.course / "grades.csv").exists() else ""
    assert hub.alice in grades and hub.bob in grades, (str(done), grades)
