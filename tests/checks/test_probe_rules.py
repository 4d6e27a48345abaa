"""The rules of an exercise reach every probe that runs the student's code, and what a probe watches cannot be hidden.

Two holes of the same kind, each shown by the submission that used it:

- 08's ``FlashAttention`` check lists what the Function saves for backward through
  ``torch.autograd.graph.saved_tensors_hooks``; an answer that runs ``apply`` under hooks of its own
  saves the n x m probabilities unseen. The grader's reading of the source refuses autograd's
  saved-tensor and graph hooks (:data:`autograder.engine.source_check.EVASIONS`).
- 11's ``MultiHeadLatentAttention`` was run in the graded kernel by a probe that carried no rules:
  neither the kernel's guard nor the grader's reading of the source looked for the forbidden
  built-ins. Every probe a check runs on the student's object of an exercise that forbids
  built-ins now carries them; the last test derives that list from the checks themselves.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from autograder.course.repository import assignments
from autograder.engine import judge, source_check
from autograder.grader import student
from autograder.grader.verify import Case, verify
from autograder.kernel import guard as guard_module
from autograder.kernel.guard import ATTENTION_BUILTINS, ForbiddenCall
from autograder.references.flash_backward import FORWARD_BUILTINS, check_function_cases, qkv
from autograder.references.serving import LatentWeights, mla_reference, run_mla
from autograder.shared.errors import CheckFailed

from ..course_copy import reference_answers
from ..judged import failure
from ..notebook_code import answer_cells
from .test_exercise_rules import exercise_text, forbids, module, partners, solution
from .test_probes import graded_one

# -- 08: what FlashAttention saves, hidden from the probe by hooks of the answer's own -----------------------------

#: Autograd through the textbook formula's pieces, written out: the forward keeps P (n x m) for the backward.
SAVES_P = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if is_causal:
            keep = torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        P = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        P = P / P.sum(dim=-1, keepdim=True)
        ctx.save_for_backward(Q, K, V, P)
        return P @ V

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, P = ctx.saved_tensors
        dP = dO @ V.transpose(-2, -1)
        dS = P * (dP - (dP * P).sum(dim=-1, keepdim=True)) / math.sqrt(Q.shape[-1])
        return dS @ K, dS.transpose(-2, -1) @ Q, P.transpose(-2, -1) @ dO, None, None
'''
#: How the answer hides what it saves: ``apply`` run under hooks of its own, which autograd uses instead of the
#: probe's (only the innermost pair of saved-tensor hooks sees a tensor).
HIDDEN_BY = {
    "saved_tensors_hooks": '''
    @classmethod
    def apply(cls, *args):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return super().apply(*args)
''',
    "save_on_cpu": '''
    @classmethod
    def apply(cls, *args):
        with torch.autograd.graph.save_on_cpu():
            return super().apply(*args)
''',
    "an imported alias": '''
    @classmethod
    def apply(cls, *args):
        with keep(lambda t: t, lambda t: t):
            return super().apply(*args)
''',
}


def hiding(style: str) -> str:
    """:data:`SAVES_P` with ``apply`` overridden in ``style``."""
    source = SAVES_P.replace("    @staticmethod\n    def backward", HIDDEN_BY[style].lstrip("\n") + "\n    @staticmethod\n"
                             "    def backward", 1)
    return ("from torch.autograd.graph import saved_tensors_hooks as keep\n" if style == "an imported alias" else "") + source


def flash_cases() -> list[Case]:
    gen = torch.Generator().manual_seed(870)
    return [Case(qkv(gen, (2,), 8, 8, 4, 4) + (4,), label="n = m = 8, blocks of 4")]


def test_the_probabilities_hidden_by_hooks_are_still_seen_alive_where_the_source_is_not_read():
    """In this process nothing is read: the hooks hide P from the saved tensors, but P is still alive after the
    forward pass, which the record sees as well (the plain one is caught as saved)."""
    namespace: dict = {}
    exec("import math\nimport torch\n" + SAVES_P, namespace)  # noqa: S102 - the test's own answer
    with pytest.raises(CheckFailed, match="saved tensors of shapes"):
        check_function_cases(namespace["FlashAttention"], flash_cases())
    for style in HIDDEN_BY:
        namespace = {}
        exec("import math\nimport torch\n" + hiding(style), namespace)  # noqa: S102
        with pytest.raises(CheckFailed, match="alive after the forward pass"):
            check_function_cases(namespace["FlashAttention"], flash_cases())


#: P kept for the backward pass outside ctx and outside what autograd saves.
KEPT_ELSEWHERE = {
    "in a list at the top level": ("_KEPT = []\n", "_KEPT.append(P)", "P = _KEPT.pop()"),
    "in a dict at the top level": ("_KEPT = {}\n", "_KEPT['P'] = P", "P = _KEPT.pop('P')"),
    "on the class": ("", "FlashAttention.kept = P", "P = FlashAttention.kept"),
}


def keeping(top: str, keep: str, read: str) -> str:
    """:data:`SAVES_P` saving Q, K and V only, P kept by the line ``keep`` and read back by ``read``, ``top`` before."""
    return top + SAVES_P.replace(
        "ctx.save_for_backward(Q, K, V, P)", f"ctx.save_for_backward(Q, K, V)\n        {keep}").replace(
        "Q, K, V, P = ctx.saved_tensors", f"Q, K, V = ctx.saved_tensors\n        {read}")


def keeping_elsewhere(style: str) -> str:
    return keeping(*KEPT_ELSEWHERE[style])


@pytest.mark.parametrize("style", sorted(KEPT_ELSEWHERE))
def test_probabilities_kept_outside_ctx_are_seen_alive(style):
    namespace: dict = {}
    exec("import math\nimport torch\n" + keeping_elsewhere(style), namespace)  # noqa: S102 - the test's own answer
    with pytest.raises(CheckFailed, match="alive after the forward pass"):
        check_function_cases(namespace["FlashAttention"], flash_cases())


@pytest.mark.slow
def test_a_flash_attention_that_keeps_its_probabilities_in_a_global_earns_nothing_for_it_in_the_graded_kernel(tmp_path):
    """The source reader accepts this code (a list at the top level is plain Python): what the record sees alive
    after the forward pass is what catches it, case by case."""
    sources = ["import math\nimport torch", keeping_elsewhere("in a list at the top level")]
    assert source_check.forbidden_use(sources, "FlashAttention", FORWARD_BUILTINS, "FlashAttention") is None
    outputs = graded_one(tmp_path, "08_flash_backward", "FlashAttention", sources[1])
    cases = judge.case_record({"outputs": outputs})["cases"]
    kept = [c for c in cases if not c["passed"] and "alive after the forward" in c.get("message", "")]
    assert len(kept) == 7, cases


@pytest.mark.parametrize("style", sorted(HIDDEN_BY))
def test_the_reader_refuses_autograds_saved_tensor_hooks(style):
    problem = source_check.forbidden_use(["import math\nimport torch", hiding(style)], "FlashAttention",
                                         FORWARD_BUILTINS, "FlashAttention")
    assert problem is not None and "changes what autograd saves" in problem, problem


@pytest.mark.parametrize("line", [
    "torch.autograd.graph.disable_saved_tensors_hooks('no')",
    "Q.register_hook(lambda g: g)",
    "torch.autograd.graph.register_multi_grad_hook((Q, K), lambda gs: None)",
])
def test_the_reader_refuses_autograds_graph_hooks_in_the_forward(line):
    saving = "        ctx.save_for_backward(Q, K, V, P)"
    source = SAVES_P.replace(saving, f"        {line}\n{saving}")
    problem = source_check.forbidden_use(["import math\nimport torch", source], "FlashAttention", FORWARD_BUILTINS,
                                         "FlashAttention")
    assert problem is not None and "backward pass" in problem, problem


#: P kept for the backward pass through an attribute of ctx, one step away from it: in an object of the answer's own
#: class, or in a function's closure (ctx.P itself, or a list on ctx, was always seen).
KEPT_ON_CTX = {
    "in an object": ("ctx.box = Box()\n        ctx.box.P = P", "P = ctx.box.P"),
    "in a closure": ("ctx.weights = lambda: P", "P = ctx.weights()"),
    "in a dict in a list": ("ctx.kept = [{'P': P}]", "P = ctx.kept[0]['P']"),
}


def keeping_on_ctx(style: str) -> str:
    return keeping("class Box:\n    pass\n\n", *KEPT_ON_CTX[style])


@pytest.mark.parametrize("style", sorted(KEPT_ON_CTX))
def test_probabilities_kept_through_an_attribute_of_ctx_are_seen(style):
    namespace: dict = {}
    exec("import math\nimport torch\n" + keeping_on_ctx(style), namespace)  # noqa: S102 - the test's own answer
    with pytest.raises(CheckFailed, match="kept tensors as attributes of ctx"):
        check_function_cases(namespace["FlashAttention"], flash_cases())


#: An honest FlashAttention in another style: its options in a dict and in an object of its own class on ctx, and a
#: scale kept beside them (plain values only, however they are held).
HONEST_OPTIONS_ON_CTX = '''
class Options:
    def __init__(self, block_size, is_causal):
        self.block_size, self.is_causal = block_size, is_causal


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, block_size, is_causal=False):
        O, lse = flash_attention_forward(Q, K, V, block_size, is_causal)
        ctx.save_for_backward(Q, K, V, O, lse)
        ctx.options = Options(block_size, is_causal)
        ctx.sizes = {"n": Q.shape[-2], "m": K.shape[-2], "shape": Q.shape}
        ctx.scale = 1 / math.sqrt(Q.shape[-1])
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, lse = ctx.saved_tensors
        dQ, dK, dV = flash_attention_backward(Q, K, V, O, dO, lse, ctx.options.block_size, ctx.options.is_causal)
        return dQ, dK, dV, None, None
'''


def test_an_honest_flash_attention_with_plain_values_on_ctx_passes_and_is_read_as_honest():
    answers = reference_answers("08_flash_backward")
    sources = ["import math\nimport torch", answers["flash_attention_forward"], answers["flash_attention_backward"],
               HONEST_OPTIONS_ON_CTX]
    assert source_check.forbidden_use(sources, "FlashAttention", FORWARD_BUILTINS, "FlashAttention") is None
    namespace: dict = {}
    for source in sources:
        exec(source, namespace)  # noqa: S102 - the reference's answers and the test's own
    check_function_cases(namespace["FlashAttention"], flash_cases())


#: What the reader refuses because it changes what autograd saves or runs (the probes of 08 rely on both).
AUTOGRAD_HOOKS = sorted(name for name, why in source_check.EVASIONS.items() if "backward pass" in why)


def test_flash_attentions_text_forbids_autograds_hooks():
    """The rule is stated where the student reads it: the section of FlashAttention forbids each hook by name."""
    assert len(AUTOGRAD_HOOKS) >= 7, AUTOGRAD_HOOKS
    text = exercise_text("08_flash_backward", "FlashAttention")
    assert not [name for name in AUTOGRAD_HOOKS if not forbids(text, [name])]


@pytest.mark.slow
def test_a_flash_attention_that_hides_its_saved_probabilities_earns_nothing_in_the_graded_kernel(tmp_path):
    outputs = graded_one(tmp_path, "08_flash_backward", "FlashAttention", hiding("saved_tensors_hooks"))
    record = judge.case_record({"outputs": outputs})
    assert (record or {"score": 0})["score"] == 0, outputs
    assert "changes what autograd saves" in (failure(outputs) or ""), failure(outputs)


# -- 11: MultiHeadLatentAttention's calls carry the exercise's rules -------------------------------------------------

#: The reference's class, with PyTorch's fused attention doing the attention of both paths.
MLA_THROUGH_SDPA = '''
class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, num_heads, d_head, d_latent):
        super().__init__()
        self.num_heads, self.d_head, self.d_latent = num_heads, d_head, d_latent
        self.q_proj = nn.Linear(d_model, num_heads * d_head, bias=False)
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)
        self.k_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.v_up = nn.Linear(d_latent, num_heads * d_head, bias=False)
        self.out_proj = nn.Linear(num_heads * d_head, d_model, bias=False)

    def forward(self, x, latent_cache=None, absorbed=False):
        B, T, _ = x.shape
        h, d = self.num_heads, self.d_head
        q = self.q_proj(x).unflatten(-1, (h, d)).transpose(1, 2)
        c = self.kv_down(x)
        if latent_cache is not None:
            latent_cache.append(c)
            c = torch.cat(list(latent_cache), dim=1)
        m = c.shape[1]
        allowed = torch.arange(m)[None, :] <= torch.arange(m - T, m)[:, None]
        if absorbed:
            w_k = self.k_up.weight.unflatten(0, (h, d))
            w_v = self.v_up.weight.unflatten(0, (h, d))
            latents = c[:, None].expand(B, h, m, self.d_latent)
            out = F.scaled_dot_product_attention(q @ w_k, latents, latents, attn_mask=allowed,
                                                 scale=1 / math.sqrt(d)) @ w_v.transpose(-2, -1)
        else:
            k = self.k_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            v = self.v_up(c).unflatten(-1, (h, d)).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.out_proj(out.transpose(1, 2).flatten(-2))
'''


def test_a_latent_attention_through_sdpa_is_caught_in_process():
    namespace: dict = {}
    exec("import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n" + MLA_THROUGH_SDPA,
         namespace)  # noqa: S102 - the test's own answer
    gen = torch.Generator().manual_seed(0)
    case = Case((LatentWeights(1, 16, 2, 8, 6), torch.randn(1, 5, 16, generator=gen, dtype=torch.float64)),
                {"steps": [3, 2], "absorbed": False})
    with pytest.raises(ForbiddenCall, match="scaled_dot_product_attention"):
        verify(run_mla(namespace["MultiHeadLatentAttention"]), [case], mla_reference,
               exercise="MultiHeadLatentAttention", arg_names=("weights", "x"), outputs=None, forbid=ATTENTION_BUILTINS)


@pytest.mark.slow
@pytest.mark.parametrize("test", ["test_MultiHeadLatentAttention", "test_MultiHeadLatentAttention_hidden"])
def test_a_latent_attention_through_sdpa_earns_nothing_in_the_graded_kernel(tmp_path, test):
    outputs = graded_one(tmp_path, "11_serving", "MultiHeadLatentAttention", MLA_THROUGH_SDPA, test=test)
    record = judge.case_record({"outputs": outputs})
    assert (record or {"score": 0})["score"] == 0, outputs
    assert "scaled_dot_product_attention" in (failure(outputs) or ""), failure(outputs)


@pytest.mark.slow
def test_the_reference_latent_attention_keeps_every_point_in_the_graded_kernel(tmp_path):
    answer = reference_answers("11_serving")["MultiHeadLatentAttention"]
    assert failure(graded_one(tmp_path, "11_serving", "MultiHeadLatentAttention", answer)) is None


# -- every probe on the student's object of an exercise that forbids built-ins carries the rules ---------------------


#: Probes that read what the student's constructor built (the class, the parameters' names and shapes) and run
#: none of the exercise's computation: the rules, which are about how a result is computed, have nothing to watch.
STRUCTURE_ONLY = frozenset({"autograder.references.tiny_decoder:module_parameters",
                            "autograder.references.multi_head:built_module",
                            "autograder.references.multi_head:module_summary"})


def probes_of_the_checks(assignment: str, exercise: str, monkeypatch) -> tuple[bool, list[tuple[str, tuple]]]:
    """Run the exercise's visible and hidden checks on the reference in this process: whether they forbid a
    built-in (a guard with rules was made), and the probes run on the exercise's own answer (or an object of its
    class), each with the rules it was given."""
    answer = getattr(solution(assignment), exercise)
    forbids: list[bool] = []
    probes: list[tuple[str, tuple]] = []
    original_post_init, original_probe = guard_module.Guard.__post_init__, student.probe

    def recording_post_init(self) -> None:
        forbids.append(bool(self.rules))
        original_post_init(self)

    def recording_probe(examine, target, *args, what, forbid=(), **kwargs):
        if target is answer or isinstance(answer, type) and isinstance(target, answer):
            probes.append((f"{examine.__module__}:{examine.__qualname__}", what, tuple(forbid)))
        return original_probe(examine, target, *args, what=what, forbid=forbid, **kwargs)

    monkeypatch.setattr(guard_module.Guard, "__post_init__", recording_post_init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, hidden in (("checks", False), ("hidden", True)):
            checks = module(assignment, kind)
            for name, loaded in list(sys.modules.items()):  # each module binds probe by its own name
                if name.startswith("autograder.") and getattr(loaded, "probe", None) is original_probe:
                    monkeypatch.setattr(loaded, "probe", recording_probe)
            getattr(checks, f"check_{exercise}")(answer, *partners(assignment, exercise, hidden))
    return any(forbids), probes


def exercises():
    for assignment in assignments():
        for exercise in answer_cells(assignment):
            yield pytest.param(assignment, exercise, id=f"{assignment}-{exercise}")


@pytest.mark.parametrize(("assignment", "exercise"), list(exercises()))
def test_every_probe_of_an_exercise_that_forbids_built_ins_carries_its_rules(assignment, exercise, monkeypatch, capsys):
    """In the graded kernel a probe runs the student's code under the rules it is given, and the grader reads the
    source for them before it: a probe given none would let the forbidden built-ins run unseen."""
    forbids, probes = probes_of_the_checks(assignment, exercise, monkeypatch)
    capsys.readouterr()
    bare = sorted({f"{name} ({what})" for name, what, forbid in probes if not forbid and name not in STRUCTURE_ONLY})
    assert not (forbids and bare), (f"{assignment}, exercise {exercise} forbids built-ins, but these probes run the "
                                    f"student's code without its rules: {bare}")


def test_the_probes_of_latent_attention_are_seen_by_the_recording(monkeypatch, capsys):
    """The test above can fail: it sees 11's probes of MultiHeadLatentAttention, each with the exercise's rules."""
    forbids, probes = probes_of_the_checks("11_serving", "MultiHeadLatentAttention", monkeypatch)
    capsys.readouterr()
    names = {name for name, _, _ in probes}
    assert forbids and {"autograder.references.serving:mla_outputs", "autograder.references.serving:absorbed_allocations",
                        "autograder.references.tiny_decoder:module_parameters"} <= names, names
    assert all(forbid == tuple(ATTENTION_BUILTINS) for name, _, forbid in probes if name not in STRUCTURE_ONLY)
