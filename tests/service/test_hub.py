"""The course on a real JupyterHub, set up by the guide's own commands, driven in chromium; and what a student cannot read.

The hub is set up by the commands of docs/jupyterhub.md's step 3, as they are written there (read
from the page), on a fresh clone of the course, with three Linux users made for the test (an
instructor, who owns the course, and two students; removed after), an exchange, ports and a hub
state folder of its own, and a Python every user can run (this environment's own, linked outside
``/root`` where it is pyenv's there, as the guide's step 1 says to install one where the system's is
too old; it stands for ``/usr/bin/python3``). One thing is done ahead: the course's environment is
this one's packages linked into a virtual environment of that Python (``make setup`` would download
them), so the guide's ``make setup PYTHON=...`` finds it made.

A student logs in, fetches ``01_soft_lookup`` in the Assignment List (which has no Formgrader),
writes ``scaled_dot_product_attention`` with a catalogued mistake, validates it (the dialog shows the
check's message once, wrapped), submits, fetches the feedback the service released and reads the
mistake named (no hidden source) and the maths drawn by the browser (MathML: no MathJax beside a
fetched page); fixes it, submits again and sees full marks. Meanwhile a second student, in a shell
of their own, fetches, answers and submits with nbgrader's command line, and is graded too. Then,
from the first student's account, every private thing of the class is tried and must be unreadable
(:func:`private_things`, and the course's history through ``git``); the instructor sees Formgrader
inside JupyterLab (an assignment's link opens JupyterLab's file browser there), both students in
it, and their released feedback by name; and ``make grades``'s export has both. A screenshot of
each step is kept in ``<the test's tmp folder>/screenshots/``.

It skips, saying why, where this machine cannot make Linux users (not root, no ``useradd``), has
no chromium, no sandbox (the service refuses to grade without one), or cannot install the proxy
(``npm ci`` in ``hub/``).
"""

from __future__ import annotations

import json
import os
import pwd
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
from nbgrader.utils import notebook_hash

from autograder.checks.soft_lookup import check_scaled_dot_product_attention
from autograder.engine import sandbox
from autograder.grading import export
from autograder.shared.errors import CheckFailed

from ..course_copy import mistake_source, reference_answers
from ..frontdoor import user
from ..grading.test_browser import CHROMIUM, EXERCISE, Steps, cell, free_port, no_overflow, no_scaling, replace_source, save
from ..notebook_code import ROOT
from .user_env import runnable_by_all

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - said in the skip reason
    sync_playwright = None

A = "01_soft_lookup"
HUB = ROOT / "hub"
PROXY = HUB / "node_modules" / ".bin" / "configurable-http-proxy"
GUIDE = ROOT / "docs" / "jupyterhub.md"
#: The Python this environment was made from, and its installation.
BASE_PYTHON = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


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
    if user.why_not():
        return user.why_not()
    if not (runnable_by_all(BASE_PYTHON) and runnable_by_all(Path(sys.base_prefix))) and not shutil.which("patchelf"):
        return (f"{BASE_PYTHON} cannot be run by other users, and there is no patchelf to make a copy that can "
                "(apt-get install patchelf; .ci/run does)")
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


def guide_commands() -> list[str]:
    """The commands of the guide's step 3 (its one ``bash`` block), as written there."""
    block = re.search(r"```bash\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert block, f"{GUIDE} has no bash block of commands"
    return [line.strip() for line in block[1].splitlines() if line.strip()]


def everyones_python(folder: Path) -> Path:
    """A Python every user can run, of the version this environment was made from: that one where others may run it,
    else its installation linked into ``folder`` (as pyenv's in ``PYENV_ROOT=/opt/pyenv``: the guide's step 1)."""
    if runnable_by_all(BASE_PYTHON) and runnable_by_all(Path(sys.base_prefix)):
        return BASE_PYTHON
    if subprocess.run(["cp", "-al", f"{sys.base_prefix}/.", str(folder)], capture_output=True).returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["cp", "-a", f"{sys.base_prefix}/.", str(folder)], check=True)
    python = folder / BASE_PYTHON.relative_to(sys.base_prefix)
    # Its own copy (not a link), told to find its libpython beside it rather than under /root.
    subprocess.run(["cp", "--remove-destination", str(BASE_PYTHON), str(python)], check=True)
    subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../lib", str(python)], check=True)
    return python


def linked_environment(folder: Path, course: Path, python: Path) -> None:
    """In ``folder``, the environment ``make setup PYTHON=<python>`` makes in ``course``, made at once:
    a virtual environment of ``python`` whose files are this one's, linked (not copied), its scripts and
    its editable ``autograder`` pointed at their new places; ``make setup``'s stamp says it is installed."""
    subprocess.run(["cp", "-al", f"{sys.prefix}/.", str(folder)], check=True)

    def rewrite(path: Path, text: str) -> None:  # a new file: the linked one is this environment's too
        mode = path.stat().st_mode
        path.unlink()
        path.write_text(text)
        path.chmod(mode)

    (folder / "pyvenv.cfg").unlink()
    (folder / "pyvenv.cfg").write_text(f"home = {python.parent}\ninclude-system-site-packages = false\n"
                                       f"version = {sys.version_info.major}.{sys.version_info.minor}\n")
    for path in (folder / "bin").iterdir():
        if path.name.startswith("python"):
            path.unlink()
            path.symlink_to(python)
        elif path.is_file() and not path.is_symlink() and path.read_bytes().startswith(f"#!{sys.prefix}/".encode()):
            rewrite(path, path.read_text().replace(f"#!{sys.prefix}/", f"#!{folder}/", 1))
    for finder in folder.glob("lib/python*/site-packages/__editable__*finder.py"):
        rewrite(finder, finder.read_text().replace(repr(str(ROOT / "autograder")), repr(str(course / "autograder"))))
    stamp = folder / user.STAMP.name
    stamp.touch()
    later = time.time() + 86400  # newer than the clone's Makefile and pyproject.toml, made after it
    os.utime(stamp, (later, later))


@pytest.fixture
def hub(tmp_path):
    """The course on a hub, set up by the guide: a namespace with its url, users, course, exchange, state."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="course-hub-", dir="/tmp"))  # every user's server must reach the exchange
    base.chmod(0o755)
    users = Users()
    process = log = None
    try:
        instructor, alice, bob = users.make("prof"), users.make("alice"), users.make("bob")
        repository = user.clone(base)  # the working tree as it would be committed, as a repository to clone
        subprocess.run(["git", "init", "-q"], cwd=repository, check=True)
        subprocess.run(["git", "add", "-A"], cwd=repository, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the course"],
                       cwd=repository, check=True)
        # A remote's stand-in: git lets a user clone a local repository only of their own (safe.directory).
        subprocess.run(["chown", "-R", f"{instructor}:{instructor}", str(repository)], check=True)
        course, environment = base / "course", base / "env"
        environment.mkdir()
        python = everyones_python(base / "python")
        linked_environment(environment, course, python)
        names = {"prof": instructor, "alice": alice, "bob": bob}
        commands = []
        for line in guide_commands():
            line = line.replace("/srv/attention-course", str(course)).replace("/srv/attention-env", str(environment))
            line = line.replace("<repository>", f"file://{repository}").replace("/usr/bin/python3", str(python))
            line = re.sub(r"\b(prof|alice|bob)\b", lambda m: names[m[1]], line)
            commands.append(line.replace("make release", f"make release ASSIGNMENTS={A}"))
        *setup, start = commands
        assert start.startswith("make hub "), start
        env = user.user_env()
        done = subprocess.run(["bash", "-euxc", "\n".join(setup)], cwd=base, env=env, capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, f"the guide's commands failed: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        # The test's own: its grading service looks at the exchange often, and make hub finds the proxy installed.
        with open(course / "nbgrader_config.py", "a") as config:
            config.write("\nc.GradingService.poll_seconds = 0.5\n")
        shutil.copytree(HUB / "node_modules", course / "hub" / "node_modules", symlinks=True)
        (course / "hub" / "node_modules" / ".installed").touch()
        exchange, state = base / "exchange", base / "hub-state"
        port = free_port()
        hub_env = dict(env, HUB_EXCHANGE=str(exchange), HUB_STATE=str(state), HUB_URL=f"http://127.0.0.1:{port}",
                       HUB_API_PORT=str(free_port()), HUB_PROXY_API_PORT=str(free_port()))
        log = (tmp_path / "hub.log").open("w")
        print(f"hub log: {tmp_path / 'hub.log'}")
        process = subprocess.Popen(["bash", "-c", start], cwd=course, env=hub_env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"make hub exited with {process.returncode}: see {tmp_path / 'hub.log'}")
            try:
                with urllib.request.urlopen(f"{url}/hub/api", timeout=5):
                    return True
            except OSError:
                return False

        wait_until(answers, 180, "the hub answering")
        python = environment / "bin" / "python"  # every user's
        # The guide's step 4: the instructor releases the assignment, in a terminal of their JupyterLab.
        released = subprocess.run(["runuser", "-u", instructor, "--", "env", f"PATH={python.parent}:/usr/bin:/bin",
                                   f"NBGRADER_EXCHANGE={exchange}", "nbgrader", "release_assignment", A],
                                  cwd=course, capture_output=True, text=True, timeout=300)
        assert released.returncode == 0, released.stdout + released.stderr
        # JupyterLab renders every cell (not only those in view), so the test can find the exercise's cell.
        settings = Path(f"/home/{alice}/.jupyter/lab/user-settings/@jupyterlab/notebook-extension")
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        subprocess.run(["chown", "-R", f"{alice}:{alice}", f"/home/{alice}/.jupyter"], check=True)
        yield type("Hub", (), dict(url=url, users=users, instructor=instructor, alice=alice, bob=bob, course=course,
                                   exchange=exchange, python=python, hub_state=state, log=tmp_path / "hub.log",
                                   state=course / "autograded" / ".grading-service" / "state.json"))
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


def readable_by(name: str, path: Path | str, git: Path | None = None) -> bool:
    """Whether the Linux user ``name`` can list the folder or read the file ``path`` (with ``git``: run
    ``git -C <git> <path>`` as that user, e.g. ``show HEAD:...``)."""
    if git is not None:
        command = ["git", "-C", str(git), *str(path).split()]
    else:
        command = ["ls", "-A", str(path)] if Path(path).is_dir() else ["head", "-c", "1", str(path)]
    return subprocess.run(["runuser", "-u", name, "--", *command], cwd="/", capture_output=True).returncode == 0


def private_things(hub) -> dict[str, Path]:
    """What one student must never read of the class: another's work, secret, grades and feedback, the hidden
    checks, solutions and sources, the hub's database, the grading runs' folders (each is there: checked)."""
    course, other = hub.course, hub.bob
    (submission,) = (hub.exchange / "attention" / "inbound").glob(f"{other}+{A}+*")
    secret = (submission / "submission_secret.txt").read_text().strip()
    hidden = sorted((course / "autograder" / "hidden").glob("*.py"))[-1]
    runs = [Path(json.loads(record.read_text())["folder"]) for record in (course / ".grading-runs").iterdir()]
    things = {
        "another's submission": course / "submitted" / other / A,
        "another's secret": course / "submitted" / other / A / "submission_secret.txt",
        "another's graded copy": course / "autograded" / other / A,
        "another's feedback in the exchange": hub.exchange / "attention" / "feedback"
                                               / f"{notebook_hash(secret=secret, notebook_id=A)}.html",
        "another's feedback in the course": course / "released-feedback" / other,
        "the gradebook": course / "gradebook.db",
        "the grading service's state": course / "autograded" / ".grading-service" / "state.json",
        "the grading runs": course / ".grading-runs",
        "the hidden checks": hidden,
        "the solutions": course / "solutions",
        "the sources": course / "source" / A / f"{A}.ipynb",
        "the course's history": course / ".git",
        "the hub's database": hub.hub_state / "hub" / "jupyterhub.sqlite",
        **{f"a grading run's folder ({folder.name})": folder for folder in runs},
    }
    missing = [what for what, path in things.items() if not path.exists()]
    assert not missing, f"not there to try: {missing}"
    assert runs, "the grading service's run is not registered"
    return things


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
    save(page)


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
    # The maths, drawn by the browser itself: MathML, with no MathJax beside a fetched page.
    maths = page.locator("math")
    assert maths.count() > 10 and maths.first.bounding_box()["width"] > 0
    assert page.evaluate("() => typeof window.MathJax") == "undefined"
    prose = " ".join(page.locator(".text_cell_render, .jp-RenderedMarkdown").all_inner_texts())
    assert prose and "$" not in prose and "\\frac" not in prose and "\\sqrt" not in prose, prose[:2000]
    maths.nth(10).scroll_into_view_if_needed()
    steps.shot(f"{name}-feedback-maths")
    return " ".join(page.locator("body").inner_text().split())


def validate(page, steps: Steps) -> None:
    """Validate in the notebook's toolbar: the failed check's message once, every line inside the dialog."""
    page.locator(".jp-Toolbar").get_by_text("Validate", exact=True).first.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("The following cell failed", timeout=300_000)
    steps.shot("validate-dialog")
    with pytest.raises(CheckFailed) as failure:  # what the student's visible check says (no catalogue of mistakes)
        check_scaled_dot_product_attention(no_scaling().fn)
    first = " ".join(str(failure.value).splitlines()[0].split())
    shown = " ".join(dialog.inner_text().split())
    assert shown.count(first) == 1, shown
    assert no_overflow(dialog), "a line of the Validate dialog runs off its right edge"
    dialog.get_by_role("button").last.click()


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
            validate(page, steps)
            text = submit_and_read_feedback(page, hub, steps, "mistake")
            assert "no scaling" in text and "sqrt(d_k)" in text, text[:2000]
            assert "Test cell" not in text and f"{EXERCISE}: hidden checks" in text, text[:2000]  # the summary's names
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
            assert "could not grade" not in hub.log.read_text()

            read = {what: path for what, path in private_things(hub).items() if readable_by(hub.alice, path)}
            # What the service made in the course is the instructor's group's and closed to others from the start,
            # whatever the folders around it allow.
            group = pwd.getpwnam(hub.instructor).pw_gid
            loose = {str(path): oct(path.stat().st_mode) for path in (
                hub.course / "submitted" / hub.bob, hub.course / "autograded" / hub.bob / A,
                hub.course / "released-feedback" / hub.bob, hub.course / ".grading-runs", hub.state)
                if path.stat().st_mode & 0o007 or path.stat().st_gid != group}
            assert not read and not loose, f"{hub.alice} could read: {read}; open to others: {loose}"
            assert not readable_by(hub.alice, "git show HEAD:autograder/hidden", git=hub.course)
            # What the student's kernels import: the visible checks, not the hidden ones.
            code = "import autograder.checks\ntry:\n import autograder.hidden\nexcept ImportError:\n print('no hidden')"
            imports = as_user(hub.alice, "env", f"PYTHONPATH={hub.hub_state / 'python'}", "python", "-c", code,
                              cwd=Path(f"/home/{hub.alice}"), python=hub.python)
            assert imports.wait(timeout=120) == 0 and "no hidden" in imports.stdout.read()

            instructor = browser.new_page(viewport={"width": 1400, "height": 1000})
            teacher = Steps(instructor, tmp_path / "screenshots" / "instructor")
            log_in(instructor, hub, hub.instructor)
            instructor.get_by_text("Nbgrader", exact=True).first.click()
            instructor.locator(".lm-Menu").last.get_by_text("Formgrader", exact=True).click()
            inside = instructor.frame_locator("#formgrader-iframe iframe")  # Formgrader inside JupyterLab
            expect(inside.locator("body")).to_contain_text(A, timeout=120_000)
            teacher.shot("formgrader-in-jupyterlab")
            inside.get_by_role("link", name=A, exact=True).first.click()  # JupyterLab's file browser, in the source
            expect(instructor.locator(".jp-FileBrowser .jp-BreadCrumbs")).to_contain_text(A, timeout=60_000)
            instructor.goto(f"{hub.url}/user/{hub.instructor}/formgrader/manage_submissions/{A}")
            expect(instructor.locator("body")).to_contain_text(hub.bob, timeout=120_000)
            expect(instructor.locator("body")).to_contain_text(hub.alice)
            teacher.shot("formgrader-submissions")
            for student in (hub.alice, hub.bob):  # what each student was shown, by name, for the instructor
                pages = sorted((hub.course / "released-feedback" / student / A).glob(f"*/{A}.html"))
                assert pages and readable_by(hub.instructor, pages[-1]), student
        finally:
            browser.close()
    done = export.export(root=hub.course)  # make grades, on the hub's course
    grades = (hub.course / "grades.csv").read_text() if (hub.course / "grades.csv").exists() else ""
    assert hub.alice in grades and hub.bob in grades, (str(done), grades)
