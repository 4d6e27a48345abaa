"""Memory and time of attention's backward pass on CPU: autograd through the naive formula,
notebook 08's ``FlashAttention`` and PyTorch's SDPA.

For each sequence length n (512 to 4096 by default; one sequence, 8 heads, d = 64, float32)
it measures three ways of training through softmax(Q K^T / sqrt(d)) V:

* ``naive``: autograd through the textbook formula (it saves the n x n weights P);
* ``flash``: the reference ``FlashAttention`` of notebook 08, a ``torch.autograd.Function``
  that saves Q, K, V, O and the logsumexp and recomputes P block by block in backward
  (blocks of ``--block``, 256 by default);
* ``sdpa``: autograd through ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's
  fused CPU kernel and its backward).

``FlashAttention`` and the functions it calls are read from the source notebook itself (one
source of truth): every answer cell of ``source/08_flash_backward/08_flash_backward.ipynb``
is executed as it is.

Each (method, n) point runs in a fresh subprocess. It measures:

* **saved**: the bytes autograd keeps between the forward and the backward pass, every tensor
  saved for backward seen through ``torch.autograd.graph.saved_tensors_hooks``, each block of
  memory (storage) counted once;
* **peak**: the high-water mark of the process's resident memory during one forward and
  backward pass, minus its resident memory just before (``/proc/self/clear_refs`` resets the
  mark after imports, inputs and a warm-up): everything the computation touches;
* **time**: of the forward pass and of the backward pass (``torch.autograd.grad``), the best of
  up to 3 runs;
* the largest difference between its gradients and SDPA's.

Results, in ``bench/results/``: ``flash_backward_bench.md`` (table, ratios, the targets at
n = 4096), ``flash_backward_bench.png`` and ``flash_backward_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_bench import load_average, mem_available, reset_high_water_mark, status_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "source" / "08_flash_backward" / "08_flash_backward.ipynb"
RESULTS = ROOT / "bench" / "results"

BATCH, HEADS, D = 1, 8, 64
NS = [512, 1024, 2048, 4096]
METHODS = ["naive", "flash", "sdpa"]
TARGET_N = 4096
MAX_RUNS = 3
TIME_BUDGET = 20.0  # seconds of further timed runs per point
CHILD_TIMEOUT = 900
GiB, MiB = 2**30, 2**20


def labels(block: int) -> dict[str, str]:
    return {"naive": "autograd through the naive formula", "flash": f"FlashAttention (block {block})",
            "sdpa": "autograd through F.scaled_dot_product_attention"}


# --- the child: one method at one n, in its own process ---------------------------------------


def reference_names() -> dict:
    """Execute every answer cell of the source notebook (solutions included) and return its names."""
    import nbformat

    notebook = nbformat.read(SOURCE, as_version=4)
    namespace: dict = {}
    exec("import math\nimport torch\nimport torch.nn.functional as F", namespace)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(cell.source, f"<{SOURCE.name}:{cell.metadata['nbgrader']['grade_id']}>", "exec"), namespace)
    return namespace


def child(method: str, n: int, threads: int, block: int) -> dict:
    import gc

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    FlashAttention = reference_names()["FlashAttention"]  # noqa: N806 - the class of the notebook

    def naive(Q, K, V):
        return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V

    forward = {"naive": naive, "flash": lambda Q, K, V: FlashAttention.apply(Q, K, V, block, False),
               "sdpa": F.scaled_dot_product_attention}[method]

    gen = torch.Generator().manual_seed(n)
    Q, K, V = (torch.randn(BATCH, HEADS, n, D, generator=gen).requires_grad_(True) for _ in range(3))
    dO = torch.randn(BATCH, HEADS, n, D, generator=gen)
    small = [t[..., :256, :].detach().clone().requires_grad_(True) for t in (Q, K, V)]
    torch.autograd.grad(forward(*small), small, dO[..., :256, :])  # warm-up: kernels, thread pool
    del small

    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(Q, K, V)
    del out
    gc.collect()

    reset = reset_high_water_mark()
    baseline = status_bytes("VmRSS") if reset else status_bytes("VmHWM")
    forward_times, backward_times = [], []
    grads = None
    while not backward_times or (len(backward_times) < MAX_RUNS and sum(forward_times + backward_times) <= TIME_BUDGET):
        start = time.perf_counter()
        out = forward(Q, K, V)
        forward_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        grads = torch.autograd.grad(out, (Q, K, V), dO)
        backward_times.append(time.perf_counter() - start)
        del out
        if len(backward_times) == 1:
            peak = status_bytes("VmHWM") - baseline
    reference = torch.autograd.grad(F.scaled_dot_product_attention(Q, K, V), (Q, K, V), dO)
    error = max(float((a - b).abs().max()) for a, b in zip(grads, reference))
    return {"method": method, "n": n, "saved_bytes": sum(saved.values()), "peak_bytes": peak, "hwm_reset": reset,
            "forward_times": forward_times, "backward_times": backward_times, "max_grad_error_vs_sdpa": error}


# --- the parent: run every point, tabulate, plot ---------------------------------------------------


def score_matrix_bytes(n: int) -> int:
    return BATCH * HEADS * n * n * 4


def estimated_peak(method: str, n: int) -> int:
    """A generous estimate of a point's peak memory, to skip points that cannot fit."""
    linear = 12 * BATCH * HEADS * n * D * 4
    return 4 * score_matrix_bytes(n) + linear if method == "naive" else linear  # naive: P, dP, dS and a copy


def run_point(method: str, n: int, threads: int, block: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", method, str(n), "--threads", str(threads),
               "--block", str(block)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"method": method, "n": n, "skipped": f"timed out after {CHILD_TIMEOUT} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"method": method, "n": n, "skipped": f"failed (exit {done.returncode}): {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_bytes(size: float) -> str:
    if size < 0.05 * MiB:
        return "< 0.1 MiB"
    return f"{size / GiB:.2f} GiB" if size >= GiB else f"{size / MiB:.1f} MiB"


def targets(points: dict, label: dict) -> list[str]:
    """The issue's targets at n = 4096, met or missed, with the numbers."""
    naive, flash, sdpa = (points.get((m, TARGET_N), {}) for m in METHODS)
    lines = []
    if "saved_bytes" in flash and "saved_bytes" in naive:
        ratio = flash["saved_bytes"] / naive["saved_bytes"]
        lines.append(f"* {label['flash']} keeps at most 1/8 of the memory autograd through the naive formula keeps "
                     f"between forward and backward: {'met' if ratio <= 1 / 8 else 'MISSED'} "
                     f"({fmt_bytes(flash['saved_bytes'])} vs {fmt_bytes(naive['saved_bytes'])}, ratio {ratio:.4f} "
                     f"= 1/{1 / ratio:.1f}).")
        ratio = max(flash["peak_bytes"], 0) / naive["peak_bytes"]
        lines.append(f"* Peak resident memory of one forward and backward pass: {fmt_bytes(flash['peak_bytes'])} vs "
                     f"{fmt_bytes(naive['peak_bytes'])}, ratio {ratio:.4f} (1/{1 / ratio:.1f}).")
    if "backward_times" in flash and "backward_times" in sdpa:
        ratio = min(flash["backward_times"]) / min(sdpa["backward_times"])
        lines.append(f"* {label['flash']}'s backward pass takes at most 4x the time of autograd through SDPA: "
                     f"{'met' if ratio <= 4 else 'MISSED'} ({fmt_time(min(flash['backward_times']))} vs "
                     f"{fmt_time(min(sdpa['backward_times']))}, ratio {ratio:.2f}).")
    return lines


def write_results(points: dict, ns: list[int], threads: int, block: int, started: str, loads: tuple[str, str],
                  elapsed: float) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    label = labels(block)
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Attention's backward pass on CPU: memory and time",
        "",
        f"Written by `bench/flash_backward_bench.py` on {started}, in {elapsed / 60:.1f} minutes.",
        "",
        f"Setup: batch {BATCH}, {HEADS} heads, d = {D}, float32, CPU ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} logical cores), PyTorch {torch.__version__}, {threads} thread(s) per process "
        f"(`--threads`). Load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]}.",
        "",
        "Each point runs in a fresh process. **Saved**: the bytes of the tensors autograd keeps for the backward "
        "pass (`torch.autograd.graph.saved_tensors_hooks`, each storage once). **Peak**: the high-water mark of the "
        "process's resident memory during one forward and backward pass, minus its resident memory just before "
        "(reset through `/proc/self/clear_refs`). **Forward** and **backward**: the best of up to "
        f"{MAX_RUNS} runs. `FlashAttention` is executed from the answer cells of "
        "`source/08_flash_backward/08_flash_backward.ipynb`.",
        "",
        "| n | one n x n matrix (float32) | method | saved | peak | forward | backward | max gradient error vs SDPA |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    skipped = []
    for n in ns:
        for method in METHODS:
            point = points.get((method, n), {})
            if "saved_bytes" not in point:
                skipped.append(f"* {label[method]} at n = {n}: {point.get('skipped', 'not run')}.")
                continue
            lines.append(f"| {n} | {fmt_bytes(score_matrix_bytes(n))} | {label[method]} | "
                         f"{fmt_bytes(point['saved_bytes'])} | {fmt_bytes(max(point['peak_bytes'], 0))} | "
                         f"{fmt_time(min(point['forward_times']))} | {fmt_time(min(point['backward_times']))} | "
                         f"{point['max_grad_error_vs_sdpa']:.1e} |")
    if skipped:
        lines += ["", "Skipped points:", "", *skipped]
    ratios = ["", "## Ratios", ""]
    for n in ns:
        naive, flash, sdpa = (points.get((m, n), {}) for m in METHODS)
        parts = []
        if "saved_bytes" in flash and "saved_bytes" in naive:
            parts.append(f"flash / naive saved = 1/{naive['saved_bytes'] / flash['saved_bytes']:.1f}")
        if "backward_times" in flash and "backward_times" in sdpa:
            parts.append(f"flash / SDPA backward time = {min(flash['backward_times']) / min(sdpa['backward_times']):.2f}")
        if "backward_times" in naive and "backward_times" in sdpa:
            parts.append(f"naive / SDPA backward time = {min(naive['backward_times']) / min(sdpa['backward_times']):.2f}")
        if parts:
            ratios.append(f"* n = {n}: " + "; ".join(parts) + ".")
    lines += ratios
    found = targets(points, label)
    lines += ["", f"## Targets at n = {TARGET_N}", "", *(found or ["* not measured (n = 4096 was not run)."])]
    lines += ["", "![memory and time](flash_backward_bench.png)", ""]
    (RESULTS / "flash_backward_bench.md").write_text("\n".join(lines))
    raw = [dict(point, label=label[method]) for (method, n), point in sorted(points.items(), key=lambda kv: kv[0][1])]
    (RESULTS / "flash_backward_bench.json").write_text(json.dumps(
        {"threads": threads, "block": block, "started": started, "load_average": loads, "points": raw}, indent=1))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for method, style in zip(METHODS, ["o-", "s-", "x--"]):
        done = [n for n in ns if "saved_bytes" in points.get((method, n), {})]
        if not done:
            continue
        axes[0].loglog(done, [points[method, n]["saved_bytes"] / MiB for n in done], style, label=label[method])
        axes[1].loglog(done, [max(points[method, n]["peak_bytes"], 0.05 * MiB) / MiB for n in done], style,
                       label=label[method])
        axes[2].loglog(done, [min(points[method, n]["backward_times"]) for n in done], style, label=label[method])
    for ax in axes[:2]:
        ax.loglog(ns, [score_matrix_bytes(n) / MiB for n in ns], "k:", label="one n x n matrix")
    axes[0].set_title("saved between forward and backward")
    axes[1].set_title("peak resident memory, forward + backward")
    axes[2].set_title(f"backward time ({threads} thread(s), best run)")
    axes[0].set_ylabel("MiB")
    axes[1].set_ylabel("MiB")
    axes[2].set_ylabel("seconds")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("sequence length n")
        ax.legend(fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(f"attention's backward pass: batch {BATCH}, {HEADS} heads, d = {D}, float32, CPU")
    fig.tight_layout()
    fig.savefig(RESULTS / "flash_backward_bench.png", dpi=100)
    return ratios[3:] + found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (default 1: on a shared machine, multi-threaded runs of "
                             "many small operations measure the other processes more than the code)")
    parser.add_argument("--block", type=int, default=256, help="block size of FlashAttention (default 256)")
    parser.add_argument("--ns", type=int, nargs="*", default=NS, help="sequence lengths (default: 512 to 4096)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads, args.block)))
        return 0

    ns = sorted(args.ns)
    started, t0, load_before = time.strftime("%Y-%m-%d %H:%M"), time.time(), load_average()
    print(f"flash backward bench: n in {ns}, batch {BATCH}, {HEADS} heads, d = {D}, float32, {args.threads} thread(s)")
    points = {}
    for n in ns:
        for method in METHODS:
            need, available = estimated_peak(method, n), mem_available()
            if need > 0.6 * available:
                reason = f"needs about {fmt_bytes(need)}, more than 60% of the {fmt_bytes(available)} available"
                points[method, n] = {"method": method, "n": n, "skipped": reason}
                print(f"  n = {n:5}  {method:6} skipped: {reason}", flush=True)
                continue
            point = run_point(method, n, args.threads, args.block)
            points[method, n] = point
            if "saved_bytes" in point:
                print(f"  n = {n:5}  {method:6} saved {fmt_bytes(point['saved_bytes']):>10}  peak "
                      f"{fmt_bytes(max(point['peak_bytes'], 0)):>10}  forward {fmt_time(min(point['forward_times'])):>9}"
                      f"  backward {fmt_time(min(point['backward_times'])):>9}  (error vs SDPA "
                      f"{point['max_grad_error_vs_sdpa']:.1e})", flush=True)
            else:
                print(f"  n = {n:5}  {method:6} skipped: {point['skipped']}", flush=True)
    summary = write_results(points, ns, args.threads, args.block, started, (load_before, load_average()),
                            time.time() - t0)
    print("\n".join(line for line in summary if line))
    print(f"wrote {RESULTS / 'flash_backward_bench.md'} and {RESULTS / 'flash_backward_bench.png'} "
          f"in {(time.time() - t0) / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
