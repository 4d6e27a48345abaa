"""Decoding with and without a KV cache, and filling a cache by preallocation or by concatenation (CPU).

``python bench/decoding_and_training_bench.py`` measures, with the reference solutions of notebook
09 (its answer cells and its ``TinyDecoder`` cell, read from the source notebook and executed as
they are):

* **generation**: greedy decoding of 512 tokens after a prompt of 8 by the model of the
  notebook's experiment (``TinyDecoder(16, 32, 2, 64, 2)``, random weights: the time does not
  depend on them), with ``generate(..., use_cache=True)`` and ``use_cache=False``, in float64 (the
  notebook's dtype) and float32. The total is the best of ``--repeat`` runs of ``generate``; the
  time of every token comes from one more run of the same loop that times each call of the model.
  Both paths must choose the same tokens.
* **the cache**: ``n`` appends of one token (a layer of the same model: 2 key/value heads of d = 16, float32)
  to the notebook's ``KVCache`` (storage allocated once) and to a cache grown by ``torch.cat``
  (the catalogued mistake), for n = 256 ... 4096, best of ``--repeat``.

One thread (``torch.set_num_threads(1)``), as in the notebook. Results in ``bench/results/``:
``decoding_and_training.json`` (raw data, machine, load average), ``decoding_and_training.md``
(tables and the target: decoding 512 tokens at least 5x faster with the cache) and
``decoding_and_training.png`` (time per token against length; time to fill a cache).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SOURCE = ROOT / "source" / "09_decoding_and_training" / "09_decoding_and_training.ipynb"
RESULTS = ROOT / "bench" / "results"

VOCAB, D_MODEL, HEADS, D_FF, LAYERS = 16, 32, 2, 64, 2
PROMPT, STEPS = 8, 512
TARGET = 5.0  # decoding 512 tokens with the cache at least this many times faster
CACHE_NS = [256, 512, 1024, 2048, 4096]
CACHE_SHAPE = (1, 2, 16)  # batch, key/value heads, d_head: a layer of the notebook's model


def reference_namespace() -> dict:
    """Execute the answer cells (solutions included) and the TinyDecoder cell of the source notebook."""
    import nbformat

    namespace: dict = {"torch": torch, "math": math, "F": F, "nn": nn}
    for cell in nbformat.read(SOURCE, as_version=4).cells:
        answer = cell.metadata.get("nbgrader", {}).get("solution")
        if cell.cell_type == "code" and (answer or cell.source.startswith("class TinyDecoder")):
            exec(compile(cell.source, f"<{SOURCE.name}>", "exec"), namespace)
    return namespace


def per_token_times(model, prompt: torch.Tensor, steps: int, use_cache: bool) -> tuple[list[float], torch.Tensor]:
    """The loop of generate, timing each call of the model: (seconds of the call that made token i, tokens)."""
    times, chosen = [], []
    with torch.no_grad():
        caches = model.new_caches(prompt.shape[0], prompt.shape[1] + steps) if use_cache else None
        tokens, feed = prompt, prompt
        for _ in range(steps):
            start = time.perf_counter()
            logits = model(feed, caches) if use_cache else model(tokens)
            times.append(time.perf_counter() - start)
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            chosen.append(token)
            tokens = torch.cat([tokens, token], dim=1)
            feed = token
    return times, torch.cat(chosen, dim=1)


def best(fn, repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn()``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_generation(ns: dict, dtype: torch.dtype, repeat: int) -> dict:
    torch.manual_seed(0)
    model = ns["TinyDecoder"](VOCAB, D_MODEL, HEADS, D_FF, LAYERS).to(dtype).eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    result = {}
    for use_cache in (True, False):
        tokens = ns["generate"](model, prompt, STEPS, use_cache=use_cache)
        total = best(lambda use_cache=use_cache: ns["generate"](model, prompt, STEPS, use_cache=use_cache), repeat)
        times, same = per_token_times(model, prompt, STEPS, use_cache)
        result["cache" if use_cache else "no_cache"] = {"total_s": total, "per_token_s": times,
                                                        "tokens": tokens[0].tolist()}
        assert torch.equal(same, tokens), "the timed loop must choose the tokens generate chooses"
    result["same_tokens"] = result["cache"]["tokens"] == result["no_cache"]["tokens"]
    result["speedup"] = result["no_cache"]["total_s"] / result["cache"]["total_s"]
    return result


def bench_cache(ns: dict, repeat: int) -> dict:
    from autograder.hidden.decoding_and_training import CacheConcatenated

    batch, kv_heads, d_head = CACHE_SHAPE
    gen = torch.Generator().manual_seed(2)
    tokens = [(torch.randn(batch, kv_heads, 1, d_head, generator=gen),
               torch.randn(batch, kv_heads, 1, d_head, generator=gen)) for _ in range(CACHE_NS[-1])]

    def fill(kind, n):
        cache = kind(batch, kv_heads, n, d_head)
        for k, v in tokens[:n]:
            cache.append(k, v)

    return {name: [best(lambda kind=kind, n=n: fill(kind, n), repeat) for n in CACHE_NS]
            for name, kind in [("preallocated (KVCache)", ns["KVCache"]), ("torch.cat", CacheConcatenated)]}


def fitted_exponent(ns: list[int], costs: list[float]) -> float:
    """Slope of the least-squares line through (log n, log cost)."""
    x = [math.log(n) for n in ns]
    y = [math.log(c) for c in costs]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def write_figure(generation: dict, cache: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    lengths = list(range(PROMPT, PROMPT + STEPS))
    for dtype, style in [("float64", "-"), ("float32", "--")]:
        for key, label in [("no_cache", "without a cache"), ("cache", "with a cache")]:
            run = generation[dtype][key]
            axes[0].plot(lengths, [t * 1e3 for t in run["per_token_s"]], style, lw=0.8,
                         label=f"{label}, {dtype}: {run['total_s']:.2f} s for {STEPS} tokens")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("tokens so far")
    axes[0].set_ylabel("ms for the next token")
    axes[0].set_title(f"greedy decoding, TinyDecoder({VOCAB}, {D_MODEL}, {HEADS}, {D_FF}, {LAYERS}), CPU, 1 thread")
    axes[0].legend(fontsize=8)
    for name, times in cache.items():
        axes[1].loglog(CACHE_NS, [t * 1e3 for t in times], "o-",
                       label=f"{name}: n^{fitted_exponent(CACHE_NS[-3:], times[-3:]):.2f}")
    axes[1].set_xticks(CACHE_NS, [str(n) for n in CACHE_NS])
    axes[1].minorticks_off()
    axes[1].set_xlabel("tokens appended one at a time, n")
    axes[1].set_ylabel("milliseconds (best of runs)")
    axes[1].set_title(f"filling a cache (batch, kv heads, d) = {CACHE_SHAPE}, float32")
    axes[1].legend(fontsize=8)
    plt.tight_layout()
    fig.savefig(path, dpi=110)


def write_table(data: dict, path: Path) -> None:
    lines = ["# Decoding with and without a KV cache (notebook 09)", "",
             f"Machine: {data['machine']}; torch {data['torch']}; 1 thread; load average at the start "
             f"{data['load_average'][0]:.2f}.", "",
             f"Greedy decoding of {STEPS} tokens after a prompt of {PROMPT}, TinyDecoder({VOCAB}, {D_MODEL}, {HEADS}, "
             f"{D_FF}, {LAYERS}) (the notebook's model), best of {data['repeat']} runs of `generate`:", "",
             "| dtype | with the cache | without | speedup | same tokens | target (>= 5x) |", "|---|---|---|---|---|---|"]
    for dtype in ("float64", "float32"):
        g = data["generation"][dtype]
        lines.append(f"| {dtype} | {g['cache']['total_s']:.3f} s | {g['no_cache']['total_s']:.3f} s | "
                     f"{g['speedup']:.1f}x | {g['same_tokens']} | {'met' if g['speedup'] >= TARGET else 'NOT met'} |")
    lines += ["", f"Filling a cache with n tokens appended one at a time, {CACHE_SHAPE} (batch, kv heads, d), float32:",
              "", "| n | " + " | ".join(data["cache"]) + " |", "|---|" + "---|" * len(data["cache"])]
    for i, n in enumerate(CACHE_NS):
        lines.append(f"| {n} | " + " | ".join(f"{times[i] * 1e3:.1f} ms" for times in data["cache"].values()) + " |")
    lines += ["", "Fitted exponents (three largest n): " + ", ".join(
        f"{name} n^{fitted_exponent(CACHE_NS[-3:], times[-3:]):.2f}" for name, times in data["cache"].items()), ""]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the fastest is kept")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    ns = reference_namespace()
    generation = {}
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).removeprefix("torch.")
        generation[name] = bench_generation(ns, dtype, args.repeat)
        g = generation[name]
        print(f"{name}: {STEPS} tokens with the cache {g['cache']['total_s']:.3f} s, without "
              f"{g['no_cache']['total_s']:.3f} s: {g['speedup']:.1f}x (same tokens: {g['same_tokens']})")
    cache = bench_cache(ns, args.repeat)
    for name, times in cache.items():
        print(f"{name:24}" + "".join(f"  n = {n}: {t * 1e3:7.1f} ms" for n, t in zip(CACHE_NS, times)))
    data = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "torch": torch.__version__, "load_average": load, "repeat": args.repeat, "generation": generation,
            "cache_ns": CACHE_NS, "cache": cache}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decoding_and_training.json").write_text(json.dumps(data, indent=1))
    write_table(data, args.out / "decoding_and_training.md")
    write_figure(generation, cache, args.out / "decoding_and_training.png")
    print(f"wrote {args.out / 'decoding_and_training.md'}, .json and .png")


if __name__ == "__main__":
    main()
