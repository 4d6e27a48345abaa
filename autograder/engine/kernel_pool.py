"""A warm kernel pool: sandboxed kernels started ahead, fresh kernels for each submission.

Starting a sandboxed kernel and importing PyTorch costs more than most notebooks' checks. The
fork server (:mod:`autograder.engine.forkserver`) therefore keeps, for each submission being
graded, a forked process that waits for the next grading request, having already started its
own sandboxed kernel processes (:func:`autograder.engine.kernel_manager.prepare`): one for the
notebook's kernel and, where the checks run in the grader, one for the graded kernel
(:mod:`autograder.engine.graded_kernel`), each in its own sandbox, private folder and control group
(:class:`StartedAhead`). Such a process imports ipykernel, PyTorch and matplotlib (:data:`PRELOAD`),
nothing of any student, and then blocks until it is told to become a kernel. When a request comes,
the waiting process runs nbgrader as a fresh one would; its kernel managers adopt the waiting kernels
in the order they are made (``SandboxedKernelManager.started_ahead``, set in that nbgrader's
configuration): the submission's files are copied into the sandbox's input folder, and the kernel is
told "go" (the connection file to use), copies them into its working folder and starts ipykernel.

- A kernel is a child of the process whose kernel manager manages it, as jupyter_client expects.
- Each kernel serves one kernel manager of one submission: the waiting process holds the kernels
  started for the one request it is handed, and each is handed to one manager only
  (:meth:`PreparedKernel.take`); the graded kernel is never the notebook's. A restart after a crash
  starts a cold kernel, or one forked from the zygote where the first was
  (:mod:`autograder.engine.kernel_manager`).
- A waiting process older than :attr:`KernelPool.max_idle` seconds is discarded and replaced.
- A waiting process is only handed a request from the same course folder with the same
  environment (the run's mark aside) as the one it was started for; its kernel is only adopted
  when the kernel command and the limits are those it was started with, else it is stopped and
  the kernel starts cold.
- The pool runs only where the kernel is in a bubblewrap sandbox (never with the limits only).
- Where :func:`zygote.usable <autograder.engine.zygote.usable>`, the process in the sandbox has
  imported nothing: it is forked from the fork server's zygote, which imported :data:`PRELOAD` once.

What this does NOT protect: a kernel started ahead carries no mark of the grading run that will
use it (``AUTOGRADER_RUN``); it dies with the process that started it (bubblewrap's
``--die-with-parent``) and with its control group. Its output before "go" is thrown away.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic
from typing import IO

from traitlets import Bool, Float, Integer
from traitlets.config import Configurable

from . import cgroup
from .sandbox import INPUT, RUN_VARIABLE, Limits, kill_leftovers, mode


class KernelPool(Configurable):
    """Settings of the warm kernel pool (``c.KernelPool`` in ``nbgrader_config.py``)."""

    enabled = Bool(True, help="Start sandboxed kernels ahead (the fork server's pool); only where the kernel runs in "
                              "bubblewrap. AUTOGRADER_KERNEL_POOL=0 turns it off.").tag(config=True)
    max_idle = Float(300.0, help="Seconds a kernel started ahead may wait for a submission before it is discarded "
                                 "and replaced.").tag(config=True)
    zygote = Bool(True, help="Fork the kernels started ahead from a process that imported PyTorch once (the zygote), "
                             "where bubblewrap runs as root with --uid; else each imports in its sandbox."
                  ).tag(config=True)
    size = Integer(4, help="Most kernels kept waiting at once (as many as submissions are being graded at once, "
                           "up to this).").tag(config=True)


def wanted(pool: KernelPool, bubblewrap: bool) -> bool:
    """Whether kernels are started ahead with the settings ``pool`` for kernels in bubblewrap or not (``bubblewrap``:
    ``SandboxedKernelManager.bubblewrap``)."""
    return pool.enabled and mode(bubblewrap) != "limits only"


def key(request: dict) -> str:
    """What a waiting process must share with a request to take it: the course folder and the environment."""
    env = {k: v for k, v in request["env"].items() if k != RUN_VARIABLE}
    return json.dumps([request["cwd"], sorted(env.items())])


def python_kernel(kernel_cmd: list[str]) -> bool:
    """Whether ``kernel_cmd`` starts this Python's ipykernel (what a kernel started ahead can become)."""
    return list(kernel_cmd[:3]) == [sys.executable, "-m", "ipykernel_launcher"]


#: What a kernel started ahead imports: ipykernel, what every notebook imports, and what a notebook's first
#: cell imports that costs a second of its own (``torch.nn.attention.bias``, in 03 and 09, imports TorchDynamo).
#: Not the autograder
#: package: a cold kernel imports it from its path when the first check calls in (a submission's own
#: ``autograder/`` folder then shadows it, and the grader reads its forged answers as such), so a warm
#: one must too. A preloaded module cannot be shadowed by a submission's files, unlike in a cold kernel.
PRELOAD = ("ipykernel.kernelapp", "torch", "torch.nn.functional", "matplotlib.pyplot", "torch.nn.attention.bias")

# In the sandbox: import PRELOAD, wait for "go" (the kernel's arguments), then copy the submission's
# files in and become ipykernel. Nothing before "go" comes from a student. The matplotlib backend
# is the one ipykernel would choose (it sets MPLBACKEND the same way, only where it is unset).
_WAITING = (
    "import json,os,runpy,shutil,sys\n"
    "os.environ.get('MPLBACKEND') or os.environ.update(MPLBACKEND='module://matplotlib_inline.backend_inline')\n"
    f"for name in {PRELOAD!r}:\n"
    "    __import__(name)\n"
    "line=sys.stdin.readline()\n"
    "line.strip() or sys.exit(0)\n"
    f"os.path.isdir({INPUT!r}) and shutil.copytree({INPUT!r},'.',dirs_exist_ok=True)\n"
    "sys.argv=['ipykernel_launcher',*json.loads(line)]\n"
    "runpy.run_module('ipykernel_launcher',run_name='__main__',alter_sys=True)\n"
)


def waiting_command() -> list[str]:
    """The command of a kernel started ahead (it becomes ``python -m ipykernel_launcher ARGS`` on "go")."""
    return [sys.executable, "-c", _WAITING]


@dataclass
class PreparedKernel:
    """A sandboxed process started ahead, waiting to become one submission's kernel."""

    process: subprocess.Popen
    private: Path
    token: str
    group: cgroup.Group | None
    limits: Limits
    started: float
    go_pipe: IO[bytes] | None = None  # where "go" is written (None: the process's stdin)
    zygote: str | None = None  # the address of the zygote it was forked from (None: it imported in its sandbox)
    taken: bool = field(default=False)
    launched: bool = field(default=False)

    def fits(self, kernel_cmd: list[str], limits: Limits) -> bool:
        """Whether it can become ``kernel_cmd`` under ``limits`` (it is alive, and was started for them)."""
        return python_kernel(kernel_cmd) and limits == self.limits and self.process.poll() is None

    def __deepcopy__(self, memo: dict) -> PreparedKernel:
        # one running process: traitlets deep-copies configuration values, and a copy would be a second
        # owner of the same kernel (``SandboxedKernelManager.started_ahead`` carries it in the configuration)
        return self

    def take(self) -> PreparedKernel | None:
        """This kernel the first time it is asked for, None after (one kernel manager adopts it)."""
        if self.taken:
            return None
        self.taken = True
        return self

    def go(self, kernel_cmd: list[str]) -> None:
        """Tell it to become ``kernel_cmd`` (its arguments: the connection file)."""
        self.launched = True
        pipe = self.go_pipe or self.process.stdin
        assert pipe is not None
        pipe.write((json.dumps(list(kernel_cmd[3:])) + "\n").encode())
        pipe.close()  # a cold kernel's stdin is closed too (jupyter_client's launch_kernel)

    def stop(self) -> None:
        """Kill its process and everything in its sandbox (its folder and group stay, for a cold kernel)."""
        self.launched = True
        if self.go_pipe is not None and not self.go_pipe.closed:
            self.go_pipe.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        kill_leftovers(self.token)

    def discard(self) -> None:
        """Stop it and remove its control group and folder."""
        self.stop()
        cgroup.remove(self.group)
        shutil.rmtree(self.private, ignore_errors=True)


class StartedAhead:
    """The kernels started ahead for one submission: each handed to one kernel manager, in order, then none.

    The first manager of the submission (nbclient's, for the notebook's kernel) takes the first; the
    second (the graded kernel's, :mod:`autograder.engine.graded_kernel`) the second; later ones (a
    measured call's kernel) none, and start theirs as without the pool: forked from ``zygote`` (the
    fork server's zygote's address) where there is one, so is every kernel of a submission that no
    kernel was started ahead for (the first of a run), else cold.
    """

    def __init__(self, kernels: list[PreparedKernel], zygote: str | None = None) -> None:
        self.kernels = list(kernels)
        self.zygote = zygote

    def __deepcopy__(self, memo: dict) -> StartedAhead:
        return self  # running processes, as for PreparedKernel: a copy would be a second owner of each

    def take(self) -> PreparedKernel | None:
        """The next kernel not taken yet (None: each was taken)."""
        return next((kernel for kernel in self.kernels if kernel.take() is not None), None)

    def discard(self) -> None:
        """Stop the kernels no manager launched and remove their groups and folders (a launched one is its
        manager's, whose provisioner cleans it up)."""
        for kernel in self.kernels:
            if not kernel.launched:
                kernel.discard()


@dataclass
class Waiting:
    """The fork server's view of a waiting process."""

    pid: int
    fd: int  # the write end of its request pipe: closing it discards the process
    key: str
    started: float = field(default_factory=monotonic)


@dataclass
class Pool:
    """The fork server's waiting processes (see :mod:`autograder.engine.forkserver`), with the run's settings."""

    settings: KernelPool = field(default_factory=KernelPool)
    enabled: bool = False  # :func:`wanted` for the run's settings
    waiting: list[Waiting] = field(default_factory=list)
    discarded: set[int] = field(default_factory=set)

    def take(self, request: dict) -> Waiting | None:
        """A waiting process for ``request`` (the others, started for other requests, are discarded)."""
        wanted_key = key(request)
        for stale in [w for w in self.waiting if w.key != wanted_key]:
            self.discard(stale)
        return self.waiting.pop(0) if self.waiting else None

    def missing(self, running: int) -> int:
        """How many waiting processes to start while ``running`` requests are graded."""
        if not self.enabled:
            return 0
        return max(0, min(self.settings.size, running) - len(self.waiting))

    def expire(self, max_idle: float | None = None) -> list[Waiting]:
        """Discard the processes that waited longer than the limit; return them."""
        limit = self.settings.max_idle if max_idle is None else max_idle
        old = [w for w in self.waiting if monotonic() - w.started > limit]
        for w in old:
            self.discard(w)
        return old

    def discard(self, w: Waiting) -> None:
        if w in self.waiting:
            self.waiting.remove(w)
        os.close(w.fd)  # the process reads the end of its pipe, stops its kernel and exits
        self.discarded.add(w.pid)

    def gone(self, pid: int) -> None:
        """A child of the server ended: forget it if it was the pool's (one that died waiting is replaced)."""
        self.discarded.discard(pid)
        for w in [w for w in self.waiting if w.pid == pid]:
            self.waiting.remove(w)
            os.close(w.fd)

    def fds(self) -> list[int]:
        return [w.fd for w in self.waiting]
