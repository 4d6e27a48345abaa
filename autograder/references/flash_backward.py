"""What is right in notebook 08, FlashAttention's backward pass: PyTorch's autograd through the
math-backend attention as the referee, the built-ins the exercises may not call, the inputs, and
the steps of checking a ``torch.autograd.Function`` both kinds of checks run."""

from __future__ import annotations

import gc
import math
import types
from collections.abc import Sequence
from typing import Any

import torch

from ..grader.cases import case as case_of_check
from ..grader.compare import assert_close, describe, is_close
from ..grader.diagnosis import Mistake, MistakeFound
from ..grader.inputs import math_sdpa, randn
from ..grader.student import probe
from ..grader.verify import Case
from ..kernel.guard import ATTENTION_BUILTINS, ForbiddenCall, Guard, forbidden, forbidden_call
from ..kernel.watches import TensorWatch
from ..references.scaling import BACKWARD, FORWARD_AD, SOFTMAX_BACKWARD
from ..shared.errors import CheckFailed, fail

AUTOGRAD_GRAD = forbidden("torch.autograd.grad", "jacobian", "jacrev", "vjp", "hessian")


SDPA_BACKWARD = forbidden(
    "the backward of torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
)


#: Gradients are written from the formulas: no automatic differentiation, no built-in backward.
AUTOGRAD_BUILTINS = (AUTOGRAD_GRAD, BACKWARD, FORWARD_AD, SOFTMAX_BACKWARD)


#: The forward pass is written from scratch: no SDPA (whose CPU kernel also returns the logsumexp).
FORWARD_BUILTINS = (*ATTENTION_BUILTINS, SDPA_BACKWARD)


#: The backward passes: neither SDPA nor automatic differentiation.
BACKWARD_BUILTINS = (*ATTENTION_BUILTINS, SDPA_BACKWARD, *AUTOGRAD_BUILTINS)


GRADS = ("dQ", "dK", "dV")


FORWARD_ARGS = ("Q", "K", "V", "block_size")


BACKWARD_ARGS = ("Q", "K", "V", "O", "dO", "lse", "block_size")


def autograd_softmax_backward(p: torch.Tensor, grad_p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient of the scores s with p = softmax(s), by autograd of torch.softmax at s = log p."""
    scores = p.detach().log().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(torch.softmax(scores, dim=dim), scores, grad_p)
    return grad


def causal_top_left(n: int, m: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (n, m): query i may attend to key j when j <= i (SDPA's ``is_causal=True``)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril()


def sdpa_gradients(Q, K, V, dO, is_causal=False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of SDPA (math backend) for the upstream gradient dO, by autograd."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (Q, K, V)]
    with torch.enable_grad():
        O = math_sdpa(*leaves, is_causal=is_causal)
        return tuple(g.detach() for g in torch.autograd.grad(O, leaves, dO))


def scaled_logsumexp(Q: torch.Tensor, K: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """torch.logsumexp of each row of the scaled scores Q K^T / sqrt(d), masked keys left out."""
    scores = torch.matmul(Q, K.mT) * Q.shape[-1] ** -0.5
    if is_causal:
        scores = scores.masked_fill(~causal_top_left(Q.shape[-2], K.shape[-2], Q.device), -math.inf)
    return torch.logsumexp(scores, dim=-1)


def forward_reference(Q, K, V, block_size, is_causal=False) -> tuple[torch.Tensor, torch.Tensor]:
    """What flash_attention_forward must return: (SDPA's output, the logsumexp of each row)."""
    return math_sdpa(Q, K, V, is_causal=is_causal), scaled_logsumexp(Q, K, is_causal)


def backward_reference(Q, K, V, O, dO, lse, block_size, is_causal=False):
    """What flash_attention_backward must return: the gradients of SDPA, by autograd."""
    return sdpa_gradients(Q, K, V, dO, is_causal)


def attention_backward_reference(Q, K, V, dO, is_causal=False):
    """What attention_backward must return: the gradients of SDPA, by autograd."""
    return sdpa_gradients(Q, K, V, dO, is_causal)


def backward_case(Q, K, V, dO, block_size: int, is_causal: bool, label: str) -> Case:
    """A case of flash_attention_backward: O and lse computed exactly (float64), then cast to the inputs' dtype."""
    O, lse = forward_reference(*(t.double() for t in (Q, K, V)), block_size, is_causal)
    args = (Q, K, V, O.to(Q.dtype), dO, lse.to(Q.dtype), block_size)
    return Case(args, {"is_causal": True} if is_causal else {}, label)


def qkv(gen: torch.Generator, batch: tuple, n: int, m: int, d_k: int, d_v: int, dtype=torch.float64, scale=1.0):
    """Random Q (batch, n, d_k), K (batch, m, d_k), V (batch, m, d_v) and dO (batch, n, d_v)."""
    return (scale * randn(*batch, n, d_k, gen=gen, dtype=dtype), scale * randn(*batch, m, d_k, gen=gen, dtype=dtype),
            randn(*batch, m, d_v, gen=gen, dtype=dtype), randn(*batch, n, d_v, gen=gen, dtype=dtype))


def softmax_rows(gen: torch.Generator, *shape: int, dim: int = -1, scale: float = 2.0) -> torch.Tensor:
    """Random softmax outputs of ``shape`` along ``dim``: every entry positive, each row summing to one."""
    return torch.softmax(scale * randn(*shape, gen=gen), dim=dim)


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _error_text(error: BaseException, function: Any) -> list[str]:
    """[type, message] of an error, with the class's own name written as FlashAttention (for comparisons)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    name = getattr(function, "__name__", "")
    if name and name != "FlashAttention":
        message = message.replace(name, "FlashAttention")
    return [type(error).__name__, message]


#: How deep :func:`_tensors_on` looks inside what an attribute of ctx holds.
CTX_DEPTH = 8


def _held_by(value: Any) -> list:
    """What ``value`` holds that may hold a tensor: a container's items, an object's attributes, a function's
    closure and defaults (a tensor kept in a box, a lambda or a list on ctx is kept all the same)."""
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, types.FunctionType):
        return [*_cells(value), *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    if isinstance(value, types.MethodType):
        return [value.__self__, value.__func__]
    if hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)):
        return list(vars(value).values())
    return []


def _cells(function: types.FunctionType) -> list:
    """The values of ``function``'s closure (a cell not filled yet holds nothing)."""
    values = []
    for cell in function.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            pass
    return values


def _tensors_on(ctx: Any) -> list[list]:
    """[attribute, shape] of every tensor kept through an attribute of ctx: directly, or in what it holds (a list,
    a dict, an object's attributes, a function's closure), up to :data:`CTX_DEPTH` steps deep."""
    found, seen = [], set()
    for name, value in sorted(vars(ctx).items()) if hasattr(ctx, "__dict__") else []:
        todo = [(value, 0)]
        while todo:
            value, depth = todo.pop()
            if id(value) in seen or depth > CTX_DEPTH:
                continue
            seen.add(id(value))
            if isinstance(value, torch.Tensor):
                found.append([name, list(value.shape)])
            else:
                todo += [(held, depth + 1) for held in _held_by(value)]
    return found


def function_record(function, Q, K, V, dO, block_size: int, is_causal: bool) -> dict:
    """A probe: ``function.apply(Q, K, V, block_size, is_causal)``, what it saves, and its gradients.

    Returns plain data: ``saved`` ([shape, bytes] of each tensor saved for backward, through
    ``torch.autograd.graph.saved_tensors_hooks``), ``saved_bytes`` (the bytes of their distinct
    storages), ``kept_bytes`` (the bytes of the other tensors the forward pass made that are still
    alive after it, the output's aside: kept in a global, a closure, ..., seen by a
    :class:`~autograder.kernel.watches.TensorWatch`), ``ctx_tensors`` (tensors kept through attributes of
    ctx), ``output``, ``grads`` (by ``torch.autograd.grad`` with dO), or ``error`` ([type, message])
    and ``stage`` where it failed.
    """
    Q, K, V = (t.detach().clone().requires_grad_(True) for t in (Q, K, V))
    saved: list[list] = []
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        address, size = _storage_key(t)
        saved.append([list(t.shape), size])
        storages[address] = size
        return t

    record: dict[str, Any] = {"saved": saved}
    watch = TensorWatch([Q, K, V], rows=2**62, cols=2**62, max_elements=2**62)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watch:
            out = function.apply(Q, K, V, block_size, is_causal)
    except NotImplementedError:
        raise  # not written yet: the caller says so
    except Exception as error:  # noqa: BLE001 - the student's error is part of the record
        return dict(record, error=_error_text(error, function), stage="forward")
    record["saved_bytes"] = sum(storages.values())
    if not isinstance(out, torch.Tensor):
        return dict(record, returned=describe(out))
    inputs = {_storage_key(t)[0] for t in (Q, K, V)}  # not made by the forward pass
    for generation in (1, 2):  # what only a reference cycle keeps is not kept; the young ones first (cheaper)
        gc.collect(generation)
        made = {address: size for address, size in [*storages.items(), _storage_key(out)]
                if address in watch.alive and address not in inputs}
        record["kept_bytes"] = watch.current - sum(made.values())
        if record["kept_bytes"] < kept_limit(Q, K):
            break
    record["output"] = out.detach()
    if out.grad_fn is None:
        return dict(record, returned="a tensor that autograd cannot differentiate (no grad_fn)")
    record["ctx_tensors"] = _tensors_on(out.grad_fn)
    try:
        grads = torch.autograd.grad(out, (Q, K, V), dO.to(out.dtype), allow_unused=True)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the student's error is part of the record
        return dict(record, error=_error_text(error, function), stage="backward")
    record["grads"] = tuple(None if g is None else g.detach() for g in grads)
    return record


def backward_under_guard(function, Q, K, V, dO, block_size: int, is_causal: bool) -> None:
    """A probe: run the student's backward directly (``out.grad_fn.apply(dO)``) under a guard against
    automatic differentiation and SDPA; raise the guard's error on a forbidden call."""
    Q, K, V = (t.detach().clone().requires_grad_(True) for t in (Q, K, V))
    out = function.apply(Q, K, V, block_size, is_causal)
    guard = Guard(BACKWARD_BUILTINS, "FlashAttention.backward")
    try:
        with guard:
            out.grad_fn.apply(dO.to(out.dtype))
    except ForbiddenCall:
        raise
    except Exception:  # noqa: BLE001 - errors are reported by function_record
        pass
    if guard.violations:
        raise forbidden_call(guard.violations[0], "FlashAttention.backward")


def function_values(function, points: list, dOs: list, block_size: int, is_causal: bool) -> tuple[list, list]:  # noqa: N803
    """A probe: ``function.apply(Q, K, V, block_size, is_causal)`` at each ``(Q, K, V)`` of ``points``, and the
    gradients autograd gets through it at the first point for each upstream gradient of ``dOs``.

    Returns ``(outputs, grads)``, plain data for the grader's gradcheck (:func:`check_gradcheck`).
    """
    outputs = [function.apply(Q, K, V, block_size, is_causal).detach() for Q, K, V in points]
    leaves = [t.detach().clone().requires_grad_(True) for t in points[0]]
    out = function.apply(*leaves, block_size, is_causal)
    grads = [torch.autograd.grad(out, leaves, dO, retain_graph=True, allow_unused=True) for dO in dOs]
    return outputs, [tuple(None if g is None else g.detach() for g in row) for row in grads]


def _jacobian_problem(outputs: list, grads: list, inputs: tuple, eps: float, rtol: float, atol: float) -> str | None:
    """Where the gradients (``grads``: one row of the Jacobian per upstream gradient) disagree with the central
    differences of the outputs (``outputs``: at the inputs, then at each entry of each input moved by -eps, +eps)."""
    shape = outputs[0].shape
    if any(not isinstance(o, torch.Tensor) or o.shape != shape for o in outputs):
        return "the output's shape changed when an input moved by a tiny amount"
    at = 1
    for name, x, column in zip(("Q", "K", "V"), inputs, zip(*grads)):
        if any(g is None for g in column):
            return f"backward gives no gradient for {name}: it must return (dQ, dK, dV, None, None)"
        if any(not isinstance(g, torch.Tensor) or g.shape != x.shape for g in column):
            return f"the gradient d{name} does not have the shape of {name}, {tuple(x.shape)}"
        moved = outputs[at:at + 2 * x.numel()]
        at += 2 * x.numel()
        numerical = torch.stack([(plus - minus).flatten() / (2 * eps) for minus, plus in zip(moved[::2], moved[1::2])],
                                dim=1)  # (outputs, entries of x)
        analytical = torch.stack([g.flatten() for g in column])
        gap = (analytical - numerical).abs()
        if bool((gap > atol + rtol * numerical.abs()).any()):
            return (f"Jacobian mismatch for the output with respect to {name}: the gradient your backward returns "
                    f"differs from finite differences of your forward by up to {gap.max().item():.3g}")
    return None


def check_gradcheck(FlashAttention, Q, K, V, block_size: int, is_causal: bool) -> None:  # noqa: N803
    """Fail unless gradcheck accepts the student's Function at Q, K, V (float64): the Jacobian its backward gives
    against central differences of its forward, entry by entry, as ``torch.autograd.gradcheck`` compares them.

    It runs here, in the grader: the Function's outputs at the moved inputs and its gradients for each
    output entry come back as data (:func:`function_values`), so code in the student's kernel can change
    what the comparison is given, never what it concludes.
    """
    what = f"torch.autograd.gradcheck of FlashAttention.apply(Q, K, V, {block_size}, {is_causal})"
    eps, rtol, atol = 1e-6, 1e-5, 1e-7
    inputs = tuple(t.detach().double() for t in (Q, K, V))
    points = [inputs]
    for index, x in enumerate(inputs):
        for entry in range(x.numel()):
            for step in (-eps, eps):
                moved = x.clone()
                moved.view(-1)[entry] += step
                points.append(tuple(moved if i == index else t for i, t in enumerate(inputs)))
    n_out = math.prod(Q.shape[:-1]) * V.shape[-1]
    dOs = [torch.eye(n_out, dtype=torch.float64)[j].reshape(*Q.shape[:-1], V.shape[-1]) for j in range(n_out)]
    outputs, grads = probe(function_values, FlashAttention, points, dOs, block_size, is_causal, what=what,
                           forbid=FORWARD_BUILTINS)
    problem = _jacobian_problem(list(outputs), [tuple(row) for row in grads], inputs, eps, rtol, atol)
    if problem:
        fail(f"{what} with Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} failed: {problem}.\n"
             "gradcheck compares the gradients your backward returns with finite differences of your forward.")


def kept_limit(Q: torch.Tensor, K: torch.Tensor) -> int:
    """Bytes of one n x m matrix of Q's dtype: FlashAttention's forward pass may not leave that much alive besides its
    output and what it saves (a block's mask an answer caches is less; P, or the scores, of any layout is more)."""
    return Q.shape[-2] * K.shape[-2] * Q.element_size()


def saved_budget(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> int:
    """Bytes of Q, K, V, O and lse: all FlashAttention may keep between forward and backward."""
    queries = Q.numel() // Q.shape[-1]  # every query of every batch entry: one lse each
    return (Q.numel() + K.numel() + V.numel() + queries * V.shape[-1] + queries) * Q.element_size()


def _n_by_m(saved: list[list], n: int, m: int) -> list[list[int]]:
    """The saved shapes with an axis of n queries and another of m keys (the size of P)."""
    return [shape for shape, _ in saved
            if any(a == n and b == m for i, a in enumerate(shape) for j, b in enumerate(shape) if i != j)]


def function_problem(record: dict, case: Case) -> tuple[str, Any, str] | None:
    """The first problem of a :func:`function_record`: (kind, evidence, message), or None.

    ``kind`` and ``evidence`` let a student's record be compared with a catalogued mistake's.
    """
    Q, K, V, dO, block_size = case.args
    causal = case.kwargs.get("is_causal", False)
    call = f"FlashAttention.apply(Q, K, V, {block_size}, {causal})"
    if "error" in record:
        kind, message = record["error"]
        return "error", tuple(record["error"]), (
            f"{call} raised {kind} in the {record['stage']} pass: {message}" + (
                "\nbackward must return one gradient per input of forward: (dQ, dK, dV, None, None), None for "
                "block_size and is_causal." if "incorrect number of gradients" in message else ""))
    if "returned" in record:
        return "returned", record["returned"], (
            f"{call} should return the output O, a tensor of shape {tuple(Q.shape[:-1]) + (V.shape[-1],)}, but it "
            f"returned {record['returned']}. forward returns O only: the logsumexp is saved with "
            "ctx.save_for_backward, not returned.")
    n, m = Q.shape[-2], K.shape[-2]
    big = _n_by_m(record["saved"], n, m)
    if big:
        return "saved n x m", sorted(big), (
            f"{call} saved tensors of shapes {', '.join(str(tuple(s)) for s in big)} for the backward pass (seen through "
            f"torch.autograd.graph.saved_tensors_hooks): an n x m = {n} x {m} tensor per head, as autograd through "
            "the naive formula keeps. FlashAttention saves Q, K, V, O and the logsumexp of each row, and "
            "recomputes the weights block by block in backward.")
    if record["ctx_tensors"]:
        names = [name for name, _ in record["ctx_tensors"]]
        return "ctx tensors", sorted(names), (
            f"{call} kept tensors as attributes of ctx ({', '.join('ctx.' + x for x in names)}). Save tensors with "
            "ctx.save_for_backward(Q, K, V, O, lse) and read them back with ctx.saved_tensors: autograd then "
            "checks that they were not changed in place, and frees them after backward. Attributes are for "
            "plain values such as block_size and is_causal.")
    budget = saved_budget(Q, K, V)
    kept = record.get("kept_bytes", 0)
    if kept >= kept_limit(Q, K):
        return "kept bytes", kept, (
            f"{call} left {kept} bytes of tensors it made alive after the forward pass, besides its output and what "
            f"it saved for backward: as much as an n x m = {n} x {m} matrix. Tensors kept in a global, a closure or "
            "a cache are kept all the same. FlashAttention saves Q, K, V, O and the logsumexp with "
            "ctx.save_for_backward, and keeps nothing else.")
    if record["saved_bytes"] > budget:
        shapes = [shape for shape, _ in record["saved"]]
        return "saved bytes", record["saved_bytes"], (
            f"{call} saved {record['saved_bytes']} bytes for the backward pass (tensors of shapes {shapes}), more "
            f"than the {budget} bytes of Q, K, V, O and lse together. Save Q, K, V, O and lse only.")
    tolerance = {"rtol": 1e-9, "atol": 1e-11} if Q.dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    Q, K, V, dO = (t.double() for t in (Q, K, V, dO))
    try:
        assert_close(record["output"], math_sdpa(Q, K, V, is_causal=causal), f"The output of {call}", **tolerance)
    except CheckFailed as failure:
        return "output", record["output"], str(failure)
    grads = record["grads"]
    for name, got, want in zip(GRADS, grads, sdpa_gradients(Q, K, V, dO, causal)):
        if got is None:
            return "grads", grads, (
                f"After {call}, autograd gives no gradient for {name[1]}: backward must return (dQ, dK, dV, None, "
                "None), the gradient of each of Q, K and V.")
        try:
            assert_close(got, want, f"The gradient {name} that autograd gets from {call}", **tolerance)
        except CheckFailed as failure:
            return "grads", grads, f"{failure}\nIt is compared with autograd through F.scaled_dot_product_attention."
    return None


def same_evidence(a: Any, b: Any) -> bool:
    """Whether two pieces of evidence agree: tensors within 1e-6, tuples element by element, else ==."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_evidence(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return is_close(a, b, 1e-6, 1e-8)
    return a == b


def check_function_cases(FlashAttention, cases: Sequence[Case], mistakes: Sequence[Mistake] = ()) -> None:  # noqa: N803
    """Run each case through the student's Function (a probe); fail on the first problem, naming a mistake
    of the catalogue that has the same problem with the same evidence."""
    for case in cases:
        Q, K, V, dO, block_size = case.args
        causal = case.kwargs.get("is_causal", False)
        what = f"FlashAttention.apply(Q, K, V, {block_size}, {causal})"
        with case_of_check(case.label or what, case.weight):
            record = probe(function_record, FlashAttention, Q, K, V, dO, block_size, causal, what=what,
                           forbid=FORWARD_BUILTINS)
            problem = function_problem(record, case)
            if problem is None:
                continue
            kind, evidence, message = problem
            message = f"With the input {case.describe(('Q', 'K', 'V', 'dO', 'block_size'))}:\n{message}"
            for mistake in mistakes:
                theirs = function_problem(probe(function_record, mistake.fn, Q, K, V, dO, block_size, causal,
                                                what=what), case)
                if theirs is not None and theirs[0] == kind and same_evidence(theirs[1], evidence):
                    raise MistakeFound(message, [mistake])
            fail(message)


def check_backward_guard(FlashAttention, Q, K, V, dO, block_size: int, is_causal: bool) -> None:  # noqa: N803
    """Fail if the student's backward calls automatic differentiation or SDPA.

    The guard that watches the backward runs in the student's kernel, where code can replace it; the
    grader also reads the Function's source for the same built-ins before the probe runs (``forbid``).
    """
    probe(backward_under_guard, FlashAttention, Q, K, V, dO, block_size, is_causal,
          what=f"FlashAttention's backward (Q, K, V, {block_size}, {is_causal})", forbid=BACKWARD_BUILTINS)
