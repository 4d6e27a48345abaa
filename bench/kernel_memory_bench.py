"""How far a grading kernel's memory reaches on the case notebooks 07 and 08 measure, read from outside the kernel.

The hidden checks of ``chunked_attention`` and ``flash_attention`` (07), ``flash_attention_forward`` and
``flash_attention_backward`` (08) call the student's function on Q, K, V of shape (1, 4096, 8) in float32 with
``block_size=256`` (``chunk_size=128``), and
bound how far the memory of the kernel that makes the call reaches above what it held before the answer
cells were loaded (:data:`autograder.grader.memory.MEMORY_RISE_BOUND`), read by the grader from that kernel's
control group; each measured call is made in a fresh kernel loaded as the graded one. This runs the
references and wrong answers (the n x m matrix built whole, queries chunked over all keys, every score
kept as a Python float) as answer cells, as grading does, and prints each one's figure, the time of its
call (a fresh kernel's start and load included), and the time of each whole measured check on the
references (the cost grading pays). Results in
``bench/results/kernel_memory_bench.{json,md}``. Needs a memory control group (root): it says so and stops
where there is none.

Run: ``.venv/bin/python bench/kernel_memory_bench.py``
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.engine import cgroup  # noqa: E402
from autograder.engine.execute import ResilientExecute  # noqa: E402
from autograder.grader.memory import MEMORY_CASE_BLOCK, MEMORY_CASE_D, MEMORY_CASE_N, MEMORY_RISE_BOUND  # noqa: E402
from autograder.hidden.complexity import MEMORY_CASE_CHUNK  # noqa: E402
from tests.course_copy import reference_answers  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPEATS = 5

WRONG = '''
def naive_attention(Q, K, V, block_size, is_causal=False):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    return torch.softmax(scores, dim=-1) @ V

def naive_forward(Q, K, V, block_size, is_causal=False):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    return torch.softmax(scores, dim=-1) @ V, torch.logsumexp(scores, dim=-1)

def naive_backward(Q, K, V, O, dO, lse, block_size, is_causal=False):
    scale = 1 / math.sqrt(Q.shape[-1])
    P = torch.exp(Q @ K.transpose(-2, -1) * scale - lse[..., None])
    dP = dO @ V.transpose(-2, -1)
    dS = P * (dP - (dO * O).sum(-1, keepdim=True))
    return dS @ K * scale, dS.transpose(-2, -1) @ Q * scale, P.transpose(-2, -1) @ dO

def chunked_queries(Q, K, V, block_size, is_causal=False):
    outputs = []
    for q0 in range(0, Q.shape[-2], block_size):
        scores = Q[..., q0:q0 + block_size, :] @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        outputs.append(torch.softmax(scores, dim=-1) @ V)
    return torch.cat(outputs, dim=-2)

def in_float64(Q, K, V, block_size, is_causal=False):
    return flash_attention(Q.double(), K.double(), V.double(), block_size, is_causal).to(Q.dtype)

def scores_as_floats(Q, K, V, block_size, is_causal=False):
    d = Q.shape[-1]
    scores = [(K[0] @ Q[0, i] / math.sqrt(d)).tolist() for i in range(Q.shape[-2])]
    rows = [torch.softmax(torch.tensor(s, dtype=Q.dtype), dim=-1) @ V[0] for s in scores]
    return torch.stack(rows)[None]
'''

MEASURE = f'''
import time
import torch
from autograder.hidden import complexity, flash_backward
from autograder.grader.inputs import generator, randn
from autograder.grader.memory import MEMORY_CASE_BLOCK, MEMORY_CASE_D, MEMORY_CASE_DTYPE, MEMORY_CASE_N, measured_memory_call
from autograder.hidden.complexity import MEMORY_CASE_CHUNK

n, d, block, dtype = MEMORY_CASE_N, MEMORY_CASE_D, MEMORY_CASE_BLOCK, MEMORY_CASE_DTYPE
gen = generator(1)
Q = randn(1, n, d, gen=gen, dtype=dtype)
K = randn(1, n, d, gen=gen, dtype=dtype)
V = randn(1, n, d, gen=gen, dtype=dtype)
dO = randn(1, n, d, gen=gen, dtype=dtype)
scores = Q @ K.mT / d**0.5
O, lse = torch.softmax(scores, dim=-1) @ V, torch.logsumexp(scores, dim=-1)
del scores
forward_args = (Q, K, V, block)
backward_args = (Q, K, V, O, dO, lse, block)
warm = (Q[:, :n // 4], K[:, :n // 4], V[:, :n // 4], block)
chunked_args, warm_chunked = (Q, K, V, MEMORY_CASE_CHUNK), (*warm[:3], MEMORY_CASE_CHUNK)
warm_backward = (Q[:, :n // 4], K[:, :n // 4], V[:, :n // 4], O[:, :n // 4], dO[:, :n // 4], lse[:, :n // 4], block)
rows = []
for exercise, name, fn, args, first in [
    ("chunked_attention", "reference", chunked_attention, chunked_args, warm_chunked),
    ("flash_attention", "reference", flash_attention, forward_args, warm),
    ("flash_attention", "reference, in float64 inside", in_float64, forward_args, warm),
    ("flash_attention", "the n x m scores and their softmax", naive_attention, forward_args, warm),
    ("flash_attention", "queries chunked by block_size over all keys", chunked_queries, forward_args, warm),
    ("flash_attention", "every score kept as a Python float", scores_as_floats, forward_args, warm),
    ("flash_attention_forward", "reference", flash_attention_forward, forward_args, warm),
    ("flash_attention_forward", "the n x m scores, softmax and logsumexp", naive_forward, forward_args, warm),
    ("flash_attention_backward", "reference", flash_attention_backward, backward_args, warm_backward),
    ("flash_attention_backward", "P, dP and dS whole", naive_backward, backward_args, warm_backward),
]:
    fn(*first)  # as the checks do: a quarter of the case first, unmeasured
    rises, seconds = [], []
    for _ in range({REPEATS}):
        started = time.perf_counter()
        _, rise = measured_memory_call(fn, args, {{}}, exercise=exercise)
        seconds.append(time.perf_counter() - started)
        rises.append(rise)
    rows.append({{"exercise": exercise, "answer": name, "rise_mib": [r / 2**20 for r in rises],
                 "call_s": [round(s, 3) for s in seconds]}})
checks = []
for name, module, fn, exercise in [("chunked_attention (07)", complexity, chunked_attention, "chunked_attention"),
                                   ("flash_attention (07)", complexity, flash_attention, "flash_attention"),
                                   ("flash_attention_forward (08)", flash_backward, flash_attention_forward,
                                    "flash_attention_forward"),
                                   ("flash_attention_backward (08)", flash_backward, flash_attention_backward,
                                    "flash_attention_backward")]:
    seconds = []
    for _ in range({REPEATS}):
        started = time.perf_counter()
        module.measured_memory_check(fn, exercise)
        seconds.append(time.perf_counter() - started)
    checks.append({{"check": name, "seconds": [round(s, 3) for s in seconds]}})
print("RESULT " + __import__("json").dumps({{"calls": rows, "checks": checks}}))
'''


def answer_cell(source: str, grade_id: str) -> dict:
    """An answer cell: what the graded kernel loads (autograder.engine.graded_cells), and a measured call's kernel."""
    meta = {"grade": False, "solution": True, "locked": False, "grade_id": grade_id, "schema_version": 3}
    return new_code_cell(source, metadata={"nbgrader": meta})


def graded_cell(source: str) -> dict:
    meta = {"grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "measure", "schema_version": 3}
    return new_code_cell(source, metadata={"nbgrader": meta})


def main() -> None:
    if "memory" not in cgroup.controllers():
        print("No memory control group can be made here (the grader is not root in one): nothing to measure.")
        return
    answers = {**reference_answers("07_complexity"), **reference_answers("08_flash_backward")}
    cells = [new_code_cell("import math\nimport torch\ntorch.set_num_threads(1)"),
             *(answer_cell(answers[name], name) for name in ("chunked_attention", "flash_attention",
                                                             "flash_attention_forward", "flash_attention_backward")),
             answer_cell(WRONG, "wrong"), graded_cell(MEASURE)]
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory() as folder:
        graded, _ = ResilientExecute(timeout=600).preprocess(notebook, {"metadata": {"path": folder}})
    text = "".join(o.get("text", "") for o in graded.cells[-1].outputs)
    found = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise SystemExit(f"the measuring cell failed: {graded.cells[-1].outputs}")
    result = json.loads(found[0].removeprefix("RESULT "))
    lines = ["# How far a grading kernel's memory reaches above what it held before the answer cells were loaded, "
             "read from its control group",
             "", f"Q, K, V of shape (1, {MEMORY_CASE_N}, {MEMORY_CASE_D}) in float32, block_size={MEMORY_CASE_BLOCK}; "
             f"chunk_size={MEMORY_CASE_CHUNK};"
             f" one {MEMORY_CASE_N} x {MEMORY_CASE_N} float32 matrix is {MEMORY_CASE_N**2 * 4 // 2**20} MiB; the bound "
             f"is {MEMORY_RISE_BOUND // 2**20} MiB. Each call {REPEATS} times, after a call on a quarter of the size.",
             "",
             "| exercise | answer | above the base (MiB) | call, a fresh kernel's start included (s) |",
             "|---|---|---|---|"]
    for row in result["calls"]:
        rises = ", ".join(f"{r:.1f}" for r in row["rise_mib"])
        lines.append(f"| {row['exercise']} | {row['answer']} | {rises} | {', '.join(map(str, row['call_s']))} |")
    lines += ["", "The whole measured check on the reference, as grading runs it (seconds):", "",
              "| check | seconds |", "|---|---|"]
    lines += [f"| {c['check']} | {', '.join(map(str, c['seconds']))} |" for c in result["checks"]]
    report = "\n".join(lines) + "\n"
    print(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kernel_memory_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "kernel_memory_bench.md").write_text(report)


if __name__ == "__main__":
    main()
