"""The kernel manager of grading: every kernel in the sandbox of :mod:`autograder.engine.sandbox`.

:class:`SandboxedKernelManager` is nbgrader's ``Execute.kernel_manager_class`` (set by
:class:`~autograder.engine.execute.ResilientExecute`). Its traits are the sandbox's resource
limits (``nbgrader_config.py``; the ``AUTOGRADER_MEMORY_MB``, ... environment variables override
them where a run starts: :class:`autograder.course.settings.Settings`). Its kernel spec names the
kernel provisioner :class:`~autograder.engine.provisioner.SandboxProvisioner`, which makes the
kernel's processes (warm, forked or cold: see there); the manager holds what identifies the kernel
for its whole life: its private folder (the connection file and sockets are there), its token and
its control group, lent by the kernel started ahead for it when there is one (the notebook's kernel and
the graded kernel each have one: :class:`~autograder.engine.kernel_pool.StartedAhead`).

:class:`PlainKernelManager` is the manager of kernels run without this module's manager at all
(``ResilientExecute.sandbox = False``, and the tests' plain kernels; ``Grading.sandbox False`` keeps
:class:`SandboxedKernelManager`, with its limits and without bubblewrap): a kernel of the grader's own
user, protected by nothing, but talking through Unix sockets in a private folder as the sandboxed one
does. jupyter_client's default, TCP ports the manager picks and the kernel binds a moment later, races
every other process picking ports on the machine: with kernels starting beside each other, one fails
with "Address already in use".
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Any, Bool, Integer

from ..course.settings import Settings
from . import cgroup, kernel_pool, provisioner
from .sandbox import Limits


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
    cpu_percent = _limit("cpu_percent", "CPU of the sandbox's control group, every process in it together, in percent "
                                        "of one core (0: no cap): a submission that starts busy processes slows only "
                                        "itself, never a classmate graded beside it.")
    bubblewrap = Bool(True, help="Run each kernel in a bubblewrap sandbox where one can be made; False: with the "
                      "resource limits only (Grading.sandbox False sets it too). The environment variable "
                      "AUTOGRADER_SANDBOX=off overrides it (grading then refuses unless Grading.sandbox is False)."
                      ).tag(config=True)

    started_ahead = Any(None, allow_none=True, help="The kernels started ahead for this submission by the fork "
                        "server's pool (running processes, kernel_pool.StartedAhead, set by the fork server in the "
                        "configuration of the nbgrader it runs, never in a file): each manager made with it adopts "
                        "the next one, until none is left.").tag(config=True, set_by="the fork server")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # a kernel started ahead for this submission lends its private folder (nbgrader makes this manager deep
        # inside its preprocessors: the configuration is the one way in)
        self._started_ahead = self.started_ahead.take() if self.started_ahead is not None else None
        pooled = self._started_ahead
        #: The kernel's own folder: connection file, sockets, home, the copy of the submission.
        self.private = pooled.private if pooled else Path(tempfile.mkdtemp(prefix="autograder-kernel-"))
        #: Marks every process of this kernel's sandbox (:func:`autograder.engine.sandbox.kill_leftovers`).
        self.token = pooled.token if pooled else uuid.uuid4().hex
        if "transport" not in kwargs:
            self.transport = "ipc"
        if "ip" not in kwargs:
            self.ip = str(self.private / "kernel")
        if "connection_file" not in kwargs:
            self.connection_file = str(self.private / "kernel.json")
        #: The sandbox's control group (None until the first sandbox is made, or where none can be).
        self.group: cgroup.Group | None = pooled.group if pooled else None
        #: Where a kernel of this manager is forked from when none was started ahead for it (None: cold).
        self.zygote_address: str | None = self.started_ahead.zygote if self.started_ahead is not None else None

    def take_started_ahead(self) -> kernel_pool.PreparedKernel | None:
        """The kernel started ahead for this manager, once (None: there is none, or it was taken)."""
        pooled, self._started_ahead = self._started_ahead, None
        return pooled

    @property
    def kernel_spec(self) -> KernelSpec | None:
        """The kernel spec, naming the sandbox's provisioner (jupyter_client then makes it this kernel's)."""
        spec = super().kernel_spec
        if spec is not None:
            spec.metadata["kernel_provisioner"] = {"provisioner_name": provisioner.NAME, "config": {}}
        return spec

    @property
    def limits(self) -> Limits:
        """The traits' limits."""
        return Limits(**{name: getattr(self, name) for name in Limits.__dataclass_fields__})


def prestart(manager: SandboxedKernelManager, zygote: str | None = None) -> kernel_pool.PreparedKernel:
    """A sandboxed process started ahead for ``manager``'s limits, waiting to become a kernel (the pool).

    ``zygote``: the address of the fork server's zygote (:mod:`autograder.engine.zygote`) to fork it
    from, if there is one.
    """
    made = provisioner.SandboxProvisioner(kernel_id=uuid.uuid4().hex, kernel_spec=manager.kernel_spec, parent=manager)
    return made.prestart(zygote)


def prepare(settings: Settings, zygote: str | None = None, kernels: int = 1) -> kernel_pool.StartedAhead:
    """In a waiting process of the pool: start ``kernels`` sandboxed kernels with the run's ``settings``, each
    with its own manager (its own private folder, token and control group)."""
    started = kernel_pool.StartedAhead([], zygote)
    try:
        for _ in range(kernels):
            started.kernels.append(prestart(settings.make(SandboxedKernelManager), zygote))
    except Exception:
        if not started.kernels:
            raise
    return started


class PlainKernelManager(AsyncKernelManager):
    """A kernel manager of unsandboxed kernels whose sockets are files in a private folder (see the module doc)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: The kernel's own folder: its connection file and sockets, removed when the kernel is shut down.
        self.private = Path(tempfile.mkdtemp(prefix="autograder-kernel-"))
        self.transport = "ipc"
        self.ip = str(self.private / "kernel")
        self.connection_file = str(self.private / "kernel.json")

    def cleanup_ipc_files(self) -> None:
        """The sockets removed; on a shutdown (not a restart: the connection file is gone by then), the folder too."""
        super().cleanup_ipc_files()
        if not os.path.exists(self.connection_file):
            shutil.rmtree(self.private, ignore_errors=True)
