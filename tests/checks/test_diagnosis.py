"""Diagnosis beyond the catalogue: how a wrong answer differs, whether or not its mistake is catalogued.

Each generic diagnosis is fed a mistake of its kind, written here and in no catalogue, through a
real check, and its message is read. The visible checks name catalogued mistakes when the grader
has the catalogue, in the same words as the hidden checks, and say only the generic diagnoses when
it is missing (the student's bundle, checked on a real bundle too). Finally, correct answers
written in other styles (einsum, loops, torch.where, float64 inside, complex numbers, closed forms)
pass every visible and hidden check of notebooks 01-07.
"""

from __future__ import annotations

import importlib
import math
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from torch import nn

from autograder.checks import complexity as visible07
from autograder.checks import masking as visible03
from autograder.checks import multi_head as visible05
from autograder.checks import numerical_stability as visible04
from autograder.checks import scaling as visible02
from autograder.checks import soft_lookup as visible01
from autograder.grader.compare import assert_close
from autograder.grader.diagnoses import explain_device, explain_number, explain_values, simple_number
from autograder.grader.diagnosis import Mistake, catalogue, name_mistakes
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import Remote, lookup
from autograder.grader.verify import Case, verify
from autograder.hidden import complexity as hidden07
from autograder.hidden import masking as hidden03
from autograder.hidden import multi_head as hidden05
from autograder.hidden import numerical_stability as hidden04
from autograder.hidden import positional_encoding as hidden06
from autograder.hidden import scaling as hidden02
from autograder.hidden import soft_lookup as hidden01
from autograder.shared.errors import CheckFailed

from ..notebook_code import solution_namespace

NOTEBOOKS = ["soft_lookup", "scaling", "masking", "numerical_stability", "multi_head", "positional_encoding",
             "complexity"]


def message_of(check, fn) -> str:
    """The message ``check(fn)`` fails with (the test fails if it passes)."""
    with pytest.raises(CheckFailed) as failure:
        check(fn)
    return str(failure.value)


def proxy(name: str, value) -> Remote:
    """``value`` as the grader sees a student's object: a proxy into a kernel (here, this process)."""
    found, remote = lookup(LocalChannel({name: value}), name)
    assert found and isinstance(remote, Remote)
    return remote


@pytest.fixture(scope="module")
def ref01():
    return solution_namespace("01_soft_lookup")


@pytest.fixture(scope="module")
def ref04():
    return solution_namespace("04_numerical_stability")


# --- precision ------------------------------------------------------------------------------------------


def sdpa_in_float32(Q, K, V):
    q, k, v = Q.float(), K.float(), V.float()
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    return (weights @ v).to(Q.dtype), weights.to(Q.dtype)


def sdpa_float32_scale(Q, K, V):
    scale = torch.tensor(math.sqrt(Q.shape[-1]))  # float32: the scores are rounded to float32
    weights = torch.softmax(((Q @ K.transpose(-2, -1)).float() / scale).to(Q.dtype), dim=-1)
    return weights @ V, weights


def sdpa_in_float16(Q, K, V):
    q, k, v = Q.half(), K.half(), V.half()
    weights = torch.softmax(q.float() @ k.float().transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1).half()
    return (weights.float() @ v.float()).half().to(Q.dtype), weights.to(Q.dtype)


def test_a_result_computed_in_float32_is_said_to_be():
    message = message_of(visible01.check_scaled_dot_product_attention, sdpa_in_float32)
    # Printed to 6 digits the entry with the largest error reads the same in both: the numbers get the digits that
    # show the difference (which entry that is depends on the CPU's float32 matmul, so it is not named here).
    shown = re.search(r"where you return (-?[0-9.e+-]+) and the expected value is (-?[0-9.e+-]+) ", message)
    assert shown and shown[1] != shown[2], message
    assert "Your computation loses precision: every entry of your result is a torch.float32 number" in message


def test_float32_inside_a_float64_computation_is_named():
    message = message_of(hidden01.check_scaled_dot_product_attention, sdpa_float32_scale)
    assert "is far above torch.float64 rounding and the size of torch.float32 rounding" in message
    assert "Was part of it computed in torch.float32?" in message


def test_float16_is_named():
    message = message_of(hidden01.check_scaled_dot_product_attention, sdpa_in_float16)
    assert "every entry of your result is a torch.float16 number" in message


def sdpa_wrong_on_batch_1(Q, K, V):
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    output = weights @ V
    if output.dim() == 3:
        output = torch.cat([output[:1], output[1:] * 1.01])
    return output, weights


def sdpa_scaled_by_sqrt_n(Q, K, V):
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-2]), dim=-1)
    return weights @ V, weights


def logsumexp_is_the_max(x, dim=-1):
    return x.amax(dim=dim)


def test_a_wrong_constant_is_not_called_imprecision():
    """A wrong scale or a missing log-sum-exp term can have the size of a lower precision's rounding; it moves the
    entries together, which rounding does not."""
    for check in (visible01.check_scaled_dot_product_attention, hidden01.check_scaled_dot_product_attention):
        assert "loses precision" not in message_of(check, sdpa_scaled_by_sqrt_n)
    for check in (visible04.check_logsumexp, hidden04.check_logsumexp):
        assert "loses precision" not in message_of(check, logsumexp_is_the_max)


def hard_lookup_largest_magnitude(query, keys, values):
    return values[(keys @ query).abs().argmax()]


def causal_mask_offset_clamped(n, m=None, align="top_left", device=None):
    m = n if m is None else m
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(0 if align == "top_left" else max(m - n, 0))


def test_a_mistake_is_not_named_where_the_student_is_right_and_it_is_wrong():
    """|score| instead of the score matches argmin on one random input by chance, and is right where argmin is
    not; a causal mask whose offset is clamped is right on the bottom-right cases the ignored-alignment mistake
    gets wrong."""
    assert "This looks like" not in message_of(hidden01.check_hard_lookup, hard_lookup_largest_magnitude)
    for check in (visible03.check_causal_mask, hidden03.check_causal_mask):
        assert "This looks like" not in message_of(check, causal_mask_offset_clamped)


def soft_lookup_weights_alone_when_cold(query, keys, values, temperature=1.0):
    scores = keys @ query / temperature
    weights = torch.softmax(scores, dim=-1)
    if temperature < 1e-2:  # the cold limit written by hand, returning the weights alone
        return torch.zeros_like(weights).index_fill(0, scores.argmax(), 1.0)
    return weights @ values, weights


def test_a_result_that_is_not_a_pair_is_told_so_before_it_is_unpacked():
    message = message_of(visible01.check_soft_lookup, soft_lookup_weights_alone_when_cold)
    assert message.startswith("soft_lookup(..., temperature=1e-3) should return a tuple (output, weights)")


def test_an_error_on_one_batch_element_is_not_called_imprecision():
    message = message_of(visible01.check_scaled_dot_product_attention, sdpa_wrong_on_batch_1)
    assert "loses precision" not in message
    assert "Only part of your result is wrong: along axis 0 (size 2) only the index(es) 1 differ" in message


# --- a factor, an offset, an order of the axes ----------------------------------------------------------


def entropy_doubled(weights):
    return -2 * torch.where(weights > 0, weights * torch.log(weights.clamp_min(1e-300)), 0.0).sum(dim=-1)


def sdpa_output_scaled(Q, K, V):
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    return weights @ V / math.sqrt(Q.shape[-1]), weights


def softmax_over_sum_and_max(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / (e.sum(dim=dim, keepdim=True) + e.amax(dim=dim, keepdim=True))


def log_softmax_minus_max(x, dim=-1):
    return x - x.amax(dim=dim, keepdim=True)


def logsumexp_plus_one(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    return (m + 1 + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)


def test_a_constant_factor_is_measured_and_recognised():
    assert "multiplied by 2, everywhere" in message_of(visible02.check_attention_entropy, entropy_doubled)
    message = message_of(visible01.check_scaled_dot_product_attention, sdpa_output_scaled)
    assert "multiplied by 0.5 (= 1/2), everywhere" in message  # 1/sqrt(d_k) with d_k = 4
    assert simple_number(1 / math.sqrt(8)) == "1/sqrt(8)" and simple_number(-3.0) == "-3"
    assert simple_number(1 / math.log(2)) == "1/ln 2" and simple_number(0.123456) is None


def log_softmax_upside_down(x, dim=-1):
    top = x.amax(dim=dim, keepdim=True)
    return top + torch.log(torch.exp(x - top).sum(dim=dim, keepdim=True)) - x


def test_a_sign_error_is_called_a_sign_error():
    message = message_of(visible04.check_log_softmax, log_softmax_upside_down)
    assert "the expected one with the opposite sign, everywhere" in message
    assert "multiplied by -1" not in message


def padding_mask_of_ints(lengths, max_len=None):
    max_len = int(lengths.max()) if max_len is None else max_len
    return (torch.arange(max_len)[None, :] < lengths[:, None]).int()


def test_a_mask_of_ints_is_not_called_a_float_mask():
    message = message_of(hidden03.check_padding_mask, padding_mask_of_ints)
    assert "should be a boolean tensor" in message and "a 0/1 mask of numbers instead of a boolean one" in message
    assert "float" not in message.split("This looks like")[1].split(":")[0]


def test_a_factor_or_an_offset_per_row():
    message = message_of(visible04.check_stable_softmax, softmax_over_sum_and_max)
    assert "Each row (along the last axis) of your result is the expected row times a number" in message
    message = message_of(visible04.check_log_softmax, log_softmax_minus_max)
    assert "Each row (along the last axis) of your result is the expected row plus a number" in message
    assert "the expected one plus 1, everywhere" in message_of(visible04.check_logsumexp, logsumexp_plus_one)


def split_heads_without_transpose(x, num_heads):
    B, T, D = x.shape
    return x.reshape(B, T, num_heads, D // num_heads)


def split_heads_by_view(x, num_heads):
    B, T, D = x.shape
    return x.reshape(B, num_heads, T, D // num_heads)


def window_transposed(n, window):
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    return ((distance >= 0) & (distance < window)).T


def test_axes_in_another_order_or_numbers_rearranged():
    message = message_of(visible05.check_split_heads, split_heads_without_transpose)
    assert "should have shape (2, 2, 3, 4), but it has shape (2, 3, 2, 4)" in message
    assert "the expected one with axes 1 and 2 swapped: the numbers are right" in message
    message = message_of(visible07.check_sliding_window_mask, window_transposed)
    assert "the expected one with the last two axes swapped (a transpose)" in message
    message = message_of(visible05.check_split_heads, split_heads_by_view)
    assert "holds the expected numbers, but arranged differently" in message
    with pytest.raises(CheckFailed, match="in reverse order along axis 0"):
        verify(lambda x: x.flip(0), [Case((torch.arange(6.0).reshape(3, 2),))], lambda x: x, exercise="f",
               arg_names=("x",), outputs=None)


# --- which part is wrong; NaN and infinities ------------------------------------------------------------


def masked_attention_minus_1e30(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e30) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, weights


def gqa_nan_under_float_masks(Q, K, V, mask=None):
    """Right for boolean masks (their empty rows are handled), NaN on a float mask's row of -inf."""
    if Q.dim() != 4 or K.shape != V.shape[:3] + K.shape[3:] or Q.shape[1] % K.shape[1] or Q.shape[-1] != K.shape[-1]:
        raise ValueError("Q, K and V do not fit")
    r = Q.shape[1] // K.shape[1]
    K, V = K.repeat_interleave(r, dim=1), V.repeat_interleave(r, dim=1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None and mask.dtype == torch.bool:
        has_key = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~mask, -math.inf).masked_fill(~has_key, 0.0)
        weights = torch.softmax(scores, dim=-1) * has_key
        return weights @ V, weights
    weights = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    return weights @ V, weights


def test_only_the_rows_with_no_allowed_key_are_wrong():
    message = message_of(visible03.check_masked_attention, masked_attention_minus_1e30)
    assert "along axis 1 (size 5, the rows) only the index(es) 0, 1 differ; the rest is right" in message
    assert "The wrong rows are exactly the rows whose expected values are all 0 (in attention: the queries with " \
           "no allowed key): [0, 0], [0, 1]." in message


def test_the_empty_row_of_a_float_mask_in_gqa():
    """The visible check (boolean masks only) passes it; the hidden case with a float mask's row of -inf does not."""
    visible05.check_grouped_query_attention(gqa_nan_under_float_masks)
    message = message_of(hidden05.check_grouped_query_attention, gqa_nan_under_float_masks)
    assert "a float mask whose row 0 is all -inf" in message
    assert "Your result has NaN where the expected value is 0 at 32 entries" in message
    assert "The wrong rows are exactly the rows whose expected values are all 0" in message


def softmax_without_shift(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def logsumexp_without_shift(x, dim=-1):
    return torch.log(torch.exp(x).sum(dim=dim))


def log_softmax_nan_rows(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    return x - (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True)))


def additive_minus_1e4(mask, dtype):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -1e4)


def test_nan_and_infinities_say_what_was_expected_there():
    message = message_of(visible04.check_stable_softmax, softmax_without_shift)
    assert "NaN where the expected value is a finite number at 10 entries" in message
    assert "Whole rows are NaN" in message and "no maximum subtracted?" in message
    message = message_of(visible04.check_logsumexp, logsumexp_without_shift)
    assert "an infinity where the expected value is finite" in message
    message = message_of(visible04.check_log_softmax, log_softmax_nan_rows)
    assert "NaN where the expected value is -inf" in message and "was a maximum of -inf subtracted?" in message
    # F.log_softmax gives NaN there too, but a mistake that calls a forbidden built-in is the guard's to name.
    assert "the mistake 'NaN on rows that are entirely -inf'" in message and "built-in" not in message
    message = message_of(hidden03.check_to_additive_mask, additive_minus_1e4)
    assert "a finite number where the expected value is -inf" in message


# --- shapes, devices, inputs changed in place -----------------------------------------------------------


def sdpa_squeezed(Q, K, V):
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    return (weights @ V).squeeze(), weights.squeeze()


def logsumexp_squeezed(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    return (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze()


def logsumexp_keepdim(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    return m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))


def test_a_dimension_of_size_1_dropped_or_added():
    message = message_of(hidden01.check_scaled_dot_product_attention, sdpa_squeezed)
    assert "A dimension of size 1 is missing: the expected shape (2, 1, 3, 6, 7) has size 1 at position(s) [1]" \
           in message and "Its values are right: only the shape is wrong." in message
    message = message_of(hidden04.check_logsumexp, logsumexp_squeezed)
    assert "dim=0 of a (4, 1, 3) tensor" in message and "A dimension of size 1 is missing" in message
    message = message_of(visible04.check_logsumexp, logsumexp_keepdim)
    assert "Your result has an extra dimension of size 1: shape (2, 1) where (2,) is expected" in message


def additive_on_the_cpu(mask, dtype):
    return torch.zeros(tuple(mask.shape), dtype=dtype).masked_fill(~mask.cpu() if mask.device.type == "cpu"
                                                                   else torch.zeros(mask.shape, dtype=torch.bool),
                                                                   -math.inf)


def causal_ignoring_device(n, m=None, *, align="top_left", device=None):
    m = n if m is None else m
    if align not in ("top_left", "bottom_right"):
        raise ValueError(align)
    return torch.ones(n, m, dtype=torch.bool).tril(diagonal=0 if align == "top_left" else m - n)


def causal_always_on_meta(n, m=None, *, align="top_left", device=None):
    return causal_ignoring_device(n, m, align=align).to("meta")


def test_a_result_on_the_wrong_device():
    """Meta expected and CPU returned, and the reverse (a GPU tensor cannot cross to the grader: see below)."""
    message = message_of(visible03.check_to_additive_mask, additive_on_the_cpu)
    assert "a mask on the meta device" in message
    assert "should be on the device 'meta', but it is on 'cpu'" in message and "device=x.device" in message
    message = message_of(hidden03.check_causal_mask, causal_ignoring_device)
    assert "should be on the device 'meta', but it is on 'cpu'" in message
    message = message_of(visible03.check_causal_mask, causal_always_on_meta)
    assert "should be on the device 'cpu', but it is on 'meta'" in message
    assert explain_device(torch.zeros(1), torch.zeros(1)) == []


class Tensor:
    """Stands for a CUDA tensor: the wire carries tensors on the CPU or meta only, others come back as handles."""


def test_a_tensor_the_grader_cannot_read_is_said_to_be_on_another_device():
    def on_a_gpu(x):
        return Tensor()

    with pytest.raises(CheckFailed, match="a tensor the grader cannot read, on another device"):
        verify(proxy("f", on_a_gpu), [Case((torch.ones(2),))], lambda x: x, exercise="f", arg_names=("x",),
               outputs=None)


def masked_attention_scaling_q_in_place(Q, K, V, mask=None):
    Q /= math.sqrt(Q.shape[-1])
    scores = Q @ K.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    no_key = (scores == -math.inf).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(no_key, 0.0), dim=-1).masked_fill(no_key, 0.0)
    return weights @ V, weights


def sdpa_doubling_q_in_place(Q, K, V):
    Q *= 2
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    return weights @ V, weights


@pytest.mark.parametrize("as_proxy", [False, True])
def test_an_input_changed_in_place(as_proxy):
    fn = proxy("masked_attention", masked_attention_scaling_q_in_place) if as_proxy \
        else masked_attention_scaling_q_in_place
    message = message_of(visible03.check_masked_attention, fn)
    assert "masked_attention returned the right result, but it changed its input(s) Q in place" in message
    message = message_of(visible01.check_scaled_dot_product_attention, sdpa_doubling_q_in_place)
    assert "is not what it should be" in message and "Your function changed its input(s) Q in place" in message


# --- numbers ---------------------------------------------------------------------------------------------


def test_a_rounded_number_is_told_to_give_the_exact_value(ref01):
    message = message_of(hidden02.check_std_unscaled_512, 22.6)
    assert "22.6 is the exact value rounded to 3 significant figure(s): give the value as computed" in message
    assert "agrees with the exact value to about 2 significant figures only" in message_of(
        hidden02.check_std_unscaled_512, 22.41)

    def fit_rounded(ns, costs):
        x, y = torch.log(torch.tensor(ns, dtype=torch.float64)), torch.log(torch.tensor(costs, dtype=torch.float64))
        return round(float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()), 2)

    message = message_of(visible07.check_fit_power_law, fit_rounded)
    assert "1.47 is the exact value rounded to 3 significant figure(s)" in message
    assert explain_number(0.125, 0.125) == [] and explain_number(3.0, 7.0) == []

    def rounded_encoding(max_len, d_model, base=10000.0, *, dtype=torch.float32):
        ref = solution_namespace("06_positional_encoding").sinusoidal_encoding
        return torch.round(ref(max_len, d_model, base, dtype=torch.float64), decimals=4).to(dtype)

    message = message_of(hidden06.check_sinusoidal_encoding, rounded_encoding)
    assert "rounded to 4 decimal place(s): do not round" in message and "float32 accuracy" not in message


def test_nothing_is_said_when_nothing_fits():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    assert explain_values(x + torch.tensor([[0.3, -1.0, 0.2], [2.0, 0.1, -0.7]], dtype=torch.float64), x, 1e-7,
                          1e-9) == []
    with pytest.raises(CheckFailed) as failure:
        assert_close(x.flip(1) * 3, x, "y")
    assert str(failure.value).count("\n") == 0  # the plain message alone


# --- two mistakes that give the same result ---------------------------------------------------------------


def test_two_mistakes_that_fit_are_both_said_and_other_inputs_tell_them_apart():
    """4 bytes assumed and two matrices counted agree on float16; float32 and float64 tell them apart."""
    named = {m.name: m for m in hidden07.MISTAKES["attention_memory_bytes"]}
    four, two = named["bytes that ignore the dtype (4 bytes assumed)"], \
        named["two matrices counted (the scores and the weights)"]
    only_float16 = [(Case((3, 5, 7, 11, torch.float16)), 2310)]
    with pytest.raises(CheckFailed) as failure:
        visible07.verify_number(four.fn, only_float16, exercise="attention_memory_bytes", arg_names=visible07.MEMORY_ARGS,
                                integer=True, mistakes=hidden07.MISTAKES["attention_memory_bytes"])
    message = str(failure.value)
    assert "More than one known mistake gives exactly this result on this input:" in message
    assert f"- {four.message()}" in message and f"- {two.message()}" in message
    for mistake, other in ((four, two), (two, four)):
        message = message_of(hidden07.check_attention_memory_bytes, mistake.fn)
        assert mistake.message() in message and other.name not in message
    assert name_mistakes([]) == "" and name_mistakes([four]) == four.message()


def test_a_mistake_that_is_right_on_the_failing_input_names_nothing():
    """With d_v = d_k, scaling by sqrt(d_v) is right: an imprecise answer must not be told it made that mistake."""
    message = message_of(hidden01.check_scaled_dot_product_attention, sdpa_float32_scale)
    assert "sqrt(d_v)" not in message and "This looks like" not in message


# --- the catalogue in the visible checks: the grader and the bundle ---------------------------------------


def hide_the_catalogue(monkeypatch) -> None:
    """Make autograder.hidden unimportable, as it is in the student's bundle."""
    monkeypatch.setitem(sys.modules, "autograder.hidden", None)
    for name in NOTEBOOKS:
        monkeypatch.setitem(sys.modules, f"autograder.hidden.{name}", None)


def catalogue_cases():
    for name in NOTEBOOKS:
        module = importlib.import_module(f"autograder.hidden.{name}")
        for exercise, mistakes in module.MISTAKES.items():
            for i, mistake in enumerate(mistakes):
                yield pytest.param(name, exercise, i, id=f"{name}-{exercise}-{mistake.fn.__name__}")


@pytest.mark.parametrize(("name", "exercise", "index"), list(catalogue_cases()))
def test_visible_checks_name_catalogued_mistakes_as_the_hidden_ones_do(monkeypatch, name, exercise, index):
    """Where a visible check fails on a comparison of results, it names the mistake, in the hidden check's words;
    without the catalogue it says the same thing less that paragraph."""
    hidden = importlib.import_module(f"autograder.hidden.{name}")
    visible = importlib.import_module(f"autograder.checks.{name}")
    mistake = hidden.MISTAKES[exercise][index]
    check = getattr(visible, f"check_{exercise}")
    try:
        check(mistake.fn)
    except CheckFailed as failure:
        in_grader = str(failure)
    else:
        assert (name, mistake.fn.__name__) == ("scaling", "saturation_spectral_norm")  # see VISIBLE_MISSES in test_catalogue.py
        return
    compared = in_grader.startswith("With the input") or "This looks like" in in_grader
    if compared:
        assert mistake.message() in in_grader
        assert mistake.message() in message_of(getattr(hidden, f"check_{exercise}"), mistake.fn)
    hide_the_catalogue(monkeypatch)
    assert catalogue(name, exercise) == ()
    in_bundle = message_of(check, mistake.fn)
    assert "This looks like" not in in_bundle and "known mistake" not in in_bundle
    if compared:
        paragraph = in_grader[len(in_bundle):]
        assert in_grader.startswith(in_bundle) and paragraph.startswith("\n") and mistake.message() in paragraph


def test_most_catalogued_mistakes_are_named_by_the_visible_checks():
    """All but the random experiments of notebook 02, the guard's built-ins and a detached gradient (whose own
    messages say what is wrong)."""
    named, total = 0, 0
    for name in NOTEBOOKS:
        hidden = importlib.import_module(f"autograder.hidden.{name}")
        visible = importlib.import_module(f"autograder.checks.{name}")
        for exercise, mistakes in hidden.MISTAKES.items():
            if exercise in ("empirical_score_variance", "saturation_curve"):
                continue
            for mistake in mistakes:
                total += 1
                try:
                    getattr(visible, f"check_{exercise}")(mistake.fn)
                except CheckFailed as failure:
                    named += mistake.message() in str(failure)
    assert total - named <= 5, (named, total)


def test_the_student_bundle_says_the_generic_diagnoses_only(tmp_path):
    """In a real bundle, autograder.hidden does not exist: a float32 answer is explained, no mistake is named."""
    from autograder.course.bundle import write_bundle

    with zipfile.ZipFile(write_bundle(tmp_path / "course.zip")) as archive:
        archive.extractall(tmp_path)
    script = textwrap.dedent('''
        import sys
        # This checkout's editable install maps autograder.* to the checkout: a student's machine has no such finder.
        sys.meta_path = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
        sys.path = [p for p in sys.path if "__editable__" not in p]
        import importlib.util, math, torch
        import autograder
        from autograder.checks.soft_lookup import check_scaled_dot_product_attention
        from autograder.shared.errors import CheckFailed
        assert importlib.util.find_spec("autograder.hidden") is None, autograder.__file__

        def no_scaling(Q, K, V):
            weights = torch.softmax(Q @ K.transpose(-2, -1), dim=-1)
            return weights @ V, weights

        def in_float32(Q, K, V):
            weights = torch.softmax(Q.float() @ K.float().transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
            return (weights @ V.float()).double(), weights.double()

        for fn in (no_scaling, in_float32):
            try:
                check_scaled_dot_product_attention(fn)
            except CheckFailed as failure:
                print(failure)
                print("----")
    ''')
    folder = tmp_path / "attention-course"
    result = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    no_scaling, in_float32 = result.stdout.split("----")[:2]
    assert "is not what it should be" in no_scaling and "This looks like" not in no_scaling
    assert "every entry of your result is a torch.float32 number" in in_float32
    with pytest.raises(CheckFailed, match="the mistake 'no scaling'"):  # here, in the grader, it is named
        visible01.check_scaled_dot_product_attention(hidden01.sdpa_no_scaling)


def test_visible_multi_head_attention_runs_catalogued_classes_as_the_student_class():
    mistakes = visible05.module_mistakes(visible05.NOTEBOOK)
    assert mistakes and all(isinstance(m, Mistake) for m in mistakes)
    first = hidden05.MISTAKES["MultiHeadAttention"][0]
    assert first.message() in message_of(visible05.check_MultiHeadAttention, first.fn)


def sinusoidal_base_over_ten(max_len, d_model, base=10000.0, *, dtype=torch.float32):
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    angle = position * (base / 10) ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2).to(dtype)


def test_a_mistake_that_fits_one_small_table_by_chance_is_not_named():
    """With base 100 a base of 10 gives the numbers of the exponent i/d (10^(2i/d) = 100^(i/d))."""
    from autograder.checks import positional_encoding as visible06

    message = message_of(visible06.check_sinusoidal_encoding, sinusoidal_base_over_ten)
    assert "exponent i/d" not in message


def test_the_visible_tables_are_the_reference():
    from autograder.checks import positional_encoding as visible06

    ref = solution_namespace("06_positional_encoding")
    assert torch.allclose(ref.relative_shift_matrix(2, 4, 100.0, dtype=torch.float64), visible06.SHIFT_2_4_BASE_100,
                          rtol=0, atol=visible06.TABLE_ATOL)
    assert torch.allclose(ref.sinusoidal_encoding(6, 4, 100.0, dtype=torch.float64), visible06.PE_6_4_BASE_100,
                          rtol=0, atol=visible06.TABLE_ATOL)
    assert torch.allclose(ref.sinusoidal_encoding(3, 4, 1000.0, dtype=torch.float64), visible06.PE_3_4_BASE_1000,
                          rtol=0, atol=visible06.TABLE_ATOL)
    ids = {m.id for m in hidden04.MISTAKES["online_softmax"]}
    assert set(visible04.RULE_MISTAKE_IDS.values()) <= ids


# --- correct answers in other styles: none may lose a point ------------------------------------------------
# Each is right, but written unlike the reference solution: einsum, loops, torch.where, float64 inside,
# complex numbers, closed forms. The checks compare results, not code, so every check must pass them.


def alt_hard_lookup(query, keys, values):
    """A loop over the keys, the first strictly larger score wins, one-hot weights."""
    best, best_score = 0, None
    for i in range(keys.shape[0]):
        score = float(torch.dot(keys[i], query))
        if best_score is None or score > best_score:
            best, best_score = i, score
    weights = torch.zeros(keys.shape[0], dtype=values.dtype)
    weights[best] = 1.0
    return weights @ values


def alt_soft_lookup(query, keys, values, temperature=1.0):
    """einsum and a hand-written softmax, computed in float64."""
    if query.shape[-1] != keys.shape[-1]:
        raise ValueError(f"query {tuple(query.shape)} and keys {tuple(keys.shape)} differ in features")
    scores = torch.einsum("md,d->m", keys.double(), query.double()) / temperature
    weights = torch.exp(scores - scores.max())
    weights = weights / weights.sum()
    return (weights @ values.double()).to(values.dtype), weights.to(keys.dtype)


def alt_nadaraya_watson(x_query, x_train, y_train, bandwidth):
    """Distances from torch.cdist, normalised with exp(s - logsumexp(s))."""
    distance = torch.cdist(x_query[:, None], x_train[:, None], compute_mode="donot_use_mm_for_euclid_dist")
    scores = -distance**2 / (2 * bandwidth**2)
    weights = torch.exp(scores - torch.logsumexp(scores, dim=-1, keepdim=True))
    return torch.einsum("nm,m->n", weights, y_train), weights


def alt_scaled_dot_product_attention(Q, K, V):
    """einsum with ellipses, scale by d**-0.5, Tensor.softmax."""
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} do not fit")
    weights = (torch.einsum("...nd,...md->...nm", Q, K) * Q.shape[-1] ** -0.5).softmax(dim=-1)
    return torch.einsum("...nm,...mv->...nv", weights, V), weights


def alt_empirical_score_variance(d_k, num_samples, scaled, generator):
    """q and k drawn as one tensor; the unbiased variance written out."""
    if d_k < 1 or num_samples < 2:
        raise ValueError(f"need d_k >= 1 and num_samples >= 2, got {d_k} and {num_samples}")
    q, k = torch.randn(2, num_samples, d_k, generator=generator, dtype=torch.float64)
    scores = torch.einsum("nd,nd->n", q, k) / (math.sqrt(d_k) if scaled else 1.0)
    return float(((scores - scores.mean()) ** 2).sum() / (num_samples - 1))


def alt_softmax_jacobian(p):
    """p_i (delta_ij - p_j) with an identity matrix and broadcasting."""
    if p.dim() == 0:
        raise ValueError("p must have a last axis")
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return p.unsqueeze(-1) * (eye - p.unsqueeze(-2))


def alt_attention_entropy(weights):
    """torch.where keeps log(0) out of the sum."""
    if weights.dim() == 0:
        raise ValueError("weights must have a last axis")
    positive = weights > 0
    safe = torch.where(positive, weights, torch.ones_like(weights))
    return -torch.where(positive, weights * torch.log(safe), torch.zeros_like(weights)).sum(dim=-1)


def alt_saturation_curve(d_ks, scaled, num_keys, num_queries, generator):
    """einsum and a hand-written softmax; the Frobenius norm of diag(p) - p p^T in closed form."""
    if any(d < 1 for d in d_ks) or num_keys < 1 or num_queries < 1:
        raise ValueError("every d_k, num_keys and num_queries must be at least 1")
    curves = {"max_weight": [], "entropy": [], "jacobian_norm": []}
    for d_k in d_ks:
        Q = torch.randn(num_queries, d_k, generator=generator, dtype=torch.float64)  # the order the text fixes
        K = torch.randn(num_keys, d_k, generator=generator, dtype=torch.float64)
        scores = torch.einsum("qd,kd->qk", Q, K) * (d_k**-0.5 if scaled else 1.0)
        p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        p = p / p.sum(dim=-1, keepdim=True)
        s2, s3 = (p**2).sum(dim=-1), (p**3).sum(dim=-1)
        curves["max_weight"].append(p.amax(dim=-1).mean())
        curves["entropy"].append(alt_attention_entropy(p).mean())
        curves["jacobian_norm"].append(torch.sqrt((s2 - 2 * s3 + s2**2).clamp_min(0)).mean())
    return {key: torch.stack(values) for key, values in curves.items()}


def alt_to_additive_mask(mask, dtype):
    """torch.where on the mask, then a cast (-inf stays -inf in every dtype)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError("mask must be boolean")
    return torch.where(mask, 0.0, -math.inf).to(dtype)


def alt_causal_mask(n, m=None, *, align="top_left", device=None):
    """A triangle of ones, its diagonal moved by m - n for bottom-right."""
    m = n if m is None else m
    if align not in ("top_left", "bottom_right"):
        raise ValueError(f"align must be 'top_left' or 'bottom_right', not {align!r}")
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=0 if align == "top_left" else m - n)


def alt_padding_mask(lengths, max_len):
    """One row per sequence, written with a Python loop, moved to the device of lengths."""
    if lengths.dim() != 1:
        raise ValueError("lengths must have shape (B,)")
    rows = []
    for length in lengths.tolist():
        if not 0 <= length <= max_len:
            raise ValueError(f"a length of {length} does not fit in max_len = {max_len}")
        rows.append([j < length for j in range(max_len)])
    return torch.tensor(rows, dtype=torch.bool).reshape(len(rows), max_len).to(lengths.device)


def alt_masked_attention(Q, K, V, mask=None):
    """float64 inside, torch.where for the mask and for rows with no allowed key."""
    if Q.dim() < 2 or Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError("Q, K and V do not fit")
    scores = torch.einsum("...nd,...md->...nm", Q.double(), K.double()) / math.sqrt(Q.shape[-1])
    if mask is not None:
        try:
            fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"a mask of shape {tuple(mask.shape)} does not fit scores {tuple(scores.shape)}")
        scores = torch.where(mask, scores, -math.inf) if mask.dtype == torch.bool else scores + mask.double()
    row_max = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - torch.where(row_max == -math.inf, 0.0, row_max))
    total = e.sum(dim=-1, keepdim=True)
    weights = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)
    return (weights @ V.double()).to(Q.dtype), weights.to(Q.dtype)


def _check_dim(x, dim):
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is not a dimension of x of shape {tuple(x.shape)}")


def alt_stable_softmax(x, dim=-1):
    """float64 inside, torch.where for rows of -inf."""
    _check_dim(x, dim)
    x64 = x.double()
    top = x64.amax(dim=dim, keepdim=True)
    e = torch.exp(x64 - torch.where(top == -math.inf, torch.zeros_like(top), top))
    total = e.sum(dim=dim, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(1e-300), torch.zeros_like(e)).to(x.dtype)


def alt_logsumexp(x, dim=-1):
    """A pairwise torch.logaddexp over the slices along dim, in float64."""
    _check_dim(x, dim)
    slices = x.double().unbind(dim)
    total = slices[0]
    for s in slices[1:]:
        total = torch.logaddexp(total, s)
    return total.to(x.dtype)


def alt_log_softmax(x, dim=-1):
    """x minus a hand-written log-sum-exp, float64 inside, -inf rows kept."""
    _check_dim(x, dim)
    x64 = x.double()
    top = x64.amax(dim=dim, keepdim=True)
    shift = torch.where(top == -math.inf, torch.zeros_like(top), top)
    lse = shift + torch.log(torch.exp(x64 - shift).sum(dim=dim, keepdim=True))
    return torch.where(lse == -math.inf, torch.full_like(x64, -math.inf), x64 - lse).to(x.dtype)


def alt_online_softmax(x, block_size):
    """torch.split into blocks, running statistics kept in float64; the blocks counted with a boolean sum (a count
    is not a reduction of the row)."""
    if x.dim() == 0 or block_size < 1:
        raise ValueError("need a last dimension and block_size >= 1")
    starts = torch.arange(x.shape[-1]) % block_size == 0
    assert int(starts.sum()) == math.ceil(x.shape[-1] / block_size)
    x64 = x.double()
    running_max = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    running_sum = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float64)
    for block in x64.split(block_size, dim=-1):
        new_max = torch.maximum(running_max, block.amax(dim=-1, keepdim=True))
        shift = torch.where(new_max == -math.inf, 0.0, new_max)
        running_sum = running_sum * torch.exp(running_max - shift) + torch.exp(block - shift).sum(-1, keepdim=True)
        running_max = new_max
    shift = torch.where(running_max == -math.inf, 0.0, running_max)
    return torch.where(running_sum > 0, torch.exp(x64 - shift) / running_sum.clamp_min(1e-300), 0.0).to(x.dtype)


def alt_split_heads(x, num_heads):
    """unflatten, then movedim."""
    if x.dim() != 3 or num_heads <= 0 or x.shape[-1] % num_heads:
        raise ValueError(f"cannot split x of shape {tuple(x.shape)} into {num_heads} heads")
    return x.unflatten(-1, (num_heads, x.shape[-1] // num_heads)).movedim(2, 1)


def alt_merge_heads(x):
    """movedim, then flatten."""
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, h, T, d), not {tuple(x.shape)}")
    return x.movedim(1, 2).flatten(2)


class AltMultiHeadAttention(nn.Module):
    """One fused input projection as nn.MultiheadAttention keeps it, a loop over heads, einsum."""

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        if num_heads <= 0 or d_model % num_heads:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        self.d_model, self.num_heads = d_model, num_heads
        self.in_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_bias = nn.Parameter(torch.zeros(3 * d_model)) if bias else None
        self.out = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_weight)

    @classmethod
    def from_torch(cls, mha):
        if not mha.batch_first or mha.kdim != mha.embed_dim or mha.vdim != mha.embed_dim:
            raise ValueError("need batch_first=True and kdim == vdim == embed_dim")
        module = cls(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None).to(mha.in_proj_weight.dtype)
        with torch.no_grad():
            module.in_weight.copy_(mha.in_proj_weight)
            module.out.weight.copy_(mha.out_proj.weight)
            if module.in_bias is not None:
                module.in_bias.copy_(mha.in_proj_bias)
                module.out.bias.copy_(mha.out_proj.bias)
        return module

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None):
        D, h = self.d_model, self.num_heads
        if (query.dim() != 3 or key.dim() != 3 or value.dim() != 3 or query.shape[-1] != D or key.shape[-1] != D
                or value.shape[-1] != D or key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]):
            raise ValueError("query, key and value do not fit")
        B, n, m = query.shape[0], query.shape[1], key.shape[1]
        if attn_mask is not None and tuple(attn_mask.shape) != (n, m):
            raise ValueError("attn_mask must have shape (n, m)")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, m):
            raise ValueError("key_padding_mask must have shape (B, m)")
        biases = self.in_bias.chunk(3) if self.in_bias is not None else (None, None, None)
        q, k, v = (torch.nn.functional.linear(t, w, b)
                   for t, w, b in zip((query, key, value), self.in_weight.chunk(3), biases))
        d = D // h
        outputs, weights = [], []
        for i in range(h):
            cols = slice(i * d, (i + 1) * d)
            scores = torch.einsum("bnd,bmd->bnm", q[..., cols], k[..., cols]) / math.sqrt(d)
            if attn_mask is not None:
                scores = torch.where(attn_mask, scores, -math.inf) if attn_mask.dtype == torch.bool \
                    else scores + attn_mask
            if key_padding_mask is not None:
                scores = torch.where(key_padding_mask[:, None, :], scores, -math.inf)
            w = torch.softmax(scores, dim=-1)
            outputs.append(torch.einsum("bnm,bmd->bnd", w, v[..., cols]))
            weights.append(w)
        return self.out(torch.cat(outputs, dim=-1)), torch.stack(weights, dim=1)


def alt_grouped_query_attention(Q, K, V, mask=None):
    """Query heads grouped by a reshape, one einsum per product, torch.where for rows with no key."""
    if Q.dim() != 4 or K.dim() != 4 or V.dim() != 4:
        raise ValueError("Q, K and V must be 4-D")
    B, h, n, d = Q.shape
    g, m = K.shape[1], K.shape[2]
    if K.shape[0] != B or V.shape[:3] != K.shape[:3] or K.shape[3] != d or h % g:
        raise ValueError("Q, K and V do not fit")
    scores = torch.einsum("bgrnd,bgmd->bgrnm", Q.reshape(B, g, h // g, n, d), K).reshape(B, h, n, m) / math.sqrt(d)
    if mask is not None:
        scores = torch.where(mask, scores, -math.inf) if mask.dtype == torch.bool else scores + mask
    has_key = (scores > -math.inf).any(dim=-1, keepdim=True)
    weights = torch.where(has_key, torch.softmax(torch.where(has_key, scores, 0.0), dim=-1), 0.0)
    output = torch.einsum("bgrnm,bgmv->bgrnv", weights.reshape(B, g, h // g, n, m), V).reshape(B, h, n, -1)
    return output, weights


def alt_graph_attention(X, edges, W_Q, W_K, W_V, self_loops=True):
    """The adjacency filled edge by edge in a loop; torch.where for the mask and for nodes with no neighbour."""
    if X.dim() != 2:
        raise ValueError("X must have shape (N, d)")
    N, d = X.shape
    if edges.dim() != 2 or edges.shape[0] != 2:
        raise ValueError("edges must have shape (2, E)")
    if edges.dtype.is_floating_point or edges.dtype.is_complex or edges.dtype == torch.bool:
        raise ValueError("edges must hold integers")
    if edges.numel() and (int(edges.min()) < 0 or int(edges.max()) >= N):
        raise ValueError("edges must hold node indices 0 ... N - 1")
    if (W_Q.dim() != 2 or W_K.dim() != 2 or W_V.dim() != 2 or W_Q.shape[0] != d or W_K.shape[0] != d
            or W_V.shape[0] != d or W_Q.shape[1] != W_K.shape[1]):
        raise ValueError("the projections do not fit X")
    adjacency = torch.zeros(N, N, dtype=torch.bool)
    for source, target in edges.t().tolist():
        adjacency[target, source] = True
    if self_loops:
        adjacency.fill_diagonal_(True)
    q, k, v = X @ W_Q, X @ W_K, X @ W_V
    scores = torch.where(adjacency, torch.einsum("id,jd->ij", q, k) / math.sqrt(q.shape[-1]), -math.inf)
    has = adjacency.any(dim=-1, keepdim=True)
    weights = torch.where(has, torch.softmax(torch.where(has, scores, 0.0), dim=-1), 0.0)
    return weights @ v, weights


def alt_sinusoidal_encoding(max_len, d_model, base=10000.0, *, dtype=torch.float32):
    """Complex numbers: e^(i pos omega) holds the cosine (real part) and the sine (imaginary part)."""
    if d_model <= 0 or d_model % 2 or max_len < 0:
        raise ValueError(f"need an even d_model > 0 and max_len >= 0, got {d_model} and {max_len}")
    omega = torch.tensor([base ** (-2 * i / d_model) for i in range(d_model // 2)], dtype=torch.float64)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), omega)
    z = torch.polar(torch.ones_like(angles), angles)
    return torch.stack([z.imag, z.real], dim=-1).reshape(max_len, d_model).to(dtype)


def alt_relative_shift_matrix(k, d_model, base=10000.0, *, dtype=torch.float32):
    """torch.block_diag of 2x2 rotations, each built from Python's math.cos and math.sin."""
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be even and positive, got {d_model}")
    blocks = []
    for i in range(d_model // 2):
        angle = k * base ** (-2 * i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks).to(dtype)


def alt_apply_rope(x, positions, base=10000.0):
    """Complex-number RoPE: each pair is a complex number multiplied by e^(i angle)."""
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must have shape (..., T, d) with d even, got {tuple(x.shape)}")
    positions = torch.as_tensor(positions)
    T, d = x.shape[-2], x.shape[-1]
    if positions.shape != (T,):
        raise ValueError(f"positions must have shape ({T},), got {tuple(positions.shape)}")
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * omega
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).reshape(x.shape).to(x.dtype)


def alt_attention_flops(batch, heads, n, m, d_k, d_v):
    """Both products at once: 2 n m (d_k + d_v) per head."""
    return 2 * batch * heads * n * m * (d_k + d_v)


def alt_attention_memory_bytes(batch, heads, n, m, dtype):
    """Bits per element from torch.finfo, divided by 8."""
    return batch * heads * n * m * (torch.finfo(dtype).bits // 8)


def alt_fit_power_law(ns, costs):
    """torch.linalg.lstsq on the design matrix [log n, 1], in float64."""
    if len(ns) != len(costs) or len(ns) < 2 or min(ns) <= 0 or min(costs) <= 0:
        raise ValueError("need two lists of the same length (at least 2) of positive numbers")
    x = torch.log(torch.tensor(ns, dtype=torch.float64))
    A = torch.stack([x, torch.ones_like(x)], dim=1)
    y = torch.log(torch.tensor(costs, dtype=torch.float64))[:, None]
    return float(torch.linalg.lstsq(A, y).solution[0, 0])


def _check_qkv(Q, K, V, size):
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)} do not fit")
    if size < 1:
        raise ValueError("the size must be at least 1")


def alt_chunked_attention(Q, K, V, chunk_size, is_causal=False):
    """torch.split over the queries, einsum, torch.where with a per-chunk causal mask."""
    _check_qkv(Q, K, V, chunk_size)
    keys = torch.arange(K.shape[-2])
    outputs, start = [], 0
    for q in Q.split(chunk_size, dim=-2):
        scores = torch.einsum("...cd,...md->...cm", q, K) / math.sqrt(Q.shape[-1])
        if is_causal:
            rows = torch.arange(start, start + q.shape[-2])[:, None]
            scores = torch.where(keys[None, :] <= rows, scores, -math.inf)
        outputs.append(torch.einsum("...cm,...mv->...cv", torch.softmax(scores, dim=-1), V))
        start += q.shape[-2]
    return torch.cat(outputs, dim=-2)


def alt_flash_attention(Q, K, V, block_size, is_causal=False):
    """Loops over query and key blocks, accumulators in float64, the scale applied to each block of scores."""
    _check_qkv(Q, K, V, block_size)
    n, m = Q.shape[-2], K.shape[-2]
    scale = 1.0 / math.sqrt(Q.shape[-1])
    outputs = []
    for q0 in range(0, n, block_size):
        q = Q[..., q0:q0 + block_size, :].double()
        top = torch.full((*q.shape[:-1], 1), -math.inf, dtype=torch.float64)
        total = torch.zeros((*q.shape[:-1], 1), dtype=torch.float64)
        acc = torch.zeros((*q.shape[:-1], V.shape[-1]), dtype=torch.float64)
        for k0 in range(0, m, block_size):
            if is_causal and k0 > q0 + q.shape[-2] - 1:
                break
            scores = torch.einsum("...qd,...kd->...qk", q, K[..., k0:k0 + block_size, :].double()) * scale
            if is_causal:
                i = torch.arange(q0, q0 + q.shape[-2])[:, None]
                j = torch.arange(k0, k0 + scores.shape[-1])[None, :]
                scores = torch.where(j <= i, scores, -math.inf)
            new_top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))
            p = torch.exp(scores - new_top)
            factor = torch.exp(top - new_top)
            total = total * factor + p.sum(dim=-1, keepdim=True)
            acc = acc * factor + torch.einsum("...qk,...kv->...qv", p, V[..., k0:k0 + block_size, :].double())
            top = new_top
        outputs.append((acc / total).to(Q.dtype))
    return torch.cat(outputs, dim=-2)


def alt_sliding_window_mask(n, window):
    """Written out with Python comparisons, one entry at a time."""
    if window < 1:
        raise ValueError("a window must hold at least one key")
    return torch.tensor([[0 <= i - j < window for j in range(n)] for i in range(n)], dtype=torch.bool).reshape(n, n)


#: The numeric answers of notebook 02, computed another way than the reference.
ALT_NUMBERS = {
    "std_unscaled_512": 512**0.5,
    "scale_for_unit_variance": (64 * 2.0 * 0.5) ** -0.5,
    # ||diag(p) - p p^T||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2 at p = 1/16 everywhere
    "jacobian_norm_uniform_16": math.sqrt(16 / 16**2 - 2 * 16 / 16**3 + (16 / 16**2) ** 2),
}

ALTERNATIVES = {
    "soft_lookup": [alt_hard_lookup, alt_soft_lookup, alt_nadaraya_watson, alt_scaled_dot_product_attention],
    "scaling": [alt_empirical_score_variance, alt_softmax_jacobian, alt_attention_entropy, alt_saturation_curve],
    "masking": [alt_to_additive_mask, alt_causal_mask, alt_padding_mask, alt_masked_attention],
    "numerical_stability": [alt_stable_softmax, alt_logsumexp, alt_log_softmax, alt_online_softmax],
    "multi_head": [alt_split_heads, alt_merge_heads, AltMultiHeadAttention, alt_grouped_query_attention,
                   alt_graph_attention],
    "positional_encoding": [alt_sinusoidal_encoding, alt_relative_shift_matrix, alt_apply_rope],
    "complexity": [alt_attention_flops, alt_attention_memory_bytes, alt_fit_power_law, alt_chunked_attention,
                   alt_flash_attention, alt_sliding_window_mask],
}


def exercise_of(fn) -> str:
    return "MultiHeadAttention" if fn is AltMultiHeadAttention else fn.__name__.removeprefix("alt_")


def test_every_exercise_of_01_to_07_has_an_alternative():
    for name in NOTEBOOKS:
        exercises = set(importlib.import_module(f"autograder.hidden.{name}").MISTAKES)
        assert exercises == {exercise_of(fn) for fn in ALTERNATIVES[name]}, name


@pytest.mark.parametrize(("name", "fn"), [(n, f) for n, fns in ALTERNATIVES.items() for f in fns],
                         ids=lambda v: v if isinstance(v, str) else exercise_of(v))
def test_a_correct_answer_in_another_style_passes_every_check(name, fn, capsys):
    exercise = exercise_of(fn)
    for kind in ("checks", "hidden"):
        getattr(importlib.import_module(f"autograder.{kind}.{name}"), f"check_{exercise}")(fn)
    out = capsys.readouterr()
    assert f"{exercise} passes the visible checks." in out.out and f"{exercise} passes the hidden checks." in out.out
    assert out.err == ""


@pytest.mark.parametrize("exercise", list(ALT_NUMBERS))
def test_a_numeric_answer_computed_another_way_passes(exercise, capsys):
    for module in (visible02, hidden02):
        getattr(module, f"check_{exercise}")(ALT_NUMBERS[exercise])
    assert "passes the hidden checks" in capsys.readouterr().out


@pytest.mark.parametrize("fn", [alt_scaled_dot_product_attention, alt_masked_attention, alt_grouped_query_attention,
                                alt_apply_rope, alt_flash_attention], ids=exercise_of)
def test_a_correct_answer_in_another_style_passes_through_the_proxies(fn):
    name = next(n for n, fns in ALTERNATIVES.items() if fn in fns)
    exercise = exercise_of(fn)
    for kind in ("checks", "hidden"):
        getattr(importlib.import_module(f"autograder.{kind}.{name}"), f"check_{exercise}")(proxy(exercise, fn))


def test_whole_rows_of_nan_point_at_a_mask_on_the_wrong_axis():
    """The padding mask applied to the queries (self-attention): a padded query sees no key, a row of NaN."""
    mha = solution_namespace("05_multi_head").MultiHeadAttention(12, 3).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 12, generator=gen, dtype=torch.float64)
    real = torch.tensor([[True] * 5, [True, True, True, False, False]])
    q, k, v = (p(x).unflatten(-1, (3, 4)).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~real[:, None, :, None], -math.inf)
    wrong = mha.out_proj((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).flatten(2))
    with pytest.raises(CheckFailed) as failure:
        assert_close(wrong, mha(x, x, x, key_padding_mask=real)[0], "The output")
    assert "Whole rows are NaN" in str(failure.value) and "wrong axis" in str(failure.value), str(failure.value)
    scattered = torch.tensor([[0.5, math.nan, 0.5], [0.2, 0.3, math.nan]], dtype=torch.float64)
    with pytest.raises(CheckFailed) as failure:
        assert_close(scattered, torch.full((2, 3), 1 / 3, dtype=torch.float64), "The result")
    assert "Whole rows" not in str(failure.value) and "did an exponential overflow?" in str(failure.value)
