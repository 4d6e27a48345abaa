"""Time and peak memory of causal attention on CPU: softmax, sliding window and linear attention (notebook 10).

``make bench`` runs this script. For each sequence length n (256 to 16384; one sequence, one
head, d = 64, float32, causal) it measures three ways to attend:

* ``softmax``: the textbook formula, the n x n scores with a causal mask, then their softmax;
* ``window``: a sliding window of ``WINDOW`` keys, computed in blocks of ``WINDOW`` queries, each
  against its own keys and the ``WINDOW - 1`` before, masked by the reference
  ``sink_window_mask`` of notebook 10 (bottom-right aligned): O(n * WINDOW);
* ``linear``: the reference ``linear_attention(Q, K, V, is_causal=True)`` of notebook 10
  (elu + 1 features, prefix sums of the (d, d_v) outer products): O(n d d_v).

The reference functions are read from the source notebook (every answer cell of
``source/10_long_context/10_long_context.ipynb`` is executed as it is). As in
``bench/attention_bench.py``, whose helpers this script uses, each (method, n) point runs in a
fresh process: peak memory is the high-water mark of its resident memory during the first run,
minus its resident memory just before. Time: the best of up to three runs. The window's output
is checked against SDPA with the window mask, at every n where the n x n mask fits.

Results, in ``bench/results/``: ``long_context_bench.md`` (table, fitted exponents over
n >= 2048), ``long_context_bench.png`` (log-log figure) and ``long_context_bench.json`` (raw data).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_bench import (  # noqa: E402 - the helpers of the attention benchmark, one folder up the path
    fit_power_law,
    fmt_bytes,
    fmt_time,
    load_average,
    reset_high_water_mark,
    status_bytes,
)

SOURCE = ROOT / "source" / "10_long_context" / "10_long_context.ipynb"
RESULTS = ROOT / "bench" / "results"

HEADS, D = 1, 64
NS = [256, 512, 1024, 2048, 4096, 8192, 16384]
WINDOW = 256
METHODS = ["softmax", "window", "linear"]
LABELS = {"softmax": "softmax (n x n scores)", "window": f"sliding window {WINDOW}",
          "linear": "linear_attention (causal)"}
MAX_RUNS = 3
TIME_BUDGET = 10.0
CHILD_TIMEOUT = 600
MiB = 2**20


def reference_functions() -> dict:
    """Execute every answer cell of the source notebook (solutions included) and return its names."""
    import nbformat

    namespace: dict = {}
    exec("import math\nimport torch\nimport torch.nn.functional as F", namespace)
    for cell in nbformat.read(SOURCE, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(cell.source, f"<{SOURCE.name}:{cell.metadata['nbgrader']['grade_id']}>", "exec"), namespace)
    return namespace


def methods(names: dict) -> dict:
    """The three ways to attend, causal, on (1, n, d) inputs."""
    import torch

    def softmax(Q, K, V):
        n = Q.shape[-2]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(scores, dim=-1) @ V

    def window(Q, K, V):
        n, outputs = Q.shape[-2], []
        for start in range(0, n, WINDOW):
            end, first = min(start + WINDOW, n), max(0, start - WINDOW + 1)
            scores = Q[..., start:end, :] @ K[..., first:end, :].transpose(-2, -1) / math.sqrt(Q.shape[-1])
            mask = names["sink_window_mask"](end - start, end - first, WINDOW)
            outputs.append(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ V[..., first:end, :])
        return torch.cat(outputs, dim=-2)

    def linear(Q, K, V):
        return names["linear_attention"](Q, K, V, is_causal=True)

    return {"softmax": softmax, "window": window, "linear": linear}


def child(method: str, n: int, threads: int) -> dict:
    import gc

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    names = reference_functions()
    fn = methods(names)[method]
    gen = torch.Generator().manual_seed(n)
    Q, K, V = (torch.randn(HEADS, n, D, generator=gen) for _ in range(3))
    fn(*(t[..., :256, :].clone() for t in (Q, K, V)))  # warm-up
    gc.collect()

    reset = reset_high_water_mark()
    baseline_rss = status_bytes("VmRSS")
    baseline = baseline_rss if reset else status_bytes("VmHWM")
    start = time.perf_counter()
    out = fn(Q, K, V)
    times = [time.perf_counter() - start]
    peak = status_bytes("VmHWM") - baseline
    error = None
    if method == "window" and n <= 4096:
        mask = names["sink_window_mask"](n, n, WINDOW)
        error = float((out - F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)).abs().max())
    del out
    while len(times) < MAX_RUNS and sum(times[1:]) + times[-1] <= TIME_BUDGET:
        start = time.perf_counter()
        fn(Q, K, V)
        times.append(time.perf_counter() - start)
    return {"method": method, "n": n, "times": times, "peak_bytes": peak, "hwm_reset": reset,
            "baseline_rss": baseline_rss, "max_error_vs_sdpa": error}


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


def exponents(points: dict) -> dict:
    """method -> (time exponent, memory exponent, sizes), least squares over n >= 2048."""
    found = {}
    for method in METHODS:
        done = [n for n in NS if "times" in points.get((method, n), {}) and n >= 2048]
        if len(done) >= 2:
            found[method] = (fit_power_law(done, [min(points[method, n]["times"]) for n in done]),
                             fit_power_law(done, [max(points[method, n]["peak_bytes"], 1) for n in done]), done)
    return found


def write_results(points: dict, threads: int, started: str, loads: tuple[str, str], elapsed: float) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    fitted = exponents(points)
    machine = platform.processor() or platform.machine()
    lines = ["# Long context on CPU: softmax, sliding window and linear attention (notebook 10)", "",
             f"Written by `bench/long_context_bench.py` (`make bench`) on {started}, in {elapsed / 60:.1f} minutes.", "",
             f"Setup: one sequence, {HEADS} head, d = {D}, float32, causal, CPU ({machine}, {os.cpu_count()} logical "
             f"cores), PyTorch {torch.__version__}, {threads} thread(s) "
             f"per process. Load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]}.", "",
             "Each point runs in a fresh process (the method of `bench/attention_bench.py`): **time** is the best of "
             f"up to {MAX_RUNS} runs; **peak memory** the high-water mark of resident memory during the first run "
             "above the resident memory just before. `sink_window_mask` and `linear_attention` are the answer cells "
             "of `source/10_long_context/10_long_context.ipynb`.", "",
             "| n | " + " | ".join(LABELS[m] for m in METHODS) + " |", "|---:|" + "---:|" * len(METHODS)]
    notes = []
    for n in NS:
        cells = []
        for method in METHODS:
            point = points.get((method, n), {})
            if "times" in point:
                cells.append(f"{fmt_time(min(point['times']))}<br>{fmt_bytes(max(point['peak_bytes'], 0))}")
            else:
                cells.append("skipped")
                notes.append(f"* {LABELS[method]} at n = {n}: {point.get('skipped', 'not run')}.")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    errors = [p["max_error_vs_sdpa"] for p in points.values() if p.get("max_error_vs_sdpa") is not None]
    lines += ["", "Each cell: best time, then peak memory above the baseline. "
              + (f"The window's output differs from SDPA with the window mask by at most {max(errors):.1e} (n <= 4096)."
                 if errors else "")]
    if notes:
        lines += ["", "Skipped points:", "", *notes]
    lines += ["", "## Fitted exponents (least squares on log-log, n >= 2048)", "",
              "| method | time exponent | memory exponent | sizes |", "|---|---:|---:|---|"]
    summary = []
    for method, (t_exp, m_exp, done) in fitted.items():
        lines.append(f"| {LABELS[method]} | {t_exp:.2f} | {m_exp:.2f} | {', '.join(map(str, done))} |")
        summary.append(f"{LABELS[method]}: time n^{t_exp:.2f}, memory n^{m_exp:.2f}")
    lines += ["", "![time and memory](long_context_bench.png)", ""]
    (RESULTS / "long_context_bench.md").write_text("\n".join(lines))
    raw = [dict(p, label=LABELS[m]) for (m, n), p in sorted(points.items(), key=lambda kv: kv[0][1])]
    (RESULTS / "long_context_bench.json").write_text(json.dumps({"threads": threads, "started": started,
                                                                  "load_average": loads, "points": raw}, indent=1))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in METHODS:
        done = [n for n in NS if "times" in points.get((method, n), {})]
        suffix = f" (time n^{fitted[method][0]:.2f}, memory n^{fitted[method][1]:.2f})" if method in fitted else ""
        axes[0].loglog(done, [min(points[method, n]["times"]) for n in done], "o-", label=LABELS[method] + suffix)
        measured = [n for n in done if points[method, n]["peak_bytes"] >= 0.05 * MiB]
        axes[1].loglog(measured, [points[method, n]["peak_bytes"] / MiB for n in measured], "o-", label=LABELS[method])
    axes[0].set_title(f"time (causal, {HEADS} head, d = {D}, float32, {threads} thread(s))")
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
    fig.savefig(RESULTS / "long_context_bench.png", dpi=100)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads per measurement (default 1)")
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads)))
        return 0
    started, before, begin = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_average(), time.perf_counter()
    points = {}
    for n in NS:
        for method in METHODS:
            points[method, n] = point = run_point(method, n, args.threads)
            shown = (f"{fmt_time(min(point['times']))}, peak {fmt_bytes(max(point['peak_bytes'], 0))}"
                     if "times" in point else point["skipped"])
            print(f"n = {n:5}  {LABELS[method]:28} {shown}", flush=True)
    for line in write_results(points, args.threads, started, (before, load_average()), time.perf_counter() - begin):
        print(line)
    print(f"wrote {RESULTS / 'long_context_bench.md'}, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
