"""Decoding with and without a KV cache, and filling a cache by preallocation or by concatenation (CPU).

``python bench/decoding_and_training_bench.py`` measures, with the reference solutions of notebook
09 (its answer cells and its ``TinyDecoder`` cell, read from the source notebook and executed as
they are):

* **generation**: greedy decoding of 512 tokens after a prompt of 8 by the model of the
  notebook's experiment (``TinyDecoder(16, 32, 2, 64, 2)``, random weights: the time does not
  depend on them), with ``generate(..., use_cache=True)`` and ``use_cache=False``, in float64 (the
  notebook's dtype) and float32, and, for comparison, by a wider model (``TinyDecoder(16, 128, 4,
  512, 2)``, float32). The total is the best of ``--repeat`` runs of ``generate``; the time of
  every token comes from one more run of the same loop that times each call of the model (it
  also warms up). Both paths must choose the same tokens.
* **the cache**: ``n`` appends of one token (one layer, 2 key/value heads of d = 32, float32)
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_bench import fit_power_law  # noqa: E402 - the attention benchmark's fit, in this folder

SOURCE = ROOT / "source" / "09_decoding_and_training" / "09_decoding_and_training.ipynb"
RESULTS = ROOT / "bench" / "results"

VOCAB = 16
#: (label, d_model, heads, d_ff, layers, dtype): the notebook's model in its dtype and in float32, then a wider one.
MODELS = [("notebook, float64", 32, 2, 64, 2, torch.float64), ("notebook, float32", 32, 2, 64, 2, torch.float32),
          ("wider, float32", 128, 4, 512, 2, torch.float32)]
PROMPT, STEPS = 8, 512
TARGET = 5.0  # decoding 512 tokens with the cache at least this many times faster
CACHE_NS = [256, 512, 1024, 2048, 4096]
CACHE_SHAPE = (1, 2, 32)  # batch, key/value heads, d_head


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


def bench_generation(ns: dict, d_model: int, heads: int, d_ff: int, layers: int, dtype: torch.dtype,
                     repeat: int) -> dict:
    torch.manual_seed(0)
    model = ns["TinyDecoder"](VOCAB, d_model, heads, d_ff, layers).to(dtype).eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    result = {"model": f"TinyDecoder({VOCAB}, {d_model}, {heads}, {d_ff}, {layers})", "dtype": str(dtype)[6:]}
    for use_cache in (True, False):
        times, looped = per_token_times(model, prompt, STEPS, use_cache)
        chosen = []
        total = best(lambda use_cache=use_cache, chosen=chosen: chosen.append(
            ns["generate"](model, prompt, STEPS, use_cache=use_cache)), repeat)
        assert torch.equal(looped, chosen[-1]), "the timed loop must choose the tokens generate chooses"
        result["cache" if use_cache else "no_cache"] = {"total_s": total, "per_token_s": times,
                                                        "tokens": chosen[-1][0].tolist()}
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


WINDOW = 15  # tokens in the running median of the per-token times (one run is noisy on a shared machine)


def running_median(values: list[float], window: int = WINDOW) -> list[float]:
    """The median of each value and its neighbours, ``window`` in all (fewer at the ends)."""
    half = window // 2
    return [sorted(values[max(0, i - half):i + half + 1])[len(values[max(0, i - half):i + half + 1]) // 2]
            for i in range(len(values))]


def write_figure(generation: dict, cache: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    lengths = list(range(PROMPT, PROMPT + STEPS))
    for (label, g), colour in zip(generation.items(), ["C0", "C1", "C2"]):
        for key, style, how in [("no_cache", "-", "without"), ("cache", ":", "with")]:
            run = g[key]
            axes[0].plot(lengths, [t * 1e3 for t in running_median(run["per_token_s"])], style, color=colour,
                         lw=1.2, label=f"{label}, {how} cache: {run['total_s']:.2f} s")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("tokens so far")
    axes[0].set_ylabel("ms for the next token")
    axes[0].set_title(f"greedy decoding of {STEPS} tokens, CPU, 1 thread (running median of {WINDOW})")
    axes[0].legend(fontsize=8)
    for name, times in cache.items():
        axes[1].loglog(CACHE_NS, [t * 1e3 for t in times], "o-",
                       label=f"{name}: n^{fit_power_law(CACHE_NS[-3:], times[-3:]):.2f}")
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
             f"Greedy decoding of {STEPS} tokens after a prompt of {PROMPT}, best of {data['repeat']} runs of "
             "`generate` (the notebook's model is TinyDecoder(16, 32, 2, 64, 2), trained in float64):", "",
             "| model | dtype | with the cache | without | speedup | same tokens | >= 5x |", "|---|---|---|---|---|---|---|"]
    for g in data["generation"].values():
        lines.append(f"| {g['model']} | {g['dtype']} | {g['cache']['total_s']:.3f} s | {g['no_cache']['total_s']:.3f} s "
                     f"| {g['speedup']:.1f}x | {g['same_tokens']} | {'yes' if g['speedup'] >= TARGET else 'no'} |")
    lines += ["", f"Filling a cache with n tokens appended one at a time, {CACHE_SHAPE} (batch, kv heads, d), float32:",
              "", "| n | " + " | ".join(data["cache"]) + " |", "|---|" + "---|" * len(data["cache"])]
    for i, n in enumerate(CACHE_NS):
        lines.append(f"| {n} | " + " | ".join(f"{times[i] * 1e3:.1f} ms" for times in data["cache"].values()) + " |")
    lines += ["", "Fitted exponents (three largest n): " + ", ".join(
        f"{name} n^{fit_power_law(CACHE_NS[-3:], times[-3:]):.2f}" for name, times in data["cache"].items()), ""]
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
    for label, *sizes, dtype in MODELS:
        g = generation[label] = bench_generation(ns, *sizes, dtype, args.repeat)
        print(f"{label} ({g['model']}): {STEPS} tokens with the cache {g['cache']['total_s']:.3f} s, without "
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
