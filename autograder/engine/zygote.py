"""Kernels forked into their sandboxes from one process that imported PyTorch once (the zygote).

A kernel started ahead (:mod:`autograder.engine.kernel_pool`) used to import ipykernel,
PyTorch and matplotlib in its own sandbox: about 2.3 CPU seconds per submission, most of a
small notebook's cost. Where bubblewrap runs as root (:func:`usable`), the fork server starts a
*zygote* instead (:class:`Zygote`): a fresh Python (started by ``exec``, never forked from the
grader, whose memory holds the hidden checks), with the sandbox's environment, that imports
``kernel_pool.PRELOAD`` once. A kernel started ahead is then a sandbox whose only process is a
small *holder* (:data:`HOLDER_COMMAND`), plus a process the zygote forks into the holder's
namespaces (:func:`fork_kernel`; the program is :mod:`autograder.engine.zygote_main`, whose
docstring lists the steps). The holder waits for the forked kernel's exit status and exits
with it, so the sandbox (bubblewrap, which jupyter_client watches and kills) lives exactly as
long as the kernel, as with a kernel bubblewrap started.

What this does NOT protect: only the mode where the grader is root and bubblewrap gives the
sandbox user ``--uid`` (``sandbox.mode() == "bwrap"``) forks kernels; "bwrap as nobody" and a
grader that is not root import in each sandbox as before (joining their namespaces needs
another order, untested). A forked kernel's memory starts as the zygote's (the standard
library, the preloaded modules and the zygote's program), and its pages shared with the
zygote are counted in the zygote's control group, not the sandbox's.
"""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from . import cgroup, sandbox
from .sandbox_folders import copy_font_cache


def source() -> str:
    """The zygote's program (run with ``-c``: like a cold kernel's, its ``sys.path`` starts with the working folder).

    Read through the import system: a Dask worker imports the package from a zip.
    """
    data = pkgutil.get_data(__package__, "zygote_main.py")
    assert data is not None
    return data.decode()


# The holder: wait for the kernel's exit status on stdin, then end the same way (killed by the
# same signal, or exit with the same code); end with 1 when the zygote's side is gone unsaid.
_HOLDER = (
    "import os,signal,sys\n"
    "line=sys.stdin.readline().strip()\n"
    "code=int(line) if line.lstrip('-').isdigit() else 1\n"
    "if code<0:\n"
    "    -code in (signal.SIGKILL,signal.SIGSTOP) or signal.signal(-code,signal.SIG_DFL)\n"
    "    os.kill(os.getpid(),-code)\n"
    "sys.exit(code if code>=0 else 128-code)\n"
)
#: The command of a sandbox's holder.
HOLDER_COMMAND = [sys.executable, "-S", "-c", _HOLDER]


class ZygoteError(RuntimeError):
    """A kernel could not be forked into its sandbox (the caller starts one the usual way)."""


def usable() -> bool:
    """Whether kernels are forked into their sandboxes here (see the module doc)."""
    return sandbox.mode() == "bwrap" and os.geteuid() == 0


class Zygote:
    """A running zygote (started by the fork server; it dies with it)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="autograder-zygote-"))  # root's alone: no sandbox sees it
        self.address = str(self.folder / "socket")
        home = self.folder / "home"
        copy_font_cache(home)
        env = sandbox.environment(sandbox.Limits(), str(home), token="")
        env.pop(sandbox.TOKEN_VARIABLE)
        self.process = subprocess.Popen([sys.executable, "-c", source(), self.address, *preload], env=env,
                                        cwd=str(self.folder), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _holder(process: subprocess.Popen, timeout: float) -> int:
    """The pid of the holder in the sandbox ``process`` started (once it runs the holder's program)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for child in psutil.Process(process.pid).children(recursive=True):
                try:
                    if child.cmdline() == HOLDER_COMMAND:
                        return child.pid
                except psutil.Error:
                    continue
        except psutil.Error:
            pass
        if process.poll() is not None:
            raise ZygoteError(f"the sandbox ended ({process.returncode}) before its holder started")
        time.sleep(0.005)
    raise ZygoteError(f"no holder in the sandbox after {timeout} s")


def fork_kernel(address: str, sandboxed: subprocess.Popen, *, limits: sandbox.Limits, env: dict[str, str],
                workdir: str, group: cgroup.Group | None, fds: list[int], timeout: float = 30.0) -> None:
    """Have the zygote at ``address`` fork a kernel into the sandbox of ``sandboxed`` (started on the holder).

    ``fds``: the kernel's stdin, stdout, stderr, and the write end of the holder's stdin.
    Raises :class:`ZygoteError` when it cannot (the sandbox is then the caller's to stop).
    """
    request = {
        "holder": _holder(sandboxed, timeout),
        "cgroup": [str(p) for p in group.procs_files()] if group is not None else [],
        "uid": sandbox.NOBODY,
        "gid": sandbox.NOBODY,
        "rlimits": sandbox.rlimits(limits),
        "threads": limits.threads,
        "workdir": workdir,
        "input": sandbox.INPUT,
        "env": env,
    }
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        while True:
            try:
                conn.connect(address)
                break
            except FileNotFoundError:  # still importing: it listens once it has
                if time.monotonic() > deadline:
                    raise ZygoteError(f"no zygote listens at {address} after {timeout} s") from None
                time.sleep(0.02)
            except OSError as error:  # it listened and is gone
                raise ZygoteError(f"the zygote at {address} is gone: {error}") from None
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = conn.recv(4096)
        except OSError as error:
            raise ZygoteError(f"the zygote did not answer: {error}") from None
    if reply != b"ok":
        raise ZygoteError(reply.decode(errors="replace") or "the zygote closed the connection")
