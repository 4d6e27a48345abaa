"""Paged vs contiguous KV caches: memory used vs reserved, and how many requests one pool serves at once (CPU).

``python bench/serving_bench.py`` measures, with the reference solutions of notebook 11 (its answer
cells, read from the source notebook and executed as they are):

* **used vs reserved**: batches of ``--batch`` requests whose final lengths are drawn from two
  distributions up to ``max_len`` = 4096 tokens, *uniform* (16 to 4096) and *short-heavy* (a geometric
  law of mean 512, cut at 4096, as chat answers are mostly short); each request is appended whole to
  the notebook's ``PagedKVCache`` for block sizes 1 to 256, and the slots its block tables reserve are
  counted; contiguous caches reserve ``max_len`` per request. Five batches per distribution (seeds 0-4).
* **requests served at once**: a pool of a fixed size (the memory of 16 contiguous caches of
  ``max_len``) receives the requests of a stream one after the other, each appended whole, until an
  append raises the notebook's ``ValueError`` (pool exhausted); contiguous caches admit 16.

The memory figures in bytes are for a 7B-class model with grouped-query attention (32 layers, 8
key/value heads of 128, bfloat16: the notebook's ``cache_bytes_per_token``); the simulation itself
stores one number per token (the slots are what is counted). Results in ``bench/results/``:
``serving_bench.json`` (raw data, machine), ``serving_bench.md`` (tables) and ``serving_bench.png``
(used fraction against block size; requests served at once).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "source" / "11_serving" / "11_serving.ipynb"
RESULTS = ROOT / "bench" / "results"

MAX_LEN = 4096
BLOCKS = [1, 4, 8, 16, 32, 64, 128, 256]
SEEDS = range(5)
CONTIGUOUS_ADMITTED = 16  # the pool of the second measure holds this many contiguous caches of MAX_LEN
MODEL = (32, 32, 8, 128, torch.bfloat16)  # layers, heads, key/value heads, d_head, dtype
GiB = 2**30


def reference_namespace() -> dict:
    """Execute the answer cells (solutions included) of the source notebook."""
    import nbformat

    namespace: dict = {"torch": torch, "math": math, "F": F, "nn": nn}
    for cell in nbformat.read(SOURCE, as_version=4).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(cell.source, f"<{SOURCE.name}>", "exec"), namespace)
    return namespace


def lengths_of(kind: str, count: int, seed: int) -> list[int]:
    """Final lengths of ``count`` requests: uniform in [16, MAX_LEN] or geometric of mean 512 cut to [16, MAX_LEN]."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        return torch.randint(16, MAX_LEN + 1, (count,), generator=gen).tolist()
    u = torch.rand(count, generator=gen, dtype=torch.float64)
    geometric = torch.ceil(torch.log1p(-u) / math.log1p(-1 / 512))
    return geometric.clamp(16, MAX_LEN).long().tolist()


def reserved_paged(PagedKVCache, lengths: list[int], block: int) -> int:  # noqa: N803
    """Slots the block tables of ``lengths`` hold in the notebook's cache (each request appended whole)."""
    cache = PagedKVCache(sum(-(-n // block) for n in lengths), block, 1, 1, dtype=torch.float16)
    ids = []
    for n in lengths:
        ids.append(cache.new_sequence())
        cache.append(ids[-1], torch.zeros(1, n, 1), torch.zeros(1, n, 1))
    assert all(cache.length(i) == n for i, n in zip(ids, lengths))
    return sum(len(cache.block_table(i)) for i in ids) * block


def admitted(PagedKVCache, lengths: list[int], block: int) -> int:  # noqa: N803
    """Requests of the stream ``lengths`` a pool of CONTIGUOUS_ADMITTED * MAX_LEN slots holds before it is full."""
    cache = PagedKVCache(CONTIGUOUS_ADMITTED * MAX_LEN // block, block, 1, 1, dtype=torch.float16)
    for count, n in enumerate(lengths):
        try:
            cache.append(cache.new_sequence(), torch.zeros(1, n, 1), torch.zeros(1, n, 1))
        except ValueError:
            return count
    raise RuntimeError("the stream ended before the pool was full: make it longer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="requests per batch (used vs reserved)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    namespace = reference_namespace()
    PagedKVCache, per_token = namespace["PagedKVCache"], namespace["cache_bytes_per_token"](*MODEL)  # noqa: N806

    results: dict = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                                 "processor": platform.processor() or platform.machine()},
                     "max_len": MAX_LEN, "batch": args.batch, "bytes_per_token": per_token, "fraction_used": {},
                     "admitted": {}}
    for kind in ("uniform", "short-heavy"):
        batches = [lengths_of(kind, args.batch, seed) for seed in SEEDS]
        used = sum(map(sum, batches))
        contiguous = len(batches) * args.batch * MAX_LEN
        fractions = {"contiguous": used / contiguous}
        for block in BLOCKS:
            fractions[str(block)] = used / sum(reserved_paged(PagedKVCache, b, block) for b in batches)
        results["fraction_used"][kind] = fractions
        stream = lengths_of(kind, 40 * CONTIGUOUS_ADMITTED * MAX_LEN // 512, 100)
        results["admitted"][kind] = {"contiguous": CONTIGUOUS_ADMITTED,
                                     **{str(block): admitted(PagedKVCache, stream, block) for block in BLOCKS}}

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serving_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    pool_gib = CONTIGUOUS_ADMITTED * MAX_LEN * per_token / GiB
    lines = ["# Paged vs contiguous KV caches", "",
             f"Requests up to {MAX_LEN} tokens; a 7B-class model with GQA (32 layers, 8 key/value heads of 128, "
             f"bfloat16) holds {per_token // 1024} KiB per token. Produced by `bench/serving_bench.py`.", "",
             f"## Fraction of the reserved slots that hold a token ({len(SEEDS)} batches of {args.batch})", "",
             "| lengths | contiguous | " + " | ".join(f"paged, block {b}" for b in BLOCKS) + " |",
             "|---|---|" + "---|" * len(BLOCKS)]
    for kind, fractions in results["fraction_used"].items():
        lines.append(f"| {kind} | {fractions['contiguous']:.1%} | "
                     + " | ".join(f"{fractions[str(b)]:.1%}" for b in BLOCKS) + " |")
    lines += ["", f"## Requests served at once by a pool of {CONTIGUOUS_ADMITTED} x {MAX_LEN} slots "
              f"({pool_gib:.0f} GiB of cache for this model)", "",
              "| lengths | contiguous | " + " | ".join(f"paged, block {b}" for b in BLOCKS) + " |",
              "|---|---|" + "---|" * len(BLOCKS)]
    for kind, counts in results["admitted"].items():
        lines.append(f"| {kind} | {counts['contiguous']} | " + " | ".join(str(counts[str(b)]) for b in BLOCKS) + " |")
    (RESULTS / "serving_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    for kind, marker in [("uniform", "o"), ("short-heavy", "s")]:
        fractions, counts = results["fraction_used"][kind], results["admitted"][kind]
        line = left.plot(BLOCKS, [fractions[str(b)] for b in BLOCKS], marker=marker, label=f"paged, {kind}")[0]
        left.axhline(fractions["contiguous"], ls="--", color=line.get_color(), label=f"contiguous, {kind}")
        right.plot(BLOCKS, [counts[str(b)] for b in BLOCKS], marker=marker, color=line.get_color(),
                   label=f"paged, {kind}")
    right.axhline(CONTIGUOUS_ADMITTED, ls="--", color="gray", label="contiguous")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.legend(fontsize=8)
    left.set(ylabel="used / reserved", ylim=(0, 1.02), title=f"batches of {args.batch} requests up to {MAX_LEN}")
    right.set(ylabel="requests held at once", title=f"one pool of {CONTIGUOUS_ADMITTED} x {MAX_LEN} slots")
    fig.tight_layout()
    fig.savefig(RESULTS / "serving_bench.png", dpi=120)
    print(f"wrote {RESULTS / 'serving_bench.md'}, .json and .png")


if __name__ == "__main__":
    main()
