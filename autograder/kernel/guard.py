"""Forbid chosen PyTorch built-ins while the student's function runs.

Built on :class:`torch.overrides.TorchFunctionMode`, which sees every call into the
torch API, however it was reached: ``torch.softmax``, ``Tensor.softmax``,
``F.softmax``, a renamed import (``from torch.nn.functional import
scaled_dot_product_attention as f``), ``torch.ops.aten...`` and modules such as
``nn.MultiheadAttention`` whose forward calls a forbidden function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch.overrides import TorchFunctionMode

from ..shared.errors import WholeCellFailure


class ForbiddenCall(WholeCellFailure):
    """A student's code called (or its source uses) a built-in its exercise forbids.

    Raised inside the student's function by the guard, and by the checks when the guard saw a call
    the function caught; checks recognise it by its type. ``builtin`` is the forbidden built-in as
    the student knows it (None: the code got round the guard, which forbids every built-in).
    """

    def __init__(self, message: str, builtin: str | None = None) -> None:
        super().__init__(message)
        self.builtin = builtin


def forbidden_call(shown_as: str, exercise: str) -> ForbiddenCall:
    """The failure of ``exercise`` calling the forbidden ``shown_as``."""
    return ForbiddenCall(message_for(shown_as, exercise), shown_as)


@dataclass(frozen=True)
class Forbidden:
    """One forbidden built-in: the name a student knows it by, the names torch calls it, and its family.

    ``family`` (a regular expression, or empty) matches the name of any PyTorch entry of the same kind
    (``_native_multi_head_attention``, ``flex_attention``, ... for attention), not only the names listed:
    PyTorch has more ways to the same kernel than any list holds, and gains new ones.
    """

    shown_as: str
    names: frozenset[str]
    family: str = ""

    def matches(self, name: str) -> bool:
        """Whether the PyTorch entry called ``name`` (an overload's ``name.default`` too) is this built-in or its kin."""
        base = name.split(".", 1)[0]
        return base in self.names or bool(self.family and re.search(self.family, base) and base not in NOT_KIN)


#: Names that a family's pattern finds but that compute nothing forbidden: the module ``torch.nn.attention``
#: (where notebook 03's ``causal_lower_right`` lives).
NOT_KIN = frozenset({"attention"})


def forbidden(shown_as: str, *aliases: str, family: str = "") -> Forbidden:
    """A forbidden built-in shown as ``shown_as``; matched by its last name part, ``aliases`` and ``family``."""
    return Forbidden(shown_as, frozenset({shown_as.rsplit(".", 1)[-1], *aliases}), family)


#: Every PyTorch entry that computes attention: SDPA and its kernels, multi-head attention, flex attention, the
#: transformer layers and their fused paths (``nn.TransformerEncoderLayer``, ``_transformer_encoder_layer_fwd``), ...
ATTENTION_FAMILY = r"(?i)attention|sdpa|_sdp_|multihead|_mha|transformer"
SOFTMAX_FAMILY = r"(?i)softmax"


SDPA = forbidden(
    "torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    family=ATTENTION_FAMILY,
)
MULTI_HEAD_ATTENTION = forbidden("torch.nn.MultiheadAttention", "multi_head_attention_forward", family=ATTENTION_FAMILY)
MULTI_HEAD_ATTENTION_FORWARD = forbidden("torch.nn.functional.multi_head_attention_forward", family=ATTENTION_FAMILY)
SOFTMAX = forbidden("torch.softmax", "special_softmax", "_softmax", family=SOFTMAX_FAMILY)
LOG_SOFTMAX = forbidden("torch.nn.functional.log_softmax", "special_log_softmax", "_log_softmax", family=SOFTMAX_FAMILY)
LOGSUMEXP = forbidden("torch.logsumexp", "special_logsumexp", family=r"(?i)logsumexp")

#: The attention built-ins no from-scratch attention exercise may call.
ATTENTION_BUILTINS = (SDPA, MULTI_HEAD_ATTENTION, MULTI_HEAD_ATTENTION_FORWARD)
#: The built-ins the softmax exercises of notebook 04 must write themselves.
SOFTMAX_BUILTINS = (SOFTMAX, LOG_SOFTMAX, LOGSUMEXP)


@dataclass
class Guard(TorchFunctionMode):
    """A torch function mode that raises :class:`ForbiddenCall` on a forbidden call.

    ``violations`` keeps every forbidden call seen, so a student function that catches
    the error and carries on is still caught afterwards.
    """

    rules: tuple[Forbidden, ...]
    exercise: str
    violations: list[str] = field(default_factory=list)
    #: The rule each name called so far falls under (None: allowed). A student's loop calls a few names hundreds of
    #: thousands of times; matching the families' patterns on every call was a fifth of the checks' time.
    verdicts: dict[str, Forbidden | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        super().__init__()

    def rule_for(self, name: str) -> Forbidden | None:
        """The rule that forbids the PyTorch entry called ``name``, or None."""
        try:
            return self.verdicts[name]
        except KeyError:
            pass
        base = name.split(".", 1)[0]
        # A built-in named by a rule is that rule's, before any family claims it (an attention backward is
        # "the backward of SDPA", not SDPA).
        rule = (next((r for r in self.rules if base in r.names), None)
                or next((r for r in self.rules if r.matches(name)), None))
        self.verdicts[name] = rule
        return rule

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rule = self.rule_for(getattr(func, "__name__", ""))
        if rule is not None:
            self.violations.append(rule.shown_as)
            raise forbidden_call(rule.shown_as, self.exercise)
        return func(*args, **(kwargs or {}))


def message_for(shown_as: str, exercise: str) -> str:
    """What a student reads when ``exercise`` called the forbidden ``shown_as``."""
    return (
        f"{exercise} called {shown_as}, which this exercise asks you to write yourself. "
        f"Outside your function PyTorch's built-in is the referee your answer is compared with; "
        f"inside it, build the result from basic operations (matmul, exp, sum, max, ...)."
    )
