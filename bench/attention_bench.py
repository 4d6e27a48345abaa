"""Time and peak memory of attention on CPU: naive, chunked, flash and PyTorch's SDPA.

``make bench`` runs this script. For each sequence length n (256 to 16384; one sequence,
8 heads, d = 64, float32) it measures four implementations of softmax(Q K^T / sqrt(d)) V:

* ``naive``: the textbook formula, which materialises the n x n scores and their softmax;
* ``chunked``: the reference ``chunked_attention`` of notebook 07 (queries in chunks);
* ``flash``: the reference ``flash_attention`` of notebook 07 (tiles of queries and keys,
  online softmax, never an n x n tensor);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused CPU kernel).

The two reference functions are read from the source notebook itself (one source of
truth): every answer cell of ``source/07_complexity/07_complexity.ipynb`` (nbgrader
metadata ``solution: true``) is executed as it is.

Each (method, n) point runs in a fresh subprocess, so that memory is honest: the child
imports everything, allocates Q, K and V, runs a warm-up on small inputs, resets the
kernel's high-water mark of its resident memory (``/proc/self/clear_refs``), reads its
resident memory as the baseline, runs the method once and reports the high-water mark
(``VmHWM``) minus the baseline: the peak memory of the computation, whatever allocated it
(PyTorch's kernels' scratch space included). Further runs only time.

Results, in ``bench/results/``: ``attention_bench.md`` (table, fitted exponents, ratios, targets),
``attention_bench.png`` (log-log figure) and ``attention_bench.json`` (raw data). Ratios are also
printed.
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

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "source" / "07_complexity" / "07_complexity.ipynb"
RESULTS = ROOT / "bench" / "results"

BATCH, HEADS, D = 1, 8, 64
NS = [256, 512, 1024, 2048, 4096, 8192, 16384]
CHUNK = 512  # queries per chunk of chunked_attention
BLOCK = 512  # queries and keys per block of flash_attention
METHODS = ["naive", "chunked", "flash", "sdpa"]
LABELS = {
    "naive": "naive (n x n scores)",
    "chunked": f"chunked_attention (chunk {CHUNK})",
    "flash": f"flash_attention (block {BLOCK})",
    "sdpa": "F.scaled_dot_product_attention",
}
TIME_BUDGET = 12.0  # seconds of timed runs per point, after the first run
MAX_RUNS = 3
CHILD_TIMEOUT = 600
GiB = 2**30
MiB = 2**20


# --- the child: one method at one n, in its own process ---------------------------------------


def reference_functions() -> dict:
    """Execute every answer cell of the source notebook (solutions included) and return its names."""
    import nbformat

    notebook = nbformat.read(SOURCE, as_version=4)
    namespace: dict = {}
    exec("import math\nimport torch\nimport torch.nn.functional as F", namespace)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(cell.source, f"<{SOURCE.name}:{cell.metadata['nbgrader']['grade_id']}>", "exec"), namespace)
    return namespace


def status_bytes(key: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_high_water_mark() -> bool:
    """Make VmHWM equal to the current VmRSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(method: str, n: int, threads: int) -> dict:
    import gc

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    names = reference_functions()

    def naive(Q, K, V):
        return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V

    fn = {
        "naive": naive,
        "chunked": lambda Q, K, V: names["chunked_attention"](Q, K, V, CHUNK),
        "flash": lambda Q, K, V: names["flash_attention"](Q, K, V, BLOCK),
        "sdpa": F.scaled_dot_product_attention,
    }[method]

    gen = torch.Generator().manual_seed(n)
    Q, K, V = (torch.randn(BATCH, HEADS, n, D, generator=gen) for _ in range(3))
    small = tuple(t[..., :256, :].clone() for t in (Q, K, V))
    fn(*small)  # warm-up: load kernels, start the thread pool
    del small
    gc.collect()

    reset = reset_high_water_mark()
    baseline_rss = status_bytes("VmRSS")
    baseline = baseline_rss if reset else status_bytes("VmHWM")
    start = time.perf_counter()
    out = fn(Q, K, V)
    times = [time.perf_counter() - start]
    peak = status_bytes("VmHWM") - baseline
    expected = torch.nn.functional.scaled_dot_product_attention(Q[:, :, :64], K, V) if method != "sdpa" else None
    error = float((out[:, :, :64] - expected).abs().max()) if expected is not None else 0.0
    del out, expected

    while len(times) < MAX_RUNS and sum(times[1:]) + times[-1] <= TIME_BUDGET:
        start = time.perf_counter()
        fn(Q, K, V)
        times.append(time.perf_counter() - start)
    return {"method": method, "n": n, "times": times, "peak_bytes": peak, "hwm_reset": reset,
            "baseline_rss": baseline_rss, "max_error_first_64_rows": error}


# --- the parent: run every point, fit, tabulate, plot ---------------------------------------------


def mem_available() -> int:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def score_matrix_bytes(n: int) -> int:
    return BATCH * HEADS * n * n * 4


def estimated_peak(method: str, n: int) -> int:
    """A generous estimate of a point's peak memory, to skip points that cannot fit."""
    linear = 8 * BATCH * HEADS * n * D * 4
    if method == "naive":
        return 2 * score_matrix_bytes(n) + linear  # Q K^T and its scaled copy, then scores and weights
    if method == "chunked":
        return 3 * BATCH * HEADS * CHUNK * n * 4 + linear
    if method == "flash":
        return 6 * BATCH * HEADS * BLOCK * BLOCK * 4 + linear
    return linear


def fit_power_law(ns: list[int], costs: list[float]) -> float:
    """Slope of the least-squares line through (log n, log cost)."""
    x = [math.log(v) for v in ns]
    y = [math.log(v) for v in costs]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def run_point(method: str, n: int, threads: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", method, str(n), "--threads", str(threads)]
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


def write_results(points: dict, threads: int, started: str, loads: tuple[str, str], elapsed: float) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    best = {k: min(p["times"]) for k, p in points.items() if "times" in p}
    peak = {k: max(p["peak_bytes"], 0) for k, p in points.items() if "times" in p}

    exponents = {}
    for method in METHODS:
        done = [n for n in NS if (method, n) in best and n >= 2048]
        if len(done) >= 2:
            exponents[method] = (fit_power_law(done, [best[method, n] for n in done]),
                                 fit_power_law(done, [max(peak[method, n], 1) for n in done]), done)

    lines = [
        "# Attention on CPU: time and peak memory",
        "",
        f"Written by `bench/attention_bench.py` (`make bench`) on {started}, in {elapsed / 60:.1f} minutes.",
        "",
        f"Setup: batch {BATCH}, {HEADS} heads, d = {D}, float32, CPU ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} logical cores), PyTorch {torch.__version__}, {threads} thread(s) per process "
        f"(`--threads`). Load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]}.",
        "",
        "Each point runs in a fresh process. **Time**: the best of up to "
        f"{MAX_RUNS} runs. **Peak memory**: the high-water mark of the process's resident memory during the first "
        "run, minus its resident memory just before (after imports, allocation of Q, K, V and a warm-up; the "
        "high-water mark is reset through `/proc/self/clear_refs`). It counts everything the computation "
        "touches, the output and the kernels' scratch space included. The reference `chunked_attention` and "
        "`flash_attention` are executed from the answer cells of `source/07_complexity/07_complexity.ipynb`.",
        "",
        "| n | score matrix (one, float32) | " + " | ".join(LABELS[m] for m in METHODS) + " |",
        "|---:|---:|" + "---:|" * len(METHODS),
    ]
    skipped_notes = []
    for n in NS:
        cells = []
        for method in METHODS:
            point = points.get((method, n), {})
            if "times" in point:
                cells.append(f"{fmt_time(best[method, n])}<br>{fmt_bytes(peak[method, n])}")
            else:
                cells.append("skipped")
                skipped_notes.append(f"* {LABELS[method]} at n = {n}: {point.get('skipped', 'not run')}.")
        lines.append(f"| {n} | {fmt_bytes(score_matrix_bytes(n))} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: best time, then peak memory above the baseline. Resident memory also holds freed "
              "blocks that the C allocator keeps for reuse, so it can exceed the bytes alive at any one instant; "
              "at small n such fixed costs dominate, and the comparison is meaningful from about n = 2048 on. "
              "Raw data: `attention_bench.json`."]
    if skipped_notes:
        lines += ["", "Skipped points:", "", *skipped_notes]

    if exponents:
        lines += ["", "## Fitted exponents (least squares on log-log, n >= 2048)", "",
                  "| method | time exponent | memory exponent | sizes |", "|---|---:|---:|---|"]
    for method, (t_exp, m_exp, done) in exponents.items():
        lines.append(f"| {LABELS[method]} | {t_exp:.2f} | {m_exp:.2f} | {', '.join(map(str, done))} |")

    ratios = ["", "## Ratios", ""]
    for n in NS:
        parts = []
        if ("flash", n) in best and ("naive", n) in best and peak["naive", n] > 0:
            ratio = peak["flash", n] / peak["naive", n]
            parts.append(f"flash / naive peak memory = {ratio:.4f}" + (f" (1/{1 / ratio:.1f})" if 0 < ratio < 1 else ""))
        if ("flash", n) in best and ("sdpa", n) in best:
            parts.append(f"flash / SDPA time = {best['flash', n] / best['sdpa', n]:.2f}")
        if ("chunked", n) in best and ("sdpa", n) in best:
            parts.append(f"chunked / SDPA time = {best['chunked', n] / best['sdpa', n]:.2f}")
        if ("naive", n) in best and ("sdpa", n) in best:
            parts.append(f"naive / SDPA time = {best['naive', n] / best['sdpa', n]:.2f}")
        if parts:
            ratios.append(f"* n = {n}: " + "; ".join(parts) + ".")
    lines += ratios

    n_target = 8192
    lines += ["", f"## Targets at n = {n_target}", ""]
    if ("flash", n_target) in best and ("naive", n_target) in best:
        ratio = peak["flash", n_target] / peak["naive", n_target]
        lines.append(f"* flash_attention uses at most 1/8 of naive attention's peak memory: "
                     f"{'met' if ratio <= 1 / 8 else 'MISSED'} ({fmt_bytes(peak['flash', n_target])} vs "
                     f"{fmt_bytes(peak['naive', n_target])}, ratio {ratio:.4f}).")
    if ("flash", n_target) in best and ("sdpa", n_target) in best:
        ratio = best["flash", n_target] / best["sdpa", n_target]
        lines.append(f"* flash_attention takes at most 3x the time of SDPA: {'met' if ratio <= 3 else 'MISSED'} "
                     f"({fmt_time(best['flash', n_target])} vs {fmt_time(best['sdpa', n_target])}, "
                     f"ratio {ratio:.2f}).")
    lines += ["", "![time and memory](attention_bench.png)", ""]
    (RESULTS / "attention_bench.md").write_text("\n".join(lines))
    raw = [dict(point, label=LABELS[method]) for (method, n), point in sorted(points.items(), key=lambda kv: kv[0][1])]
    (RESULTS / "attention_bench.json").write_text(json.dumps({"threads": threads, "started": started,
                                                               "load_average": loads, "points": raw}, indent=1))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in METHODS:
        done = [n for n in NS if (method, n) in best]
        if not done:
            continue
        suffix = ""
        if method in exponents:
            suffix = f" (time n^{exponents[method][0]:.2f}, memory n^{exponents[method][1]:.2f})"
        axes[0].loglog(done, [best[method, n] for n in done], "o-", label=LABELS[method] + suffix)
        measured = [n for n in done if peak[method, n] >= 0.05 * MiB]  # below: under the resolution of RSS
        axes[1].loglog(measured, [peak[method, n] / MiB for n in measured], "o-", label=LABELS[method])
    axes[1].loglog(NS, [score_matrix_bytes(n) / MiB for n in NS], "k:", label="one n x n score matrix")
    axes[0].set_title(f"time (batch {BATCH}, {HEADS} heads, d = {D}, float32, {threads} thread(s))")
    axes[0].set_ylabel("seconds (best run)")
    axes[1].set_title("peak resident memory above baseline")
    axes[1].set_ylabel("MiB")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(NS, [str(n) for n in NS])
        ax.minorticks_off()
        ax.set_xlabel("sequence length n")
        ax.legend(fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "attention_bench.png", dpi=100)
    return ratios[3:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (default 1: on a shared machine, multi-threaded runs of "
                             "many small operations measure the other processes more than the code)")
    parser.add_argument("--ns", type=int, nargs="*", default=NS, help="sequence lengths (default: 256 to 16384)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads)))
        return 0

    NS[:] = sorted(args.ns)
    started, t0, load_before = time.strftime("%Y-%m-%d %H:%M"), time.time(), load_average()
    print(f"attention bench: n in {NS}, batch {BATCH}, {HEADS} heads, d = {D}, float32, {args.threads} thread(s)")
    points = {}
    for n in NS:
        for method in METHODS:
            need, available = estimated_peak(method, n), mem_available()
            if need > 0.6 * available:
                reason = (f"needs about {fmt_bytes(need)} (one n x n score matrix is "
                          f"{fmt_bytes(score_matrix_bytes(n))}, and the naive formula holds two), more than 60% of "
                          f"the {fmt_bytes(available)} available")
                points[method, n] = {"method": method, "n": n, "skipped": reason}
                print(f"  n = {n:5}  {method:8} skipped: {reason}", flush=True)
                continue
            point = run_point(method, n, args.threads)
            points[method, n] = point
            if "times" in point:
                print(f"  n = {n:5}  {method:8} {fmt_time(min(point['times'])):>10}  peak {fmt_bytes(point['peak_bytes']):>10}"
                      f"  (runs: {len(point['times'])}, max error vs SDPA on 64 rows: "
                      f"{point['max_error_first_64_rows']:.1e})", flush=True)
            else:
                print(f"  n = {n:5}  {method:8} skipped: {point['skipped']}", flush=True)
    ratios = write_results(points, args.threads, started, (load_before, load_average()), time.time() - t0)
    print("\n".join(ratios))
    print(f"wrote {RESULTS / 'attention_bench.md'} and {RESULTS / 'attention_bench.png'} "
          f"in {(time.time() - t0) / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
