"""The kernel manager of grading: every kernel in the sandbox of :mod:`autograder.engine.sandbox`.

:class:`SandboxedKernelManager` is nbgrader's ``Execute.kernel_manager_class`` (set by
:class:`~autograder.engine.execute.ResilientExecute`). Its traits are the sandbox's resource
limits (``nbgrader_config.py``; the ``AUTOGRADER_MEMORY_MB``, ... environment variables override
them, :meth:`autograder.engine.sandbox.Limits.from_environment`).

A kernel starts in one of two ways:

- **cold**: the kernel command, wrapped in the sandbox, is started when nbclient asks for it
  (and again after each restart);
- **warm**: in a process forked by the fork server's kernel pool (:mod:`autograder.engine.kernel_pool`),
  a sandboxed process was started ahead and has imported PyTorch and matplotlib
  (``kernel_pool.PRELOAD``), nothing of any student. The first launch of this manager adopts it:
  the submission's files are copied into its (until then empty) input folder, and it is told to
  become the kernel. A pooled kernel is used for one submission only.

A restart (after a crash or a cell that ignores its interrupt) starts a cold kernel, except where
the first kernel was forked from the fork server's zygote (:mod:`autograder.engine.zygote`): the
new one is forked from it too, into a new sandbox made as the first one was (same folder, same
control group, the submission's files copied in again), or starts cold when the zygote cannot.

What this does NOT protect: the sandbox's own limits are those of ``sandbox.py`` (its docstring
says what they leave open); a warm kernel has been running since it was started ahead, so its CPU
seconds (``cpu_seconds``) include the imports it made while it waited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from time import monotonic

from jupyter_client.launcher import launch_kernel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Integer

from ..course.settings import course_config
from . import cgroup, kernel_pool, zygote
from .sandbox import RUN_VARIABLE, Limits, control_group, environment, kill_leftovers, mode, sandbox_owner, wrap
from .sandbox_folders import chown_tree, copy_font_cache, prepare_scratch


def _limit(name: str, text: str) -> Integer:
    variable = f"AUTOGRADER_{name.upper()}"
    return Integer(getattr(Limits, name), help=f"{text} The environment variable {variable} overrides it.").tag(
        config=True)


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels run in the sandbox (see the module doc)."""

    memory_mb = _limit("memory_mb", "Private writable memory of each sandboxed process in MB (RLIMIT_DATA), and the memory "
                                    "of the sandbox's control group.")
    cpu_seconds = _limit("cpu_seconds", "CPU seconds of each sandboxed process (RLIMIT_CPU).")
    file_mb = _limit("file_mb", "Largest file a sandboxed process may write, in MB (RLIMIT_FSIZE).")
    tmp_mb = _limit("tmp_mb", "Size in MB of each of the sandbox's tmpfs folders: its working folder, home and "
                              "TMPDIR.")
    processes = _limit("processes", "Processes (tasks) of the sandbox's control group; RLIMIT_NPROC too where the "
                                    "sandbox user is not root.")
    threads = _limit("threads", "OMP/MKL threads of the kernel: one gives the same results with any number of "
                                "workers, and no oversubscription.")

    def __init__(self, **kwargs):
        # a kernel started ahead for this process (the fork server's pool) lends its private folder
        self._pooled = kernel_pool.take()
        pooled = self._pooled
        self._private = pooled.private if pooled else Path(tempfile.mkdtemp(prefix="autograder-kernel-"))
        self._token = pooled.token if pooled else uuid.uuid4().hex
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", str(self._private / "kernel"))
        kwargs.setdefault("connection_file", str(self._private / "kernel.json"))
        super().__init__(**kwargs)
        self._group: cgroup.Group | None = pooled.group if pooled else None
        self._zygote: str | None = None  # where a restarted kernel is forked from (the first one's zygote)

    @property
    def limits(self) -> Limits:
        """The traits' limits, with the environment's overrides."""
        return Limits.from_environment(Limits(**{name: getattr(self, name) for name in Limits.__dataclass_fields__}))

    def _sandboxed(self, kernel_cmd: list[str], workdir: str, submission: str | None, kw: dict) -> list[str]:
        """``kernel_cmd`` wrapped in the sandbox (``kw``: the launch's keywords, updated).

        ``submission`` is the folder whose files the kernel gets (None: none yet, a kernel started ahead).
        """
        scratch = self._private / "work"
        if scratch.exists():
            shutil.rmtree(scratch)
        owner = sandbox_owner()
        prepare_scratch(submission, scratch, owner)
        home = self._private / "home"
        copy_font_cache(home)
        if owner is not None:
            chown_tree(home, owner)
            os.chown(self._private, owner, owner)
            if os.path.exists(self.connection_file):
                os.chown(self.connection_file, owner, owner)
        limits = self.limits
        cmd, env = wrap(kernel_cmd, workdir=workdir, scratch=str(scratch), private=str(self._private), limits=limits,
                        token=self._token)
        if self._group is None:
            self._group = control_group(self._token, limits)
        cmd = cgroup.join_command(self._group, cmd)
        if mode() == "limits only":
            kw["cwd"] = str(scratch)
            if RUN_VARIABLE in os.environ:
                env[RUN_VARIABLE] = os.environ[RUN_VARIABLE]
        else:
            kw["cwd"] = str(self._private)
            # A SIGINT to the process group would end bwrap itself (and with it the sandbox):
            # interrupt through the kernel's control channel instead.
            self.kernel_spec.interrupt_mode = "message"
        kw["env"] = env
        return cmd

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        workdir = os.path.realpath(kw.get("cwd") or os.getcwd())
        pooled, self._pooled = self._pooled, None
        if pooled is not None:
            if pooled.fits(kernel_cmd, self.limits):
                self._adopt(pooled, kernel_cmd, workdir)
                return
            pooled.stop()  # started for other settings: this kernel starts cold, in the same folder
        elif self._zygote is not None and kernel_pool.python_kernel(kernel_cmd):
            try:
                self._adopt(self._prestart_forked(self._zygote), kernel_cmd, workdir)
                return
            except zygote.ZygoteError as error:
                self.log.warning("Restarting the kernel the usual way: %s", error)
        cmd = self._sandboxed(kernel_cmd, workdir, workdir, kw)
        await super()._async_launch_kernel(cmd, **kw)

    def _adopt(self, pooled: kernel_pool.PreparedKernel, kernel_cmd: list[str], workdir: str) -> None:
        """Make the kernel started ahead this manager's kernel: the submission's files in, then "go"."""
        owner = sandbox_owner()
        prepare_scratch(workdir, self._private / "work", owner)  # the folder the sandbox sees at sandbox.INPUT
        if owner is not None:
            os.chown(self.connection_file, owner, owner)
        pooled.go(kernel_cmd)
        self._zygote = pooled.zygote
        self.kernel_spec.interrupt_mode = "message"
        provisioner = self.provisioner
        assert provisioner is not None
        provisioner.process = pooled.process
        provisioner.pid = pooled.process.pid
        provisioner.pgid = os.getpgid(pooled.process.pid)
        provisioner.cwd = str(self._private)
        self._reconcile_connection_info(provisioner.connection_info)

    def prestart(self, zygote_address: str | None = None) -> kernel_pool.PreparedKernel:
        """Start a sandboxed process that has imported what a kernel needs and waits to become one (the pool).

        With ``zygote_address`` (where :func:`zygote.usable`) it is forked from the zygote; else, or
        when that fails, it starts in the sandbox and imports there.
        """
        if zygote_address is not None and zygote.usable():
            try:
                return self._prestart_forked(zygote_address)
            except zygote.ZygoteError as error:
                self.log.warning("Starting a kernel the usual way: %s", error)
        kw: dict = {}
        cmd = self._sandboxed(kernel_pool.waiting_command(), str(self._private / "cwd"), None, kw)
        process = launch_kernel(cmd, stdin=subprocess.PIPE, **kw)  # its stdin says "go" (then closes, as a cold one's)
        return kernel_pool.PreparedKernel(process, self._private, self._token, self._group, self.limits, monotonic())

    def _prestart_forked(self, address: str) -> kernel_pool.PreparedKernel:
        """A sandbox around a holder, and a kernel forked into it by the zygote at ``address``."""
        kw: dict = {}
        workdir = str(self._private / "cwd")
        cmd = self._sandboxed(zygote.HOLDER_COMMAND, workdir, None, kw)
        status_read, status_write = os.pipe()
        go_read, go_write = os.pipe()
        try:
            process = launch_kernel(cmd, stdin=status_read, **kw)
        except BaseException:
            os.close(go_read)
            os.close(go_write)
            raise
        finally:
            os.close(status_read)
        limits = self.limits
        prepared = kernel_pool.PreparedKernel(process, self._private, self._token, self._group, limits, monotonic(),
                                              go_pipe=os.fdopen(go_write, "wb"), zygote=address)
        try:
            zygote.fork_kernel(address, process, limits=limits, workdir=workdir, group=self._group,
                               env=environment(limits, str(self._private / "home"), self._token),
                               fds=[go_read, 1, 2, status_write])  # output before "go" goes where a cold one's does
        except BaseException:
            prepared.stop()
            raise
        finally:
            os.close(go_read)
            os.close(status_write)
        return prepared

    def seal(self) -> None:
        """Once the kernel has made its sockets, take back its right to write in the private folder.

        Where the sandbox user is ``nobody`` (a root grader) the folder goes back to root, so the
        student's code cannot fill the grader's disk through it. Elsewhere the sandbox user is the
        grader's own user, who could give the right back: only the tmpfs folders are capped there.
        """
        if sandbox_owner() is not None:
            os.chown(self._private, 0, 0)
            os.chmod(self._private, 0o755)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        kill_leftovers(self._token)
        if not restart:
            cgroup.remove(self._group)
            self._group = None
            shutil.rmtree(self._private, ignore_errors=True)


def prepare(request: dict, zygote: str | None = None) -> kernel_pool.PreparedKernel | None:
    """In a waiting process of the pool: start its sandboxed kernel for requests like ``request``.

    ``zygote``: the address of the fork server's zygote (:mod:`autograder.engine.zygote`), if it has one.
    """
    return SandboxedKernelManager(config=course_config(Path(request["cwd"]))).prestart(zygote)
