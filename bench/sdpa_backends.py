"""What ``F.scaled_dot_product_attention`` returns on a row with no allowed key, kernel by kernel.

PyTorch's SDPA picks one of several kernels (``SDPBackend.MATH``, ``FLASH_ATTENTION``,
``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``) from the device, the dtype, the shapes and the mask.
The kernels agree on ordinary rows but not necessarily on a query whose every key is masked out,
where softmax is 0 / 0. Notebook 03 teaches the consequence: make such rows impossible, or handle
them yourself. This script measures, on the machine it runs on, for every kernel (each forced with
``torch.nn.attention.sdpa_kernel``, and the default choice) and every dtype (float32, float16,
bfloat16, float64):

* **empty rows**: what the output is on the rows with no allowed key, for a boolean mask with an
  all-False row, an additive float mask with an all ``-inf`` row, and ``causal_lower_right(n, m)``
  with more queries than keys: ``zeros``, ``NaN``, ``inf``, ``other`` (finite, not all zero; the
  largest magnitude is given) or ``not available`` (the kernel refused the inputs; the reason,
  from PyTorch's warnings or error, is in the details);
* **rows with keys**: the largest error of the other rows against a float64 softmax written out by
  hand (so a kernel that is right on ordinary rows is told apart from one that is simply wrong);
* **gradient**: whether the gradient of Q, K and V is finite when the loss multiplies the empty
  rows by 0 (the usual way of ignoring pad queries; NaN x 0 is NaN);
* **is_causal alignment** when n != m: which corner ``is_causal=True`` anchors the diagonal to
  (``top-left``: query i sees keys j <= i; ``bottom-right``: j <= i + m - n).

Run ``.venv/bin/python bench/sdpa_backends.py`` (``--device cuda`` on a GPU; the default is cuda
when available). It prints the tables and writes ``bench/results/sdpa_backends_<device>.md`` and
``.json``. On a CPU the kernels that exist only on CUDA are reported ``not available``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

RESULTS = Path(__file__).resolve().parent / "results"
BACKENDS = ["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "default"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
# Largest error on rows with keys that still counts as right: a few units in the last place of the dtype
# after a softmax and a weighted sum of 16 values.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 4e-2, "float64": 1e-12}
BATCH, HEADS, N, M, D = 2, 2, 16, 16, 64  # head dim 64: every GPU kernel accepts it
CASES = {
    "bool": "boolean attn_mask, one all-False row per sequence",
    "float": "additive float attn_mask, one all -inf row per sequence",
    "lower_right": f"attn_mask=causal_lower_right({N}, {M // 2}): the first {N - M // 2} of {N} queries have no key",
}


def inputs(dtype: torch.dtype, device: str, n: int, m: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Q (B, H, n, D), K and V (B, H, m, D) from a seeded generator, rounded to dtype."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, n, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(BATCH, HEADS, m, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return tuple(t.to(dtype).to(device) for t in (q, k, v))


def allowed_matrix(case: str, device: str) -> torch.Tensor:
    """The (B, 1, n, m) boolean matrix of allowed (query, key) pairs of a case (True = may attend)."""
    if case == "lower_right":
        n, m = N, M // 2
        allowed = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
        return allowed.expand(BATCH, 1, n, m).to(device)
    allowed = torch.ones(N, M, dtype=torch.bool).tril().expand(BATCH, 1, N, M).clone()
    allowed[0, 0, 3] = False  # sequence 0: query 3 sees nothing
    allowed[1, 0, 0] = False  # sequence 1: query 0 sees nothing
    return allowed.to(device)


def attn_mask(case: str, allowed: torch.Tensor, dtype: torch.dtype):
    """What the case passes to SDPA as attn_mask."""
    if case == "bool":
        return allowed
    if case == "float":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, -math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "will produce NaNs when seq_len_q > seq_len_kv": measured here, not assumed
        return causal_lower_right(allowed.shape[-2], allowed.shape[-1])


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V in float64, written out; rows with no key are 0."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = (q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    empty = ~allowed.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return weights @ v


def call_sdpa(backend: str, q, k, v, **kwargs):
    """SDPA with one kernel forced (or PyTorch's own choice); warnings are returned, not printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if backend == "default":
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            else:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            error = None
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            out, error = None, exc
    messages = [str(w.message) for w in caught if "Lower right causal bias" not in str(w.message)]
    return out, error, messages


def why_not(error: Exception, messages: list[str]) -> str:
    """The most specific reason PyTorch gives for refusing a kernel, on one line."""
    reasons = [msg for msg in messages if "not used because" in msg or "requires" in msg] or [str(error)]
    return " | ".join(re.sub(r"\s+", " ", msg).strip()[:160] for msg in reasons[:3])


def classify(values: torch.Tensor) -> str:
    """zeros / NaN / inf / other (largest magnitude) for the output on empty rows."""
    if values.isnan().any():
        return "NaN"
    if values.isinf().any():
        return "inf"
    if (values == 0).all():
        return "zeros"
    return f"other (max |x| {values.abs().max().item():.3g})"


def default_choice(q, k, v, mask) -> str:
    """The kernel PyTorch's dispatcher picks for a tensor mask (private API; '?' where it is missing)."""
    if isinstance(mask, CausalBias):
        return "?"  # CausalBias chooses in Python (flash, then efficient, else a materialised mask)
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False)).name
    except Exception:  # a private function: any failure means "unknown"
        return "?"


def empty_row_point(case: str, backend: str, dtype_name: str, device: str) -> dict:
    """One (case, kernel, dtype): empty rows, rows with keys, gradient."""
    dtype = DTYPES[dtype_name]
    allowed = allowed_matrix(case, device)
    n, m = allowed.shape[-2:]
    q, k, v = inputs(dtype, device, n, m)
    mask = attn_mask(case, allowed, dtype)
    point = {"case": case, "backend": backend, "dtype": dtype_name}
    if backend == "default":
        point["dispatcher_choice"] = default_choice(q, k, v, mask)
    out, error, messages = call_sdpa(backend, q, k, v, attn_mask=mask)
    if out is None:
        point.update(empty_rows="not available", reason=why_not(error, messages))
        return point
    empty = ~allowed.any(dim=-1)  # (B, 1, n)
    empty_rows = out.double().cpu()[empty.expand(out.shape[:-1]).cpu()]
    point["empty_rows"] = classify(empty_rows)
    error_keys = (out.double() - reference(q, k, v, allowed)).abs()[~empty.expand(out.shape[:-1])].max().item()
    point["rows_with_keys_max_error"] = error_keys
    point["rows_with_keys_ok"] = bool(error_keys <= TOLERANCE[dtype_name])
    point["gradient"] = gradient_status(backend, q, k, v, mask, empty)
    if messages:
        point["warnings"] = [re.sub(r"\s+", " ", msg)[:160] for msg in messages[:3]]
    return point


def gradient_status(backend: str, q, k, v, mask, empty: torch.Tensor) -> str:
    """'finite' or 'NaN' for the gradient of Q, K, V when the loss multiplies the empty rows by 0."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, error, messages = call_sdpa(backend, *leaves, attn_mask=mask)
    if out is None:
        return "not available"
    keep = (~empty).to(out.dtype)[..., None]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (out * keep).sum().backward()
    except (RuntimeError, NotImplementedError) as exc:
        return "backward not available (" + re.sub(r"\s+", " ", str(exc))[:80] + ")"
    bad = [name for name, t in zip("QKV", leaves) if not torch.isfinite(t.grad).all()]
    return "finite" if not bad else "NaN in " + ", ".join(bad)


def alignment_point(backend: str, dtype_name: str, device: str, n: int, m: int) -> dict:
    """Which corner is_causal=True anchors the diagonal to, for n queries and m keys."""
    dtype = DTYPES[dtype_name]
    # Equal scores (Q = K = 0) and V = the identity on its first m columns: the output is the weight matrix.
    q = torch.zeros(1, 1, n, D, dtype=dtype, device=device)
    k = torch.zeros(1, 1, m, D, dtype=dtype, device=device)
    v = torch.zeros(1, 1, m, D, dtype=dtype, device=device)
    v[0, 0, :, :m] = torch.eye(m, dtype=dtype, device=device)
    point = {"backend": backend, "dtype": dtype_name, "n": n, "m": m}
    out, error, messages = call_sdpa(backend, q, k, v, is_causal=True)
    if out is None:
        point.update(alignment="not available", reason=why_not(error, messages))
        return point
    weights = out[0, 0, :, :m].double().cpu()
    point["alignment"] = "other"
    for name, offset in (("top-left", 0), ("bottom-right", m - n)):
        allowed = torch.ones(n, m, dtype=torch.bool).tril(diagonal=offset)
        rows = allowed.any(dim=-1)
        expected = allowed.double() / allowed.sum(dim=-1, keepdim=True).clamp(min=1)
        if torch.allclose(weights[rows], expected[rows], atol=TOLERANCE[dtype_name] * 10):
            point["alignment"] = name
            if not rows.all():
                point["alignment"] += f" (empty rows: {classify(weights[~rows])})"
            break
    return point


def environment(device: str) -> dict:
    """What the results depend on: versions and hardware."""
    env = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if device.startswith("cuda"):
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return env


def slug(env: dict) -> str:
    """File-name part naming the machine: cpu, or the GPU's name (nvidia_h100_80gb_hbm3, ...)."""
    if env["device"] == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", env["device_name"].lower()).strip("_")


def gradient_cell(point: dict) -> str:
    """The gradient column of a point: its status, or why the kernel did not run."""
    return point.get("gradient", point["empty_rows"])


def markdown(env: dict, points: list[dict], alignments: list[dict], seconds: float) -> str:
    """The results as a Markdown report."""
    lines = [
        f"# SDPA on rows with no allowed key: {env['device_name']}",
        "",
        f"Written by `bench/sdpa_backends.py --device {env['device']}` on {env['date']} in {seconds:.1f} s. "
        + ", ".join(f"{key} {env[key]}" for key in ("torch", "cuda", "cudnn", "capability", "python") if key in env)
        + ".",
        "",
        f"Inputs: batch {BATCH}, {HEADS} heads, head dim {D}, Q, K, V from `torch.Generator().manual_seed(0)`. "
        "Each kernel is forced with `torch.nn.attention.sdpa_kernel`; `default` lets PyTorch choose. "
        "`not available`: the kernel refused these inputs (reasons below).",
        "",
    ]
    for case, title in CASES.items():
        lines += [f"## Empty rows: {title}", "", "| dtype | " + " | ".join(BACKENDS) + " |", "|---" * (len(BACKENDS) + 1) + "|"]
        for dtype_name in DTYPES:
            cells = []
            for backend in BACKENDS:
                p = next(p for p in points if (p["case"], p["backend"], p["dtype"]) == (case, backend, dtype_name))
                cell = p["empty_rows"]
                if "rows_with_keys_ok" in p and not p["rows_with_keys_ok"]:
                    cell += f"; rows with keys WRONG ({p['rows_with_keys_max_error']:.2g})"
                if p.get("dispatcher_choice", "?") != "?":
                    cell += f" (picks {p['dispatcher_choice']})"
                cells.append(cell)
            lines.append(f"| {dtype_name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "## Gradient of Q, K, V when the loss multiplies the empty rows by 0 (boolean mask)",
        "",
        "| dtype | " + " | ".join(BACKENDS) + " |",
        "|---" * (len(BACKENDS) + 1) + "|",
    ]
    for dtype_name in DTYPES:
        cells = [
            gradient_cell(next(p for p in points if (p["case"], p["backend"], p["dtype"]) == ("bool", b, dtype_name)))
            for b in BACKENDS
        ]
        lines.append(f"| {dtype_name} | " + " | ".join(cells) + " |")
    lines += ["", "## `is_causal=True` when n != m (top-left: query i sees keys j <= i)", ""]
    shapes = sorted({(a["n"], a["m"]) for a in alignments})
    lines += ["| dtype | n, m | " + " | ".join(BACKENDS) + " |", "|---" * (len(BACKENDS) + 2) + "|"]
    for dtype_name in DTYPES:
        for n, m in shapes:
            cells = [
                next(a for a in alignments if (a["backend"], a["dtype"], a["n"], a["m"]) == (b, dtype_name, n, m))["alignment"]
                for b in BACKENDS
            ]
            lines.append(f"| {dtype_name} | {n}, {m} | " + " | ".join(cells) + " |")
    reasons = sorted({(p["backend"], p["reason"]) for p in points + alignments if "reason" in p})
    lines += ["", "## Why a kernel was not available", ""]
    lines += [f"* {backend}: {reason}" for backend, reason in reasons] or ["* every kernel ran every case"]
    if env["device"] == "cpu":
        lines += [
            "",
            "On a CPU PyTorch has two SDPA kernels, FLASH_ATTENTION (a CPU implementation of the tiled algorithm) "
            "and MATH (`select_sdp_backend_cpp` in `aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`); "
            "EFFICIENT_ATTENTION and CUDNN_ATTENTION are CUDA kernels. Run the script on a GPU for their rows.",
        ]
    lines += [
        "",
        f"Rows with keys are compared with a float64 softmax written out by hand; tolerances {TOLERANCE}. "
        f"Raw data: `sdpa_backends_{slug(env)}.json`.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the .md and .json (default: bench/results)")
    args = parser.parse_args()
    start = time.perf_counter()
    env = environment(args.device)
    points = [
        empty_row_point(case, backend, dtype_name, args.device)
        for case in CASES
        for dtype_name in DTYPES
        for backend in BACKENDS
    ]
    alignments = [
        alignment_point(backend, dtype_name, args.device, n, m)
        for dtype_name in DTYPES
        for n, m in ((4, 6), (6, 4))
        for backend in BACKENDS
    ]
    seconds = time.perf_counter() - start
    report = markdown(env, points, alignments, seconds)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"sdpa_backends_{slug(env)}"
    stem.with_suffix(".md").write_text(report)
    data = {"environment": env, "empty_rows": points, "is_causal": alignments}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print(f"wrote {stem}.md and {stem}.json")


if __name__ == "__main__":
    main()
