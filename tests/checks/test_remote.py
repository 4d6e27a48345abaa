"""The boundary between the student's kernel and the grader: plain data only, checks judged on the grader's side.

These run in one process (``LocalChannel``): every reference solution passes every hidden check
when the student's functions are proxies, exactly as at grading time, where the same requests go
to a sandboxed kernel (every catalogued mistake through the proxies: ``test_catalogue.py``).
"""

from __future__ import annotations

import ast
import base64
import importlib
import json
import math
import types

import nbformat
import pytest
import torch

from autograder.course.repository import assignments, module_name
from autograder.engine.graded_cells import before, graded_sources, imported_modules
from autograder.engine.source_check import forbidden_use
from autograder.grader import remote as remote_module
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import Remote, lookup
from autograder.grader.student import attempt, call_student, expect_error, probe
from autograder.kernel.guard import ATTENTION_BUILTINS, ForbiddenCall
from autograder.references.multi_head import run_module
from autograder.references.numerical_stability import unchanged_by
from autograder.shared import wire
from autograder.shared.errors import CheckFailed

from ..course_copy import fill, reference_answers
from ..notebook_code import ROOT, answer_cells, hidden_test_arguments, nbgrader_meta, solution_namespace, source_notebook


def proxy(name: str, value) -> Remote:
    found, remote = lookup(LocalChannel({name: value}), name)
    assert found and isinstance(remote, Remote)
    return remote


# -- the format ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    None, True, 0, -2**70, 1.5, -0.0, math.inf, math.nan, 1e-310, 2 + 3j, "text \u00e9", (1, [2.5, "x"]),
    {"a": (torch.ones(2),)}, torch.float16, torch.device("cpu"),
])
def test_plain_values_cross_unchanged(value):
    back = wire.decode(wire.encode(value))
    assert type(back) is type(value)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    elif isinstance(value, dict):
        assert torch.equal(back["a"][0], value["a"][0])
    else:
        assert back == value and repr(back) == repr(value)


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES.values(), key=str))
def test_tensors_cross_exactly(dtype):
    source = (torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) - 7.25).to(dtype)
    back = wire.decode(wire.encode(source.transpose(0, 2)))
    assert type(back) is torch.Tensor and back.dtype == dtype and back.shape == (4, 3, 2)
    assert torch.equal(back, source.transpose(0, 2))
    meta = wire.decode(wire.encode(torch.empty(3, 5, dtype=dtype, device="meta")))
    assert meta.device.type == "meta" and meta.shape == (3, 5) and meta.dtype == dtype
    grad = wire.decode(wire.encode(torch.ones(2, dtype=torch.float64, requires_grad=True)))
    assert grad.requires_grad


def test_generators_and_modules_cross_with_their_state():
    gen = torch.Generator().manual_seed(5)
    torch.rand(3, generator=gen)
    back = wire.decode(wire.encode(gen))
    assert torch.equal(torch.rand(4, generator=back), torch.rand(4, generator=gen))
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=4, vdim=6, dtype=torch.float64)
    rebuilt = wire.decode(wire.encode(mha))
    assert (rebuilt.kdim, rebuilt.vdim, rebuilt.batch_first, rebuilt.num_heads) == (4, 6, True, 2)
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.state_dict().values(), mha.state_dict().values()))


class Exact(torch.Tensor):
    def __eq__(self, other):
        return True


class Big(int):
    def __eq__(self, other):
        return True


def test_subclasses_and_objects_never_cross_as_plain_values():
    kept = []

    def keep(obj):
        kept.append(obj)
        return wire.Handle(len(kept), type(obj).__name__, callable(obj))

    back = wire.decode(wire.encode([torch.ones(2).as_subclass(Exact), Big(3), object()], keep=keep),
                       resolve=lambda n, kind, is_callable: ("handle", kind))
    assert back == [("handle", "Exact"), ("handle", "Big"), ("handle", "object")]
    with pytest.raises(wire.WireError, match="not plain data"):
        wire.encode(Big(3))


@pytest.mark.parametrize("data", [
    b"", b"AGW1", b"pickle\x80\x04", b"AGW1" + (10**9).to_bytes(8, "little") + b"{}",
    wire.MAGIC + (20).to_bytes(8, "little") + b'{"tensor":{"dtype":"float64","shape":[1000000],"device":"cpu"}}',
    wire.MAGIC + (40).to_bytes(8, "little") + b'{"tensor":{"dtype":"object","shape":[1],"device":"cpu"}}',
    wire.MAGIC + (31).to_bytes(8, "little") + b'{"str":1}' + b" " * 22,
    wire.MAGIC + (14).to_bytes(8, "little") + b'{"eval":"1+1"}',
    wire.MAGIC + (8).to_bytes(8, "little") + b"[" * 8,
])
def test_malformed_or_hostile_bytes_are_refused(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_nesting_and_size_are_bounded():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError, match="nested"):
        wire.encode(deep)
    header = b'{"list":[' + b",".join([b'{"bool":true}'] * (wire.MAX_VALUES + 1)) + b"]}"
    with pytest.raises(wire.WireError, match="too many"):
        wire.decode(wire.MAGIC + len(header).to_bytes(8, "little") + header)


def test_what_the_grader_reads_is_bounded_before_anything_is_built():
    """A header, a reply or a module described larger than the limits is refused before it is parsed or built."""
    header = b'{"str":"' + b"x" * wire.MAX_HEADER_BYTES + b'"}'
    with pytest.raises(wire.WireError, match="description of the values is larger"):
        wire.decode(wire.MAGIC + len(header).to_bytes(8, "little") + header)
    big = wire.encode(torch.zeros(wire.MAX_REPLY_BYTES // 8 + 1, dtype=torch.float64))
    assert wire.decode(big).numel() == wire.MAX_REPLY_BYTES // 8 + 1  # a message the kernel may be sent
    with pytest.raises(wire.WireError, match="larger than 64 MB"):
        wire.decode(big, limit=wire.MAX_REPLY_BYTES)  # but not an answer the grader reads
    # An nn.MultiheadAttention of width 16384 described in a few bytes: refused at once, never built (4 GB).
    spec = wire.encode(torch.nn.MultiheadAttention(8, 2))
    length = int.from_bytes(spec[4:12], "little")
    header = json.loads(spec[12:12 + length])
    header["mha"].update(embed_dim=16384, kdim=16384, vdim=16384)
    header = json.dumps(header).encode()
    wide = wire.MAGIC + len(header).to_bytes(8, "little") + header + spec[12 + length:]
    with pytest.raises(wire.WireError, match="larger than the weights the message carries"):
        wire.decode(wide)


def test_what_a_check_call_prints_is_kept_only_to_the_cells_budget():
    """1 GB printed while a check runs the student's function: the grader keeps the budget and one character."""
    from autograder.engine.kernel_requests import KernelRequests

    requests = KernelRequests()
    requests.max_output_bytes, requests._streams, requests._streams_size = 1000, [], 0
    for _ in range(10_000):
        requests.keep_stream("stdout", "spam " * 200)
    assert sum(len(text) for _, text in requests._streams) == 1001


def test_the_grading_process_caps_its_own_memory():
    """ResilientExecute.grader_memory_mb: past it, an allocation in the grader fails (that submission), not the machine."""
    import subprocess
    import sys

    code = ("from autograder.engine.execute import limit_own_memory\nlimit_own_memory({mb})\n"
            "try:\n    kept = bytearray(3 * 2**30)\nexcept MemoryError:\n    print('refused')\nelse:\n    print('allowed')")
    capped = subprocess.run([sys.executable, "-c", code.format(mb=2048)], capture_output=True, text=True, timeout=120)
    uncapped = subprocess.run([sys.executable, "-c", code.format(mb=0)], capture_output=True, text=True, timeout=120)
    assert (capped.stdout.strip(), uncapped.stdout.strip()) == ("refused", "allowed"), capped.stderr + uncapped.stderr


# -- the proxies -----------------------------------------------------------------------------------


def test_a_proxy_runs_the_function_on_copies_and_rebuilds_its_errors():
    def mutate(x):
        x += 1
        return x * 2

    x = torch.zeros(3)
    assert torch.equal(call_student(proxy("mutate", mutate), x, what="mutate(x)"), torch.full((3,), 2.0))
    assert torch.equal(x, torch.zeros(3))

    class MyError(ValueError):
        pass

    def fails(x):
        raise MyError("the shapes (2, 3) and (4,) do not fit")

    raised = expect_error(proxy("fails", fails), x, error=ValueError, what="fails(x)", why="it must")
    assert type(raised).__name__ == "MyError" and "do not fit" in str(raised)
    outcome, error = attempt(proxy("fails", fails), (x,), exercise="fails")
    assert outcome.error == ("MyError", "the shapes (2, 3) and (4,) do not fit")
    assert "raise MyError" in error.student_frames


def test_unwritten_and_forbidden_reach_the_check_as_messages():
    def unwritten(Q, K, V):
        raise NotImplementedError()

    def cheats(Q, K, V):
        return torch.nn.functional.scaled_dot_product_attention(Q, K, V)

    q = torch.ones(1, 2, 4)
    with pytest.raises(CheckFailed, match="not written yet"):
        call_student(proxy("sdpa", unwritten), q, q, q, what="sdpa(...)")
    with pytest.raises(CheckFailed, match="which this exercise asks you to write yourself"):
        call_student(proxy("sdpa", cheats), q, q, q, what="sdpa(...)", forbid=ATTENTION_BUILTINS)


class UsesSdpa:
    """A student's MultiHeadAttention that calls the built-in its exercise forbids."""

    @classmethod
    def from_torch(cls, mha):
        return cls()

    def __call__(self, query, key, value):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value)


class RulesSeen(LocalChannel):
    """A channel that notes the rules each call of the student's objects carries to the kernel."""

    def __init__(self, namespace: dict) -> None:
        super().__init__(namespace)
        self.calls: list[tuple[str, list[str]]] = []

    def request(self, message: bytes) -> bytes:
        request = wire.decode(message, resolve=lambda number, kind, is_callable: number)
        if request.get("op") == "call":
            self.calls.append((request["exercise"], [shown for shown, _, _ in request["forbid"]]))
        return super().request(message)


def test_the_objects_a_harness_runs_carry_the_rules_of_the_checks_call():
    """A check that runs the student's class through code of its own (a harness) passes its call's rules on, explicitly:
    the class, and the module reached from it, are called under them in the kernel; so is an object given as an
    argument of the check's own function. A proxy called with no rules is its own exercise, with nothing forbidden."""
    q, torch_mha = torch.ones(1, 2, 4), types.SimpleNamespace(mha=None)
    channel = RulesSeen({"MultiHeadAttention": UsesSdpa})
    cls = lookup(channel, "MultiHeadAttention")[1]
    rules = [r.shown_as for r in ATTENTION_BUILTINS]
    with pytest.raises(ForbiddenCall, match="^MultiHeadAttention called torch.nn.functional.scaled_dot_product_attention"):
        attempt(run_module(cls), (torch_mha, q, q, q), exercise="MultiHeadAttention", forbid=ATTENTION_BUILTINS)
    assert channel.calls == [("MultiHeadAttention", rules)] * 2  # from_torch, then the module it built
    channel.calls.clear()
    with pytest.raises(ForbiddenCall, match="^scenario called torch.nn.functional.scaled_dot_product_attention"):
        attempt(lambda given, x: given.from_torch(None)(x, x, x), (cls, q), exercise="scenario", forbid=ATTENTION_BUILTINS)
    assert channel.calls == [("scenario", rules)] * 2
    channel.calls.clear()
    assert torch.equal(run_module(cls)(torch_mha, q, q, q), UsesSdpa()(q, q, q))  # called outside a check's call
    assert channel.calls == [("MultiHeadAttention", [])] * 2


def test_objects_stay_in_the_kernel_and_answer_through_handles():
    class Counter:
        def __init__(self, start):
            self.items = list(range(start))

        def add(self, x):
            self.items.append(x)
            return torch.tensor(self.items)

        def __len__(self):
            return len(self.items)

    counter = call_student(proxy("Counter", Counter), 2, what="Counter(2)")
    assert isinstance(counter, Remote) and counter.description == "a Counter"
    assert torch.equal(counter.add(7), torch.tensor([0, 1, 7])) and len(counter) == 3
    with pytest.raises(AttributeError):
        counter.missing  # noqa: B018 - reading it is the test
    with pytest.raises(AttributeError):
        counter._private  # noqa: B018 - private names are never asked for


def test_probes_run_where_the_student_code_runs():
    def pure(x, dim=-1):
        return x * 2

    def in_place(x, dim=-1):
        return x.mul_(2)

    x = torch.ones(3, dtype=torch.float64)
    for fn, unchanged in ((pure, True), (in_place, False)):
        assert probe(unchanged_by, fn, x, {}, what="f(x)") is unchanged
        assert probe(unchanged_by, proxy("f", fn), x, {}, what="f(x)") is unchanged
    with pytest.raises(CheckFailed, match="not a probe of the public checks"):
        probe(test_probes_run_where_the_student_code_runs, proxy("f", pure), what="f(x)")


def test_a_check_run_in_another_thread_of_the_kernel_fails():
    import threading

    def starts_a_thread(x):
        threading.Thread(target=lambda: __import__("time").sleep(0.5)).start()
        return x

    with pytest.raises(CheckFailed, match="started a thread"):
        call_student(proxy("f", starts_a_thread), torch.ones(2), what="f(x)")


@pytest.mark.parametrize("before", [False, True], ids=["no-child-before", "a-child-before"])
@pytest.mark.parametrize("waits", [False, True], ids=["left-running", "waited-for"])
def test_a_process_the_function_leaves_running_fails_its_call_and_one_it_waited_for_does_not(waits, before):
    """Whether or not this process had a child before the call (the count reads the machine's processes only when
    it has one), a process started by the function and still running when it returns fails the call."""
    import subprocess
    import sys

    started = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])] if before else []

    def starts_a_process(x):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        if waits:
            started[-1].kill()
            started[-1].wait()
        return x

    try:
        if waits:
            assert torch.equal(call_student(proxy("f", starts_a_process), torch.ones(2), what="f(x)"), torch.ones(2))
        else:
            with pytest.raises(CheckFailed, match="started a thread or a process"):
                call_student(proxy("f", starts_a_process), torch.ones(2), what="f(x)")
    finally:
        for process in started:
            process.kill()
            process.wait()


# -- every check through the proxies ----------------------------------------------------------------


def hidden_module(assignment):
    return importlib.import_module(f"autograder.hidden.{module_name(assignment)}")


class SourceChannel(LocalChannel):
    """A channel whose source reading sees what the graded kernel loads (as grading's does), and records what it was
    asked."""

    def __init__(self, namespace: dict, sources: list[str]) -> None:
        super().__init__(namespace)
        self.sources, self.asked = sources, []

    def forbidden_use(self, name, rules, exercise):
        self.asked.append((name, rules))
        return forbidden_use(self.sources, name, rules, exercise)


@pytest.mark.parametrize("assignment", assignments())
def test_every_hidden_check_passes_the_reference_through_the_proxies(assignment):
    """Each name the hidden test cell gives its check is a proxy into the reference's namespace, and the
    reference's source is read for forbidden built-ins as grading reads it: nothing is flagged.
    (Every catalogued mistake through the proxies: test_catalogue.py.)"""
    module = hidden_module(assignment)
    notebook = fill(source_notebook(assignment), reference_answers(assignment))
    loaded = graded_sources(notebook, nbformat.read(ROOT / "notebooks" / f"{assignment}.ipynb", as_version=4))
    test_cell = {nbgrader_meta(c).get("grade_id"): i for i, c in enumerate(notebook.cells)}
    reference = vars(solution_namespace(assignment))
    arguments = hidden_test_arguments(assignment)
    asked = []
    for exercise in answer_cells(assignment):
        sources = [s.source for s in before(loaded, test_cell[f"test_{exercise}_hidden"])]  # what grading loads
        channel = SourceChannel(reference, sources)
        getattr(module, f"check_{exercise}")(*(lookup(channel, name)[1] for name in arguments[exercise]))
        asked += channel.asked
    forbidding = sorted({name for name, rules in asked if rules})
    print(assignment, "exercises read for forbidden built-ins:", forbidding)
    if assignment == "01_soft_lookup":
        assert forbidding == ["scaled_dot_product_attention"]


def test_an_input_changed_in_place_is_seen_on_both_sides():
    def in_place(x, y, scale=None):
        x.sub_(x.max())
        if scale is not None:
            scale.mul_(2)
        return x

    x, y, scale = torch.tensor([1.0, float("nan")]), torch.ones(2), torch.ones(1)
    for fn in (in_place, proxy("f", in_place)):
        outcome, error = attempt(fn, (x, y), {"scale": scale}, exercise="f")
        assert error is None and outcome.mutated == (0, "scale")
        assert torch.equal(scale, torch.ones(1))
    outcome, _ = attempt(proxy("f", lambda x: x + 0), (torch.tensor([float("nan")]),), exercise="f")
    assert outcome.mutated == ()


def test_an_output_nested_too_deeply_is_kept_without_its_depth():
    """display() with metadata 700 levels deep: the output is kept, its metadata dropped (nbformat would recurse)."""
    from autograder.engine.execute import ResilientExecute

    execute = ResilientExecute()
    execute.reset_execution_trackers()  # nbclient's own state, as at the start of a notebook
    execute.clear_before_next_output = False  # as nbclient sets it before a cell runs
    execute._output_bytes, execute._noted, execute._notebook_output_bytes = {}, {}, 0
    deep: dict = {}
    level = deep
    for _ in range(700):
        level["a"] = {}
        level = level["a"]
    outputs: list = []
    content = {"data": {"text/plain": "x", "application/json": [deep]}, "metadata": deep, "transient": {}}
    execute.output(outputs, {"msg_type": "display_data", "header": {"msg_type": "display_data"},
                             "parent_header": {"msg_id": "m"}, "content": content}, None, 0)
    assert len(outputs) == 1 and outputs[0].metadata == {}
    assert outputs[0].data == {"text/plain": "(an output nested too deeply to keep)"}


def _modules_loaded_by(code: str) -> set[str]:
    """The package's modules a fresh Python has loaded after ``code``."""
    import subprocess
    import sys

    from ..notebook_code import ROOT

    script = code + "\nimport sys\nprint(' '.join(m for m in sys.modules if m == 'autograder' or m.startswith('autograder.')))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


#: The grader's side: what runs outside the student's kernel and judges it.
GRADER_SIDE = ("autograder.grader.remote", "autograder.engine", "autograder.grading", "autograder.service", "autograder.course",
               "autograder.hidden", "autograder.__main__")


def test_the_kernel_side_imports_nothing_of_the_graders_and_the_reverse():
    """serve (what answers in the student's kernel) and the grader's side never import each other, so no code of
    the grader's is loaded where the student's runs, and none of the kernel's is trusted where the grader's runs.
    No module of autograder/kernel (nor of autograder/shared, beside it) imports autograder/grader, nor the
    instructor's side."""
    package = ROOT / "autograder"
    allowed = {"kernel": ("autograder.kernel", "autograder.shared"), "shared": ("autograder.shared",)}
    for side, within in allowed.items():
        for path in sorted((package / side).glob("*.py")):
            names = imported_modules(ast.parse(path.read_text()), f"autograder.{side}")
            modules = [n for n in names if (ROOT / n.replace(".", "/")).with_suffix(".py").is_file()
                       or (ROOT / n.replace(".", "/")).is_dir()]  # not a name the root package holds
            outside = [n for n in modules if n.startswith("autograder.") and not n.startswith(within)]
            assert not outside, f"{path.relative_to(ROOT)} imports {outside}"
    kernel = _modules_loaded_by("import autograder.kernel.serve, autograder.kernel.call, autograder.kernel.watches\n"
                                "autograder.kernel.serve.hold_probes()")
    assert "autograder.kernel.serve" in kernel
    assert not {m for m in kernel if m.startswith(GRADER_SIDE)}, sorted(kernel)
    grader = _modules_loaded_by(
        "import pkgutil, autograder.hidden, autograder.engine\n"
        "for package in (autograder.hidden, autograder.engine):\n"
        "    for module in pkgutil.iter_modules(package.__path__):\n"
        "        __import__(f'{package.__name__}.{module.name}')\n"
        "import autograder.grader.remote, autograder.grading.grade, autograder.grading.cluster, autograder.service.serve")
    assert {"autograder.grader.remote", "autograder.engine.judge", "autograder.hidden.complexity"} <= grader
    assert "autograder.kernel.serve" not in grader


# -- objects the grader serves to the kernel ----------------------------------------------------------------


def test_a_served_object_is_called_in_the_grader_and_only_through_the_methods_allowed():
    from autograder.kernel import served as kernel_side

    class Model:
        def __init__(self):
            self.calls = 0

        def __call__(self, tokens, caches=None):
            self.calls, self.caches = self.calls + 1, caches
            return tokens * 2

        def new_caches(self):
            self.made = [object()]  # not plain data: it stays in the grader
            return self.made

        def load_state_dict(self, state):
            raise AssertionError("the kernel may not reach this")

    model = Model()

    def student(m, x):
        caches = m.new_caches()
        return m(x, caches), type(caches).__name__

    remote = proxy("student", student)
    outcome, error = remote.attempt((remote.serve(model, ("__call__", "new_caches")), torch.ones(2)), {},
                                    exercise="student")
    assert error is None and torch.equal(outcome.value[0], torch.full((2,), 2.0))
    assert outcome.value[1] == "ServedObject" and model.calls == 1 and model.caches is model.made

    def forbidden(m):
        return m.load_state_dict({})

    outcome, error = proxy("forbidden", forbidden).attempt((remote.serve(model, ("__call__",)),), {}, exercise="f")
    assert isinstance(error, RuntimeError) and "no method 'load_state_dict'" in str(error)
    # what the kernel sends that is not a request, or not readable, is an error answer, never an exception here
    for junk in ("", "not base64!", base64.b64encode(b"AGW1junk").decode()):
        assert "error" in wire.decode(base64.b64decode(remote_module.answer_served(junk)))
    # a stand-in outside a check's call has nobody to ask
    with pytest.raises(RuntimeError, match="only a check's call"):
        kernel_side.ServedObject(1)(torch.ones(1))
    # and a kernel's ordinary answer cannot carry a served object to the grader
    with pytest.raises(wire.WireError):
        wire.decode(wire.encode({"value": wire.Served(1)}))
