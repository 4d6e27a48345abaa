"""Hostile and broken submissions, graded with a reference student in one parallel run.

Each case is a submission of notebook 01 that hangs, crashes, floods, tampers with the
checks or the notebook, or tries to leave its sandbox. For each: the test cells that can be
graded honestly are, the rest score 0, the feedback says what happened, the reference
student keeps full marks, nothing the submission started is left running, and the run
ends with a summary.
"""

from __future__ import annotations

import copy
import html
import re
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from autograder.pipeline import cgroup, grade, sandbox
from autograder.pipeline.course import assignments
from autograder.pipeline.integrity import NOTES_FILE, normalize, recheck, scan, stage

from .course_copy import fill, make_course, reference_answers, released, submit
from .notebook_code import ROOT, nbgrader_meta, source_notebook

A = "01_soft_lookup"
CELL_TIMEOUT = 25
NOTEBOOK_TIMEOUT = 300
MARKER = f"hostile-{uuid.uuid4().hex}"
POINTS = {
    "test_hard_lookup": 1, "test_hard_lookup_hidden": 1,
    "test_soft_lookup": 1, "test_soft_lookup_hidden": 2,
    "test_nadaraya_watson": 1, "test_nadaraya_watson_hidden": 2,
    "test_scaled_dot_product_attention": 2, "test_scaled_dot_product_attention_hidden": 3,
}
TESTS_OF = {ex: [f"test_{ex}", f"test_{ex}_hidden"]
            for ex in ("hard_lookup", "soft_lookup", "nadaraya_watson", "scaled_dot_product_attention")}
SIGNATURES = {
    "hard_lookup": "def hard_lookup(query, keys, values):",
    "soft_lookup": "def soft_lookup(query, keys, values, temperature=1.0):",
    "nadaraya_watson": "def nadaraya_watson(x_query, x_train, y_train, bandwidth):",
    "scaled_dot_product_attention": "def scaled_dot_product_attention(Q, K, V):",
}


def body(exercise: str, code: str) -> str:
    """The exercise's function with ``code`` (indented) as its body."""
    lines = "\n".join("    " + line for line in code.strip().splitlines())
    return f"{SIGNATURES[exercise]}\n{lines}\n"


WRONG = {
    "hard_lookup": body("hard_lookup", "return values[0] * 0"),
    "soft_lookup": body("soft_lookup", "return values[0] * 0, keys[:, 0] * 0"),
    "nadaraya_watson": body("nadaraya_watson", "return x_query * 0, x_query[:, None] * x_train[None, :] * 0"),
    "scaled_dot_product_attention": body("scaled_dot_product_attention", "return Q * 0, Q @ K.mT * 0"),
}


def cell_index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if nbgrader_meta(c).get("grade_id") == grade_id)


def with_cell(notebook, after: str, source: str, metadata: dict | None = None):
    """A copy of ``notebook`` with a code cell inserted after the cell ``after``."""
    notebook = copy.deepcopy(notebook)
    cell = nbformat.v4.new_code_cell(source, metadata=metadata or {})
    notebook.cells.insert(cell_index(notebook, after) + 1, cell)
    return notebook


# -- the submissions ------------------------------------------------------------------------
# name -> (build(release, reference answers, course) -> notebook or None, expected zero test
# cells (None: all), words expected in the feedback)

def loop_forever(rel, ref, course):
    return fill(rel, dict(ref, hard_lookup=body("hard_lookup", "while True:\n    pass")))


def swallow_interrupt(rel, ref, course):
    code = "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass"
    return fill(rel, dict(ref, soft_lookup=body("soft_lookup", code)))


def kernel_exit(rel, ref, course):
    return fill(rel, dict(ref, nadaraya_watson=body("nadaraya_watson", "import os\nos._exit(3)")))


def segfault(rel, ref, course):
    return fill(rel, dict(ref, scaled_dot_product_attention=body(
        "scaled_dot_product_attention", "import ctypes\nctypes.string_at(0)")))


def system_exit(rel, ref, course):
    return fill(rel, dict(ref, hard_lookup=body("hard_lookup", "raise SystemExit(1)")))


def flood(rel, ref, course):
    return fill(rel, dict(ref, hard_lookup="print('spam ' * 4_000_000)\n" + ref["hard_lookup"]))


def memory(rel, ref, course):
    code = "import torch\nbig = torch.ones(2**33, dtype=torch.float64)\nreturn big[:1], big[:1]"
    top = "try:\n    hoard = bytearray(64 * 2**30)\nexcept MemoryError:\n    print('no memory for that')\n"
    return fill(rel, dict(ref, soft_lookup=top + body("soft_lookup", code)))


def patch_torch(rel, ref, course):
    patch = ("import torch\nimport torch.testing\n"
             "torch.allclose = lambda *args, **kwargs: True\n"
             "torch.testing.assert_close = lambda *args, **kwargs: None\n"
             "torch.Tensor.allclose = lambda *args, **kwargs: True\n")
    return fill(rel, dict(WRONG, hard_lookup=patch + WRONG["hard_lookup"]))


def patch_hidden(rel, ref, course):
    patch = ("import autograder.hidden.soft_lookup as h\nimport autograder.checks.soft_lookup as v\n"
             "for name in dir(h):\n    if name.startswith('check_'):\n        setattr(h, name, lambda fn: None)\n"
             "for name in dir(v):\n    if name.startswith('check_'):\n        setattr(v, name, lambda fn: None)\n")
    return fill(rel, dict(WRONG, hard_lookup=patch + WRONG["hard_lookup"]))


def patch_fail(rel, ref, course):
    patch = ("import autograder.errors, autograder.verify, autograder.compare, autograder.student\n"
             "for module in (autograder.errors, autograder.verify, autograder.compare, autograder.student):\n"
             "    module.fail = lambda message: None\n")
    return fill(rel, dict(WRONG, hard_lookup=patch + WRONG["hard_lookup"]))


def sys_modules(rel, ref, course):
    patch = ("import sys, types\n"
             "for name in ('autograder.hidden.soft_lookup', 'autograder.checks.soft_lookup'):\n"
             "    fake = types.ModuleType(name)\n"
             "    fake.__getattr__ = lambda attr: (lambda fn: None)\n"
             "    sys.modules[name] = fake\n")
    return fill(rel, dict(WRONG, hard_lookup=patch + WRONG["hard_lookup"]))


def ipython_hooks(rel, ref, course):
    patch = ("shell = get_ipython()\n"
             "shell.input_transformers_post.append(lambda lines: ['pass\\n'] if 'check' in ''.join(lines) else lines)\n"
             "shell.set_custom_exc((BaseException,), lambda *args, **kwargs: None)\n")
    return fill(rel, dict(WRONG, hard_lookup=patch + WRONG["hard_lookup"]))


def edit_tests(rel, ref, course):
    notebook = fill(rel, dict(ref, scaled_dot_product_attention=WRONG["scaled_dot_product_attention"]))
    for cell in notebook.cells:
        if nbgrader_meta(cell).get("grade"):
            cell.source = "pass"
    return notebook


def delete_tests(rel, ref, course):
    notebook = fill(rel, dict(ref, nadaraya_watson=WRONG["nadaraya_watson"]))
    gone = {"test_nadaraya_watson", "test_nadaraya_watson_hidden", "test_scaled_dot_product_attention_hidden"}
    notebook.cells = [c for c in notebook.cells if nbgrader_meta(c).get("grade_id") not in gone]
    return notebook


def reorder_tests(rel, ref, course):
    notebook = fill(rel, ref)
    cells = notebook.cells
    hidden = cells.pop(cell_index(notebook, "test_hard_lookup_hidden"))
    cells.insert(0, hidden)
    visible = cells.pop(cell_index(notebook, "test_soft_lookup"))
    cells.append(visible)
    return notebook


def metadata(rel, ref, course):
    notebook = fill(rel, ref)
    nbgrader_meta(notebook.cells[cell_index(notebook, "test_hard_lookup")])["points"] = 100
    nbgrader_meta(notebook.cells[cell_index(notebook, "test_soft_lookup_hidden")])["grade_id"] = "bonus_points"
    fake = {"nbgrader": {"grade": True, "grade_id": "extra_credit", "locked": True, "points": 50,
                         "schema_version": 3, "solution": False, "task": False}}
    return with_cell(notebook, "test_scaled_dot_product_attention_hidden", "print('free points')", fake)


def renamed(rel, ref, course):
    folder = course / "submitted" / "renamed" / A
    folder.mkdir(parents=True)
    nbformat.write(fill(rel, ref), folder / "my_attention_homework.ipynb")


def omitted(rel, ref, course):
    folder = course / "submitted" / "omitted" / A
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("I forgot the notebook.\n")


def added_cells(rel, ref, course):
    notebook = with_cell(fill(rel, ref), "test_hard_lookup_hidden", "def helper(x):\n    return 2 * x\n\nhelper(3)")
    notebook.cells.append(nbformat.v4.new_markdown_cell("My own notes."))
    return notebook


def background(rel, ref, course):
    launch = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)', '{MARKER}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(3600)', '{MARKER}-daemon'])\n"
    )
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", launch)


FORK_BOMB = """import os, time
forked = 0
try:
    for _ in range(600):  # well over the cap of 256, yet bounded where there is none
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        forked += 1
except OSError as error:
    print("refused:", error.strerror)
print("forked", forked)
"""


def fork_bomb(rel, ref, course):
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", FORK_BOMB)


def chdir(rel, ref, course):
    return fill(rel, dict(ref, hard_lookup="import os\nos.chdir('/')\n" + ref["hard_lookup"]))


def snoop(rel, ref, course):
    targets = {
        "source": ROOT / "source" / A / f"{A}.ipynb",
        "course source": course / "source" / A / f"{A}.ipynb",
        "solutions": ROOT / "solutions" / A / f"{A}.ipynb",
        "gradebook": course / "gradebook.db",
        "other student": course / "submitted" / "reference" / A / f"{A}.ipynb",
        "other hidden checks": ROOT / "autograder" / "hidden" / "masking.py",
        "pipeline": ROOT / "autograder" / "pipeline" / "grade.py",
    }
    code = ["import os, socket", "results = []"]
    for what, path in targets.items():
        code += [f"try:\n    open({str(path)!r}, 'rb').read(100)\n    results.append('LEAKED {what}')\n"
                 f"except OSError:\n    results.append('BLOCKED {what}')"]
    for what, path in {"course": course / "written.txt", "repository": ROOT / f"written-{MARKER}.txt"}.items():
        code += [f"try:\n    open({str(path)!r}, 'w').write('x')\n    results.append('LEAKED write {what}')\n"
                 f"except OSError:\n    results.append('BLOCKED write {what}')"]
    code += ["try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    results.append('LEAKED network')\n"
             "except OSError:\n    results.append('BLOCKED network')",
             "print(' / '.join(results))"]
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", "\n".join(code))


ALL = None
CASES = {
    "reference": (lambda rel, ref, course: fill(rel, ref), [], []),
    "untouched": (lambda rel, ref, course: rel, ALL, []),
    "loop_forever": (loop_forever, TESTS_OF["hard_lookup"], [f"stopped after running for {CELL_TIMEOUT} s"]),
    "swallow_interrupt": (swallow_interrupt, TESTS_OF["soft_lookup"], [f"stopped after running for {CELL_TIMEOUT} s"]),
    "kernel_exit": (kernel_exit, TESTS_OF["nadaraya_watson"], ["The kernel", "exited with code 3"]),
    "segfault": (segfault, TESTS_OF["scaled_dot_product_attention"], ["The kernel", "SIGSEGV"]),
    "system_exit": (system_exit, TESTS_OF["hard_lookup"], ["SystemExit"]),
    "flood": (flood, [], ["output cut"]),
    "memory": (memory, TESTS_OF["soft_lookup"], ["allocate memory"]),
    "patch_torch": (patch_torch, ALL, ["allclose was", "protected re-run"]),
    "patch_hidden": (patch_hidden, ALL, ["was replaced", "protected re-run"]),
    "patch_fail": (patch_fail, ALL, ["fail was replaced"]),
    "sys_modules": (sys_modules, ALL, ["sys.modules", "was replaced"]),
    "ipython_hooks": (ipython_hooks, ALL, ["protected re-run", "hard_lookup"]),
    "edit_tests": (edit_tests, TESTS_OF["scaled_dot_product_attention"], ["was edited; the original was run"]),
    "delete_tests": (delete_tests, TESTS_OF["nadaraya_watson"], ["was missing from your notebook"]),
    "reorder_tests": (reorder_tests, [], ["had been moved"]),
    "metadata": (metadata, [], ["was restored", "claims to be graded"]),
    "renamed": (renamed, [], ["was named my_attention_homework.ipynb"]),
    "omitted": (omitted, ALL, ["was not in your submission"]),
    "added_cells": (added_cells, [], []),
    "background": (background, [], []),
    "fork_bomb": (fork_bomb, [], []),
    "chdir": (chdir, [], []),
    "snoop": (snoop, [], []),
}


def grade_the_class(course: Path):
    """Submit every case, grade the class in one parallel run and write its feedback."""
    rel, ref = released(course, A), reference_answers(A)
    for student, (build, _, _) in CASES.items():
        notebook = build(rel, ref, course)
        if notebook is not None:
            submit(course, A, student, notebook)
    options = grade.Options(cell_timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT)
    summary = grade.autograde([A], workers=2, root=course, progress=False, options=options)
    errors = grade.feedback([A], root=course)
    with Gradebook(grade.db_url(course)) as gb:
        scores = {s: {g.name: g.score for g in gb.find_submission_notebook(A, A, s).grades} for s in CASES}
        totals = {s: (gb.find_submission(A, s).score, gb.find_submission(A, s).max_score) for s in CASES}
    return summary, errors, scores, totals


def feedback_text(course: Path, student: str) -> str:
    page = course / "feedback" / student / A / f"{A}.html"
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


@pytest.mark.slow
def test_a_hostile_class(tmp_path):
    """One test (one parallel run, on one pytest worker); every problem found is reported at the end."""
    course = make_course(tmp_path, [A])
    summary, errors, scores, totals = grade_the_class(course)
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    # the run ends with a summary, every submission graded
    check(not summary.failed and not errors, f"failures: {summary.failed} {errors}")
    check(sorted(s for _, s in summary.graded) == sorted(CASES), f"graded: {summary.graded}")
    check(str(summary).startswith(f"graded {len(CASES)}, failed 0") and "submissions per minute" in str(summary),
          f"summary: {str(summary)[:200]}")

    # each submission: the expected scores, and the feedback says what happened
    for student, (_, zero, words) in CASES.items():
        zero = set(POINTS) if zero is ALL else set(zero)
        expected = {name: 0.0 if name in zero else float(points) for name, points in POINTS.items()}
        check(scores[student] == expected, f"{student}: scores {scores[student]}, expected {expected}")
        text = feedback_text(course, student)
        for word in words:
            check(word in text, f"{student}: {word!r} is not in the feedback")
        check("BEGIN HIDDEN TESTS" not in text, f"{student}: the feedback shows hidden tests")

    # no other student's grade changes: the reference keeps full marks, nothing earns extra
    full = float(sum(POINTS.values()))
    check(totals["reference"] == (full, full), f"reference: {totals['reference']}")
    check(all(maximum == full for _, maximum in totals.values()), f"max scores: {totals}")
    notes = (course / "autograded" / "reference" / A / NOTES_FILE).read_text()
    check(not notes.strip("[]\n "), f"reference has notes: {notes}")

    # the tampering ones were re-run and lost their points there
    for student in ("patch_torch", "patch_hidden", "patch_fail", "sys_modules", "ipython_hooks"):
        check((A, student) in summary.rechecked and summary.zeroed.get((A, student)), f"{student} not re-checked")
    check((A, "reference") not in summary.rechecked, "the reference was re-checked")

    # nothing is left running
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if any(MARKER in part for part in p.info["cmdline"] or [])]
    check(not leftovers, f"left running: {leftovers}")

    # the sandbox keeps the submission in (only where bubblewrap runs)
    if sandbox.mode() != "limits only":
        graded = nbformat.read(course / "autograded" / "snoop" / A / f"{A}.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
        check("BLOCKED" in printed and "LEAKED" not in printed, f"snoop: {printed[:600]}")
    if "pids" in cgroup.controllers() or sandbox.mode() == "bwrap as nobody":
        graded = nbformat.read(course / "autograded" / "fork_bomb" / A / f"{A}.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
        forked = re.search(r"forked (\d+)", printed)
        check(forked is not None and int(forked.group(1)) < sandbox.Limits().processes, f"fork bomb: {printed[:300]}")
    check(not (course / "written.txt").exists() and not (ROOT / f"written-{MARKER}.txt").exists(), "a file was written")

    assert not problems, "\n".join(problems)


SNOOP = """
import os, socket, sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").read(10)
        print("LEAKED read", path)
    except OSError:
        print("BLOCKED read", path)
for path in ("/tmp/outside.txt", os.path.join(os.path.dirname(sys.argv[1]), "written.txt")):
    try:
        open(path, "w").write("x")
        print("LEAKED write", path)
    except OSError:
        print("BLOCKED write", path)
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    print("LEAKED network")
except OSError:
    print("BLOCKED network")
try:
    bytearray(8 * 2**30)
    print("LEAKED memory")
except MemoryError:
    print("BLOCKED memory")
print("uid", os.getuid(), "environment", sorted(os.environ))
"""


def test_the_sandbox_on_its_own(tmp_path):
    """Without nbgrader: what sandboxed code can read, write, reach and allocate."""
    if sandbox.mode() == "limits only":
        pytest.skip("bubblewrap is not available here: grading runs with resource limits only (see README)")
    secrets_ = [ROOT / "source" / A / f"{A}.ipynb", ROOT / "solutions" / A / f"{A}.ipynb",
                ROOT / "autograder" / "hidden" / "soft_lookup.py", ROOT / "nbgrader_config.py", Path("/etc/shadow")]
    import sys

    code, out, err = sandbox.run([sys.executable, "-c", SNOOP, *map(str, secrets_)], stdin=b"", timeout=120)
    text = out.decode()
    assert code == 0, err.decode()[-2000:]
    assert text.count("BLOCKED") == len(secrets_) + 4 and "LEAKED" not in text, text
    assert "uid 65534" in text and "NBGRADER" not in text and "AUTOGRADER_RUN" not in text, text
    assert not (ROOT / "source" / A / "written.txt").exists()


FORK_AND_ALLOCATE = """
import os, signal, time
sleepers = []
try:
    for _ in range(1000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        sleepers.append(pid)
except OSError:
    pass
print("forked", len(sleepers))
for pid in sleepers:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os._exit(0)
    children.append(pid)
print("exits", [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children])
"""


def test_the_control_group_caps_processes_and_memory(monkeypatch):
    """A fork bomb stops at the process cap; four processes of 300 MB do not all fit in 700 MB; nothing is left."""
    if not cgroup.controllers():
        pytest.skip("control groups cannot be made here: the per-process limits are all there is (see README)")
    import sys

    made = []
    create = cgroup.create
    monkeypatch.setattr(cgroup, "create", lambda *a, **k: made.append(create(*a, **k)) or made[-1])
    limits = sandbox.Limits(processes=40, memory_mb=700)
    code, out, err = sandbox.run([sys.executable, "-c", FORK_AND_ALLOCATE], stdin=b"", timeout=120, limits=limits)
    text = out.decode()
    assert code == 0, err.decode()[-2000:]
    if "pids" in cgroup.controllers():
        assert 10 < int(re.search(r"forked (\d+)", text).group(1)) < 40, text
    if "memory" in cgroup.controllers():
        exits = eval(re.search(r"exits (\[.*\])", text).group(1))
        assert exits.count(0) < 4 and set(exits) <= {0, -9}, text
    assert made and made[0] is not None and not any(folder.exists() for folder in made[0].folders)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", assignments())
def test_the_recheck_passes_every_reference(assignment):
    """No false alarm: every notebook's reference solution passes the protected re-run as it is."""
    notebook = source_notebook(assignment)
    verdicts, problem = recheck(notebook, assignment, ROOT, cell_timeout=120, timeout=900)
    assert problem == ""
    tests = {nbgrader_meta(c)["grade_id"] for c in notebook.cells
             if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}
    assert set(verdicts) == tests
    assert {g: v.reason for g, v in verdicts.items() if not v.ok} == {}


def released_source() -> nbformat.NotebookNode:
    """The release of notebook 01 as nbgrader makes it, from the source (no nbgrader run)."""
    notebook = source_notebook(A)
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            cell.source = re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "raise NotImplementedError()", cell.source,
                                 flags=re.S)
        elif "BEGIN HIDDEN TESTS" in cell.source:
            cell.source = cell.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    return notebook


@pytest.mark.parametrize("code", [
    "torch.allclose = lambda *a, **k: True",
    "import torch.testing\ntorch.testing.assert_close = print",
    "setattr(torch, 'allclose', print)",
    "get_ipython().set_custom_exc((Exception,), print)",
    "import sys\nsys.modules['autograder.hidden.soft_lookup'] = None",
    "hard_lookup.__code__ = (lambda q, k, v: v).__code__",
    "class Cheat(torch.Tensor):\n    pass",
    "from torch.overrides import TorchFunctionMode",
    "torch._C._set_grad_enabled(False)",
    "getattr(torch, name)",
    "%load_ext something",
    "import autograder.hidden.soft_lookup as h",
    "def f():\n    import ctypes\n    return ctypes",
])
def test_scan_finds_code_that_can_tamper(code):
    release = released_source()
    notebook = fill(release, {"hard_lookup": code + "\n" + body("hard_lookup", "return values[0]")})
    assert any(f.startswith("hard_lookup: ") for f in scan(notebook, release)), code


def test_scan_leaves_ordinary_answers_alone():
    release = released_source()
    assert scan(fill(release, reference_answers(A)), release) == []
    plain = body("soft_lookup", "w = torch.softmax(keys @ query / temperature, dim=-1)\n"
                                "print(getattr(w, 'dtype', None))\nreturn w @ values, w")
    assert scan(fill(release, {"soft_lookup": plain}), release) == []


def test_normalize_puts_locked_cells_back():
    release = released_source()
    notebook = fill(release, reference_answers(A))
    cells = notebook.cells
    cells.pop(cell_index(notebook, "test_nadaraya_watson_hidden"))  # deleted
    moved = cells.pop(cell_index(notebook, "test_hard_lookup"))
    cells.insert(0, moved)  # moved before its exercise
    cells[cell_index(notebook, "test_soft_lookup")].source = "pass"  # edited
    nbgrader_meta(cells[cell_index(notebook, "test_soft_lookup_hidden")])["points"] = 99  # metadata
    nbgrader_meta(cells[cell_index(notebook, "test_scaled_dot_product_attention")])["grade_id"] = "mine"  # renamed id
    cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True, "grade_id": "bonus",
                                                                          "points": 9, "locked": True}}))
    fixed, notes = normalize(notebook, release)
    kinds = sorted({n.kind for n in notes})
    assert kinds == ["added", "deleted", "edited", "metadata", "moved"], notes
    ids = [nbgrader_meta(c).get("grade_id") for c in fixed.cells if nbgrader_meta(c)]
    expected = [nbgrader_meta(c)["grade_id"] for c in release.cells if nbgrader_meta(c)]
    assert ids == expected
    by_id = {nbgrader_meta(c)["grade_id"]: c for c in fixed.cells if nbgrader_meta(c)}
    released_by_id = {nbgrader_meta(c)["grade_id"]: c for c in release.cells if nbgrader_meta(c)}
    for gid, cell in by_id.items():
        assert nbgrader_meta(cell) == nbgrader_meta(released_by_id[gid])
        if nbgrader_meta(cell).get("locked"):
            assert cell.source == released_by_id[gid].source
    assert fixed.cells[-1].source == "x = 1" and "nbgrader" not in fixed.cells[-1].metadata
    assert normalize(fill(release, reference_answers(A)), release)[1] == []


def test_stage_copies_regular_files_and_finds_a_renamed_notebook(tmp_path):
    root = tmp_path / "course"
    (root / "build" / "release" / A).mkdir(parents=True)
    release = released_source()
    nbformat.write(release, root / "build" / "release" / A / f"{A}.ipynb")
    folder = root / "submitted" / "s" / A
    folder.mkdir(parents=True)
    nbformat.write(fill(release, reference_answers(A)), folder / "copy of my work.ipynb")
    (folder / "data.txt").write_text("mine")
    (folder / "secret").symlink_to(ROOT / "nbgrader_config.py")
    (folder / "timestamp.txt").write_text("2026-01-01 10:00:00")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert {n.kind for n in staged.notes} == {"renamed", "link"}
    target = tmp_path / "staging" / "s" / A
    assert sorted(p.name for p in target.iterdir()) == sorted([f"{A}.ipynb", "data.txt", "timestamp.txt"])
    assert not any(p.is_symlink() for p in target.iterdir())
    (folder / "copy of my work.ipynb").unlink()
    staged = stage(root, A, "s", tmp_path / "staging2")
    assert staged.notebooks == [] and [n.kind for n in staged.notes if n.kind != "link"] == ["missing"]
