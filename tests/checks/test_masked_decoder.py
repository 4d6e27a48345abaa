"""Notebook 10's trained model (autograder.references.masked_decoder) is notebook 09's TinyDecoder: the same
weights from the same seed, the same logits, weights that respect any mask, gradients through RoPE to every
parameter, and a clear error for a mask or a size it cannot use."""

from __future__ import annotations

import pytest
import torch

from autograder.grader.inputs import generator
from autograder.references.decoding_and_training import causal_rope_attention
from autograder.references.long_context import sink_window_reference
from autograder.references.masked_decoder import MaskedBlock, MaskedDecoder
from autograder.references.tiny_decoder import Weights, decoder_reference

from ..notebook_code import solution_namespace

SIZES = {"vocab": 16, "d_model": 32, "num_heads": 2, "d_ff": 64, "num_layers": 2}


def tokens(batch: int = 3, length: int = 11) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab"], (batch, length), generator=generator(5))


def test_the_same_seed_gives_notebook_09s_model():
    """Notebook 10's prose says so: notebook 09's TinyDecoder, made from the same seed, has the same weights."""
    notebook_09 = solution_namespace("09_decoding_and_training")
    torch.manual_seed(0)
    theirs = notebook_09.TinyDecoder(*SIZES.values()).double()
    torch.manual_seed(0)
    ours = MaskedDecoder(*SIZES.values()).double()
    assert theirs.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(theirs.state_dict()[k], t) for k, t in ours.state_dict().items())
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x), rtol=1e-12, atol=1e-12)


def test_logits_and_weights_are_the_references():
    """With notebook 09's reference weights: the logits of decoder_reference, and block 0's weights those of
    causal attention with RoPE on its own queries and keys."""
    weights = Weights(3, SIZES["d_model"], SIZES["num_heads"], SIZES["d_ff"], vocab=SIZES["vocab"],
                      num_layers=SIZES["num_layers"])
    model = MaskedDecoder(*SIZES.values()).double()
    model.load_state_dict(weights.state)
    x = tokens()
    with torch.no_grad():
        logits, every_weights = model(x)
        torch.testing.assert_close(logits, decoder_reference(weights, x), rtol=1e-10, atol=1e-10)
        block = model.blocks[0]
        normed = block.norm1(model.embed(x))
        q, k, v = (layer(normed).unflatten(-1, (2, 16)).transpose(1, 2) for layer in (block.q_proj, block.k_proj,
                                                                                      block.v_proj))
        torch.testing.assert_close(every_weights[0], causal_rope_attention(q, k, v)[1], rtol=1e-10, atol=1e-10)


def test_the_mask_decides_what_each_query_reads():
    model = MaskedDecoder(*SIZES.values()).double()
    x = tokens(length=14)
    mask = sink_window_reference(14, 14, 4, 2)
    with torch.no_grad():
        _, every_weights = model(x, mask)
        _, causal = model(x)
    for weights in every_weights:
        assert bool((weights[..., ~mask] == 0).all())
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones_like(weights.sum(dim=-1)))
    assert not torch.allclose(every_weights[0], causal[0])  # the mask changed what is read


def test_every_parameter_trains():
    """RoPE is applied by multiplication with fixed matrices: the queries' and keys' projections get gradients
    (the reference's rotation of the tensor itself detaches them)."""
    model = MaskedDecoder(*SIZES.values()).double()
    logits, _ = model(tokens())
    logits.square().mean().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)] == []


@pytest.mark.parametrize("mask, words", [
    (torch.ones(5, 5, dtype=torch.bool).tril(), "(11, 11)"),
    (torch.ones(11, 11).tril(), "torch.float32"),
    (torch.zeros(11, 11, dtype=torch.bool), "all False"),
])
def test_a_mask_it_cannot_use_is_named(mask, words):
    with pytest.raises(ValueError, match=r"mask|key") as raised:
        MaskedDecoder(*SIZES.values())(tokens(), mask)
    assert words in str(raised.value)


def test_sizes_it_cannot_use_are_named():
    with pytest.raises(ValueError, match="heads of an even size"):
        MaskedBlock(30, 4, 8)
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        MaskedDecoder(*SIZES.values())(tokens()[0])
