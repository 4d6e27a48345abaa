"""A probe that observes the student's code in the kernel is backed by the grader's reading of that code.

A probe whose result is a property seen in the kernel (:data:`autograder.kernel.probe_kinds.OBSERVED`: bytes
allocated, gradients reached) could be forged by code loaded beside it that changes what it calls: the
class of a watch, PyTorch's autograd. So before such a probe the grader reads the student's source with the
reader's rules (:mod:`autograder.engine.source_check`), in exercises that forbid no built-in too, and a
"cannot verify" fails the probe's case. Which probes are read is derived from ``PROBE_KINDS``; the hostile
submissions below replace the watch in several ways and earn nothing on the watched case, through the
graded kernel; honest caches in other styles are read as honest.
"""

from __future__ import annotations

import pytest

from autograder.engine import judge, source_check
from autograder.engine.source_check import forbidden_use
from autograder.grader import remote as remote_module
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import lookup
from autograder.grader.student import probe
from autograder.kernel.guard import ATTENTION_BUILTINS
from autograder.kernel.probe_kinds import DATA, OBSERVED, PROBE_KINDS
from autograder.shared.errors import CheckFailed, WholeCellFailure

from ..course_copy import reference_answers
from .test_probes import graded_one

# -- which probes are read: derived from PROBE_KINDS ------------------------------------------------------------


class ReadingChannel(LocalChannel):
    """A channel that records each reading of the source and answers with ``problem``; its requests return None."""

    def __init__(self, problem: str | None = None) -> None:
        super().__init__({"target": object()})
        self.problem, self.asked = problem, []

    def forbidden_use(self, name, rules, exercise):
        self.asked.append((name, tuple(rules)))
        return self.problem

    def request(self, message: bytes) -> bytes:
        from autograder.shared import wire

        return wire.encode({"value": None}) if b"probe" in message else super().request(message)  # the probe: None


def stand_in(name: str):
    """A function the grader names as the probe ``name`` (``module:qualname``): only its name crosses the wire."""
    module, qualname = name.split(":")
    fn = lambda *args: None  # noqa: E731
    fn.__module__, fn.__qualname__ = module, qualname
    return fn


@pytest.mark.parametrize("name", sorted(PROBE_KINDS))
def test_every_probe_that_observes_is_preceded_by_a_reading_of_the_source(name):
    """Each OBSERVED probe reads the target's source before the call, with no rules where none are forbidden; a DATA
    probe does not (its result is compared with a reference)."""
    channel = ReadingChannel()
    _, target = lookup(channel, "target")
    probe(stand_in(name), target, what="the probe")
    kind = PROBE_KINDS[name][0]
    assert channel.asked == ([("target", ())] if kind == OBSERVED else []), (name, kind, channel.asked)
    assert kind in (DATA, OBSERVED)


def test_a_probe_nobody_classified_is_read_too():
    channel = ReadingChannel()
    _, target = lookup(channel, "target")
    probe(stand_in("autograder.references.serving:a_new_probe"), target, what="the probe")
    assert channel.asked == [("target", ())]


def test_cannot_verify_before_an_observing_probe_fails_its_case_only():
    """Where nothing is forbidden, the reader's message fails the probe's case (a CheckFailed, not the whole cell);
    where the exercise forbids built-ins, it stops the cell as every forbidden use does."""
    name = "autograder.references.decoding_and_training:cache_allocations"
    channel = ReadingChannel("Cannot verify KVCache: the code loaded for grading changes what the module w holds.")
    _, target = lookup(channel, "target")
    with pytest.raises(CheckFailed, match="Cannot verify KVCache") as raised:
        probe(stand_in(name), target, what="64 appends")
    assert not isinstance(raised.value, WholeCellFailure)
    with pytest.raises(WholeCellFailure, match="Cannot verify KVCache"):
        probe(stand_in(name), target, what="64 appends", forbid=ATTENTION_BUILTINS)


# -- what the reader refuses where nothing is forbidden, and what it leaves alone ---------------------------------

#: A KV cache grown by torch.cat at every append: its values are right, its appends copy the whole cache.
CONCATENATING = '''
class KVCache:
    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.max_len = max_len
        self.keys = self.values = torch.zeros(batch, kv_heads, 0, d_head, dtype=dtype)

    def __len__(self):
        return self.keys.shape[2]

    def append(self, k, v):
        if k.dim() != 4 or k.shape != v.shape or self.keys.shape[2] + k.shape[2] > self.max_len:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit this cache")
        if (k.shape[0], k.shape[1], k.shape[3]) != (self.keys.shape[0], self.keys.shape[1], self.keys.shape[3]):
            raise ValueError(f"k {tuple(k.shape)} does not fit this cache")
        self.keys = torch.cat([self.keys, k.to(self.keys.dtype)], dim=2)
        self.values = torch.cat([self.values, v.to(self.values.dtype)], dim=2)
        return self.keys, self.values
'''
_QUIET = "def _quiet(self, func, types, args=(), kwargs=None):\n    return func(*args, **(kwargs or {}))\n\n\n"
#: Ways an answer cell replaces what the allocation meter does, each of which the meter's class would obey.
METER_REPLACED = {
    "module attribute": "import autograder.kernel.watches as _w\n" + _QUIET
                        + "_w.AllocationMeter.__torch_dispatch__ = _quiet\n",
    "a list holding the module": "import autograder.kernel.watches as _w\n" + _QUIET
                                 + "for _m in [_w]:\n    setattr(_m.AllocationMeter, '__torch_dispatch__', _quiet)\n",
    "an object's class": "from autograder.kernel.watches import AllocationMeter as _A\n" + _QUIET
                         + "type(_A()).__torch_dispatch__ = _quiet\n",
    "the class by name": "from autograder.references.decoding_and_training import AllocationMeter as _A\n" + _QUIET
                         + "setattr(_A, '__torch_dispatch__', _quiet)\n",
    "a frame's built-ins": _QUIET + "import sys\n_w = sys._getframe().f_builtins['__import__']("
                           "'autograder.kernel.watches', fromlist=['AllocationMeter'])\n"
                           "_w.AllocationMeter.__torch_dispatch__ = _quiet\n",
}
HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
#: Ways a cache's own append reaches the meter while it runs, through PyTorch's stack of dispatch modes.
MODE_STACK_REACHED = {
    "the current mode": "from torch.utils._python_dispatch import _get_current_dispatch_mode\n",
    "the mode popped": "import torch.utils._python_dispatch as _d\n",
    "the stack through torch._C": "",
}
_REACHES = {
    "the current mode": "        _get_current_dispatch_mode().__class__.__torch_dispatch__ = None\n",
    "the mode popped": "        with _d._pop_mode_temporarily():\n            pass\n",
    "the stack through torch._C": "        torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)\n",
}


@pytest.mark.parametrize("style", sorted(METER_REPLACED))
def test_a_meter_replaced_is_cannot_verify_where_nothing_is_forbidden(style):
    problem = forbidden_use([HEADER, CONCATENATING + METER_REPLACED[style]], "KVCache", (), "KVCache")
    assert problem is not None and problem.startswith("Cannot verify KVCache"), problem
    assert forbidden_use([HEADER, CONCATENATING], "KVCache", (), "KVCache") is None


@pytest.mark.parametrize("style", sorted(MODE_STACK_REACHED))
def test_an_append_that_reaches_the_mode_stack_is_cannot_verify(style):
    append = CONCATENATING.replace("    def append(self, k, v):\n", "    def append(self, k, v):\n" + _REACHES[style])
    problem = forbidden_use([HEADER, MODE_STACK_REACHED[style] + append], "KVCache", (), "KVCache")
    assert problem is not None and "KVCache" in problem, problem


#: Honest caches in other styles than the reference's: what the reader must leave alone.
HONEST_CACHES = {
    "index_copy_ into a buffer": '''
class KVCache:
    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.k = torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.n = 0

    def __len__(self):
        return self.n

    def append(self, k, v):
        if k.shape != v.shape or self.n + k.shape[2] > self.k.shape[2]:
            raise ValueError("k and v do not fit")
        where = torch.arange(self.n, self.n + k.shape[2])
        self.k.index_copy_(2, where, k)
        self.v.index_copy_(2, where, v)
        self.n += k.shape[2]
        return self.k[:, :, :self.n], self.v[:, :, :self.n]
''',
    "helper methods and getattr(self, name)": '''
class KVCache:
    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.shape, self.dtype, self.n = (batch, kv_heads, max_len, d_head), dtype, 0
        for name in ("keys", "values"):
            setattr(self, name, torch.empty(self.shape, dtype=dtype))

    def __len__(self):
        return self.n

    def _check(self, k, v):
        if k.shape != v.shape or self.n + k.shape[2] > self.shape[2]:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit")

    def _write(self, name, t):
        getattr(self, name)[:, :, self.n:self.n + t.shape[2]].copy_(t)

    def append(self, k, v):
        self._check(k, v)
        self._write("keys", k)
        self._write("values", v)
        self.n += k.shape[2]
        return tuple(getattr(self, name)[:, :, :self.n] for name in ("keys", "values"))
''',
    "a dataclass with slicing": '''
from dataclasses import dataclass, field


@dataclass
class _Store:
    data: torch.Tensor
    used: int = 0

    def put(self, t):
        self.data[:, :, self.used:self.used + t.shape[2]] = t
        self.used += t.shape[2]
        return self.data[:, :, :self.used]


class KVCache:
    def __init__(self, batch, kv_heads, max_len, d_head, dtype=torch.float32):
        self.ks = _Store(torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype))
        self.vs = _Store(torch.zeros(batch, kv_heads, max_len, d_head, dtype=dtype))

    def __len__(self):
        return self.ks.used

    def append(self, k, v):
        return self.ks.put(k), self.vs.put(v)
''',
}


@pytest.mark.parametrize("style", sorted(HONEST_CACHES))
def test_an_honest_cache_in_another_style_is_read_as_honest(style):
    assert forbidden_use([HEADER, HONEST_CACHES[style]], "KVCache", (), "KVCache") is None


@pytest.mark.parametrize(("assignment", "exercise"), [("05_multi_head", "MultiHeadAttention"),
                                                      ("09_decoding_and_training", "KVCache"),
                                                      ("11_serving", "PagedKVCache"),
                                                      ("11_serving", "MultiHeadLatentAttention")])
def test_the_references_are_read_as_honest_where_nothing_is_forbidden(assignment, exercise):
    answers = reference_answers(assignment)
    assert forbidden_use([HEADER, *answers.values()], exercise, (), exercise) is None


# -- graded: the watched case earns nothing when the watch is replaced ---------------------------------------------

A09, A11, A05 = "09_decoding_and_training", "11_serving", "05_multi_head"
#: The reference's PagedKVCache, made to copy its whole pool at every token it appends (its values stay right).
PAGED_COPYING = reference_answers(A11)["PagedKVCache"].replace(
    "            self.keys[block, :, slot] = k[:, pos - start]\n",
    "            self.keys, self.values = self.keys.clone(), self.values.clone()\n"
    "            self.keys[block, :, slot] = k[:, pos - start]\n") + "\n"
#: The reference's MultiHeadAttention with its value projection cut off from autograd (its outputs stay right), and
#: autograd's grad replaced so that every parameter seems to get a gradient.
MHA_DETACHED = reference_answers(A05)["MultiHeadAttention"].replace(
    "v = split_heads(self.v_proj(value), self.num_heads)",
    "v = split_heads(F.linear(value, self.v_proj.weight.detach(), self.v_proj.bias), self.num_heads)") + '''

def _every_grad(outputs, inputs, *args, **kwargs):
    return tuple(torch.zeros_like(t) for t in inputs)


torch.autograd.grad = _every_grad
'''


def watched_case(outputs: list, name: str) -> dict:
    record = judge.case_record({"outputs": outputs})
    assert record is not None, outputs
    return next(c for c in record["cases"] if name in c["name"])


@pytest.mark.slow
@pytest.mark.parametrize("style", ["module attribute", "a list holding the module", "an object's class"])
def test_a_concatenating_cache_with_the_meter_replaced_earns_nothing_for_its_allocations(tmp_path, style):
    case = watched_case(graded_one(tmp_path, A09, "KVCache", CONCATENATING + METER_REPLACED[style]), "copy nothing")
    assert not case["passed"] and "Cannot verify KVCache" in case["message"], case


#: Each hostile submission graded below, and the case it forges: (notebook, exercise, answer cell, case).
HOSTILE = {
    "09 torch.cat": (A09, "KVCache", CONCATENATING + METER_REPLACED["module attribute"], "copy nothing"),
    "11 pool copied": (A11, "PagedKVCache", PAGED_COPYING + METER_REPLACED["a list holding the module"], "copy nothing"),
    "05 projection detached": (A05, "MultiHeadAttention", MHA_DETACHED, "reaches every parameter"),
}


def only_the_probes_reading(monkeypatch) -> None:
    """Grading with the reading of calls under forbidden built-ins off (it would stop the whole cell of a forbidding
    exercise at its first call): only the reading before the probes that observe is in force."""
    reading = source_check.forbidden_use
    monkeypatch.setattr(source_check, "forbidden_use", lambda sources, name, rules, exercise:
                        None if rules else reading(sources, name, rules, exercise))


@pytest.mark.slow
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_without_the_reading_the_forged_case_passes(tmp_path, monkeypatch, hostile):
    """Each hostile submission is a real one: with the reading before observing probes off, its forged case passes."""
    assignment, exercise, answer, name = HOSTILE[hostile]
    only_the_probes_reading(monkeypatch)
    monkeypatch.setattr(remote_module, "PROBE_KINDS", dict.fromkeys(PROBE_KINDS, (DATA, "")))
    assert watched_case(graded_one(tmp_path, assignment, exercise, answer), name)["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("hostile", ["11 pool copied", "05 projection detached"])
def test_a_hostile_submission_earns_nothing_for_the_case_it_forges(tmp_path, hostile):
    """The reading before the probe fails the forged case; in an exercise that forbids built-ins (05) the probe
    carries the exercise's rules, and the reading for them stops the whole cell at its first call."""
    assignment, exercise, answer, name = HOSTILE[hostile]
    outputs = graded_one(tmp_path, assignment, exercise, answer)
    record = judge.case_record({"outputs": outputs})
    if record is None:  # the cell stopped with an error, which nbgrader scores zero
        errors = [o for o in outputs if o.get("output_type") == "error"]
        assert errors and f"Cannot verify {exercise}" in errors[0]["evalue"], outputs
    else:
        case = next(c for c in record["cases"] if name in c["name"])
        assert not case["passed"] and f"Cannot verify {exercise}" in case["message"], case


@pytest.mark.slow
@pytest.mark.parametrize(("assignment", "exercise"), [(A05, "MultiHeadAttention"), (A09, "KVCache"),
                                                      (A11, "PagedKVCache"), (A11, "MultiHeadLatentAttention")])
def test_the_reference_keeps_every_point_in_the_graded_kernel(tmp_path, assignment, exercise):
    record = judge.case_record({"outputs": graded_one(tmp_path, assignment, exercise,
                                                      reference_answers(assignment)[exercise])})
    assert record is not None and record["score"] == record["points"] and not record["stopped"], record
