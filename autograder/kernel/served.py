"""The kernel's stand-in for an object the grader keeps: a model whose calls the grader makes, and counts.

How a student's code calls a model is part of some answers: notebook 09's ``generate`` must feed
the prompt once, then one token per call, through the caches; notebook 11's speculative decoder
must call the target model once per round. Counted in the kernel, beside the student's code, the
count is whatever that code lets it be. So the grader keeps the model
(:meth:`autograder.grader.remote.Remote.serve`) and sends the kernel only its number
(:class:`~autograder.shared.wire.Served`), which the kernel reads as a :class:`ServedObject`. Each call of
it, or of one of the methods the grader allows, is a request from the kernel to the grader over
the kernel's stdin channel: an ``input_request``, which ipykernel sends for ``input()`` (the check's
request allows stdin, and :func:`autograder.kernel.serve.serve` sets :data:`TRANSPORT` to the kernel's own
``raw_input``), and which the grader answers while a check's call runs
(:class:`autograder.engine.kernel_requests.KernelRequests`).
The grader makes the call on its own object, counts it, and answers with the result as plain data;
a result that is not plain data (a model's caches) stays in the grader and comes back as another
number. In one process (:class:`autograder.grader.local_channel.LocalChannel`), :data:`TRANSPORT` carries the
request straight to the grader's function.

What this does not protect: nothing in the kernel is protected; the student's code may call the
model as often as it likes, or not at all, and may send such requests itself. The grader counts
and judges exactly the calls it was asked to make, with the arguments it received.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from ..shared import wire

#: How a request reaches the grader in one process (None: over the kernel's stdin channel, with ``input()``).
TRANSPORT: ContextVar[Callable[[str], str] | None] = ContextVar("autograder_served_transport", default=None)


class ServedObject:
    """An object the grader keeps: calling it, or one of its methods, is a request to the grader."""

    def __init__(self, number: int) -> None:
        self._number = number

    def __wire_served__(self) -> wire.Served:
        """How :mod:`autograder.shared.wire` sends this stand-in back to the grader: by its number."""
        return wire.Served(self._number)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return ask(self._number, "__call__", args, kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: ask(self._number, name, args, kwargs)

    def __repr__(self) -> str:
        return "<an object the grader runs for this check>"


def ask(number: int, method: str, args: tuple, kwargs: dict) -> Any:
    """Have the grader call ``method`` of its object ``number``; its result (an error raised as a RuntimeError)."""
    try:
        request = wire.encode({"object": number, "method": method, "args": tuple(args), "kwargs": dict(kwargs)})
    except wire.WireError as error:
        raise TypeError(f"the model takes plain data (tensors, numbers, its caches): {error}") from None
    text = base64.b64encode(request).decode("ascii")
    transport = TRANSPORT.get()
    if transport is None:
        raise RuntimeError("this object is run by the grader, and only a check's call can use it")
    answer = transport(text)
    try:
        reply = wire.decode(base64.b64decode(answer, validate=True), served=ServedObject)
    except ValueError:
        raise RuntimeError("the grader's answer could not be read: was input() replaced?") from None
    if not isinstance(reply, dict):
        raise RuntimeError("the grader's answer could not be read")
    if "error" in reply:
        raise RuntimeError(str(reply["error"]))
    return reply.get("value")
