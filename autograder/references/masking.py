"""What is right in notebook 03, masks: PyTorch's masked attention as the referee, the masks it takes, and a
padding mask made on the device of its lengths whatever the default device is."""

from __future__ import annotations

import warnings

import torch
from torch.nn.utils.rnn import pad_sequence

from ..grader.compare import is_close
from ..grader.diagnosis import run
from ..grader.inputs import math_sdpa
from ..shared.errors import fail

INF = float("inf")


def sdpa_causal_pattern(n: int, m: int) -> torch.Tensor:
    """The keys ``F.scaled_dot_product_attention(..., is_causal=True)`` lets each query see.

    With all scores equal (zero queries and keys) and the identity as values, the output
    is the weight matrix itself: uniform over the allowed keys, zero elsewhere.
    """
    zeros_q = torch.zeros(n, 1, dtype=torch.float64)
    zeros_k = torch.zeros(m, 1, dtype=torch.float64)
    weights = math_sdpa(zeros_q, zeros_k, torch.eye(m, dtype=torch.float64), is_causal=True)
    return weights > 0


def lower_right_pattern(n: int, m: int) -> torch.Tensor:
    """``torch.nn.attention.bias.causal_lower_right(n, m)`` as a boolean (n, m) matrix."""
    # imported here: it imports TorchDynamo (a CPU second), which every process that imports the checks would pay
    # (each grading run's fork server, the grader), though only the checks of 03 and 09 call this
    from torch.nn.attention.bias import causal_lower_right

    with warnings.catch_warnings():
        # PyTorch warns that rows without keys may give NaN when n > m; the pattern is what we want.
        warnings.simplefilter("ignore")
        return causal_lower_right(n, m)._materialize().to(torch.bool)


def causal_reference(n, m=None, *, align="top_left", device=None):
    """The mask SDPA's ``is_causal=True`` (top-left) or ``causal_lower_right`` (bottom-right) uses, on ``device``."""
    m = n if m is None else m
    mask = sdpa_causal_pattern(n, m) if align == "top_left" else lower_right_pattern(n, m)
    return mask if device is None else mask.to(device)


def padding_reference(lengths, max_len):
    """Pad sequences of True of the given lengths with False up to ``max_len`` (``pad_sequence``)."""
    rows = [torch.ones(int(length), dtype=torch.bool) for length in lengths]
    rows.append(torch.zeros(max_len, dtype=torch.bool))  # forces the padded length to max_len
    return pad_sequence(rows, batch_first=True, padding_value=False)[:-1]


def allowed_keys(mask: torch.Tensor | None, scores_shape: torch.Size) -> torch.Tensor:
    """Which (query, key) pairs a bool or float mask allows, broadcast to ``scores_shape``."""
    if mask is None:
        return torch.ones(scores_shape, dtype=torch.bool)
    allowed = mask if mask.dtype == torch.bool else mask > -INF
    return allowed.expand(scores_shape)


def masked_attention_reference(Q, K, V, mask=None):
    """SDPA (math backend, float64) with ``attn_mask``; its weights are SDPA applied to the identity.

    Rows with no allowed key are set to exactly zero: the convention of this course.
    """
    q, k, v = Q.double(), K.double(), V.double()
    attn_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    m = k.shape[-2]
    eye = torch.eye(m, dtype=torch.float64).expand(*k.shape[:-2], m, m)
    output = math_sdpa(q, k, v, attn_mask=attn_mask)
    weights = math_sdpa(q, k, eye, attn_mask=attn_mask)
    no_key = ~allowed_keys(mask, weights.shape).any(dim=-1, keepdim=True)
    output = output.masked_fill(no_key, 0.0)
    weights = weights.masked_fill(no_key, 0.0)
    return output.to(Q.dtype), weights.to(Q.dtype)


def assert_exact_zeros(result, mask, what: str) -> None:
    """Rows with no allowed key must be exactly zero (weights and output), never NaN."""
    output, weights = result
    no_key = ~allowed_keys(mask, weights.shape).any(dim=-1)
    for name, value in (("weights", weights), ("output", output)):
        rows = value[no_key]
        if not bool((rows == 0).all()):
            bad = rows[rows != 0]
            fail(
                f"{what}: the {name} of the rows with no allowed key should be exactly 0, "
                f"but they contain {bad[0].item():.6g}"
                + (" (NaN: softmax of a row that is all -inf is 0/0)." if bool(bad.isnan().any()) else ".")
            )


#: What moving a meta tensor says: it holds no data. An answer that built the mask on the default device and
#: moved it to the device of ``lengths`` itself says it; with a default device that holds data it is right.
MOVED_OFF_META = "Cannot copy out of meta tensor"


def padding_mask_off_the_default_device(padding_mask, lengths: torch.Tensor, max_len: int) -> dict:
    """A probe: ``padding_mask(lengths, max_len)`` with PyTorch's default device set to meta, ``lengths`` on the CPU.

    Returns ``{"moved": True}`` when the answer built on the default device and moved its result to the device
    of ``lengths`` (right, but meta has no data to move), ``{"error": ...}`` for another error, and otherwise
    the result's device and, when it is on the CPU, its values.
    """
    try:
        with torch.device("meta"):
            mask = padding_mask(lengths, max_len)
    except Exception as error:  # noqa: BLE001 - NotImplementedError included: meta's, not an unwritten answer's
        if MOVED_OFF_META in str(error):
            return {"moved": True}
        return {"error": f"{type(error).__name__}: {error}"}
    if not isinstance(mask, torch.Tensor):
        return {"returned": type(mask).__name__}
    return {"device": mask.device.type, "values": mask.tolist() if mask.device.type == "cpu" else None}


def default_device_problem(record: dict, lengths: list[int], max_len: int) -> str | None:
    """What is wrong with a :func:`padding_mask_off_the_default_device` record, or None."""
    call = (f"With PyTorch's default device set to another device than that of lengths (here `with "
            f"torch.device(\"meta\"):`, lengths on the CPU), padding_mask(tensor({lengths}), {max_len})")
    fix = ("A tensor made without device= goes to the default device, which a program may set "
           "(torch.set_default_device(\"cuda\")), and torch.as_tensor(lengths) or torch.tensor(lengths) copies "
           "lengths there: build the mask on the device of lengths, torch.arange(max_len, device=lengths.device).")
    if record.get("moved"):
        return None
    if "error" in record:
        return f"{call} raised {record['error']}\n{fix}"
    if "returned" in record:
        return f"{call} returned a {record['returned']}, not a tensor."
    if record["device"] != "cpu":
        return f"{call} returned a mask on the {record['device']} device, not on the CPU where lengths is.\n{fix}"
    expected = padding_reference(torch.tensor(lengths), max_len).tolist()
    if record["values"] != expected:
        return f"{call} returned {record['values']}, not {expected}."
    return None


def same_off_the_default_device(mistakes, record: dict, lengths: list[int], max_len: int) -> list:
    """Of ``mistakes`` (padding masks), those right on the CPU that do what ``record`` says off the default device."""
    right = padding_reference(torch.tensor(lengths), max_len)
    found = []
    for mistake in mistakes:
        on_the_cpu = run(mistake.fn, (torch.tensor(lengths), max_len))
        if (on_the_cpu.error is None and is_close(on_the_cpu.value, right, 0.0, 0.0)
                and padding_mask_off_the_default_device(mistake.fn, torch.tensor(lengths), max_len) == record):
            found.append(mistake)
    return found
