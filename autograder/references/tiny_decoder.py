"""What is right in notebook 09's tiny decoder: its parameters and reference weights, the block and the
model computed from PyTorch functions, how the checks build, run, probe and train the student's
DecoderBlock, TinyDecoder and generate. Decoding and the KV cache are in
:mod:`autograder.references.decoding_and_training`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..grader.compare import assert_close
from ..grader.inputs import generator, randn
from ..grader.student import call_student, harness, probe
from ..shared.errors import CheckFailed, fail
from .decoding_and_training import causal_rope_attention


def block_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    """The parameters of a DecoderBlock, by name, with their shapes."""
    square = (d_model, d_model)
    return {"norm1.weight": (d_model,), "q_proj.weight": square, "k_proj.weight": square, "v_proj.weight": square,
            "out_proj.weight": square, "norm2.weight": (d_model,), "fc1.weight": (d_ff, d_model), "fc1.bias": (d_ff,),
            "fc2.weight": (d_model, d_ff), "fc2.bias": (d_model,)}


def decoder_shapes(vocab: int, d_model: int, d_ff: int, num_layers: int) -> dict[str, tuple[int, ...]]:
    """The parameters of a TinyDecoder, by name, with their shapes."""
    shapes = {"embed.weight": (vocab, d_model)}
    for i in range(num_layers):
        shapes |= {f"blocks.{i}.{name}": shape for name, shape in block_shapes(d_model, d_ff).items()}
    return shapes | {"norm.weight": (d_model,)}


def random_state(shapes: dict[str, tuple[int, ...]], gen: torch.Generator, dtype=torch.float64) -> dict:
    """Random weights for every parameter: matrices scaled by 1/sqrt(fan-in), norm gains around 1."""
    state = {}
    for name, shape in shapes.items():
        noise = randn(*shape, gen=gen, dtype=dtype)
        if "norm" in name:
            state[name] = 1.0 + 0.2 * noise
        elif name.endswith("bias"):
            state[name] = 0.1 * noise
        else:
            state[name] = noise / math.sqrt(shape[-1])
    return state


class Weights:
    """The weights of a block or a model, plus its sizes; a one-line repr names it in a message."""

    def __init__(self, seed: int, d_model: int, num_heads: int, d_ff: int, *, vocab: int | None = None,
                 num_layers: int | None = None, rope_base: float = 10000.0, dtype=torch.float64) -> None:
        gen = generator(seed)
        shapes = block_shapes(d_model, d_ff) if vocab is None else decoder_shapes(vocab, d_model, d_ff, num_layers)
        self.state = random_state(shapes, gen, dtype)
        self.d_model, self.num_heads, self.d_ff, self.rope_base = d_model, num_heads, d_ff, rope_base
        self.vocab, self.num_layers, self.dtype = vocab, num_layers, dtype

    def __repr__(self) -> str:
        if self.vocab is None:
            base = "" if self.rope_base == 10000.0 else f", rope_base={self.rope_base}"
            return f"DecoderBlock({self.d_model}, {self.num_heads}, {self.d_ff}{base}) with random {self.dtype} weights"
        return (f"TinyDecoder({self.vocab}, {self.d_model}, {self.num_heads}, {self.d_ff}, {self.num_layers}) with "
                f"random {self.dtype} weights")


def block_reference(weights: Weights, x: torch.Tensor, steps=None, prefix: str = "") -> torch.Tensor:
    """Pre-norm block from PyTorch functions: x + attn(rms_norm(x)), then + fc2(gelu(fc1(rms_norm(.)))).

    Attention is SDPA's causal attention over the whole sequence with RoPE at positions
    0..T-1; how the sequence was cut into ``steps`` must not matter.
    """
    w = {name[len(prefix):]: t for name, t in weights.state.items() if name.startswith(prefix)}
    B, T, D = x.shape
    h = weights.num_heads

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (h, D // h)).transpose(1, 2)

    normed = F.rms_norm(x, (D,), w["norm1.weight"], eps=1e-6)
    q, k, v = (heads(F.linear(normed, w[f"{p}.weight"])) for p in ("q_proj", "k_proj", "v_proj"))
    attended, _, _ = causal_rope_attention(q, k, v, weights.rope_base)
    x = x + F.linear(attended.transpose(1, 2).flatten(-2), w["out_proj.weight"])
    hidden = F.gelu(F.linear(F.rms_norm(x, (D,), w["norm2.weight"], eps=1e-6), w["fc1.weight"], w["fc1.bias"]))
    return x + F.linear(hidden, w["fc2.weight"], w["fc2.bias"])


def decoder_reference(weights: Weights, tokens: torch.Tensor) -> torch.Tensor:
    """TinyDecoder's logits from PyTorch functions: embedding, blocks, final RMSNorm, the embedding as output layer."""
    x = F.embedding(tokens, weights.state["embed.weight"])
    for i in range(weights.num_layers):
        x = block_reference(weights, x, prefix=f"blocks.{i}.")
    x = F.rms_norm(x, (weights.d_model,), weights.state["norm.weight"], eps=1e-6)
    return x @ weights.state["embed.weight"].T


def greedy_reference(weights: Weights, prompt: torch.Tensor, steps: int, use_cache: bool = True) -> torch.Tensor:
    """Greedy decoding by recomputing the whole sequence at every step (the cache must not change the tokens)."""
    tokens = prompt
    for _ in range(steps):
        choice = decoder_reference(weights, tokens)[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, choice], dim=1)
    return tokens[:, prompt.shape[1]:]


#: The epsilon of every norm of the course's decoder, 1e-6 (nn.RMSNorm's default, None, is the dtype's machine epsilon).
NORM_EPS = 1e-6


def module_parameters(module) -> dict:
    """Probe: whether ``module`` is an nn.Module, the shape of each of its parameters and the eps of its norms, by name."""
    if not isinstance(module, nn.Module):
        return {"is_module": False, "type": type(module).__name__, "parameters": {}, "norms": {}}
    return {"is_module": True, "type": type(module).__name__,
            "parameters": {name: list(p.shape) for name, p in module.named_parameters()},
            "norms": {name: (type(m).__name__, m.eps) for name, m in module.named_modules()
                      if isinstance(m, (nn.RMSNorm, nn.LayerNorm))}}


def check_parameters(module, expected: dict[str, tuple[int, ...]], what: str) -> None:
    """Fail unless the student's module is an nn.Module with exactly the expected parameters."""
    summary = probe(module_parameters, module, what=f"the parameters of {what}")
    if not summary["is_module"]:
        fail(f"{what} should be an nn.Module, but it is a {summary['type']}: subclass nn.Module and call "
             "super().__init__() first.")
    got = {name: tuple(shape) for name, shape in summary["parameters"].items()}
    missing = [f"{n} {s}" for n, s in expected.items() if n not in got]
    extra = [f"{n} {s}" for n, s in got.items() if n not in expected]
    wrong = [f"{n} is {got[n]}, not {s}" for n, s in expected.items() if n in got and got[n] != s]
    if missing or extra or wrong:
        parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
            [f"not expected: {', '.join(extra)}"] if extra else []) + ([f"wrong shapes: {'; '.join(wrong)}"] if wrong
                                                                       else [])
        fail(f"The parameters of {what} should be exactly {', '.join(f'{n} {s}' for n, s in expected.items())}; "
             f"{'; '.join(parts)}. The checks load reference weights by these names (nn.RMSNorm(d_model, eps=1e-6) "
             "for norm1 and norm2, nn.Linear(d_model, d_model, bias=False) for the projections, nn.Linear with "
             "biases for fc1 and fc2).")
    off = {name: (kind, eps) for name, (kind, eps) in summary["norms"].items()
           if not isinstance(eps, float) or not math.isclose(eps, NORM_EPS, rel_tol=1e-9)}
    if off:
        fail(f"The norms of {what} should be made with eps=1e-6, but "
             + ", ".join(f"{name} is nn.{kind} with eps={eps}" for name, (kind, eps) in off.items())
             + ": write nn.RMSNorm(d_model, eps=1e-6). Without it, nn.RMSNorm adds the machine epsilon of the "
             "input's dtype, and every output moves slightly: an error the size of float32 rounding, though "
             "nothing was computed in float32.")


@harness
def run_block(DecoderBlock, KVCache) -> Callable[..., Any]:  # noqa: N803
    """How a check runs a DecoderBlock: built by its constructor, given the weights, fed whole or in ``steps``."""

    def run(weights, x, steps=None):
        block = DecoderBlock(weights.d_model, weights.num_heads, weights.d_ff, weights.rope_base)
        block = block.to(x.dtype)
        block.load_state_dict({name: t.to(x.dtype) for name, t in weights.state.items()}, strict=False)
        if steps is None:
            return block(x)
        cache = KVCache(x.shape[0], weights.num_heads, x.shape[1], weights.d_model // weights.num_heads, dtype=x.dtype)
        outputs, start = [], 0
        for t in steps:
            outputs.append(block(x[:, start:start + t], cache))
            start += t
        return torch.cat(outputs, dim=1)

    return run


BLOCK_ARGS = ("block", "x")


def build_model(TinyDecoder, weights: Weights):  # noqa: N803
    """A TinyDecoder built by its constructor, in the weights' dtype, with the weights loaded."""
    model = TinyDecoder(weights.vocab, weights.d_model, weights.num_heads, weights.d_ff, weights.num_layers)
    model = model.to(weights.dtype)
    model.load_state_dict(weights.state, strict=False)
    return model


@harness
def run_generate(generate, TinyDecoder) -> Callable[..., Any]:  # noqa: N803
    """How a check runs ``generate``: on a TinyDecoder that holds the weights."""

    def run(weights, prompt, steps, use_cache=True):
        return generate(build_model(TinyDecoder, weights), prompt, steps, use_cache=use_cache)

    return run


class CountedCalls:
    """A model whose every call is noted where it runs: the tokens given to each call, and whether the caches were.

    The checks serve it from the grader (:func:`autograder.grader.student.served_to`): the student's
    ``generate`` calls a stand-in in the kernel, and the calls are made, and noted, here.
    """

    #: What ``generate`` may call: the model, its caches, and the modes a model has.
    METHODS = ("__call__", "new_caches", "eval", "train")

    def __init__(self, model) -> None:
        self.model = model
        self.fed: list[int] = []
        self.cached: list[bool] = []

    def __call__(self, tokens, caches=None):
        self.fed.append(int(tokens.shape[-1]))
        self.cached.append(caches is not None)
        with torch.no_grad():
            return self.model(tokens, caches)

    def new_caches(self, batch: int, max_len: int):
        return self.model.new_caches(batch, max_len)

    def eval(self) -> CountedCalls:
        return self

    def train(self, mode: bool = True) -> CountedCalls:
        return self

    def calls(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens given to each call, and whether it received the caches."""
        return torch.tensor(self.fed, dtype=torch.long), torch.tensor(self.cached, dtype=torch.bool)


class _TokensSeen:
    """The caches of :class:`RecomputingDecoder`: the tokens given so far (None before the first call)."""

    tokens: torch.Tensor | None = None


class RecomputingDecoder:
    """The model of ``weights`` for counting generate's calls (the visible check): its logits are
    :func:`decoder_reference`'s, recomputed over every token its caches have seen, so it needs no answer
    of the notebook; served from the grader, the caches stay here and the kernel can only pass them back."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights

    def new_caches(self, batch: int, max_len: int) -> _TokensSeen:
        return _TokensSeen()

    def __call__(self, tokens: torch.Tensor, caches: _TokensSeen | None = None) -> torch.Tensor:
        seen = tokens
        if caches is not None:
            seen = caches.tokens = tokens if caches.tokens is None else torch.cat([caches.tokens, tokens], dim=-1)
        return decoder_reference(self.weights, seen)[..., -tokens.shape[-1]:, :]


def calls_problem(fed: torch.Tensor, cached: torch.Tensor, prompt_len: int, steps: int) -> str | None:
    """A message when generate with use_cache=True does not feed the prompt once, then one token per call."""
    pattern = ", ".join(f"{n}{'' if c else ' (no caches)'}" for n, c in zip(fed.tolist(), cached.tolist()))
    if len(fed) == 0:
        return "generate never called the model: call model(tokens, caches) to get the logits."
    if not bool(cached.all()):
        return (f"With use_cache=True the model was called with these numbers of tokens: {pattern}. Every call "
                "should pass the caches made by model.new_caches(batch, max_len), so that each step reuses the keys "
                "and values of the tokens before it.")
    if fed[0] != prompt_len or bool((fed[1:] != 1).any()) or len(fed) > steps + 1:
        return (f"With use_cache=True and a prompt of {prompt_len} tokens, the model was called with these numbers "
                f"of tokens: {pattern}. It should get the prompt once ({prompt_len} tokens), then one token per "
                f"call, the token just chosen: the cache already holds the keys and values of all the others.")
    return None


def check_model(TinyDecoder, weights: Weights, exercise: str) -> None:  # noqa: N803
    """Stop with a clear message when TinyDecoder (built from the student's block) gives the wrong logits."""
    gen = generator(96)
    tokens = torch.randint(0, weights.vocab, (2, 6), generator=gen)
    what = f"{weights!r}: model(tokens (2, 6))"

    def logits(steps):
        model = build_model(TinyDecoder, weights)
        if steps is None:
            return model(tokens)
        caches = model.new_caches(2, 6)
        return torch.cat([model(tokens[:, s:e], caches) for s, e in steps], dim=1)

    expected = decoder_reference(weights, tokens)
    for steps, how in [(None, "without caches"), ([(0, 4), (4, 5), (5, 6)], "with caches, 4 tokens then 1 then 1")]:
        got = call_student(logits, steps, what=what + " " + how)
        try:
            assert_close(got, expected, f"The logits of {what} {how}", rtol=1e-9, atol=1e-9)
        except CheckFailed as problem:
            fail(f"{exercise} is checked with TinyDecoder, which is built from your DecoderBlock and KVCache, and "
                 f"whose logits are wrong:\n{problem}\nFix DecoderBlock first (section 7), then run this check again.")


def train_block(DecoderBlock, steps: int = 40, seed: int = 0, vocab: int = 8, d_model: int = 16, num_heads: int = 2,  # noqa: N803
                d_ff: int = 32, length: int = 12, lag: int = 3) -> dict:
    """Probe: train the block, with an embedding and a linear read-out, to output the token ``lag`` places back.

    Only attention can bring that token to the position that must predict it, so the loss
    falls below log(vocab) only if gradients flow through the attention of the block. Returns
    the loss of every step and the names of the block's parameters that got no gradient.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = DecoderBlock(d_model, num_heads, d_ff)
        embed, readout = nn.Embedding(vocab, d_model), nn.Linear(d_model, vocab)
    parameters = [*block.parameters(), *embed.parameters(), *readout.parameters()]
    optimiser = torch.optim.Adam(parameters, lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    losses, no_grad = [], []
    for step in range(steps):
        tokens = torch.randint(0, vocab, (32, length), generator=gen)
        logits = readout(block(embed(tokens)))
        loss = F.cross_entropy(logits[:, lag:].reshape(-1, vocab), tokens[:, :-lag].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        if step == 0:
            no_grad = [name for name, p in block.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        optimiser.step()
        losses.append(loss.detach().item())
    return {"losses": losses, "no_grad": no_grad}
