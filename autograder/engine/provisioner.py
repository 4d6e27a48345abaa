"""How a grading kernel's process is made: jupyter_client's kernel provisioner for the sandbox.

:class:`SandboxProvisioner` is a kernel provisioner (``jupyter_client.provisioning``), registered
as the entry point ``autograder-sandbox`` of ``jupyter_client.kernel_provisioners`` (pyproject.toml)
and named by the kernel spec of :class:`~autograder.engine.kernel_manager.SandboxedKernelManager`,
so jupyter_client itself starts, signals, waits for and cleans up every grading kernel through it.
It owns the sandbox around the kernel (:mod:`autograder.engine.sandbox`), its writable folders
(:mod:`autograder.engine.sandbox_folders`), its control group (:mod:`autograder.engine.cgroup`),
and the choice of how the process is made:

- **warm**: a kernel started ahead for this submission by the fork server's pool
  (:mod:`autograder.engine.kernel_pool`; one for the notebook's kernel, one for the graded kernel)
  is adopted: the submission's files are copied into its (until then empty) input folder, and it
  is told to become the kernel;
- **forked**: after a restart, where the first kernel came from the fork server's zygote
  (:mod:`autograder.engine.zygote`), a new one is forked from it into a new sandbox made as the
  first one was (same folder, same control group, the submission's files copied in again); so is
  a graded kernel (:mod:`autograder.engine.graded_kernel`) or a measured call's kernel that none was
  started ahead for, and every kernel of a submission the pool had none ready for (the first of a
  run): its manager is given the zygote's address (``zygote_address``);
- **cold**: the kernel command, wrapped in the sandbox, is started as jupyter_client's local
  provisioner starts any kernel.

The kernel manager holds the settings (the sandbox's limits) and what identifies the kernel for
its whole life (its private folder, where the connection file is, its token and group): a kernel
started ahead lends them to the manager made for it.

What this does NOT protect: the sandbox's own limits are those of ``sandbox.py`` (its docstring
says what they leave open); a warm kernel has been running since it was started ahead, so its CPU
seconds (``cpu_seconds``) include the imports it made while it waited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from time import monotonic
from typing import Any

from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner

from . import cgroup, kernel_pool, zygote
from .sandbox import RUN_VARIABLE, control_group, environment, kill_leftovers, mode, sandbox_owner, sealed_owner, wrap
from .sandbox_folders import chown_tree, copy_font_cache, prepare_scratch

#: The provisioner's entry point name (``jupyter_client.kernel_provisioners`` in pyproject.toml).
NAME = "autograder-sandbox"


class SandboxProvisioner(LocalProvisioner):  # type: ignore[misc]  # jupyter_client's classes are untyped
    """Makes each process of a grading kernel in the sandbox, warm, forked or cold (see the module doc)."""

    zygote_address: str | None = None  # where a restarted kernel is forked from (the first one's zygote)

    @property
    def manager(self) -> Any:
        """The :class:`~autograder.engine.kernel_manager.SandboxedKernelManager` this provisioner serves
        (jupyter_client makes it the parent; it holds the limits, the private folder, token and group)."""
        return self.parent

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict:
        """Start the kernel ``cmd``: adopt the one started ahead, fork one from the zygote, or start it cold."""
        manager = self.manager
        workdir = os.path.realpath(kwargs.get("cwd") or os.getcwd())
        pooled = manager.take_started_ahead()
        if pooled is not None:
            if pooled.fits(cmd, manager.limits):
                return self.adopt(pooled, cmd, workdir)
            pooled.stop()  # started for other settings: this kernel starts cold, in the same folder
        elif (address := self.zygote_address or getattr(manager, "zygote_address", None)) is not None \
                and kernel_pool.python_kernel(cmd):
            try:
                return self.adopt(self.prestart_forked(address), cmd, workdir)
            except zygote.ZygoteError as error:
                self.log.warning("Restarting the kernel the usual way: %s", error)
        sandboxed = self.sandboxed(cmd, workdir, workdir, kwargs)
        return await super().launch_kernel(sandboxed, **kwargs)

    def adopt(self, pooled: kernel_pool.PreparedKernel, kernel_cmd: list[str], workdir: str) -> dict:
        """Make the process started ahead this kernel: the submission's files in, then "go"; its connection info."""
        manager = self.manager
        owner = sandbox_owner(manager.bubblewrap)
        prepare_scratch(workdir, manager.private / "work", owner)  # the folder the sandbox sees at sandbox.INPUT
        if owner is not None:
            os.chown(manager.connection_file, owner, owner)
        pooled.go(kernel_cmd)
        self.zygote_address = pooled.zygote
        manager.kernel_spec.interrupt_mode = "message"
        # what LocalProvisioner.launch_kernel records of the process it starts, for this one
        self.process = pooled.process
        self.pid = pooled.process.pid
        self.pgid = os.getpgid(pooled.process.pid)
        self.cwd = str(manager.private)
        return self.connection_info

    def sandboxed(self, kernel_cmd: list[str], workdir: str, submission: str | None, kw: dict) -> list[str]:
        """``kernel_cmd`` wrapped in the sandbox (``kw``: the launch's keywords, updated).

        ``submission`` is the folder whose files the kernel gets (None: none yet, a kernel started ahead).
        """
        manager = self.manager
        scratch = manager.private / "work"
        if scratch.exists():
            shutil.rmtree(scratch)
        owner = sandbox_owner(manager.bubblewrap)
        prepare_scratch(submission, scratch, owner)
        home = manager.private / "home"
        copy_font_cache(home)
        if owner is not None:
            chown_tree(home, owner)
            os.chown(manager.private, owner, owner)
            if os.path.exists(manager.connection_file):
                os.chown(manager.connection_file, owner, owner)
        elif sealed_owner(manager.bubblewrap) is not None:  # root in a user namespace: after a seal, all back to root
            chown_tree(manager.private, 0)
        limits = manager.limits
        cmd, env = wrap(kernel_cmd, workdir=workdir, scratch=str(scratch), private=str(manager.private), limits=limits,
                        token=manager.token)
        if manager.group is None:
            manager.group = control_group(manager.token, limits)
        cmd = cgroup.join_command(manager.group, cmd)
        if mode(manager.bubblewrap) == "limits only":
            kw["cwd"] = str(scratch)
            if RUN_VARIABLE in os.environ:
                env[RUN_VARIABLE] = os.environ[RUN_VARIABLE]
        else:
            kw["cwd"] = str(manager.private)
            # A SIGINT to the process group would end bwrap itself (and with it the sandbox):
            # interrupt through the kernel's control channel instead.
            manager.kernel_spec.interrupt_mode = "message"
        kw["env"] = env
        return cmd

    def prestart(self, zygote_address: str | None = None) -> kernel_pool.PreparedKernel:
        """Start a sandboxed process that has imported what a kernel needs and waits to become one (the pool).

        With ``zygote_address`` (where :func:`zygote.usable`) it is forked from the zygote; else, or
        when that fails, it starts in the sandbox and imports there.
        """
        if zygote_address is not None and zygote.usable():
            try:
                return self.prestart_forked(zygote_address)
            except zygote.ZygoteError as error:
                self.log.warning("Starting a kernel the usual way: %s", error)
        manager = self.manager
        kw: dict = {}
        cmd = self.sandboxed(kernel_pool.waiting_command(), str(manager.private / "cwd"), None, kw)
        process = launch_kernel(cmd, stdin=subprocess.PIPE, **kw)  # its stdin says "go" (then closes, as a cold one's)
        return kernel_pool.PreparedKernel(process, manager.private, manager.token, manager.group, manager.limits,
                                          monotonic())

    def prestart_forked(self, address: str) -> kernel_pool.PreparedKernel:
        """A sandbox around a holder, and a kernel forked into it by the zygote at ``address``."""
        manager = self.manager
        kw: dict = {}
        workdir = str(manager.private / "cwd")
        cmd = self.sandboxed(zygote.HOLDER_COMMAND, workdir, None, kw)
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
        limits = manager.limits
        prepared = kernel_pool.PreparedKernel(process, manager.private, manager.token, manager.group, limits,
                                              monotonic(), go_pipe=os.fdopen(go_write, "wb"), zygote=address)
        try:
            zygote.fork_kernel(address, process, limits=limits, workdir=workdir, group=manager.group,
                               env=environment(limits, str(manager.private / "home"), manager.token),
                               fds=[go_read, 1, 2, status_write])  # output before "go" goes where a cold one's does
        except BaseException:
            prepared.stop()
            raise
        finally:
            os.close(go_read)
            os.close(status_write)
        return prepared

    def seal(self) -> None:
        """Once the kernel has made its sockets, take back its right to write anywhere in its private folder.

        The folder and everything in it (the copy of the submission, the home's font cache, the
        sockets) go to an owner that is not the sandbox user (:func:`sandbox.sealed_owner`), so the
        student's code cannot fill the grader's disk through it; the grader, root, keeps every right.
        Where the sandbox user is the grader's own user, it could take the rights back: only the
        tmpfs folders are capped there.
        """
        owner = sealed_owner(self.manager.bubblewrap)
        if owner is not None:
            chown_tree(self.manager.private, owner)
            os.chmod(self.manager.private, 0o755)

    async def cleanup(self, restart: bool = False) -> None:
        """After the kernel ended: whatever it left in its sandbox killed; its group and folder removed at the end."""
        await super().cleanup(restart=restart)
        manager = self.manager
        kill_leftovers(manager.token)
        if not restart:
            cgroup.remove(manager.group)
            manager.group = None
            shutil.rmtree(manager.private, ignore_errors=True)

