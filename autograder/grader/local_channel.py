"""Both sides of grading in one process: a channel to a namespace here, answered by the kernel's side.

When a notebook is graded, the grader's side (:mod:`autograder.grader.remote`) sends its requests to
the student's kernel, whose side (:mod:`autograder.kernel.serve`) answers them. The tests, and
whoever tries the protocol without a kernel, put both in one process: a :class:`LocalChannel` hands
each request to :func:`~autograder.kernel.serve.serve` over a namespace of this process, and a served
object's calls straight to the grader's side (:func:`~autograder.grader.remote.answer_served`).

What this does not protect: nothing. The student's code runs in this process, beside the checks.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from ..kernel.guard import Forbidden
from ..kernel.serve import serve
from ..kernel.served import TRANSPORT
from .remote import answer_served


class LocalChannel:
    """A channel to a namespace in this process (tests, and trying the protocol without a kernel)."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace

    def request(self, message: bytes) -> bytes:
        # the grader is in this process: a served object's calls go straight to it (a kernel sends them with input())
        token = TRANSPORT.set(answer_served)
        try:
            return base64.b64decode(str.__str__(serve(base64.b64encode(message).decode("ascii"), self.namespace)))
        finally:
            TRANSPORT.reset(token)

    def forbidden_use(self, name: str, rules: Sequence[Forbidden], exercise: str) -> str | None:
        """Nothing is read here: the grader reads the source (:mod:`autograder.engine.source_check`)."""
        return None
