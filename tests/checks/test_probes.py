"""Every probe a check judges is held in the graded kernel: derived from the checks' code, so a new one is covered.

A probe (``probe(examine, target, ...)``, :func:`autograder.grader.student.probe`) runs in the student's
kernel and returns what a check judges. In the graded kernel the probes are copied before any
answer cell is loaded (:func:`autograder.kernel.serve.hold_probes`) and only the copies run. This test finds
every ``probe(...)`` call in the package's code and checks that its probe is among the copies; the
graded hostile submissions below replace a probe in three styles and earn nothing.
"""

from __future__ import annotations

import ast
import copy
import importlib
from pathlib import Path

import pytest
import torch
from traitlets.config import Config

import autograder
from autograder.course.repository import assignments
from autograder.engine import judge, source_check, zygote
from autograder.engine.execute import ResilientExecute, is_test_cell
from autograder.engine.graded_cells import check_modules
from autograder.grader.local_channel import LocalChannel
from autograder.kernel import probe_kinds, serve

from .. import forked_kernels
from ..course_copy import reference_answers
from ..judged import failure
from ..notebook_code import ROOT, nbgrader_meta, source_notebook

PACKAGE = Path(autograder.__file__).parent


def probes_in_the_code() -> dict[str, list[str]]:
    """``module:qualname`` of every probe some ``probe(...)`` call runs -> the modules that call it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "probe" and n.args]
        if not calls:
            continue
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = importlib.import_module(name)
        for call in calls:
            examine = call.args[0]
            assert isinstance(examine, ast.Name), f"{name}:{call.lineno}: a probe must be named, not computed"
            fn = getattr(module, examine.id, None)
            if fn is None:  # a local name (a parameter): the call sites pass one of the named probes
                continue
            found.setdefault(f"{fn.__module__}:{fn.__qualname__}", []).append(name)
    return found


def test_the_probes_are_found_in_the_code():
    found = probes_in_the_code()
    for known in ("autograder.kernel.watches:watch_allocations", "autograder.references.flash_backward:function_record",
                  "autograder.references.flash_backward:backward_under_guard",
                  "autograder.references.flash_backward:function_values"):
        assert known in found
    assert len(found) > 20


def test_every_probe_in_the_code_is_held(monkeypatch):
    monkeypatch.setattr(serve, "_held", {})
    serve.hold_probes()
    missing = sorted(set(probes_in_the_code()) - set(serve._held))
    assert not missing, f"probes not held in the graded kernel (add their modules to serve.PROBE_MODULES): {missing}"


def test_every_probe_in_the_code_says_what_its_result_is():
    """A probe whose result is a property seen in the kernel (not data judged against a reference) says what backs
    it: a new probe is classified (probe_kinds.PROBE_KINDS) before it is run, and a probe that goes takes its entry."""
    found, classified = set(probes_in_the_code()), set(probe_kinds.PROBE_KINDS)
    assert not found - classified, f"classify these probes in probe_kinds.PROBE_KINDS: {sorted(found - classified)}"
    assert not classified - found, f"no longer probes: {sorted(classified - found)}"
    assert all(kind in (probe_kinds.DATA, probe_kinds.OBSERVED) and why for kind, why in probe_kinds.PROBE_KINDS.values())


@pytest.mark.parametrize("assignment", assignments())
def test_the_probes_a_notebooks_checks_run_are_held_for_that_notebook(monkeypatch, assignment):
    """The graded kernel holds the probes of the modules the test cells reach only (importing fewer modules):
    every probe called from one of those is among them."""
    reached = check_modules(source_notebook(assignment))
    monkeypatch.setattr(serve, "_held", {})
    serve.hold_probes(reached)
    needed = {p for p, callers in probes_in_the_code().items() if set(callers) & set(reached)}
    assert not needed - set(serve._held), sorted(needed - set(serve._held))


def test_a_held_probe_is_not_the_function_an_answer_cell_can_reach(monkeypatch):
    from autograder.references import tiny_decoder

    monkeypatch.setattr(serve, "_held", {})
    serve.hold_probes()
    held = serve._held["autograder.references.tiny_decoder:train_block"]
    assert held is not tiny_decoder.train_block and held.__code__ is tiny_decoder.train_block.__code__
    assert held.__globals__ is not vars(tiny_decoder)
    with pytest.raises(ValueError, match="not a probe"):
        serve._examiner("autograder.references.tiny_decoder:Weights")


class _Concatenating:
    """A KV cache grown by torch.cat at every append (what 09's allocation check catches)."""

    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.k = self.v = torch.zeros(batch, kv_heads, 0, d_head, dtype=dtype)

    def append(self, k, v):
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v


def test_a_held_probe_keeps_the_built_ins_it_was_held_with(monkeypatch):
    """An answer cell can put its own ``range`` in ``builtins`` (here: no appends where the probe counts them)."""
    import builtins
    import sys

    from autograder.references import decoding_and_training

    monkeypatch.setattr(serve, "_held", {})
    serve.hold_probes(["autograder.references.decoding_and_training"])
    held = serve._held["autograder.references.decoding_and_training:cache_allocations"]
    held(_Concatenating, 1, 2, 4, 8, 4)  # what PyTorch imports the first time, imported before range is replaced
    real = builtins.range

    def short(*args):
        counted = len(args) == 2 and sys._getframe(1).f_code.co_name == "cache_allocations"  # the appends counted
        return real(0) if counted else real(*args)

    monkeypatch.setattr(builtins, "range", short)
    assert decoding_and_training.cache_allocations(_Concatenating, 1, 2, 16, 8, 16) == (0, 0)  # fooled
    allocated, by_cat = held(_Concatenating, 1, 2, 16, 8, 16)
    assert by_cat > 0 and allocated >= by_cat


# -- graded: a generate that never uses the cache, served a model from the grader --------------------------------

A = "09_decoding_and_training"
NEVER_CACHES = '''
def generate(model, prompt, steps, use_cache=True):
    tokens = prompt
    chosen = []
    with torch.no_grad():
        for _ in range(steps):
            token = model(tokens)[:, -1].argmax(dim=-1)
            chosen.append(token)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
    return torch.stack(chosen, dim=1).reshape(prompt.shape[0], steps)
'''
#: Never caches, and writes into the probe's own lists (reached through the wrapper the probe put on the model) what a
#: caching generate would have been counted: the held probe is not what is fooled, what it counts is.
REWRITES_THE_COUNT = '''
def generate(model, prompt, steps, use_cache=True):
    noted = getattr(model, "forward", None)
    code, closure = getattr(noted, "__code__", None), getattr(noted, "__closure__", None) or ()
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure))) if code is not None else {}
    original = cells.get("forward", model)
    tokens, chosen = prompt, []
    with torch.no_grad():
        for _ in range(steps):
            token = original(tokens)[:, -1].argmax(dim=-1)
            chosen.append(token)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
    if "fed" in cells and "cached" in cells:
        cells["fed"][:] = [prompt.shape[-1]] + [1] * (steps - 1)
        cells["cached"][:] = [True] * steps
    return torch.stack(chosen, dim=1).reshape(prompt.shape[0], steps)
'''


def graded_generate(tmp_path, generate_cell: str) -> list:
    """09 graded as grading runs it with ``generate_cell`` as generate's answer, only its hidden test run: its outputs."""
    return graded_one(tmp_path, A, "generate", generate_cell)


def graded_one(tmp_path, assignment: str, exercise: str, answer: str, test: str = "") -> list:
    """``assignment`` graded as grading runs it with ``answer`` as ``exercise``'s answer cell (the reference answers
    elsewhere), only ``exercise``'s hidden test run (or the test cell ``test``): that test cell's outputs."""
    test = test or f"test_{exercise}_hidden"
    notebook = source_notebook(assignment)
    answers = dict(reference_answers(assignment), **{exercise: answer})
    cells = []
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            cell.source = answers[meta["grade_id"]]
        elif is_test_cell(cell) and meta.get("grade_id") != test:
            cell.source = "pass"
        elif cell.cell_type == "code" and not meta and not cell.source.startswith("import"):
            continue  # the demonstrations: the graded kernel holds none of them anyway
        cells.append(copy.deepcopy(cell))
    notebook.cells = cells
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = Config()
    config.CourseDirectory.root = str(ROOT)
    # Sandboxed, its kernels forked from a zygote, where grading forks them (root with bubblewrap); else in plain
    # kernels, which need neither: what the probes see of the student's code is the same in both.
    graded, _ = ResilientExecute(timeout=300, sandbox=zygote.usable(), config=forked_kernels.config(config)).preprocess(
        notebook, {"metadata": {"path": str(tmp_path)}, "nbgrader": {"assignment": assignment, "notebook": assignment}})
    return next(c.outputs for c in graded.cells if nbgrader_meta(c).get("grade_id") == test)


@pytest.mark.slow
def test_a_generate_that_never_caches_fails(tmp_path):
    message = failure(graded_generate(tmp_path, NEVER_CACHES))
    assert message is not None and "use_cache=True" in message, message


@pytest.mark.slow
def test_a_generate_that_rewrites_what_the_count_noted_fails(tmp_path):
    """The model is served from the grader (autograder.kernel.served): its calls are counted where no answer reaches."""
    message = failure(graded_generate(tmp_path, REWRITES_THE_COUNT))
    assert message is not None and "use_cache=True" in message, message


@pytest.mark.slow
def test_a_generate_that_rewrites_what_the_count_noted_fails_the_visible_check(tmp_path):
    """The visible check serves its model from the grader too (its test cell has points)."""
    message = failure(graded_one(tmp_path, A, "generate", REWRITES_THE_COUNT, test="test_generate"))
    assert message is not None and "use_cache=True" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("test", ["test_generate", "test_generate_hidden"])
def test_the_reference_generate_passes_in_the_graded_kernel(tmp_path, test):
    assert failure(graded_one(tmp_path, A, "generate", reference_answers(A)["generate"], test=test)) is None


# -- graded: 11's speculative decoder that verifies token by token and rewrites the count of its target's calls ---

#: Proposes as speculative decoding does, then verifies each proposal with a call of the target of its own (k + 1
#: calls a round instead of one); where the models count their own calls in the kernel, it sets the target's count
#: back to one call a round.
VERIFIES_ONE_BY_ONE = '''
def speculative_generate(target, draft, prompt, steps, k):
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0 or k < 1 or steps < 1:
        raise ValueError("a batch of one non-empty prompt, k >= 1 and steps >= 1")
    start = getattr(target, "calls", 0)
    tokens, rounds = prompt, 0
    while tokens.shape[1] - prompt.shape[1] < steps:
        left = steps - (tokens.shape[1] - prompt.shape[1])
        proposal = tokens
        for _ in range(min(k, left - 1)):
            proposal = torch.cat([proposal, draft(proposal)[:, -1:].argmax(dim=-1)], dim=1)
        rounds += 1
        for i in range(tokens.shape[1], proposal.shape[1] + 1):
            best = target(tokens)[:, -1:].argmax(dim=-1)
            tokens = torch.cat([tokens, best], dim=1)
            if i == proposal.shape[1] or not bool((proposal[:, i:i + 1] == best).all()):
                break
    if isinstance(start, int):
        target.calls = start + rounds
    return tokens[:, prompt.shape[1]:], rounds
'''


@pytest.mark.slow
def test_a_speculative_decoder_that_rewrites_its_targets_count_fails(tmp_path):
    """The models are served from the grader (autograder.kernel.served): the target's calls are counted where no answer
    reaches."""
    message = failure(graded_one(tmp_path, "11_serving", "speculative_generate", VERIFIES_ONE_BY_ONE))
    assert message is not None and "target" in message, message


# -- graded: 08's FlashAttention left as released, the probes its hidden check runs replaced in three styles -------

UNTOUCHED = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, dO):
        raise NotImplementedError()


def _record(function, Q, K, V, dO, block_size, is_causal):
    import math, torch

    def attend(Q, K, V):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            scores = scores.masked_fill(~torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril(), float("-inf"))
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        return (weights / weights.sum(dim=-1, keepdim=True)) @ V

    Q, K, V = (t.detach().clone().requires_grad_(True) for t in (Q, K, V))
    out = attend(Q, K, V)
    grads = torch.autograd.grad(out, (Q, K, V), dO.to(out.dtype))
    return {"saved": [], "saved_bytes": 0, "ctx_tensors": [], "output": out.detach(),
            "grads": tuple(g.detach() for g in grads)}


def _values(function, points, dOs, block_size, is_causal):
    import math, torch

    def attend(Q, K, V):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            scores = scores.masked_fill(~torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril(), float("-inf"))
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        return (weights / weights.sum(dim=-1, keepdim=True)) @ V

    leaves = [t.detach().clone().requires_grad_(True) for t in points[0]]
    out = attend(*leaves)
    return ([attend(*p).detach() for p in points],
            [tuple(g.detach() for g in torch.autograd.grad(out, leaves, dO, retain_graph=True)) for dO in dOs])


def _nothing(*args):
    return None


import autograder.references.flash_backward as _fb
'''
#: How an answer cell replaces the probes; each would make the untouched stub pass every case if the probes ran as
#: the module holds them after the answer cells (the probes' forged results are right: reference values, nothing saved).
PROBES_REPLACED = {
    "setattr-on-a-list-element": "for _name, _fake in [('function_record', _record), ('function_values', _values), "
                                 "('backward_under_guard', _nothing)]:\n    setattr([_fb][0], _name, _fake)\n",
    "new-code": "_fb.function_record.__code__ = _record.__code__\n_fb.function_values.__code__ = _values.__code__\n"
                "_fb.backward_under_guard.__code__ = _nothing.__code__\n",
    "sys-modules": "import sys, types\nsys.modules['autograder.references.flash_backward'] = types.SimpleNamespace("
                   "**{**vars(_fb), 'function_record': _record, 'function_values': _values, "
                   "'backward_under_guard': _nothing})\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(PROBES_REPLACED))
def test_an_untouched_flash_attention_with_its_probes_replaced_earns_nothing(tmp_path, monkeypatch, style):
    # the source reader (which refuses an answer cell that patches a module) is off: the hold alone is tested
    monkeypatch.setattr(source_check, "forbidden_use", lambda *args: None)
    outputs = graded_one(tmp_path, "08_flash_backward", "FlashAttention", UNTOUCHED + PROBES_REPLACED[style])
    record = judge.case_record({"outputs": outputs})  # none when the check stopped: the cell scores nothing
    assert (record or {"score": 0})["score"] == 0 and "not written yet" in failure(outputs), outputs


# -- graded: 08's FlashAttention with a wrong backward, torch.autograd.gradcheck replaced ------------------------

#: A forward from basic operations and a backward that returns zeros; the answer cell makes gradcheck accept anything.
WRONG_BACKWARD_GRADCHECK_REPLACED = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            keep = torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        ctx.save_for_backward(Q, K, V)
        return (weights / weights.sum(dim=-1, keepdim=True)) @ V

    @staticmethod
    def backward(ctx, dO):
        Q, K, V = ctx.saved_tensors
        return torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V), None, None


torch.autograd.gradcheck = lambda *args, **kwargs: True
'''


@pytest.mark.slow
def test_a_wrong_backward_earns_nothing_from_gradcheck_replaced_in_the_kernel(tmp_path, monkeypatch):
    """gradcheck runs in the grader, on the outputs and gradients fetched from the kernel: nothing there can pass it."""
    monkeypatch.setattr(source_check, "forbidden_use", lambda *args: None)  # the hold and the wire alone are tested
    outputs = graded_one(tmp_path, "08_flash_backward", "FlashAttention", WRONG_BACKWARD_GRADCHECK_REPLACED)
    cases = judge.case_record({"outputs": outputs})["cases"]
    gradchecks = [c for c in cases if c["name"].startswith("gradcheck")]
    assert len(gradchecks) == 3 and not any(c["passed"] for c in gradchecks), gradchecks
    assert "Jacobian mismatch" in gradchecks[0]["message"], gradchecks[0]["message"]


# -- 08's backward under the guard: the grader reads the source for what the kernel's guard watches for ----------

AUTOGRAD_IN_BACKWARD = """
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        ctx.save_for_backward(Q, K, V)
        ctx.is_causal = is_causal
        return _naive(Q, K, V, is_causal)

    @staticmethod
    def backward(ctx, dO):
        Q, K, V = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (Q, K, V)]
            dQ, dK, dV = torch.autograd.grad(_naive(*leaves, ctx.is_causal), leaves, dO)
        return dQ, dK, dV, None, None


def _naive(Q, K, V, is_causal):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / weights.sum(dim=-1, keepdim=True)) @ V
"""


class _ReadingChannel(LocalChannel):
    """A namespace in this process whose source the grader reads, as grading reads the graded kernel's."""

    def __init__(self, sources: list[str]) -> None:
        namespace: dict = {}
        for source in sources:
            exec(source, namespace)  # noqa: S102 - the test's own answer
        super().__init__(namespace)
        self.sources = sources

    def forbidden_use(self, name, rules, exercise):
        return source_check.forbidden_use(self.sources, name, rules, exercise)


def test_a_backward_through_autograd_is_caught_with_the_kernels_guard_replaced(monkeypatch):
    """The guard in the kernel is replaced (as an answer cell can replace it there): the grader's reading of the
    Function's source for the built-ins the backward may not call still catches automatic differentiation."""
    from autograder.grader import remote
    from autograder.kernel.guard import ForbiddenCall, Guard
    from autograder.references.flash_backward import check_backward_guard, qkv

    channel = _ReadingChannel(["import math\nimport torch", AUTOGRAD_IN_BACKWARD])
    found, FlashAttention = remote.lookup(channel, "FlashAttention")  # noqa: N806
    assert found
    monkeypatch.setattr(Guard, "__torch_function__", lambda self, func, types, args=(), kwargs=None:
                        func(*args, **(kwargs or {})))
    Q, K, V, dO = qkv(torch.Generator().manual_seed(0), (1,), 5, 7, 3, 2)
    with pytest.raises(ForbiddenCall, match="torch.autograd.grad"):
        check_backward_guard(FlashAttention, Q, K, V, dO, 3, True)


@pytest.mark.slow
def test_the_reference_flash_attention_keeps_every_point_in_the_graded_kernel(tmp_path):
    """With the source read for what the backward may not call, and gradcheck run in the grader."""
    answer = reference_answers("08_flash_backward")["FlashAttention"]
    assert failure(graded_one(tmp_path, "08_flash_backward", "FlashAttention", answer)) is None
