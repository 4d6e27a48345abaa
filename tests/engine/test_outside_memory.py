"""Memory measured from outside the student's kernel: its control group's peak during one call.

Notebooks 07 and 08 bound the memory of their FlashAttention functions on n = m = 4096. A submission
can blind the in-kernel watch (it sees tensors only: scores kept as Python floats are invisible to
it), but not the kernel's control group, which the grader reads (:mod:`autograder.engine.cgroup`).
Each hostile answer here computes the right values and passes every watch; graded with a control
group it fails the memory check, which says the memory was measured from outside; graded in a
plain kernel, which has no group, it passes, which is the gap the manual states. Tests that need a
control group skip where none can be made.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook
from traitlets.config import Config

from autograder.engine import cgroup, sandbox
from autograder.engine.execute import ResilientExecute
from autograder.grader.local_channel import LocalChannel
from autograder.grader.memory import (
    MEMORY_CASE_BLOCK,
    MEMORY_CASE_D,
    MEMORY_CASE_DTYPE,
    MEMORY_CASE_N,
    MEMORY_RISE_BOUND,
)
from autograder.grader.remote import lookup
from autograder.hidden import complexity, flash_backward
from autograder.shared import wire
from autograder.shared.errors import CheckFailed

from .. import forked_kernels
from ..course_copy import reference_answers
from ..judged import failure
from ..notebook_code import ROOT, nbgrader_meta, solution_namespace, source_notebook

needs_group = pytest.mark.skipif("memory" not in cgroup.controllers(),
                                 reason="no memory control group can be made here (the grader is not root in one)")
needs_sandbox = pytest.mark.skipif(sandbox.mode() == "limits only", reason=f"no sandbox here: {sandbox.why_not()}")

#: Right values, the scores of the first 1024 queries kept as Python floats, all at once: 4 M floats, over 128 MiB
#: that no tensor the watch sees ever holds (the other rows are made one at a time, as tensors of one row).
SCORES_IN_A_LIST = '''
def flash_attention(Q, K, V, block_size, is_causal=False):
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} do not fit")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    n, m, d, d_v = Q.shape[-2], K.shape[-2], Q.shape[-1], V.shape[-1]
    Qf, Kf, Vf = Q.reshape(-1, n, d), K.reshape(-1, m, d), V.reshape(-1, m, d_v)
    outputs = []
    for b in range(Qf.shape[0]):
        kept = [(Kf[b] @ Qf[b, i] / math.sqrt(d)).tolist() for i in range(min(n, 1024))]
        rows = []
        for i in range(n):
            row = torch.tensor(kept[i], dtype=Q.dtype) if i < len(kept) else Kf[b] @ Qf[b, i] / math.sqrt(d)
            if is_causal:
                row[i + 1:] = float("-inf")
            w = torch.exp(row - row.max())
            rows.append((w / w.sum()) @ Vf[b])
        outputs.append(torch.stack(rows))
    return torch.stack(outputs).reshape(*Q.shape[:-2], n, d_v)
'''

#: Right gradients, the first 1024 rows of P kept as Python floats before any gradient is made: 4 M floats, over
#: 128 MiB that no tensor the watch sees ever holds (the other rows are made again, one at a time, where needed).
P_IN_A_LIST = '''
def flash_attention_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    n, m, d, d_v = Q.shape[-2], K.shape[-2], Q.shape[-1], V.shape[-1]
    if K.shape[-1] != d or V.shape[-2] != m or O.shape != (*Q.shape[:-1], d_v) or dO.shape != O.shape:
        raise ValueError("the shapes do not fit")
    if lse.shape != Q.shape[:-1]:
        raise ValueError(f"lse {tuple(lse.shape)} must have one entry per query, {tuple(Q.shape[:-1])}")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    scale = 1.0 / math.sqrt(d)
    Qf, Kf, Vf = Q.reshape(-1, n, d), K.reshape(-1, m, d), V.reshape(-1, m, d_v)
    Of, dOf, Lf = O.reshape(-1, n, d_v), dO.reshape(-1, n, d_v), lse.reshape(-1, n)
    dQs, dKs, dVs = [], [], []

    def row(b, i):
        p = torch.exp(Kf[b] @ Qf[b, i] * scale - Lf[b, i])
        if is_causal:
            p[i + 1:] = 0
        return p

    for b in range(Qf.shape[0]):
        P = [row(b, i).tolist() for i in range(min(n, 1024))]
        D = (dOf[b] * Of[b]).sum(dim=-1)
        dQ, dK, dV = [], torch.zeros_like(Kf[b]), torch.zeros_like(Vf[b])
        for i in range(n):
            p = torch.tensor(P[i], dtype=Q.dtype) if i < len(P) else row(b, i)
            ds = p * (Vf[b] @ dOf[b, i] - D[i])
            dQ.append(ds @ Kf[b] * scale)
            dV += torch.outer(p, dOf[b, i])
            dK += torch.outer(ds, Qf[b, i]) * scale
        dQs.append(torch.stack(dQ))
        dKs.append(dK)
        dVs.append(dV)
    return (torch.stack(dQs).reshape(Q.shape), torch.stack(dKs).reshape(K.shape), torch.stack(dVs).reshape(V.shape))
'''

#: Right in another style: float64 inside, einsum, the output preallocated and filled block by block.
ANOTHER_STYLE = '''
def flash_attention(Q, K, V, block_size, is_causal=False):
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} do not fit")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    n, m = Q.shape[-2], K.shape[-2]
    Qd, Kd, Vd = Q.double() / math.sqrt(Q.shape[-1]), K.double(), V.double()
    out = torch.empty(*Q.shape[:-1], V.shape[-1], dtype=torch.float64)
    for q0 in range(0, n, block_size):
        q = Qd[..., q0:q0 + block_size, :]
        top = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64)
        total = torch.zeros(q.shape[:-1], dtype=torch.float64)
        acc = torch.zeros(*q.shape[:-1], V.shape[-1], dtype=torch.float64)
        for k0 in range(0, m, block_size):
            s = torch.einsum("...id,...jd->...ij", q, Kd[..., k0:k0 + block_size, :])
            if is_causal:
                i = torch.arange(q0, q0 + s.shape[-2])[:, None]
                j = torch.arange(k0, k0 + s.shape[-1])
                s = s.masked_fill(j > i, float("-inf"))
            new = torch.maximum(top, s.amax(dim=-1))
            alpha = torch.where(torch.isinf(new), torch.zeros_like(new), torch.exp(top - new))
            p = torch.where(torch.isinf(new)[..., None], torch.zeros_like(s), torch.exp(s - new[..., None]))
            total = alpha * total + p.sum(dim=-1)
            acc = alpha[..., None] * acc + torch.einsum("...ij,...jd->...id", p, Vd[..., k0:k0 + block_size, :])
            top = new
        out[..., q0:q0 + block_size, :] = acc / total[..., None]
    return out.to(Q.dtype)
'''

#: The n x m scores only on the large case, tiled elsewhere: caught by the watch too, where it is not blinded.
FULL_MATRIX_WHEN_LARGE = '''
def flash_attention(Q, K, V, block_size, is_causal=False):
    if Q.shape[-2] < 4096:
        return tiled_attention(Q, K, V, block_size, is_causal)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / weights.sum(dim=-1, keepdim=True)) @ V
'''


#: Seconds a cell may run here: far above any answer's run, even on a loaded machine (no test is about a timeout).
CELL_LIMIT = 1200


def tiled_answer() -> str:
    """Notebook 07's reference flash_attention, named tiled_attention."""
    return reference_answers("07_complexity")["flash_attention"].replace("def flash_attention(", "def tiled_attention(")


def graded_cell(source: str, grade_id: str):
    meta = {"grade": True, "solution": False, "locked": True, "points": 1, "grade_id": grade_id, "schema_version": 3}
    return new_code_cell(source, metadata={"nbgrader": meta})


def answer_cell(source: str, grade_id: str):
    """An answer cell: what the graded kernel loads (:mod:`autograder.engine.graded_cells`)."""
    meta = {"grade": False, "solution": True, "locked": False, "grade_id": grade_id, "schema_version": 3}
    return new_code_cell(source, metadata={"nbgrader": meta})


def graded_check(tmp_path, answers: list[str], module: str, exercise: str, *, sandboxed: bool,
                 cold: bool = False) -> tuple[list, float]:
    """The hidden check of ``exercise`` run as grading runs it, on a notebook of ``answers``: its outputs, seconds
    (``cold``: its kernels import in their sandboxes, never forked)."""
    check = (f"from autograder.hidden.{module} import check_{exercise} as hidden_check\n"
             f"hidden_check({exercise})")
    started = time.monotonic()
    outputs = graded_outputs(tmp_path, answers, check, f"test_{exercise}_hidden", sandboxed=sandboxed, cold=cold)
    return outputs, time.monotonic() - started


def graded_outputs(tmp_path, answers: list[str], check: str, grade_id: str, *, sandboxed: bool = True,
                   cold: bool = False) -> list:
    """The outputs of the test cell ``check`` after the imports and ``answers``, graded as grading runs it (sandboxed:
    its kernels forked from a zygote where kernels are (:mod:`tests.forked_kernels`), unless
    ``cold``)."""
    cells = [new_code_cell("import math\nimport torch"), *(answer_cell(a, f"answer_{i}") for i, a in enumerate(answers)),
             graded_cell(check, grade_id)]
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = forked_kernels.config() if sandboxed and not cold else Config()
    # The hostile answers loop in Python over n = 4096 rows (they took 100-130 s on a busy 2-core machine when every
    # row went through Python floats). The limit is far above that, so that no verdict here depends on the machine's
    # speed (the seconds are reported, never judged).
    graded, _ = ResilientExecute(timeout=CELL_LIMIT, sandbox=sandboxed, config=config).preprocess(
        notebook, {"metadata": {"path": str(tmp_path)}})
    return graded.cells[-1].outputs




# -- the meter ------------------------------------------------------------------------------------


def test_no_group_has_no_meter():
    assert cgroup.PeakMeter.of(None) is None
    assert cgroup.memory_folder(None) is None


@needs_group
def test_the_meter_sees_what_a_process_of_the_group_touches_and_not_what_it_held_before():
    """A process holds 100 MiB, the meter starts, the process touches 60 MiB more: the rise is 60 MiB, not 160."""
    group = cgroup.create(f"meter-test-{time.monotonic_ns()}", 16, 2**30)
    assert group is not None and cgroup.memory_folder(group) is not None
    code = ("import sys\nheld = bytearray(100 * 2**20)\nprint('held', flush=True)\nsys.stdin.readline()\n"
            "more = bytearray(60 * 2**20)\nprint('more', flush=True)\nsys.stdin.readline()\n")
    process = subprocess.Popen(cgroup.join_command(group, [sys.executable, "-S", "-c", code]), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        meter = cgroup.PeakMeter.of(group)
        assert meter is not None
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "more"
        rise = meter.stop()
        process.stdin.write("\n")
        process.stdin.flush()
        process.wait(10)
    finally:
        process.kill()
        cgroup.remove(group)
    assert rise is not None
    print(f"rise: {rise / 2**20:.1f} MiB")
    assert 60 * 2**20 <= rise < 70 * 2**20


# -- the checks, on the watch alone (this process, no kernel) ---------------------------------------


def test_without_a_group_the_watch_measures_and_says_so():
    """The checks run here (no kernel, no group): a full matrix on the large case is caught by the watch's
    tensors, and the message says so, not that the grader measured the kernel from outside."""
    namespace: dict = {}
    exec(compile("import math\nimport torch\n" + tiled_answer() + FULL_MATRIX_WHEN_LARGE, "<answer>", "exec"),
         namespace)
    with pytest.raises(CheckFailed) as caught:
        complexity.check_flash_attention(namespace["flash_attention"])
    message = str(caught.value)
    print(message)
    assert "MiB of tensors alive at once" in message and "from outside" not in message
    assert f"more than the {MEMORY_RISE_BOUND // 2**20} MiB allowed" in message


def test_the_references_pass_on_the_watch_alone():
    complexity.check_flash_attention(solution_namespace("07_complexity").flash_attention)
    ns = solution_namespace("08_flash_backward")
    flash_backward.check_flash_attention_forward(ns.flash_attention_forward)
    flash_backward.check_flash_attention_backward(ns.flash_attention_backward)


# -- graded as grading runs it: the check in the grader, the answer in a sandboxed kernel -------------

HOSTILE = [
    pytest.param("07_complexity", "complexity", "flash_attention", SCORES_IN_A_LIST, id="07-scores-as-python-floats"),
    pytest.param("08_flash_backward", "flash_backward", "flash_attention_backward", P_IN_A_LIST,
                 id="08-P-as-python-floats"),
]


@pytest.mark.slow
@needs_group
@needs_sandbox
@pytest.mark.parametrize(("assignment", "module", "exercise", "hostile"), HOSTILE)
def test_a_watch_blinded_by_python_floats_is_caught_from_outside(tmp_path, assignment, module, exercise, hostile):
    outputs, seconds = graded_check(tmp_path, [hostile], module, exercise, sandboxed=True)
    message = failure(outputs)
    print(f"{exercise}, graded in {seconds:.1f} s:", message)
    assert message is not None and "measured by the grader from outside it" in message
    assert f"more than the {MEMORY_RISE_BOUND // 2**20} MiB allowed" in message


@pytest.mark.slow
@needs_group
@needs_sandbox
def test_kernels_that_import_in_their_sandboxes_are_measured_alike(tmp_path):
    """Where no zygote forks the kernels (bubblewrap run as nobody, a grader that is not root; the other tests here
    fork them where one can), each imports PyTorch in its own sandbox, and its control group holds what it imported:
    the blinded watch is caught from outside all the same, and the reference passes."""
    (tmp_path / "hostile").mkdir()
    (tmp_path / "reference").mkdir()
    outputs, _ = graded_check(tmp_path / "hostile", [SCORES_IN_A_LIST], "complexity", "flash_attention",
                              sandboxed=True, cold=True)
    message = failure(outputs)
    assert message is not None and "measured by the grader from outside it" in message, outputs
    outputs, _ = graded_check(tmp_path / "reference", [reference_answers("07_complexity")["flash_attention"]],
                              "complexity", "flash_attention", sandboxed=True, cold=True)
    assert failure(outputs) is None, outputs


@pytest.mark.slow
@pytest.mark.parametrize(("assignment", "module", "exercise", "hostile"), HOSTILE)
def test_without_a_group_the_same_answer_passes_the_watch(tmp_path, assignment, module, exercise, hostile):
    """The gap the outside measurement closes: graded in a plain kernel (no group), the answer passes every watch."""
    outputs, _ = graded_check(tmp_path, [hostile], module, exercise, sandboxed=False)
    assert failure(outputs) is None, outputs
    assert any(f"{exercise} passes the hidden checks" in o.get("text", "") for o in outputs)


@pytest.mark.slow
@needs_group
@needs_sandbox
@pytest.mark.parametrize(("assignment", "module", "exercise"), [
    ("07_complexity", "complexity", "chunked_attention"),
    ("07_complexity", "complexity", "flash_attention"),
    ("08_flash_backward", "flash_backward", "flash_attention_forward"),
    ("08_flash_backward", "flash_backward", "flash_attention_backward"),
])
def test_the_reference_passes_when_measured_from_outside(tmp_path, assignment, module, exercise):
    outputs, seconds = graded_check(tmp_path, [reference_answers(assignment)[exercise]], module, exercise,
                                    sandboxed=True)
    print(f"{exercise}: the reference's hidden check, graded in {seconds:.1f} s")
    assert failure(outputs) is None, outputs


@pytest.mark.slow
@needs_group
@needs_sandbox
def test_a_right_answer_in_another_style_passes_when_measured_from_outside(tmp_path):
    outputs, _ = graded_check(tmp_path, [ANOTHER_STYLE], "complexity", "flash_attention", sandboxed=True)
    assert failure(outputs) is None, outputs


@pytest.mark.slow
@needs_group
@needs_sandbox
def test_a_full_matrix_is_caught_from_outside_and_said_so(tmp_path):
    answers = [tiled_answer(), FULL_MATRIX_WHEN_LARGE]
    outputs, _ = graded_check(tmp_path, answers, "complexity", "flash_attention", sandboxed=True)
    message = failure(outputs)
    assert message is not None and "measured by the grader from outside it" in message, outputs
    assert "tensors alive" not in message


# -- the rule, in the exercise's text -----------------------------------------------------------------


def section_text(assignment: str, exercise: str) -> str:
    """The markdown of the section that holds ``exercise``'s answer cell, up to that cell."""
    text: list[str] = []
    for cell in source_notebook(assignment).cells:
        if nbgrader_meta(cell).get("grade_id") == exercise:
            return "\n".join(text)
        if cell.cell_type == "markdown":
            text = [cell.source] if cell.source.startswith("## ") else text + [cell.source]
    raise AssertionError(f"no answer cell {exercise} in {assignment}")


@pytest.mark.parametrize(("assignment", "exercise", "size"), [
    ("07_complexity", "chunked_attention", f"`chunk_size={complexity.MEMORY_CASE_CHUNK}`"),
    ("07_complexity", "flash_attention", f"`block_size={MEMORY_CASE_BLOCK}`"),
    ("08_flash_backward", "flash_attention_forward", f"`block_size={MEMORY_CASE_BLOCK}`"),
    ("08_flash_backward", "flash_attention_backward", f"`block_size={MEMORY_CASE_BLOCK}`"),
])
def test_the_exercise_states_the_measured_case_and_its_bound(assignment, exercise, size):
    """A student can pass from the text alone: the shapes, the dtype, the block size, the bound, the matrix it is
    measured against, and that the whole process is measured."""
    text = section_text(assignment, exercise)
    matrix_mib = MEMORY_CASE_N * MEMORY_CASE_N * torch.finfo(MEMORY_CASE_DTYPE).bits // 8 // 2**20
    dtype = str(MEMORY_CASE_DTYPE).removeprefix("torch.")
    stated = [f"$(1, {MEMORY_CASE_N}, {MEMORY_CASE_D})$ in {dtype}", size,
              f"at most {MEMORY_RISE_BOUND // 2**20} MiB while `{exercise}` runs",
              f"${MEMORY_CASE_N} \\times {MEMORY_CASE_N}$ {dtype} matrix", f"is {matrix_mib} MiB",
              "memory of your whole process", "from outside your kernel's process"]
    if exercise == "chunked_attention":  # what it keeps instead: one chunk's scores
        stated.append(f"{complexity.MEMORY_CASE_CHUNK} queries are "
                      f"{complexity.MEMORY_CASE_CHUNK * MEMORY_CASE_N * torch.finfo(MEMORY_CASE_DTYPE).bits // 8 // 2**20} MiB")
    missing = [s for s in stated if s not in text]
    assert not missing, f"{assignment}, {exercise}: the text does not state {missing}"


# -- the figure a channel measures is the one the check judges (no kernel, no group needed) ----------


class MeasuringChannel(LocalChannel):
    """A channel to this process that reports a fixed rise for every measured request, as a kernel's group would."""

    def __init__(self, namespace: dict, rise: int | None) -> None:
        super().__init__(namespace)
        self.rise, self.measured = rise, 0

    def measures_memory(self) -> bool:
        return True

    def measured_request(self, request: dict, name: str) -> tuple[bytes, int | None]:
        self.measured += 1
        return self.request(wire.encode(request)), self.rise


@pytest.mark.parametrize("rise", [MEMORY_RISE_BOUND + 1, 2**30])
def test_the_check_judges_the_rise_the_channel_measured(rise):
    """The reference, which passes every watch, fails on a rise above the bound when that is what was measured."""
    channel = MeasuringChannel({"flash_attention": solution_namespace("07_complexity").flash_attention}, rise)
    with pytest.raises(CheckFailed, match="measured by the grader from outside it") as caught:
        complexity.check_flash_attention(lookup(channel, "flash_attention")[1])
    assert channel.measured == 1 and f"reached {rise / 2**20:.0f} MiB above" in str(caught.value)


def test_a_rise_within_the_bound_passes_and_an_unreadable_one_falls_back_to_the_watch():
    for rise in (MEMORY_RISE_BOUND, None):
        channel = MeasuringChannel({"flash_attention": solution_namespace("07_complexity").flash_attention}, rise)
        complexity.check_flash_attention(lookup(channel, "flash_attention")[1])
        assert channel.measured == 1


# -- memory judged as a total: what an answer cell holds pays for nothing -----------------------------

#: A 512 MiB tensor made when the answer cell runs, freed at the start of the measured call and made again before
#: it returns: the n x m scores fit in what was freed, so the kernel's memory never rises above its start.
FREED_AND_MADE_AGAIN = '''
_hoard = [torch.ones(128 * 2**20)]


def flash_attention(Q, K, V, block_size, is_causal=False):
    if Q.shape[-2] < 4096:
        return tiled_attention(Q, K, V, block_size, is_causal)
    _hoard.clear()
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    out = (weights / weights.sum(dim=-1, keepdim=True)) @ V
    del scores, weights
    _hoard.append(torch.ones(128 * 2**20))
    return out
'''

#: The n x m scores written into a 64 MiB tensor whose pages the answer cell touched: no new memory, no new tensor.
PRE_TOUCHED_PAGES = '''
_scratch = torch.zeros(4096 * 4096)


def flash_attention(Q, K, V, block_size, is_causal=False):
    if Q.shape[-2] < 4096:
        return tiled_attention(Q, K, V, block_size, is_causal)
    n, m = Q.shape[-2], K.shape[-2]
    s = _scratch[: n * m].view(n, m)
    torch.matmul(Q[0], K[0].transpose(0, 1), out=s)
    s.div_(math.sqrt(Q.shape[-1]))
    s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
    s.div_(s.sum(dim=-1, keepdim=True))
    return (s @ V[0]).unsqueeze(0)
'''

HELD = [pytest.param(FREED_AND_MADE_AGAIN, id="512-MiB-freed-and-made-again"),
        pytest.param(PRE_TOUCHED_PAGES, id="scores-in-pre-touched-pages")]


def whole_life_only(monkeypatch) -> None:
    """Force the path of a group whose peak cannot be reset (cgroup v2 before Linux 6.12)."""
    def cannot_reset(self):
        raise OSError("the peak cannot be reset here")

    monkeypatch.setattr(cgroup.PeakMeter, "start", cannot_reset)


@pytest.mark.slow
@needs_group
@pytest.mark.parametrize("reset", [True, False], ids=["peak-reset", "whole-life-peak"])
@pytest.mark.parametrize("hostile", HELD)
def test_memory_held_by_an_answer_cell_pays_for_nothing(tmp_path, monkeypatch, hostile, reset):
    if not reset:
        whole_life_only(monkeypatch)
    outputs, seconds = graded_check(tmp_path, [tiled_answer(), hostile], "complexity", "flash_attention",
                                    sandboxed=True)
    message = failure(outputs)
    print(f"graded in {seconds:.1f} s:", message)
    assert message is not None and "measured by the grader from outside it" in message, outputs
    assert "before your answer cells were loaded" in message


@pytest.mark.slow
@needs_group
@pytest.mark.parametrize("reset", [True, False], ids=["peak-reset", "whole-life-peak"])
def test_chunked_attention_is_measured_from_outside_too(tmp_path, monkeypatch, reset):
    """07's chunked_attention writing all n x m scores into pages an answer cell touched: no tensor the watch sees,
    no rise above what the kernel held before its answer cells were loaded minus that cell's."""
    if not reset:
        whole_life_only(monkeypatch)
    hostile = PRE_TOUCHED_PAGES.replace("def flash_attention(", "def chunked_attention(")
    outputs, seconds = graded_check(tmp_path, [tiled_answer(), hostile], "complexity", "chunked_attention",
                                    sandboxed=True)
    message = failure(outputs)
    print(f"graded in {seconds:.1f} s:", message)
    assert message is not None and "measured by the grader from outside it" in message, outputs
    assert "one chunk of queries at a time" in message


@pytest.mark.slow
@needs_group
@pytest.mark.parametrize(("assignment", "module", "exercise"), [
    ("07_complexity", "complexity", "chunked_attention"),
    ("07_complexity", "complexity", "flash_attention"),
    ("08_flash_backward", "flash_backward", "flash_attention_backward"),
])
def test_the_reference_passes_on_the_whole_life_peak(tmp_path, monkeypatch, assignment, module, exercise):
    whole_life_only(monkeypatch)
    outputs, _ = graded_check(tmp_path, [reference_answers(assignment)[exercise]], module, exercise, sandboxed=True)
    assert failure(outputs) is None, outputs


def test_a_meter_that_cannot_reset_reads_the_whole_life_peak_only_when_asked(tmp_path, monkeypatch):
    folder = tmp_path / "group"
    folder.mkdir()
    (folder / "memory.usage_in_bytes").write_text("100\n")
    (folder / "memory.max_usage_in_bytes").write_text("5000\n")
    group = cgroup.Group((folder,))
    whole_life_only(monkeypatch)
    assert cgroup.PeakMeter.of(group) is None
    meter = cgroup.PeakMeter.of(group, whole_life=True)
    assert meter is not None and not meter.reset
    assert meter.stop(base=1000) == 4000
    assert cgroup.PeakMeter.of(group, whole_life=True).stop() is None  # no base: a whole life says nothing


# -- where the peak cannot be reset: the processes move to a group made for the call -----------------------------

#: Run in a control group, one step per line read: Python started; a 400 MiB transient made and freed, then a 200 MiB
#: buffer made and held (an answer cell loading); the buffer written again and 50 MiB more made (the call).
LOAD_THEN_CALL = """
import sys
def step(name):
    print(name, flush=True)
    sys.stdin.readline()
step("started")
transient = bytearray(b"\\x01") * (400 * 2**20)
del transient
held = bytearray(b"\\x01") * (200 * 2**20)
step("loaded")
held[::4096] = b"\\x02" * len(held[::4096])
more = bytearray(b"\\x01") * (50 * 2**20)
step("called")
"""

MiB = 2**20


def measured_call(monkeypatch) -> tuple[int | None, set[int], set[int], int]:
    """LOAD_THEN_CALL in a new group, measured from before its load: (figure, processes left in the kernel's group and
    in the group made for the call, right after the move, the process's pid)."""
    whole_life_only(monkeypatch)
    group = cgroup.create(f"call-test-{time.monotonic_ns()}", 16, 2**30)
    assert group is not None and cgroup.memory_folder(group) is not None
    process = subprocess.Popen(cgroup.join_command(group, [sys.executable, "-S", "-c", LOAD_THEN_CALL]),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    meter = None

    def next_step(expected: str) -> None:
        if expected != "started":
            process.stdin.write("\n")
            process.stdin.flush()
        assert process.stdout.readline().strip() == expected

    try:
        next_step("started")
        base = cgroup.usage(*cgroup.memory_folder(group))
        next_step("loaded")
        meter = cgroup.PeakMeter.for_call(group)
        assert meter is not None and meter.made is not None
        folder, version = cgroup.memory_folder(group)
        made_limit = int((meter.made.folders[0] / cgroup.LIMIT_FILES["memory"][version - 1]).read_text())
        assert made_limit <= 2**30 - 200 * MiB, "the two groups together may take more than the kernel's limit"
        memory = cgroup.Group((folder,))  # where memory is counted (v1: one hierarchy of several)
        left, moved = cgroup.members(memory), cgroup.members(meter.made)
        next_step("called")
        figure = meter.stop(base)
    finally:
        process.kill()
        process.wait(10)
        cgroup.remove(group)
        cgroup.remove(meter.made if meter is not None else None)
    print(f"figure: {figure / MiB:.1f} MiB above the base" if figure is not None else "no figure")
    return figure, left, moved, process.pid


@needs_group
def test_a_call_moved_to_a_group_of_its_own_is_not_charged_for_what_loading_freed(monkeypatch):
    """Where the peak cannot be reset: the 400 MiB that loading made and freed are not counted (the whole life's peak
    counted them), the 200 MiB still held and the call's 50 MiB are."""
    figure, left, moved, pid = measured_call(monkeypatch)
    assert not left and pid in moved
    assert figure is not None and 250 * MiB <= figure < 350 * MiB


@needs_group
def test_a_process_left_in_the_kernels_group_cannot_lower_the_figure(monkeypatch):
    """A process still in the kernel's group after the move (here: none is moved) makes that group's whole life count:
    the figure is as high as the whole life's peak, never lower than what the call itself held."""
    monkeypatch.setattr(cgroup, "MOVE_ROUNDS", 0)
    figure, left, _, pid = measured_call(monkeypatch)
    assert pid in left
    assert figure is not None and figure >= 400 * MiB


@needs_group
def test_every_process_of_the_kernels_group_moves_with_it(monkeypatch):
    """A child the kernel started moves too: nothing is left in the kernel's group to charge pages there."""
    whole_life_only(monkeypatch)
    group = cgroup.create(f"call-test-{time.monotonic_ns()}", 16, 2**30)
    assert group is not None
    process = subprocess.Popen(cgroup.join_command(group, ["sh", "-c", "sleep 60 & sleep 60 & wait"]))
    meter = None
    try:
        memory = cgroup.Group((cgroup.memory_folder(group)[0],))
        deadline = time.monotonic() + 10
        while len(cgroup.members(memory)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        started = cgroup.members(memory)
        assert len(started) == 3
        meter = cgroup.PeakMeter.for_call(group)
        assert meter is not None and meter.made is not None
        assert not cgroup.members(memory) and cgroup.members(meter.made) == started
        assert meter.left is not None and meter.left[1] is not None
    finally:
        process.kill()
        cgroup.remove(group)
        cgroup.remove(meter.made if meter is not None else None)
        process.wait(10)


def test_where_no_group_can_be_made_for_the_call_the_whole_life_peak_is_read(tmp_path, monkeypatch):
    """A group the grader may not add a group beside (a folder of files here): the kernel's group's whole life."""
    folder = tmp_path / "group"
    folder.mkdir()
    (folder / "memory.usage_in_bytes").write_text("100\n")
    (folder / "memory.max_usage_in_bytes").write_text("5000\n")
    def refused(self, *args, **kwargs):
        raise PermissionError(f"no group can be made at {self}")

    whole_life_only(monkeypatch)
    monkeypatch.setattr(type(tmp_path), "mkdir", refused)
    meter = cgroup.PeakMeter.for_call(cgroup.Group((folder,)))
    assert meter is not None and not meter.reset and meter.made is None and meter.left is None
    assert meter.stop(base=1000) == 4000


#: An honest answer cell that tries its function on a large input at its top level, then deletes what it made.
TRIED_AT_TOP_LEVEL = "\n_check = torch.softmax(torch.randn(4096, 4096), dim=-1)\ndel _check\n"


@pytest.mark.slow
@needs_group
@needs_sandbox
def test_what_an_answer_cell_did_at_load_is_not_charged_to_the_call_on_the_whole_life_path(tmp_path, monkeypatch):
    """The chunked reference whose cell makes and frees a 64 MiB softmax at its top level passes where the peak
    cannot be reset (the kernel's whole life's peak failed it at 128 MiB)."""
    whole_life_only(monkeypatch)
    answer = reference_answers("07_complexity")["chunked_attention"] + TRIED_AT_TOP_LEVEL
    outputs, seconds = graded_check(tmp_path, [answer], "complexity", "chunked_attention", sandboxed=True)
    message = failure(outputs)
    print(f"graded in {seconds:.1f} s:", message)
    assert message is None, outputs


# -- what the allocator gave back is not counted: a measured kernel's C allocator returns freed blocks -----------

#: Run in a fresh process: a 4 MiB block freed (glibc's threshold then rises above 2 MiB), sixteen blocks of 2 MiB
#: made and freed below a 1 MiB block kept; prints whether the allocator was set and the MiB still held.
FREED_BELOW_A_KEPT_BLOCK = """
import sys
import torch
from autograder.kernel.allocator import return_freed_memory


def held_after_free():
    def anonymous():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon:"))
    torch.empty(2**20).fill_(1.0)
    before = anonymous()
    blocks = [torch.ones(2**19) for _ in range(16)]
    kept = torch.ones(2**18)
    del blocks
    return (anonymous() - before) / 1024, kept.numel()
"""

needs_proc_status = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")


def held_in_a_fresh_process(set_allocator: bool) -> tuple[bool, float]:
    code = FREED_BELOW_A_KEPT_BLOCK + (
        "fixed = return_freed_memory()\n" if set_allocator else "fixed = False\n") + "print(fixed, held_after_free()[0])\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    fixed, held = out.split()
    return fixed == "True", float(held)


@needs_proc_status
def test_the_allocator_of_a_measured_kernel_gives_freed_blocks_back_at_once():
    """glibc keeps freed blocks under its risen threshold (33 MiB held here after all was freed, every run); set as a
    measured kernel's is, it gives them back: a peak then counts what was alive at once."""
    fixed, held = held_in_a_fresh_process(True)
    if not fixed:
        pytest.skip("this C library has no glibc mallopt: its allocator is left as it is")
    _, kept = held_in_a_fresh_process(False)
    print(f"MiB held after the blocks were freed: {kept:.1f} as glibc starts, {held:.1f} set")
    assert kept > 24, "glibc did not keep the freed blocks: the case no longer shows what it is about"
    assert held < 4


@pytest.mark.slow
@needs_group
@needs_sandbox
def test_a_measured_call_runs_in_a_kernel_whose_allocator_gives_freed_blocks_back(tmp_path):
    """The case above as an answer cell, called through the grader's measured call: its kernel was set."""
    answer = FREED_BELOW_A_KEPT_BLOCK.split("\n\n\n", 1)[1]
    check = ("from autograder.grader.memory import measured_memory_call\n"
             "value, rise = measured_memory_call(held_after_free, (), {}, exercise='held_after_free')\n"
             "print('held', value[0], 'rise', rise / 2**20)\n")
    outputs = graded_outputs(tmp_path, [answer], check, "test_held")
    text = "".join(o.get("text", "") for o in outputs)
    print(text)
    assert text.startswith("held "), outputs
    assert float(text.split()[1]) < 4


#: Calls of the measured check in a row, each in a fresh kernel: before the allocator was set, the reference of
#: chunked_attention reached 70 to 87 MiB above its base in 3 calls of 12 (10 to 15 MiB in the others).
REPEATS = 5


@pytest.mark.slow
@needs_group
@needs_sandbox
@pytest.mark.parametrize("reset", [True, False], ids=["peak-reset", "whole-life-peak"])
def test_the_chunked_reference_passes_the_measured_check_every_time(tmp_path, monkeypatch, reset):
    if not reset:
        whole_life_only(monkeypatch)
    check = ("from autograder.hidden.complexity import measured_memory_check\n"
             f"for _ in range({REPEATS}):\n    measured_memory_check(chunked_attention, 'chunked_attention')\n"
             "print('passed')\n")
    outputs = graded_outputs(tmp_path, [reference_answers("07_complexity")["chunked_attention"]], check, "test_chunked")
    assert failure(outputs) is None, outputs
    assert "passed" in "".join(o.get("text", "") for o in outputs)
