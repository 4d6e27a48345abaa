"""Forbid chosen PyTorch built-ins while the student's function runs.

Built on :class:`torch.overrides.TorchFunctionMode`, which sees every call into the
torch API, however it was reached: ``torch.softmax``, ``Tensor.softmax``,
``F.softmax``, a renamed import (``from torch.nn.functional import
scaled_dot_product_attention as f``), ``torch.ops.aten...`` and modules such as
``nn.MultiheadAttention`` whose forward calls a forbidden function.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from torch.overrides import TorchFunctionMode

from .errors import CheckFailed


class ForbiddenCall(CheckFailed):
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
    """One forbidden built-in: the name a student knows it by and the names torch calls it."""

    shown_as: str
    names: frozenset[str]


def forbidden(shown_as: str, *aliases: str) -> Forbidden:
    """A forbidden built-in shown as ``shown_as``; matched by its last name part and ``aliases``."""
    return Forbidden(shown_as, frozenset({shown_as.rsplit(".", 1)[-1], *aliases}))


SDPA = forbidden(
    "torch.nn.functional.scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
)
MULTI_HEAD_ATTENTION = forbidden("torch.nn.MultiheadAttention", "multi_head_attention_forward")
MULTI_HEAD_ATTENTION_FORWARD = forbidden("torch.nn.functional.multi_head_attention_forward")
SOFTMAX = forbidden("torch.softmax", "special_softmax", "_softmax")
LOG_SOFTMAX = forbidden("torch.nn.functional.log_softmax", "special_log_softmax", "_log_softmax")
LOGSUMEXP = forbidden("torch.logsumexp", "special_logsumexp")

#: The rules in force and the exercise they are for, while a check runs a student's function: calls
#: of the student's other objects made meanwhile (in the grader, through proxies) carry them along.
ACTIVE_RULES: ContextVar[tuple[tuple, str]] = ContextVar("ACTIVE_RULES", default=((), ""))

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

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        for rule in self.rules:
            if name in rule.names:
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
