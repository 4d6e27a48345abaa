"""The checks' requests to the student's kernel, for :class:`~autograder.engine.execute.ResilientExecute`.

A test cell runs in nbgrader's process (:mod:`autograder.engine.judge`); each call of a student's
function is one request to the graded kernel (:mod:`autograder.engine.graded_kernel`: only the
release's code, the imports and the answer cells are loaded there), or to the notebook's own kernel
where there is none (:class:`autograder.grader.remote.Channel`), sent as a silent execute request whose
user expression runs :func:`autograder.kernel.serve.serve` in the kernel. What the student's code prints
meanwhile goes into the test cell's streams. A kernel that dies, calls ``exit()`` or runs past the
cell's deadline raises :class:`autograder.grader.remote.KernelDied` or :class:`autograder.grader.remote.CallTimedOut`.

A request can also be measured (:meth:`KernelRequests.measured_request`): the peak of the graded
kernel's memory during it, read from its control group (:class:`autograder.engine.cgroup.PeakMeter`)
by this process, outside the sandbox, so that nothing the student's code does can change it, and
judged as a total: above the kernel's memory right after the release's own code was loaded, before
any answer cell, so that memory an answer cell holds, or frees during the call and takes again,
counts against the call. That kernel's C allocator gives freed blocks back at once
(:mod:`autograder.kernel.allocator`): what the call freed is not counted as if it were still held.

What this does NOT protect: the answer is plain data the kernel made; it is judged in the grader,
never trusted as a verdict.
"""

from __future__ import annotations

import base64
from queue import Empty
from time import monotonic

from jupyter_core.utils import ensure_async, run_sync

from ..grader import remote
from . import cgroup
from .graded_kernel import GradedKernel


class KernelRequests:
    """Mixin of ``ResilientExecute``: ``self.kc``, ``self.km``, ``self._deadline``, ``self._streams`` are its own."""

    _deadline: float
    _streams: list[tuple[str, str]]
    _streams_size: int  # characters in _streams: reset with it
    _asked_exit: bool
    max_output_bytes: int
    graded: GradedKernel | None = None  # where the checks' requests go (None: the notebook's kernel)

    def _kernel(self) -> tuple:
        """The client and manager of the kernel the requests go to."""
        return (self.graded.kc, self.graded.km) if self.graded is not None else (self.kc, self.km)

    def request(self, message: bytes) -> bytes:
        """One request to the student's kernel (:class:`autograder.grader.remote.Channel`)."""
        return run_sync(self._async_request)(message)

    def measures_memory(self) -> bool:
        """Whether the kernel has a control group whose memory peak :meth:`measured_request` can reset and read."""
        meter = cgroup.PeakMeter.of(getattr(self._kernel()[1], "group", None), whole_life=self.graded is not None)
        if meter is None:
            return False
        meter.close()
        return True

    def measured_request(self, request: dict, name: str) -> tuple[bytes, int | None]:
        """The call ``request`` on the object the notebook names ``name``, made in a kernel of its own, measured.

        A fresh kernel is started (:meth:`start_kernel_for_checks`) and loaded as the graded kernel
        is, the call made there once, the kernel stopped. Returns the reply and how many bytes that
        kernel's memory reached, at its highest during the request, above what it held once the
        release's own code was loaded, before any answer cell (:attr:`GradedKernel.base_memory`):
        memory that an answer cell holds, or frees during the call and takes again, counts. Read
        from the kernel's control group, outside it (:meth:`autograder.engine.cgroup.PeakMeter.for_call`;
        None where there is none, or its peak cannot be reset, nor read for the kernel's whole life).
        Without a graded kernel (checks in the notebook's kernel): the rise during the request in the
        notebook's kernel.
        """
        if self.graded is None:
            meter = cgroup.PeakMeter.of(getattr(self.km, "group", None))
            try:
                reply = self.request(remote.wire.encode(request))
            except BaseException:
                if meter is not None:
                    meter.close()
                raise
            return reply, meter.stop() if meter is not None else None
        return run_sync(self._async_measured_request)(request, name)

    async def _async_measured_request(self, request: dict, name: str) -> tuple[bytes, int | None]:
        kernel = await self.start_kernel_for_checks(measured=True)
        made: cgroup.Group | None = None  # a group made for the call (PeakMeter.for_call), removed after the kernel
        try:
            await kernel.load_until(self.graded_sources_now(), self._deadline, lambda: False)
            target = kernel.kc, kernel.km
            named = remote.wire.decode(await self._async_request(remote.wire.encode({"op": "name", "name": name}),
                                                                 target),
                                       resolve=lambda number, kind, is_callable: remote.wire.Handle(number),
                                       limit=remote.wire.MAX_REPLY_BYTES)
            if not isinstance(named, dict) or not isinstance(named.get("value"), remote.wire.Handle):
                return remote.wire.encode({"failed": f"{name} could not be found when your answer cells were "
                                                     "loaded again, to measure its memory."}), None
            message = remote.wire.encode(dict(request, target=named["value"]))
            # where the peak cannot be reset, the kernel's processes move to a group made for the call, whose whole
            # life is the call's: what loading the answer cells did and no longer holds is not counted
            meter = cgroup.PeakMeter.for_call(getattr(kernel.km, "group", None))
            made = meter.made if meter is not None else None
            try:
                reply = await self._async_request(message, target)
            except BaseException:
                if meter is not None:
                    meter.close()
                raise
            return reply, meter.stop(kernel.base_memory) if meter is not None else None
        finally:
            await kernel.shutdown()
            cgroup.remove(made)

    async def start_kernel_for_checks(self, measured: bool = False) -> GradedKernel:
        """A new kernel for the checks, launched (``ResilientExecute`` makes it); ``measured``: for a measured call."""
        raise NotImplementedError

    def graded_sources_now(self) -> list:
        """What the graded kernel holds for the test cell being run (``ResilientExecute`` says)."""
        raise NotImplementedError

    async def _async_request(self, message: bytes, kernel: tuple | None = None) -> bytes:
        if monotonic() >= self._deadline:  # the cell's time is spent (a case that ran out of it): nothing more is sent
            raise remote.CallTimedOut()
        payload = base64.b64encode(message).decode("ascii")
        expression = f"__import__('autograder.kernel.serve', fromlist=['serve']).serve({payload!r})"
        kc, km = kernel or self._kernel()
        # stdin is allowed: a served object's calls come back as input requests (autograder.kernel.served)
        msg_id = kc.execute("", silent=True, store_history=False, user_expressions={"r": expression},
                            allow_stdin=True)
        reply = await self._async_reply_to(msg_id, kc, km)
        await self._async_collect_streams(msg_id, kc)
        if self._asks_exit(reply):
            self._asked_exit = True
            raise remote.KernelDied()  # the student's function called exit(): the kernel stops in a moment
        content = reply.get("content", {})
        result = content.get("user_expressions", {}).get("r", {}) if content.get("status") == "ok" else {}
        if result.get("status") != "ok":
            why = result.get("ename") or content.get("ename") or "no answer"
            return remote.wire.encode({"failed": f"The kernel could not run the check's request ({why}): did your "
                                                 "code change how the notebook's kernel runs code?"})
        text = str(result.get("data", {}).get("text/plain", ""))
        if len(text) > (remote.wire.MAX_REPLY_BYTES + 12) * 4 // 3 + 4:  # base64: 4 characters for 3 bytes
            return remote.wire.encode({"failed": f"The kernel's answer to the check's request is larger than "
                                                 f"{remote.wire.MAX_REPLY_BYTES // 2**20} MB: return what the "
                                                 "exercise asks for, not more."})
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            return remote.wire.encode({"failed": "The kernel's answer to the check's request could not be read."})

    async def _async_reply_to(self, msg_id: str, kc, km) -> dict:
        """The shell reply to ``msg_id``, answering the kernel's input requests meanwhile; raises CallTimedOut or
        KernelDied."""
        while True:
            left = self._deadline - monotonic()
            if left <= 0:
                await ensure_async(km.interrupt_kernel())
                raise remote.CallTimedOut()
            await self._async_answer_input(kc)
            try:
                msg = await ensure_async(kc.shell_channel.get_msg(timeout=min(left, 0.02)))
            except Empty:
                if not await ensure_async(km.is_alive()):
                    raise remote.KernelDied() from None
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    @staticmethod
    async def _async_answer_input(kc) -> None:
        """Answer what the kernel asked on its stdin channel: a served object's call (:func:`remote.answer_served`),
        made here; any other ``input()`` gets an empty line (nobody is there to type)."""
        while True:
            try:
                msg = await ensure_async(kc.stdin_channel.get_msg(timeout=0.001))
            except Empty:
                return
            if msg.get("msg_type") != "input_request":
                continue
            prompt = str(msg.get("content", {}).get("prompt", ""))
            served = prompt.startswith(remote.wire.SERVED_PROMPT)
            kc.input(remote.answer_served(prompt.removeprefix(remote.wire.SERVED_PROMPT)) if served else "")

    async def _async_collect_streams(self, msg_id: str, kc) -> None:
        """What the student's code printed while answering ``msg_id``, into the cell's streams."""
        deadline = monotonic() + 5
        while monotonic() < deadline:
            try:
                msg = await ensure_async(kc.iopub_channel.get_msg(timeout=max(0.01, deadline - monotonic())))
            except Empty:
                return
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            content = msg.get("content", {})
            if msg.get("msg_type") == "stream":  # a stream of another name is not one: it could pose as the grader's
                self.keep_stream("stderr" if content.get("name") == "stderr" else "stdout", str(content.get("text", "")))
            elif msg.get("msg_type") == "status" and content.get("execution_state") == "idle":
                return

    def keep_stream(self, name: str, text: str) -> None:
        """Keep what the student's code printed during a check, within the cell's output budget.

        Only the budget and one character more are kept, however much arrives (a check's call may print
        gigabytes): the cell is then cut when it is written, and says so, as a flooding cell is.
        """
        room = self.max_output_bytes + 1 - self._streams_size
        if room > 0:
            self._streams.append((name, text[:room]))
            self._streams_size += len(text[:room])

    @staticmethod
    def _asks_exit(reply: dict | None) -> bool:
        """Whether an execute reply carries IPython's request to end the kernel (``exit()``, ``quit()``)."""
        payload = (reply or {}).get("content", {}).get("payload") or []
        return any(isinstance(p, dict) and p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payload)
