"""Start ``nbgrader`` processes without paying for its imports each time.

Every submission is graded by its own ``nbgrader autograde`` process, and a fresh Python
spends about two CPU seconds importing nbgrader, nbconvert, Jupyter and SQLAlchemy before it
grades anything, and more for PyTorch and the checks, which run in that process
(:mod:`autograder.engine.judge`). This module's server
(``python -m autograder.engine.forkserver``) imports them once and then, for each request,
forks a child that runs ``nbgrader ARGS`` in its own session, working folder and environment,
exactly as a new process would. The server is single-threaded (forking is safe) and only
forks, reaps and reports; :class:`ForkServer` is its client, safe to share between threads.

The server also keeps the warm kernel pool (:mod:`autograder.engine.kernel_pool`): after a
request, it forks waiting processes (as many as requests run at once, up to ``KernelPool.size``)
that start a submission's sandboxed kernels ahead (the notebook's, and the graded kernel where the
checks run in the grader) and wait on a pipe; the next request like it is written to one of them,
which then runs nbgrader as above. Closing its pipe discards it (too old, another course or
environment, the end of the input). The server starts the pool's zygote (:mod:`autograder.engine.zygote`)
as soon as it has the settings, so that it imports while the server does, and a request that no
waiting process takes (the first of a run) has its kernels forked from it instead of started cold.

Protocol (one JSON object per line): the client first sends the run's settings
(:meth:`Settings.to_json <autograder.course.settings.Settings.to_json>`: the pool's and the
kernels' settings come from there, read once by the client), then the assignments the run grades
(a list; null: any), whose checks the server imports, then ``{"id", "argv", "cwd", "env",
"out", "err"}`` for each request; the server answers ``{"id", "pid"}`` when the child starts and ``{"id", "exit"}``
when it ends (``out`` and ``err`` are files for its output).
"""

from __future__ import annotations

import gc
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..course.repository import module_name
from ..course.settings import Settings
from . import kernel_manager, kernel_pool, sandbox, zygote


def _child(request: dict, prepared=None) -> None:
    """In the forked child: become ``nbgrader ARGV`` in a new session; never returns.

    ``prepared``: the kernels started ahead for it (:class:`autograder.engine.kernel_pool.StartedAhead`), if any.
    """
    code = 1
    try:
        if os.getsid(0) != os.getpid():
            os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(handle, fd)
        sys.argv = ["nbgrader", *request["argv"]]
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from nbgrader.apps.nbgraderapp import NbGraderApp
        from traitlets.config import Config

        config = Config()
        if prepared is not None:  # nbgrader's kernel managers adopt them
            config.SandboxedKernelManager.started_ahead = prepared
        try:
            NbGraderApp.launch_instance(config=config)  # what nbgrader's main() does, with that configuration
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the server
        import traceback

        traceback.print_exc()
    finally:
        try:
            if prepared is not None:
                prepared.discard()  # the kernels no manager took
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _waiting(like: dict, pipe: int, zygote_address: str | None, settings: Settings, kernels: int) -> None:
    """In a forked waiting process: start ``kernels`` kernels ahead for requests ``like`` this one, wait for one
    request, run it (its kernel managers adopt them).

    ``settings``: the run's, whose kernel manager's settings the kernels are started with.
    Reading the end of ``pipe`` instead of a request discards the kernels. ``zygote_address``: the
    server's zygote, which forks them (None: each imports in its sandbox). Never returns.
    """
    prepared = None
    line = b""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never the server's protocol pipe; the kernel's output before "go" is dropped
            os.dup2(null, fd)
        os.chdir(like["cwd"])
        os.environ.clear()
        os.environ.update({k: v for k, v in like["env"].items() if k != sandbox.RUN_VARIABLE})
        try:
            prepared = kernel_manager.prepare(settings, zygote_address, kernels)
        except Exception:  # noqa: BLE001 - no kernel ahead: the request is graded with a cold one
            prepared = None
        with os.fdopen(pipe, "rb") as requests:
            line = requests.readline()
    except BaseException:  # noqa: BLE001 - the waiting process must not return into the server
        line = b""
    if not line.strip():
        if prepared is not None:
            prepared.discard()
        os._exit(0)
    _child(json.loads(line), prepared)


def _fork(target, *args, close: list[int]) -> int:
    """Fork a child running ``target(*args)`` (never returning), closing the server's descriptors ``close``."""
    pid = os.fork()
    if pid == 0:
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        target(*args)
    return pid


def checks_of(assignments: Sequence[str] | None) -> list[str]:
    """The modules of the checks, visible and hidden, of ``assignments`` (None: of every assignment)."""
    import pkgutil

    import autograder.checks
    import autograder.hidden

    modules = None if assignments is None else {module_name(assignment) for assignment in assignments}
    return [f"{package.__name__}.{module.name}" for package in (autograder.checks, autograder.hidden)
            for module in pkgutil.iter_modules(package.__path__) if modules is None or module.name in modules]


def serve() -> None:
    """The server loop: read requests on stdin, fork (or hand them to a waiting process), report on stdout."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    stdin = sys.stdin.buffer
    buffer = b""
    while buffer.count(b"\n") < 2:  # the settings' and the assignments' lines; read from the descriptor, as the
        chunk = os.read(stdin.fileno(), 65536)  # requests after them are
        if not chunk:
            return
        buffer += chunk
    line, assignments, buffer = buffer.split(b"\n", 2)
    settings = Settings.from_json(line.decode())
    pool_settings = settings.make(kernel_pool.KernelPool)
    bubblewrap = settings.value(kernel_manager.SandboxedKernelManager, "bubblewrap")
    pool = kernel_pool.Pool(pool_settings, kernel_pool.wanted(pool_settings, bubblewrap))
    # the zygote imports what a kernel needs while this process imports what nbgrader needs: the kernels of the
    # first submissions, which no kernel was started ahead for, are forked from it too
    forker = zygote.Zygote(kernel_pool.PRELOAD) if _forks_kernels(pool) else None

    import nbconvert.exporters  # noqa: F401 - the imports every child would otherwise repeat
    import nbformat.validator
    import nbgrader.apps.nbgraderapp  # noqa: F401
    import nbgrader.converters.autograde  # noqa: F401
    import nbgrader.preprocessors  # noqa: F401
    import sqlalchemy  # noqa: F401
    import torch

    from . import cgroup, execute, graded_cells, judge  # noqa: F401

    # the checks run in nbgrader's process (judge.py): import them, and PyTorch, once for every child; those of the
    # run's assignments only (each notebook's hidden checks build their catalogue's mistakes as they are imported:
    # a tenth of a second to a third each, which a child grading another assignment pays for itself)
    torch.set_num_threads(1)
    checks = checks_of(json.loads(assignments))
    for name in checks:
        __import__(name)
    # what each grading would otherwise work out again: the modules each check imports (the graded kernel holds
    # their probes), and nbformat's validators of the course's notebooks, strict and relaxed (nbconvert's)
    graded_cells.package_closure(checks)
    for relaxed in (False, True):
        nbformat.validator.get_validator(4, nbformat.v4.nbformat_minor, relax_add_props=relaxed)
    sandbox.mode()  # probe bubblewrap and control groups once, for every child
    cgroup.controllers()
    gc.freeze()  # what every child inherits is never garbage: its collector need not scan it (0.2 s a full pass)
    # a submission's kernels: the notebook's, and the graded kernel where the checks run in the grader
    kernels = 2 if settings.value(execute.ResilientExecute, "checks_in_grader") else 1
    running: dict[int, str] = {}
    last: dict | None = None  # the last request: the waiting processes are started for requests like it
    peak = 0
    open_input = True
    while open_input or running or pool.discarded:
        ready, _, _ = select.select([stdin] if open_input else [], [], [], 0.05)
        if ready:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                open_input = False
                for waiting in list(pool.waiting):
                    pool.discard(waiting)
            buffer += chunk
        while b"\n" in buffer:  # also what came with the settings' line
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = _hand_over(pool.take(request), line)
            if pid is None:
                ahead = kernel_pool.StartedAhead([], forker.address) if forker is not None and forker.alive() else None
                pid = _fork(_child, request, ahead, close=[out.fileno(), *pool.fds()])
            running[pid] = request["id"]
            out.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
            last, peak = request, max(peak, len(running))
        if open_input and last is not None:
            pool.expire()
            missing = pool.missing(peak)
            if missing and _forks_kernels(pool) and (forker is None or not forker.alive()):
                forker = zygote.Zygote(kernel_pool.PRELOAD)
            for _ in range(missing):
                read_end, write_end = os.pipe()
                pid = _fork(_waiting, last, read_end, forker and forker.address, settings, kernels,
                            close=[out.fileno(), write_end, *pool.fds()])
                os.close(read_end)
                pool.waiting.append(kernel_pool.Waiting(pid, write_end, kernel_pool.key(last)))
        while running or pool.waiting or pool.discarded:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            pool.gone(pid)
            ident = running.pop(pid, None)
            if ident is not None:
                out.write(json.dumps({"id": ident, "exit": os.waitstatus_to_exitcode(status)}) + "\n")
    if forker is not None:
        forker.close()


def _forks_kernels(pool: kernel_pool.Pool) -> bool:
    """Whether the kernels are forked from a zygote (:mod:`autograder.engine.zygote`) with the pool's settings."""
    return pool.enabled and pool.settings.zygote and zygote.usable()


def _hand_over(waiting: kernel_pool.Waiting | None, line: bytes) -> int | None:
    """Give the request ``line`` to a waiting process; its pid, or None when there is none (or it is gone)."""
    if waiting is None:
        return None
    try:
        data = line + b"\n"
        while data:
            data = data[os.write(waiting.fd, data):]
    except OSError:
        os.close(waiting.fd)
        return None  # it died: the server reaps it, and the request goes to a new process
    os.close(waiting.fd)
    return waiting.pid


class ForkServer:
    """A running server and its client: :meth:`run` is ``subprocess.run`` for ``nbgrader ARGS``."""

    def __init__(self, settings: Settings, cwd: Path | None = None, env: dict[str, str] | None = None,
                 assignments: Sequence[str] | None = None) -> None:
        """Start the server for a run with ``settings`` in ``cwd`` (default: this module's folder; a cluster worker
        gives its unpacked course) with ``env`` (default: this process's; a run gives its mark and temporary folder).

        ``assignments``: those the run grades, whose checks the server imports ahead (None: every one's; a
        request for another assignment is graded all the same, its checks imported by its own child).
        """
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autograder.engine.forkserver"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env if env is not None else os.environ),
            cwd=str(cwd or Path(__file__).parent),
        )
        assert self.process.stdin is not None
        graded = None if assignments is None else sorted(assignments)
        self.process.stdin.write((settings.to_json() + "\n" + json.dumps(graded) + "\n").encode())
        self.process.stdin.flush()
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[str, queue.Queue] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self._lock:
                box = self._waiting.get(message["id"])
            if box is not None:
                box.put(message)
        with self._lock:
            boxes = list(self._waiting.values())
        for box in boxes:
            box.put({"exit": None, "gone": True})

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float, workdir: Path
            ) -> tuple[int | None, str, str]:
        """Run ``nbgrader ARGV``; return (exit code, or None when it was killed at ``timeout``, stdout, stderr)."""
        out, err = workdir / "nbgrader.out", workdir / "nbgrader.err"
        box: queue.Queue = queue.Queue()
        with self._lock:
            self._next += 1
            ident = str(self._next)
            self._waiting[ident] = box
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps({"id": ident, "argv": argv, "cwd": str(cwd), "env": env,
                                                  "out": str(out), "err": str(err)}) + "\n").encode())
            self.process.stdin.flush()
        try:
            started = self._answer(box, timeout, "start nbgrader")
            if started.get("gone"):
                raise RuntimeError("the fork server stopped")
            pid = started["pid"]
            try:
                code = box.get(timeout=timeout)["exit"]
            except queue.Empty:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                self._answer(box, timeout, "reap the nbgrader it stopped")
                code = None
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        read = lambda p: p.read_text(errors="replace") if p.is_file() else ""  # noqa: E731
        return code, read(out), read(err)

    def _answer(self, box: queue.Queue, limit: float, what: str) -> dict:
        """The fork server's next answer in ``box``, waited for as long as the server lives (a busy machine only
        makes it slower), at most ``limit`` seconds."""
        deadline = time.monotonic() + limit
        while True:
            try:
                return box.get(timeout=5)
            except queue.Empty:
                if self.process.poll() is not None:
                    return {"exit": None, "gone": True}
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the fork server did not {what} within {limit:.0f} s") from None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


if __name__ == "__main__":
    serve()
