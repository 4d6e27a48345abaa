"""The grading service (``python -m autograder serve``), through nbgrader's exchange, without a hub.

The instructor releases with nbgrader's exchange, students fetch, submit and fetch feedback with
it (:mod:`tests.exchange_class`), and the service grades with the pipeline of ``make autograde``.
The queue, the state, the inbox's refusals and what is shown of hidden checks are also tested on
their own, without grading.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta

import nbformat
import pytest
from nbformat import v4
from nbgrader.api import Gradebook, MissingEntry

from autograder.course.settings import Settings
from autograder.engine import judge
from autograder.grader.cases import CaseResult, CheckRecord
from autograder.grading import grade
from autograder.service import inbox, queue, visibility
from autograder.service.serve import Service
from autograder.service.state import Record, State, Status

from ..course_copy import catalogue, fill, grading_settings, make_course, mistake_source, reference_answers
from ..demonstrations import release_without_demonstrations
from ..exchange_class import Student, release

A = "01_soft_lookup"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def record(key: str, student: str, minutes: float, assignment: str = A, **kw) -> Record:
    return Record(key, student, assignment, (T0 + timedelta(minutes=minutes)).isoformat(), **kw)


def state_of(tmp_path, *records: Record) -> State:
    state = State(tmp_path / "state.json")
    for r in records:
        state.add(r)
    return state


# -- the queue ------------------------------------------------------------------------------


def test_a_flood_from_one_student_is_one_grading_and_goes_after_the_others(tmp_path):
    flood = [record(f"a{i}", "alice", i / 10) for i in range(20)]
    state = state_of(tmp_path, record("a-old", "alice", -60, status=Status.GRADED, graded_at=T0.isoformat()),
                     *flood, record("b1", "bob", 5), record("c1", "carol", 6))
    ready = queue.plan(state, T0 + timedelta(minutes=10), 3, {A: None}, set())
    assert [r.key for r in ready] == ["b1", "c1", "a19"]  # alice was graded today: after the others
    assert all(state.records[f"a{i}"].status == Status.SUPERSEDED for i in range(19))
    assert "replaced it before it was graded" in state.records["a0"].reason


def test_a_student_with_a_grading_under_way_waits_for_the_others(tmp_path):
    state = state_of(tmp_path, record("a1", "alice", 0, assignment="02_scaling"), record("b1", "bob", 1))
    ready = queue.plan(state, T0 + timedelta(minutes=5), 3, {}, busy={("alice", A)})
    assert [r.key for r in ready] == ["b1", "a1"]
    # and nothing more of a pair being graded
    state = state_of(tmp_path, record("a2", "alice", 2))
    assert queue.plan(state, T0 + timedelta(minutes=5), 3, {}, busy={("alice", A)}) == []


def test_the_quota_is_per_student_per_assignment_per_day(tmp_path):
    graded = [record(f"g{i}", "alice", i, status=Status.GRADED, graded_at=(T0 + timedelta(minutes=i)).isoformat())
              for i in range(3)]
    other = record("o1", "alice", 4, assignment="02_scaling")
    state = state_of(tmp_path, *graded, record("n1", "alice", 5), other)
    ready = queue.plan(state, T0 + timedelta(minutes=10), 3, {}, set())
    assert [r.key for r in ready] == ["o1"]  # another assignment has its own quota
    assert state.records["n1"].status == Status.WAITING
    assert "3 official gradings" in state.records["n1"].reason and "tomorrow" in state.records["n1"].reason
    # the next day (UTC), the waiting one is graded
    ready = queue.plan(state, T0 + timedelta(days=1), 3, {}, set())
    assert [r.key for r in ready] == ["o1", "n1"] and state.records["n1"].status == Status.QUEUED


def test_after_the_due_date_the_last_submission_before_it_is_graded_once(tmp_path):
    due = T0 + timedelta(hours=1)
    graded = [record(f"g{i}", "alice", i, status=Status.GRADED, graded_at=(T0 + timedelta(minutes=i)).isoformat())
              for i in range(3)]
    state = state_of(tmp_path, *graded, record("w", "alice", 30), record("b", "bob", 10))
    assert [r.key for r in queue.plan(state, T0 + timedelta(minutes=31), 3, {A: due}, set())] == ["b"]
    assert state.records["w"].status == Status.WAITING  # alice: over quota
    state.add(record("late", "alice", 70))
    ready = queue.plan(state, due + timedelta(minutes=20), 3, {A: due}, set())
    assert sorted(r.key for r in ready) == ["b", "w"] and all(r.final for r in ready)  # whatever the quota
    assert state.records["late"].status == Status.LATE and "after the due date" in state.records["late"].reason
    for r in ready:
        r.status = Status.GRADED
    assert queue.plan(state, due + timedelta(hours=5), 3, {A: due}, set()) == []  # once


# -- the state ------------------------------------------------------------------------------


def test_the_state_survives_a_restart_and_a_grading_cut_short_is_queued_again(tmp_path):
    state = state_of(tmp_path, record("a", "alice", 0, status=Status.GRADING), record("b", "bob", 1,
                     status=Status.GRADED, graded_at=T0.isoformat()))
    state.save()
    assert not list(tmp_path.glob(".state-*")), "a temporary file was left behind"
    again = State(tmp_path / "state.json")
    assert again.records["a"].status == Status.QUEUED
    assert again.records["b"].status == Status.GRADED and again.records["b"].graded_on() == T0.date()


# -- what is shown of hidden checks ---------------------------------------------------------


def _graded_notebook():
    visible = v4.new_code_cell("check(f)", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                  "grade_id": "test_f", "points": 1}})
    visible.outputs = [v4.new_output("error", ename="CheckFailed", evalue="visible message", traceback=[])]
    failed = v4.new_code_cell("# Hidden\n### BEGIN HIDDEN TESTS\nhidden_check(f)\n### END HIDDEN TESTS",
                              metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": "test_f_hidden",
                                                     "points": 2}})
    failed.outputs = [v4.new_output("error", ename="CheckFailed", evalue="the secret message", traceback=[])]
    passed = v4.new_code_cell("### BEGIN HIDDEN TESTS\nhidden_check(g)\n### END HIDDEN TESTS",
                              metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": "test_g_hidden",
                                                     "points": 1}})
    passed.outputs = [v4.new_output("stream", name="stdout", text="g passes the hidden checks\n")]
    partial = v4.new_code_cell("### BEGIN HIDDEN TESTS\nhidden_check(h)\n### END HIDDEN TESTS",
                               metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": "test_h_hidden",
                                                      "points": 2}})
    partial.outputs = judge.scored_outputs([CheckRecord("h", [CaseResult("the secret case", 1.0, True),
                                                              CaseResult("another", 1.0, False, "the secret wrong")])],
                                           None, 2.0, False)
    return v4.new_notebook(cells=[visible, failed, passed, partial])


def test_hidden_checks_shown_as_the_setting_says():
    nb = _graded_notebook()
    assert visibility.shown(nb, "messages") == nb
    pass_fail = visibility.shown(nb, "pass_fail")
    assert pass_fail.cells[0] == nb.cells[0]  # a visible check keeps its message
    # a failed hidden check is an error (so every reader of the page sees it failed), with the words only
    assert [(o.output_type, o.evalue) for o in pass_fail.cells[1].outputs] == [("error", visibility.FAILED)]
    assert pass_fail.cells[2].outputs[0].text.strip() == visibility.PASSED
    # a check that earned a share of its points did not pass: neither its cases nor their messages are shown
    assert [(o.output_type, o.evalue) for o in pass_fail.cells[3].outputs] == [("error", visibility.FAILED)]
    nothing = visibility.shown(nb, "nothing")
    assert [c.outputs[0].get("text", "").strip() for c in nothing.cells[1:]] == [visibility.HIDDEN] * 3
    assert not nothing.cells[1].metadata.nbgrader["grade"]
    assert nothing.cells[1].source == "# Hidden" and nothing.cells[2].source == ""  # no hidden region left
    for secret in ("the secret message", "the secret case", "the secret wrong"):
        assert secret in str(nb) and secret not in str(pass_fail) + str(nothing), secret
    with pytest.raises(ValueError, match="hidden_before_due must be one of"):
        visibility.shown(nb, "some")


# -- the exchange, refusals -----------------------------------------------------------------


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course with 01_soft_lookup generated (no grading yet)."""
    return make_course(tmp_path_factory.mktemp("course"), [A])


def _class(tmp_path, course, quota: int = 3, hidden: str = "messages"):
    """A fresh copy of ``course`` with its own exchange, the assignment released, and its quota."""
    root = tmp_path / "course"
    shutil.copytree(course, root)
    with open(root / "nbgrader_config.py", "a") as config:
        config.write(f"\nc.GradingService.daily_quota = {quota}\nc.GradingService.hidden_before_due = {hidden!r}\n"
                     "c.GradingService.poll_seconds = 0.2\n")
    exchange = tmp_path / "exchange"
    release(root, exchange, A)
    return root, exchange


def _answers(mistake: str | None = None) -> dict[str, str]:
    answers = reference_answers(A)
    if mistake:
        wrong = next(m for m in catalogue(A)["scaled_dot_product_attention"] if m.name == mistake)
        answers["scaled_dot_product_attention"] = mistake_source(wrong, "scaled_dot_product_attention")
    return answers


def test_submissions_that_cannot_be_graded_are_refused_and_said_so(tmp_path, course):
    root, exchange = _class(tmp_path, course)
    inbound = exchange / "attention" / "inbound"
    alice = Student("alice", tmp_path / "alice", exchange)
    nb = alice.fetch(A)
    alice.submit(A, fill(nb, _answers()))
    (stolen,) = inbound.iterdir()
    os.chown(stolen, 65534, 65534)  # owned by `nobody`, in alice's name
    bad_name = inbound / f"..+{A}+2026-03-02 09:00:00.000000 UTC+x"
    shutil.copytree(stolen, bad_name)
    (bad_name / inbox.SECRET_FILE).write_text("another secret")
    linked = inbound / f"bob+{A}+2026-03-02 09:00:00.000000 UTC+y"
    linked.mkdir()
    (linked / inbox.SECRET_FILE).symlink_to(root / "nbgrader_config.py")
    (inbound / f"carol+{A}+notatime+z").mkdir()
    (inbound / "dave+99_nothing+2026-03-02 09:00:00.000000 UTC+w").mkdir()

    service = Service(root, exchange=exchange, settings=grading_settings(root))
    service.serve(idle_exit=True)
    reasons = {r.student: r.reason for r in service.state.records.values()}
    assert all(r.status == Status.REFUSED for r in service.state.records.values()), reasons
    assert "submitted by the user 'nobody' in the name of 'alice'" in reasons["alice"]
    assert "is not a plain name" in reasons[".."]
    assert "submission_secret.txt" in reasons["bob"]
    assert "is not a time" in reasons["carol"]
    assert "no assignment '99_nothing'" in reasons["dave"]
    assert not (root / "submitted").exists(), "a refused submission was collected"
    (page,) = alice.fetch_feedback(A).values()  # the holder of the secret is told why
    assert "cannot be graded" in page and "in the name of" in page


def test_collecting_copies_files_and_links_never_what_a_link_points_to_or_a_pipe(tmp_path):
    folder = tmp_path / "inbound" / f"alice+{A}+2026-03-02 09:00:00.000000 UTC+x"
    (folder / "sub").mkdir(parents=True)
    (folder / f"{A}.ipynb").write_text("{}")
    (folder / inbox.SECRET_FILE).write_text("s")
    (folder / "timestamp.txt").symlink_to("/etc/passwd")
    (folder / "sub" / "data.txt").write_text("mine")
    (folder / "secrets").symlink_to(tmp_path / "instructor")
    (tmp_path / "instructor").write_text("the answers")
    os.mkfifo(folder / "pipe")
    submission = inbox.parse(folder, {A})
    assert submission.problem == "" and submission.student == "alice"
    target = inbox.collect(submission, tmp_path / "course")
    assert target == tmp_path / "course" / "submitted" / "alice" / A
    assert (target / "sub" / "data.txt").read_text() == "mine" and (target / "secrets").is_symlink()
    assert not (target / "pipe").exists() and not (target / "timestamp.txt").is_symlink()
    assert (target / "timestamp.txt").read_text().startswith(submission.time.strftime("%Y-%m-%d %H:%M:%S"))


def test_a_submission_is_as_old_as_its_folder_whatever_its_name_says(tmp_path):
    folder = tmp_path / f"alice+{A}+2099-01-01 00:00:00.000000 UTC+x"  # made by hand, dated in the future
    folder.mkdir()
    (folder / inbox.SECRET_FILE).write_text("s")
    before = datetime.now(UTC)
    submission = inbox.parse(folder, {A})
    assert submission.problem == "" and abs((submission.time - before).total_seconds()) < 60


def test_a_folder_that_is_not_a_course_is_refused_with_why(tmp_path):
    with pytest.raises(ValueError, match="is not a course: it has no nbgrader_config.py"):
        Service(tmp_path)


class Broken(grade.Runner):
    """A runner whose nbgrader always fails, as a full disk would make it."""

    def __call__(self, *args, **kwargs) -> str:
        return "the disk was full"


def test_a_submission_that_could_not_be_graded_is_said_so_never_a_zero_and_graded_again(tmp_path, course, caplog):
    root, exchange = _class(tmp_path, course)
    alice = Student("alice", tmp_path / "alice", exchange)
    alice.submit(A, fill(alice.fetch(A), _answers()))
    service = Service(root, exchange=exchange, settings=grading_settings(root), runner=Broken())
    with caplog.at_level("INFO", logger="autograder.service"):
        service.serve(idle_exit=True)
    (rec,) = service.state.records.values()
    assert rec.status == Status.FAILED and rec.attempts == service.service.retries + 1
    told = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]  # the instructor's log says why, each time
    assert len(told) == rec.attempts and all(rec.key in line and "the disk was full" in line for line in told), told
    (page,) = alice.fetch_feedback(A).values()
    assert "could not be graded" in page and "the disk was full" in page and "not your doing" in page
    assert "Score" not in page
    with Gradebook(grade.db_url(Settings.load(root))) as gb, pytest.raises(MissingEntry):
        gb.find_submission(A, "alice")  # no score at all, not a 0


class Held(grade.Runner):
    """A runner that grades each submission (with no notebook graded) only when the test lets it go, one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Semaphore(0)

    def __call__(self, *args, **kwargs) -> None:
        assert self.go.acquire(timeout=300), "the test never let the grading go"


def test_a_student_is_told_at_once_when_the_feedback_will_be_ready_and_that_the_list_needs_refreshing(tmp_path, course):
    root, exchange = _class(tmp_path, course)
    alice = Student("alice", tmp_path / "alice", exchange)
    notebook = fill(alice.fetch(A), _answers())
    runner = Held()
    service = Service(root, exchange=exchange, settings=grading_settings(root), runner=runner)
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            alice.submit(A, notebook)
            assert service.cycle(pool) == 1
            (first,) = alice.fetch_feedback(A).values()  # while it is graded
            assert "being graded now" in first and "Fetch Feedback again" in first and "⟳" in first, first
            assert "the first since the grading service started" in first and "should be ready" not in first

            alice.submit(A, notebook)  # a second one while the first is graded: it waits its turn
            assert service.cycle(pool) == 0
            pages = alice.fetch_feedback(A)
            second = pages[max(pages)]
            assert "waiting for its official grading" in second and "Fetch Feedback again" in second, second

            runner.go.release()  # the first is graded; the second's grading starts, estimated from the first's
            wait(list(service.running))
            assert service.cycle(pool) == 1
            pages = alice.fetch_feedback(A)
            second, first = pages[max(pages)], pages[min(pages)]
            assert "being graded now" in second and "should be ready at about" in second, second
            assert "being graded" not in first  # the first's feedback replaced its page
        finally:
            for _ in range(2):
                runner.go.release()
    assert all(r.status == Status.GRADED for r in service.state.records.values())


# -- a class, graded for real ---------------------------------------------------------------


def _score(page: str) -> tuple[float, float]:
    found = re.search(r"Score: ([\d.]+) / ([\d.]+)", page)
    assert found, "the page shows no score"
    return float(found[1]), float(found[2])


def _latest(student: Student) -> str:
    pages = student.fetch_feedback(A)
    return pages[max(pages)]


@pytest.mark.slow
def test_a_class_graded_on_submit(tmp_path, course):
    """Mistake named then fixed, a flood, the quota, a restart, and the final grade at the due date."""
    root, exchange = _class(tmp_path, course, quota=2)
    alice, bob, carol = (Student(n, tmp_path / n, exchange) for n in ("alice", "bob", "carol"))
    released = release_without_demonstrations(alice.fetch(A), A)  # the service's work is the point, not the plots
    bob.fetch(A)
    carol.fetch(A)
    clock = {"now": None}

    def now():
        return clock["now"] or datetime.now(UTC)

    def service():  # one at a time: the order of gradings is the queue's
        return Service(root, exchange=exchange, settings=grading_settings(root, {"GradingService.workers": 1}), now=now)

    alice.submit(A, fill(released, _answers("no scaling")))
    first = service()
    first.serve(idle_exit=True)
    page = _latest(alice)
    assert "no scaling" in page and "sqrt(d_k)" in page, "the mistake is not named"
    assert "BEGIN HIDDEN TESTS" not in page and "hidden_check" not in page, "hidden source shown"
    assert "1 of your 2 official gradings of 01_soft_lookup today (UTC) used, 1 left" in page
    score, total = _score(page)
    assert score < total

    alice.submit(A, fill(released, _answers("scaling by d_k instead of sqrt(d_k)")))  # a flood: two at once,
    alice.submit(A, fill(released, _answers()))  # the second fixed
    bob.submit(A, fill(released, _answers()))
    first.serve(idle_exit=True)
    records = sorted(first.state.records.values(), key=lambda r: r.arrived)
    assert [r.status for r in records] == [Status.GRADED, Status.SUPERSEDED, Status.GRADED, Status.GRADED]
    assert records[3].graded_at < records[2].graded_at, "bob waited for alice's second grading"
    pages = alice.fetch_feedback(A)
    assert "replaced by a later submission" in pages[sorted(pages)[1]]
    page = pages[max(pages)]
    assert _score(page) == (total, total) and "0 left" in page
    assert _score(_latest(bob)) == (total, total)

    alice.submit(A, fill(released, _answers("no scaling")))  # over the quota: waits
    first.serve(idle_exit=True)
    assert "waiting for your next official grading" in _latest(alice)
    assert max(first.state.records.values(), key=lambda r: r.arrived).status == Status.WAITING

    carol.submit(A, fill(released, _answers()))  # arrives while the service is down
    second = service()
    second.serve(idle_exit=True)
    graded = [r.key for r in second.state.records.values() if r.status == Status.GRADED]
    assert len(graded) == 4 and any(k.startswith("carol+") for k in graded)
    assert _score(_latest(carol)) == (total, total)

    due = datetime.now(UTC) + timedelta(seconds=1)  # the due date passes: every last submission is final
    with Gradebook(grade.db_url(Settings.load(root))) as gb:
        gb.update_or_create_assignment(A, duedate=due.replace(tzinfo=None))
    clock["now"] = due + timedelta(minutes=1)
    second.serve(idle_exit=True)
    finals = {r.student: r for r in second.state.records.values() if r.final}
    assert sorted(finals) == ["alice", "bob", "carol"]
    assert finals["alice"].status == Status.GRADED and finals["alice"].arrived == max(
        r.arrived for r in second.state.records.values() if r.student == "alice"), "not alice's last submission"
    page = _latest(alice)
    assert "This is your final grade" in page and "no scaling" in page and _score(page)[0] < total
    with Gradebook(grade.db_url(Settings.load(root))) as gb:
        assert gb.find_submission(A, "alice").score == _score(page)[0]
        assert gb.find_submission(A, "bob").score == total
    assert nbformat.read(root / "autograded" / "alice" / A / f"{A}.ipynb", as_version=4).cells
    assert sum(1 for _ in (exchange / "attention" / "inbound").iterdir()) == 6, "a submission was not kept"

    # What a page before the due date shows of the hidden checks, in each mode, rendered as the student gets it.
    shown = {mode: second.pages(finals["alice"], [], mode)[A] for mode in visibility.MODES}
    for mode, page in shown.items():
        assert "could not be shown" not in page and _score(page)[0] < total, mode
        assert "BEGIN HIDDEN TESTS" not in page and "hidden_check" not in page, mode
    graded = nbformat.read(root / "autograded" / "alice" / A / f"{A}.ipynb", as_version=4)
    messages = {o.get("evalue", "") for c in graded.cells if visibility.is_hidden_check(c) for o in c.outputs}
    messages |= {case["message"].split("\n")[0] for c in graded.cells if visibility.is_hidden_check(c)
                 for case in (judge.case_record(c) or {}).get("cases", []) if not case["passed"]}
    visible = " ".join(str(c.get("outputs", "")) for c in graded.cells if not visibility.is_hidden_check(c))
    secret = [m for m in messages if len(m) > 40 and m[:60] not in visible]
    assert secret, "alice's final submission fails no hidden check with a message of its own"
    text = {mode: html.unescape(page) for mode, page in shown.items()}
    assert all(m[:60] in text["messages"] for m in secret)
    assert not any(m[:60] in text["pass_fail"] + text["nothing"] for m in secret), "a hidden message was shown"
    assert visibility.FAILED in shown["pass_fail"] and visibility.HIDDEN not in shown["pass_fail"]
    assert visibility.HIDDEN in shown["nothing"] and visibility.FAILED not in shown["nothing"]
    assert visibility.FAILED not in shown["messages"] and visibility.HIDDEN not in shown["messages"]
