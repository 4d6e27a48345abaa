"""Hostile and broken submissions, graded with a reference student in one parallel run.

Each case is a submission of notebook 01 that hangs, crashes, floods, tampers with the
checks or the notebook, reaches for the answers, gets round the guard, tries to damage the
grading of others or to leave its sandbox. For each: the test cells that can be graded
honestly are, the rest score 0, the feedback says what happened and shows no hidden test,
the reference student keeps full marks, nothing the submission started is left running,
and the run ends with a summary and a feedback page for everyone. It needs the sandbox:
without bubblewrap it is skipped (grading refuses to run hostile code without one).
"""

from __future__ import annotations

import copy
import html
import json
import re
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.engine import cgroup, sandbox
from autograder.engine.kernel_manager import SandboxedKernelManager
from autograder.engine.notes import NOTES_FILE
from autograder.grading import feedback, grade

from ..course_copy import UNHURRIED, fill, make_course, reference_answers, released, submit
from ..demonstrations import release_without_demonstrations
from ..notebook_code import ROOT, nbgrader_meta

A = "01_soft_lookup"
#: The cell limit the two submissions about it are graded under (:data:`TIMED`), in a run of their own; the rest of
#: the class is graded under :data:`~tests.course_copy.UNHURRIED` limits, so that no verdict depends on how busy the
#: machine is (a fork bomb's 256 forks, a reference's plots).
CELL_TIMEOUT = 10
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
    modules = "autograder.shared.errors, autograder.grader.verify, autograder.grader.compare, autograder.grader.student"
    patch = (f"import {modules}\nfor module in ({modules}):\n"
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
        "grading tools": ROOT / "autograder" / "grading" / "grade.py",
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


# -- reaching for the answers, or for the comparisons ------------------------------------------

def read_answer(rel, ref, course):
    """The hidden module's reference, imported; the checker's locals, found by walking the stack."""
    steal = ("import autograder.hidden.soft_lookup as h\nreturn h._sdpa(Q, K, V)")
    walk = ("import sys\nframe = sys._getframe(1)\nwhile frame is not None:\n"
            "    for name in ('expected', 'want', 'reference', 'theirs'):\n"
            "        if name in frame.f_locals:\n            return frame.f_locals[name]\n"
            "    frame = frame.f_back\nreturn values[0] * 0, keys[:, 0] * 0")
    return fill(rel, dict(ref, scaled_dot_product_attention=body("scaled_dot_product_attention", steal),
                          soft_lookup=body("soft_lookup", walk)))


ALWAYS_EQUAL = """import torch

class Exact(torch.Tensor):
    def __eq__(self, other):
        return True
    def allclose(self, *args, **kwargs):
        return True
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "equal", "isclose", "eq", "__eq__"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

"""


def always_equal(rel, ref, course):
    return fill(rel, dict(ref, hard_lookup=ALWAYS_EQUAL + body("hard_lookup", "return (values[0] * 0).as_subclass(Exact)")))


def self_undoing(rel, ref, course):
    """Comparisons replaced while the function runs and put back before it returns; the re-check's state hunted."""
    code = ("import gc, torch, autograder.grader.compare as c\nsaved = (torch.allclose, c.is_close, c.assert_close)\n"
            "torch.allclose, c.is_close, c.assert_close = (lambda *a, **k: True), (lambda *a, **k: True), "
            "(lambda *a, **k: None)\n"
            "for obj in gc.get_objects():\n    if isinstance(obj, dict) and 'verdicts' in obj:\n"
            "        obj['verdicts'] = {}\n"
            "result = values[0] * 0, keys[:, 0] * 0\ntorch.allclose, c.is_close, c.assert_close = saved\n"
            "return result")
    return fill(rel, dict(ref, soft_lookup=body("soft_lookup", code)))


def evade_scan(rel, ref, course):
    """Tampering run through typing.get_type_hints and pickle, and a cell too deep for a syntax tree."""
    hints = ("import typing, torch\ndef f(x: 'exec(\"import torch; torch.allclose = lambda *a, **k: True\")'): pass\n"
             "try:\n    typing.get_type_hints(f)\nexcept Exception:\n    pass\n"
             "import pickle\n"
             "pickle.loads(b\"cbuiltins\\nexec\\n(Vimport torch; torch.equal = lambda *a: True\\ntR.\")\n")
    deep = "x = " + "(" * 5000 + "1" + ")" * 5000
    notebook = fill(rel, dict(WRONG, hard_lookup=hints + WRONG["hard_lookup"]))
    return with_cell(notebook, "test_hard_lookup_hidden", deep)


def startup_file(rel, ref, course):
    """A startup file in the sandbox's home that would tamper in the kernel started after a crash."""
    plant = ("import os\nfolder = os.path.expanduser('~/.ipython/profile_default/startup')\n"
             "os.makedirs(folder, exist_ok=True)\n"
             "open(os.path.join(folder, '00-cheat.py'), 'w').write('import torch\\ntorch.allclose = lambda *a, **k: True\\n')\n")
    notebook = fill(rel, dict(ref, hard_lookup=WRONG["hard_lookup"],
                              nadaraya_watson=body("nadaraya_watson", "import os\nos._exit(3)")))
    return with_cell(notebook, "test_hard_lookup_hidden", plant)


def _forging_package(course, student):
    folder = course / "submitted" / student / A / "autograder"
    (folder / "kernel").mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "kernel" / "__init__.py").write_text("")
    (folder / "kernel" / "serve.py").write_text(
        "import base64, json, struct\n"
        "def serve(request, namespace=None):\n"
        "    header = json.dumps({'dict': [['value', {'bool': True}]]}).encode()\n"
        "    return base64.b64encode(b'AGW1' + struct.pack('<Q', len(header)) + header).decode()\n")


def shadow(rel, ref, course):
    """An autograder/ package in the submission, put first on the kernel's path, whose server forges answers."""
    _forging_package(course, "shadow")
    first = "import os, sys\nsys.path.insert(0, os.getcwd())\n" \
            "for name in [m for m in sys.modules if m.split('.')[0] == 'autograder']:\n    del sys.modules[name]\n"
    return with_cell(fill(rel, WRONG), "hard_lookup", first)


def shadow_folder(rel, ref, course):
    """The same package left in the submission's folder only: the kernel imports the grader's, not it."""
    _forging_package(course, "shadow_folder")
    return fill(rel, WRONG)


SDPA_IN_A_THREAD = """import threading
import torch.nn.functional as F
box = []
worker = threading.Thread(target=lambda: box.append(F.scaled_dot_product_attention(Q, K, V)))
worker.start()
worker.join()
weights = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, dim=-1)
return box[0], weights"""

SDPA_GUARD_OFF = """import torch
import torch.nn.functional as F
with torch._C.DisableTorchFunction():
    output = F.scaled_dot_product_attention(Q, K, V)
weights = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, dim=-1)
return output, weights"""


def guard_thread(rel, ref, course):
    return fill(rel, dict(ref, scaled_dot_product_attention=body("scaled_dot_product_attention", SDPA_IN_A_THREAD)))


def guard_off(rel, ref, course):
    return fill(rel, dict(ref, scaled_dot_product_attention=body("scaled_dot_product_attention", SDPA_GUARD_OFF)))


def leak(rel, ref, course):
    """Printing what ran before (In, _ih), the hidden module's source, and errors that would carry them."""
    code = ("import glob, os, autograder\nprint('IN:', globals().get('In', [''])[-1][:2000])\n"
            "print('IH:', globals().get('_ih', [''])[-2:])\n"
            "for path in glob.glob(os.path.join(os.path.dirname(autograder.__file__), '*', 'soft_lookup.py')):\n"
            "    print('SOURCE:', open(path).read())\n")
    return fill(rel, dict(ref, hard_lookup=ref["hard_lookup"].replace(":\n", ":\n" + "".join(
        "    " + line + "\n" for line in code.splitlines()), 1)))


FILL_DISK = """import os, tempfile
written = {}
private = os.path.dirname(os.path.expanduser("~"))  # the kernel's own folder: its sockets, the submission's copy
for where in (os.getcwd(), os.path.expanduser("~"), tempfile.gettempdir(), private, os.path.join(private, "work")):
    total = 0
    try:
        for i in range(64):  # up to 4 GB in each place, far over its quota
            with open(os.path.join(where, f"filler-{i}"), "wb") as handle:
                for _ in range(4):
                    handle.write(b"x" * 2**24)
                    total += 2**24
    except OSError as error:
        pass
    written[where] = total
    print("place", where, total, flush=True)  # a cell stopped for its time still shows where it got
print("written", max(written.values()))
"""


def fill_disk(rel, ref, course):
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", FILL_DISK)


def huge_outputs(rel, ref, course):
    """A 50 MB error message and 30 MB of display metadata: neither is an output the caps may miss."""
    big = ("from IPython.display import display\n"
           "display({'text/plain': 'small'}, metadata={'junk': 'y' * 30_000_000}, raw=True)\n"
           "raise RuntimeError('x' * 50_000_000)")
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", big)


def odd_text(rel, ref, course):
    """A lone surrogate in an added cell's grade_id and in an output, a file with a name that is not UTF-8."""
    folder = course / "submitted" / "odd_text" / A
    folder.mkdir(parents=True)
    with open(bytes(folder) + b"/\xff\xfe-data.txt", "wb") as handle:
        handle.write(b"data")
    fake = {"nbgrader": {"grade": True, "grade_id": "\ud800", "locked": True, "points": 3, "schema_version": 3,
                         "solution": False, "task": False}}
    notebook = with_cell(fill(rel, ref), "test_hard_lookup_hidden", "print('\\ud800'.encode().decode('unicode_escape'))",
                         fake)
    (folder / f"{A}.ipynb").write_text(json.dumps(notebook))  # ASCII JSON: the lone surrogate as an escape


def html_inject(rel, ref, course):
    """Script in a markdown cell and in an HTML output: nothing may run when the feedback is opened."""
    notebook = with_cell(fill(rel, ref), "test_hard_lookup_hidden",
                         "from IPython.display import HTML, display\n"
                         "display(HTML('<img src=x onerror=\"alert(3)\"><script>alert(4)</script>'))")
    notebook.cells.append(nbformat.v4.new_markdown_cell('<script>alert(1)</script><img src=x onerror="alert(2)">'))
    return notebook


def deep_metadata(rel, ref, course):
    """Metadata nested 700 levels deep, the notebook's and a cell's: graded on its answers."""
    folder = course / "submitted" / "deep_metadata" / A
    folder.mkdir(parents=True)
    notebook = fill(rel, ref)
    notebook.metadata["deep"] = "@deep@"
    notebook.cells[cell_index(notebook, "hard_lookup")].metadata["jupyter"] = "@deep@"
    deep = '{"x": ' * 700 + "{}" + "}" * 700  # as text: no JSON encoder nests that deep
    (folder / f"{A}.ipynb").write_text(json.dumps(notebook).replace('"@deep@"', deep))


def notebook_folder(rel, ref, course):
    """A folder named like the notebook, beside the notebook saved under another name."""
    folder = course / "submitted" / "notebook_folder" / A
    (folder / f"{A}.ipynb").mkdir(parents=True)
    (folder / f"{A}.ipynb" / "inside.txt").write_text("not a notebook")
    nbformat.write(fill(rel, ref), folder / f"{A} (1).ipynb")


PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="


def image_metadata(rel, ref, course):
    """An image whose width and height (written unquoted by nbconvert's template) carry event handlers."""
    code = ("from IPython.display import display\n"
            f"display({{'image/png': '{PIXEL}', 'text/plain': 'x'}}, raw=True,\n"
            "        metadata={'width': '1 onload=alert(1)', 'image/png': {'height': '1 onerror=alert(2)'}})")
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", code)


def terminal_escapes(rel, ref, course):
    """Names with terminal escapes and a forged summary line: a file, an extra notebook, an added cell's grade_id."""
    folder = course / "submitted" / "terminal_escapes" / A
    folder.mkdir(parents=True)
    forged = f"\ngraded 99, could not be graded 0\n  {A} / reference: forged\x1b]0;pwned\x07\x1b[2J"
    in_a_name = forged.replace(" / ", " \u2215 ")  # a file name cannot hold "/": a division slash looks the same
    (folder / f"link{in_a_name}").symlink_to("/etc/passwd")
    nbformat.write(fill(rel, WRONG), folder / f"extra{in_a_name}.ipynb")
    fake = {"nbgrader": {"grade": True, "grade_id": f"bonus{forged}", "locked": True, "points": 5,
                         "schema_version": 3, "solution": False, "task": False}}
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", "print('mine')", fake)


def exit_call(rel, ref, course):
    """exit() in a cell: that cell is blamed, and it is not run again at every restart."""
    return with_cell(fill(rel, ref), "test_hard_lookup_hidden", "exit()")


ALL = None
CASES = {
    "reference": (lambda rel, ref, course: fill(rel, ref), [], []),
    "untouched": (lambda rel, ref, course: rel, ALL, []),
    "kernel_exit": (kernel_exit, TESTS_OF["nadaraya_watson"], ["The kernel", "exited with code 3"]),
    "segfault": (segfault, TESTS_OF["scaled_dot_product_attention"], ["The kernel", "SIGSEGV"]),
    "system_exit": (system_exit, TESTS_OF["hard_lookup"], ["SystemExit"]),
    "flood": (flood, [], ["output cut"]),
    "memory": (memory, TESTS_OF["soft_lookup"], ["allocate memory"]),
    "patch_torch": (patch_torch, ALL, ["not what it should be"]),
    "patch_hidden": (patch_hidden, ALL, ["is not defined"]),
    "patch_fail": (patch_fail, ALL, ["not what it should be"]),
    "sys_modules": (sys_modules, ALL, ["not what it should be"]),
    "ipython_hooks": (ipython_hooks, ALL, ["not what it should be"]),
    "read_answer": (read_answer, TESTS_OF["scaled_dot_product_attention"] + TESTS_OF["soft_lookup"],
                    ["ModuleNotFoundError", "not what it should be"]),
    "always_equal": (always_equal, TESTS_OF["hard_lookup"], ["but it is a Exact"]),
    # an answer cell that swaps functions (gc, a module patched) leaves no exercise whose code is read verifiable
    "self_undoing": (self_undoing, TESTS_OF["soft_lookup"] + TESTS_OF["scaled_dot_product_attention"],
                     ["not what it should be", "Cannot verify scaled_dot_product_attention"]),
    "evade_scan": (evade_scan, ALL, ["not what it should be"]),
    "startup_file": (startup_file, TESTS_OF["hard_lookup"] + TESTS_OF["nadaraya_watson"], ["exited with code 3"]),
    # the cell that puts the forging package first is not an answer cell: the graded kernel never runs it
    "shadow": (shadow, ALL, ["not what it should be"]),
    "shadow_folder": (shadow_folder, ALL, ["not what it should be"]),
    "guard_thread": (guard_thread, TESTS_OF["scaled_dot_product_attention"], ["Thread", "another thread"]),
    "guard_off": (guard_off, TESTS_OF["scaled_dot_product_attention"], ["DisableTorchFunction"]),
    "leak": (leak, TESTS_OF["scaled_dot_product_attention"], ["Cannot verify scaled_dot_product_attention"]),
    "fill_disk": (fill_disk, [], []),
    "huge_outputs": (huge_outputs, [], ["output cut"]),
    "odd_text": (odd_text, [], ["claims to be graded"]),
    "html_inject": (html_inject, [], []),
    "exit_call": (exit_call, [], ["The kernel", "exit()"]),
    "deep_metadata": (deep_metadata, [], ["nest more than 32 levels deep was left out"]),
    "notebook_folder": (notebook_folder, [], ["is a folder, not a notebook", "was named 01_soft_lookup (1).ipynb"]),
    "image_metadata": (image_metadata, [], []),
    "terminal_escapes": (terminal_escapes, [], ["claims to be graded", "is a symbolic link", "is not part of this"]),
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
#: Submissions that run past the cell limit: graded in a run of their own under :data:`CELL_TIMEOUT`, beside the
#: reference, without the demonstrations (each of their other cells takes milliseconds, far below the limit).
TIMED = {
    "reference": CASES["reference"],
    "loop_forever": (loop_forever, TESTS_OF["hard_lookup"], [f"stopped after running for {CELL_TIMEOUT} s"]),
    "swallow_interrupt": (swallow_interrupt, TESTS_OF["soft_lookup"], [f"stopped after running for {CELL_TIMEOUT} s"]),
}


def grade_the_class(course: Path, cases: dict = CASES, limits: dict | None = None, release=None):
    """Submit every case of ``cases`` (built on ``release``, default the released notebook), grade the class in one
    parallel run under ``limits`` (default :data:`~tests.course_copy.UNHURRIED`) and write its feedback."""
    rel, ref = release or released(course, A), reference_answers(A)
    for student, (build, _, _) in cases.items():
        notebook = build(rel, ref, course)
        if notebook is not None:
            submit(course, A, student, notebook)
    settings = Settings.load(course, {"Grading.workers": 2, **(limits or UNHURRIED)})
    summary = grade.autograde([A], settings, progress=False)
    errors = feedback.feedback([A], root=course).broken
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        scores = {s: {g.name: g.score for g in gb.find_submission_notebook(A, A, s).grades} for s in cases}
        totals = {s: (gb.find_submission(A, s).score, gb.find_submission(A, s).max_score) for s in cases}
    return summary, errors, scores, totals


def expected_scores(zero) -> dict[str, float]:
    """Each test cell's points, but 0 for those of ``zero`` (:data:`ALL`: every one)."""
    zero = set(POINTS) if zero is ALL else set(zero)
    return {name: 0.0 if name in zero else float(points) for name, points in POINTS.items()}


def feedback_text(course: Path, student: str) -> str:
    page = course / "feedback" / student / A / f"{A}.html"
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


@pytest.mark.slow
def test_a_hostile_class(tmp_path):
    """One test (one parallel run, on one pytest worker); every problem found is reported at the end."""
    if sandbox.mode() == "limits only":
        pytest.skip(f"no sandbox here ({sandbox.why_not()}): grading refuses hostile code without one; "
                    "install bubblewrap to run this test")
    course = make_course(tmp_path, [A])
    summary, errors, scores, totals = grade_the_class(course)
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    # the run ends with a summary, every submission graded
    check(not summary.failed and not errors, f"failures: {summary.failed} {errors}")
    check(sorted(s for _, s in summary.graded) == sorted(CASES), f"graded: {summary.graded}")
    text = str(summary)
    text.encode("utf-8")
    check(text.startswith(f"graded {len(CASES)}, could not be graded 0") and "submissions per minute" in text
          and "protection: test cells run in the grader's process" in text, f"summary: {text[:300]}")

    # each submission: the expected scores, and the feedback says what happened
    for student, (_, zero, words) in CASES.items():
        expected = expected_scores(zero)
        check(scores[student] == expected, f"{student}: scores {scores[student]}, expected {expected}")
        text = feedback_text(course, student)
        for word in words:
            check(word in text, f"{student}: {word!r} is not in the feedback")
        for secret in ("BEGIN HIDDEN TESTS", "hidden_check_", "_lookup_cases", "def _sdpa", "SDPA_SHAPES"):
            check(secret not in text, f"{student}: the feedback shows hidden material ({secret})")

    # no other student's grade changes: the reference keeps full marks, nothing earns extra
    full = float(sum(POINTS.values()))
    check(totals["reference"] == (full, full), f"reference: {totals['reference']}")
    check(all(maximum == full for _, maximum in totals.values()), f"max scores: {totals}")
    notes = json.loads((course / "autograded" / "reference" / A / NOTES_FILE).read_text())
    check([n["kind"] for n in notes] == ["protection"], f"reference has notes: {notes}")
    check("bubblewrap sandbox" in feedback_text(course, "reference"), "the feedback does not say the protection")

    # what a submission may not do to the grading of others, or to the grader
    def printed(student: str) -> str:
        graded = nbformat.read(course / "autograded" / student / A / f"{A}.ipynb", as_version=4)
        return "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))

    written = re.search(r"written (\d+)", printed("fill_disk"))
    check(written is not None and int(written.group(1)) <= sandbox.Limits().tmp_mb * 2**20,
          f"fill_disk: {re.findall('(?:place|written) .*', printed('fill_disk'))}")
    check(not list((course / "autograded" / "fill_disk" / A).glob("filler-*")), "fill_disk wrote into the course")
    size = (course / "autograded" / "huge_outputs" / A / f"{A}.ipynb").stat().st_size
    check(size < 8 * 2**20, f"huge_outputs: the graded notebook has {size} bytes")
    page = (course / "feedback" / "html_inject" / A / f"{A}.html").read_text()
    live = re.findall(r"<[^>]*\bonerror\s*=|<script[^>]*>\s*alert", page)  # as markup, not as escaped source text
    check(not live, f"html_inject: the student's script is live in the feedback page: {live}")
    page = (course / "feedback" / "image_metadata" / A / f"{A}.html").read_text()
    live = re.findall(r"<[^>]*\son\w+\s*=", page)  # an event handler in any tag (the template writes width unquoted)
    check(not live, f"image_metadata: an event handler in the feedback page: {live}")
    # the summary: one line per note, whatever a name holds; no escape sequence reaches the terminal
    summary_lines = str(summary).split("\n")
    check([line for line in summary_lines if line.startswith("graded ")] == summary_lines[:1]
          and not any(re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", line) for line in summary_lines)
          and not any("reference: forged" in line and not line.startswith(f"  {A} / terminal_escapes: ")
                      for line in summary_lines), f"terminal_escapes: the summary: {summary_lines}")
    exit_notes = (course / "autograded" / "exit_call" / A / NOTES_FILE).read_text()
    check("not run" not in exit_notes and exit_notes.count("The kernel") == 1, f"exit_call: {exit_notes[:500]}")
    check("def _lookup_cases" not in printed("leak"), "leak: the hidden module could be read")

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


@pytest.mark.slow
def test_a_cell_past_its_time_limit_is_stopped(tmp_path):
    """A loop that never ends, and one that swallows the interrupt, are stopped at the cell limit: that exercise's
    tests score 0 and its feedback says so; the other exercises keep their points, the reference keeps full marks.
    Graded apart from the class, under a short limit that only these loops reach."""
    if sandbox.mode() == "limits only":
        pytest.skip(f"no sandbox here ({sandbox.why_not()}): grading refuses hostile code without one; "
                    "install bubblewrap to run this test")
    course = make_course(tmp_path, [A])
    summary, errors, scores, totals = grade_the_class(
        course, TIMED, {"Execute.timeout": CELL_TIMEOUT}, release_without_demonstrations(released(course, A), A))
    problems = [] if not summary.failed and not errors else [f"failures: {summary.failed} {errors}"]
    for student, (_, zero, words) in TIMED.items():
        if scores[student] != expected_scores(zero):
            problems.append(f"{student}: scores {scores[student]}, expected {expected_scores(zero)}")
        problems += [f"{student}: {word!r} is not in the feedback" for word in words
                     if word not in feedback_text(course, student)]
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
        pytest.skip("bubblewrap is not available here: grading runs with resource limits only (see docs/safety.md)")
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
# Each child holds its 300 MB until every child has made its own or been killed: four at once, whatever the order
# the machine runs them in (a child that ended before the next began would leave room for it).
release, hold = os.pipe()
children, made = [], []
for _ in range(4):
    said, says = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hold)
        block = bytearray(300 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(says, b"made")
        os.read(release, 1)
        os._exit(0)
    os.close(says)
    children.append(pid)
    made.append(said)
for said in made:
    os.read(said, 4)  # "made", or nothing: that child was killed
os.close(hold)
print("exits", [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children])
"""


def test_the_control_group_caps_processes_and_memory(monkeypatch):
    """A fork bomb stops at the process cap; of four processes holding 300 MB at once, at most two fit in 700 MB;
    nothing is left."""
    if not cgroup.controllers():
        pytest.skip("control groups cannot be made here: the per-process limits are all there is (see docs/safety.md)")
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
        assert exits.count(0) <= 2 and set(exits) <= {0, -9}, text
    assert made and made[0] is not None and not any(folder.exists() for folder in made[0].folders)




def test_a_kernel_starts_with_the_limits_only(tmp_path, monkeypatch):
    """--no-sandbox: the kernel starts and answers, as nobody where nobody can start this Python (a root grader)."""
    import asyncio

    monkeypatch.chdir(tmp_path)

    async def uid_of_a_kernel() -> str:
        km = SandboxedKernelManager(kernel_name="python3", bubblewrap=False)
        await km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        printed: list[str] = []
        try:
            await kc.wait_for_ready(timeout=120)
            await kc.execute_interactive("import os; print(os.getuid())", timeout=60,
                                         output_hook=lambda m: printed.append(m["content"].get("text", "")))
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        return "".join(printed).strip()

    owner = sandbox.sandbox_owner()
    assert asyncio.run(uid_of_a_kernel()) == str(owner if owner is not None else __import__("os").getuid())
