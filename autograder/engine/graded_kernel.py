"""The graded kernel: a second sandboxed kernel that holds only what is graded.

nbgrader's execution runs every cell of a submission in one kernel, for the feedback (outputs,
errors). What a test cell's checks call (:mod:`autograder.grader.remote`) runs elsewhere: in a
:class:`GradedKernel`, started the same way as the first (the sandbox, its limits, its own control
group and folder; started ahead by the fork server's pool beside the first, else forked from the zygote
where the first kernel was: :mod:`autograder.engine.kernel_pool`), into which the grader loads only the
sources of :mod:`autograder.engine.graded_cells`, incrementally, as test cells are reached. A scratch
cell, a magic, a set-up cell, a registry, a patch or a buffer made by an ordinary cell is not there,
so it can neither change a verdict nor cost one.

- An answer cell that fails to load (an error at top level, a hang, a crash) is remembered with why;
  a check that fails afterwards says which cell and why (:meth:`GradedKernel.load_problems`).
- A kernel that dies or hangs (while loading or while a check runs) is restarted: the sources are
  loaded again, without one that killed it, and grading goes on.
- Its control group's memory right after the release's own code was loaded (before any answer cell)
  is the base that a measured call's peak is judged against (:mod:`autograder.engine.kernel_requests`);
  a kernel made for a measured call first sets its C allocator to give freed blocks back
  (:mod:`autograder.kernel.allocator`), so that the peak counts what the call held, not what it freed.

What this does NOT protect: the answer cells are the student's code; loaded here they can do what
they could do in the notebook's kernel (replace a probe, patch PyTorch) to the graded kernel. The
checks judge plain data in the grader; see :mod:`autograder.grader.remote` for what that leaves open.
"""

from __future__ import annotations

from queue import Empty
from time import monotonic
from typing import Any

from jupyter_core.utils import ensure_async

from . import cgroup
from .graded_cells import ANSWER, GradedSource

#: Seconds a load or an idle check may wait for the kernel to answer after an interrupt.
ANSWER_WAIT = 5
#: Run before any answer cell: the probes the checks run are copied as they are (:func:`autograder.kernel.serve.hold_probes`).
HOLD_PROBES = "__import__('autograder.kernel.serve', fromlist=['hold_probes']).hold_probes({modules!r})"
#: Run first in a kernel whose memory is measured: freed blocks go back to the system (:mod:`autograder.kernel.allocator`).
RETURN_FREED_MEMORY = "__import__('autograder.kernel.allocator', fromlist=['x']).return_freed_memory()"


async def connect(km: Any, startup_timeout: float) -> Any:
    """A client of ``km``'s kernel, once it is ready; the kernel's private folder is then sealed (the provisioner's)."""
    kc = km.client()
    await ensure_async(kc.start_channels())
    await ensure_async(kc.wait_for_ready(timeout=startup_timeout))
    kc.allow_stdin = False
    seal = getattr(getattr(km, "provisioner", None), "seal", None)
    if seal is not None:
        seal()
    return kc


async def restart(km: Any, kc: Any, startup_timeout: float) -> Any:
    """``km``'s kernel started again (``kc``, its old client, closed): the new kernel's client."""
    if kc is not None:
        try:
            await ensure_async(kc.stop_channels())
        except Exception:  # noqa: BLE001 - the old channels may already be gone
            pass
    await ensure_async(km.restart_kernel(now=True))
    return await connect(km, startup_timeout)


async def responsive(km: Any, kc: Any, wait: float) -> bool:
    """Whether ``km``'s kernel answers an empty request within ``wait`` seconds (it is idle again)."""
    try:
        if not await ensure_async(km.is_alive()):
            return False
        msg_id = kc.execute("", silent=True, store_history=False)
        deadline = monotonic() + wait
        while (left := deadline - monotonic()) > 0:
            try:
                msg = await ensure_async(kc.shell_channel.get_msg(timeout=min(left, 0.2)))
            except Empty:
                if not await ensure_async(km.is_alive()):
                    return False
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return True
    except RuntimeError:
        return False
    return False


class GradedKernel:
    """A kernel manager and client for the graded kernel, and what has been loaded into it."""

    def __init__(self, manager: Any, startup_timeout: float, check_modules: list[str] | None = None, *,
                 measured: bool = False) -> None:
        self.km = manager
        #: its memory is measured: its C allocator gives freed blocks back before anything is loaded
        self.measured = measured
        self.check_modules = check_modules  # the modules whose probes are held (None: all)
        self.kc: Any = None
        self.startup_timeout = startup_timeout
        self.loaded: list[GradedSource] = []
        #: name of a source -> why it did not load (kept across restarts).
        self.failed: dict[str, str] = {}
        #: sources left out of every later load (they killed or hung the kernel).
        self.left_out: set[str] = set()
        #: the group's memory once the release's own code was loaded, before any answer cell (None: unknown).
        self.base_memory: int | None = None
        self.ready = False
        self.held = False  # the probes are held (autograder.kernel.serve.hold_probes)
        self.restarts = 0

    async def launch(self, **kwargs: Any) -> None:
        """Start the kernel's process (it imports while the notebook's kernel runs the cells)."""
        await ensure_async(self.km.start_kernel(**kwargs))

    async def _connect(self) -> None:
        self.kc = await connect(self.km, self.startup_timeout)
        self.ready = True

    async def restart(self) -> None:
        """A new kernel in place of this one; nothing loaded (the next :meth:`load_until` loads again)."""
        old, self.kc, self.ready, self.loaded, self.base_memory, self.held = self.kc, None, False, [], None, False
        self.restarts += 1
        self.kc = await restart(self.km, old, self.startup_timeout)
        self.ready = True

    async def shutdown(self) -> None:
        """Stop the kernel and remove what it had (never raises)."""
        try:
            if self.kc is not None:
                await ensure_async(self.kc.stop_channels())
            await ensure_async(self.km.shutdown_kernel(now=True))
        except Exception:  # noqa: BLE001 - a kernel already gone
            pass

    async def alive(self) -> bool:
        try:
            return bool(await ensure_async(self.km.is_alive()))
        except RuntimeError:
            return False

    # -- loading ------------------------------------------------------------------------------

    async def load_until(self, sources: list[GradedSource], deadline: float, can_restart) -> None:
        """Load the ``sources`` not loaded yet, in order, until ``deadline`` (``monotonic()``).

        A source that hangs or kills the kernel is left out from then on and the kernel restarted
        (``can_restart()`` says whether one more restart is allowed); one that raises is recorded.
        """
        if not self.ready:
            await self._connect()
        if not self.loaded and not self.held:
            # the probes are copied before any answer cell can replace them (autograder.kernel.serve.hold_probes)
            prelude = HOLD_PROBES.format(modules=self.check_modules)
            self.held = await self._run(f"{RETURN_FREED_MEMORY}\n{prelude}" if self.measured else prelude,
                                        deadline) is None
        while True:
            todo = [s for s in sources if s not in self.loaded and s.name not in self.left_out]
            if not todo:
                self._note_base_memory()
                return
            source = todo[0]
            if source.kind == ANSWER:
                self._note_base_memory()
            outcome = await self._run(source.source, deadline)
            if outcome in ("died", "hung"):
                self.left_out.add(source.name)
                self.failed[source.name] = ("it stopped the kernel" if outcome == "died" else
                                            "it ran past the time the test cell had left")
                if not can_restart():
                    return
                await self.restart()
                continue
            if outcome:
                self.failed[source.name] = outcome
            else:
                self.failed.pop(source.name, None)
            self.loaded.append(source)

    def _note_base_memory(self) -> None:
        if self.base_memory is None:
            found = cgroup.memory_folder(getattr(self.km, "group", None))
            if found is not None:
                self.base_memory = cgroup.usage(*found)

    async def _run(self, source: str, deadline: float) -> str | None:
        """Run ``source``: None when it ran, the error it raised, or "died" / "hung"."""
        msg_id = self.kc.execute(source, silent=False, store_history=False, allow_stdin=False)
        while True:
            left = deadline - monotonic()
            if left <= 0:
                await ensure_async(self.km.interrupt_kernel())
                return "hung" if not await self.idle(ANSWER_WAIT) else "it ran past the time the test cell had left"
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=min(left, 0.5)))
            except Empty:
                if not await self.alive():
                    return "died"
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            await self._drain()
            content = msg.get("content", {})
            if any(isinstance(p, dict) and p.get("source") == "ask_exit" for p in content.get("payload") or []):
                return "died"  # exit() at top level: the kernel ends in a moment
            if content.get("status") == "ok":
                return None
            return f"{str(content.get('ename', 'Error'))[:100]}: {str(content.get('evalue', ''))[:500]}"

    async def _drain(self) -> None:
        """Throw away what loading printed so far (the feedback shows the notebook kernel's outputs)."""
        while True:
            try:
                await ensure_async(self.kc.iopub_channel.get_msg(timeout=0))
            except Empty:
                return

    async def idle(self, wait: float) -> bool:
        """Whether the kernel answers an empty request within ``wait`` seconds."""
        return await responsive(self.km, self.kc, wait)

    def load_problems(self) -> str:
        """What did not load, for a failing check's message (empty when everything loaded)."""
        names = [s.name for s in self.loaded if s.name in self.failed] + sorted(self.left_out)
        if not names:
            return ""
        lines = [f"{name}: {self.failed.get(name, 'it was left out')}" for name in dict.fromkeys(names)]
        return ("\n\nThe checks call your functions in a kernel that holds only the notebook's imports and your "
                "answer cells. There, these did not load:\n" + "\n".join(lines))
