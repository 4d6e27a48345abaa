"""The zygote's program: import what a kernel needs once, then fork kernels into sandboxes.

Run by :mod:`autograder.engine.zygote` as ``python -c SOURCE ADDRESS MODULE...`` (never
imported by the grader, and importing nothing of the ``autograder`` package: what a kernel forked
from here holds in its memory is this file, the standard library and the ``MODULE`` arguments).

For each connection on the Unix socket ``ADDRESS`` it receives a request (JSON) and four file
descriptors (the kernel's stdin, stdout and stderr, and the write end of the pipe the sandbox's
holder waits on), and forks a child that, still root outside any sandbox,

1. joins the sandbox's control groups (``cgroup.procs``) and sets the resource limits;
2. joins the namespaces of the holder, a process bubblewrap started: mount (then ``chroot``
   into its root), control group, PID, network, IPC, UTS, and the user namespace last (with ``--uid``,
   bubblewrap's user namespace is nested and owns none of the others; joined first, it would
   forbid the rest);
3. becomes the sandbox's user, and drops every capability: the bounding set, then the
   effective, permitted and inheritable sets, then ``no_new_privs``;
4. forks again, so that the kernel is in the sandbox's PID namespace, replies "ok" and waits
   for the kernel, whose exit status it writes to the holder's pipe (the holder exits with it,
   and the sandbox ends with the holder, as it does with a kernel bubblewrap started).

The kernel then waits for "go" on its stdin, exactly as a kernel started ahead in the sandbox
does (:mod:`autograder.engine.kernel_pool`).

What this does NOT protect: a forked kernel's ``/proc/self/environ`` and ``cmdline`` are the
zygote's (nothing of the grader's: the zygote starts with the sandbox's environment); every
forked kernel shares the zygote's hash seed (Python's ``random`` and NumPy's are re-seeded).
"""

import ctypes
import gc
import json
import os
import random
import runpy
import shutil
import signal
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 24, 38, 1
CAPABILITY_VERSION_3 = 0x20080522
#: The order of the joins (see the module doc).
NAMESPACES = ("mnt", "cgroup", "pid", "net", "ipc", "uts", "user")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter(request: dict) -> None:
    """Steps 1-3 of the module doc, in this (forked, single-threaded) process."""
    import resource

    for path in request["cgroup"]:
        with open(path, "w") as procs:
            procs.write(str(os.getpid()))
    target = int(request["holder"])
    handles = {ns: os.open(f"/proc/{target}/ns/{ns}", os.O_RDONLY) for ns in NAMESPACES}
    root = os.open(f"/proc/{target}/root", os.O_RDONLY | os.O_DIRECTORY)
    os.setgroups([])
    for ns in NAMESPACES:
        _check(libc.setns(handles[ns], 0), f"joining the {ns} namespace")
        if ns == "mnt":
            os.fchdir(root)
            os.chroot(".")
    for handle in [*handles.values(), root]:
        os.close(handle)
    os.setresgid(request["gid"], request["gid"], request["gid"])
    os.setresuid(request["uid"], request["uid"], request["uid"])
    for name, (soft, hard) in request["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability the kernel knows
    _check(libc.capset(ctypes.byref(_CapHeader(CAPABILITY_VERSION_3, 0)), (_CapData * 2)()), "dropping capabilities")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")
    os.chdir(request["workdir"])


def become_kernel(request: dict) -> None:
    """In the sandbox: the kernel's environment, then wait for "go" and run ipykernel (never returns)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(request["threads"]))
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    if os.path.isdir(request["input"]):
        shutil.copytree(request["input"], ".", dirs_exist_ok=True)
    sys.argv = ["ipykernel_launcher", *json.loads(line)]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    os._exit(0)


def child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """The forked child (steps 1-4); never returns."""
    stdin, stdout, stderr, status = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        enter(request)
        kernel = os.fork()
    except BaseException as error:  # noqa: BLE001 - said to the grader, which starts a cold kernel
        conn.sendall(f"failed: {error!r}".encode())
        os._exit(1)
    if kernel == 0:
        try:
            for source, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
                os.dup2(source, target)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            become_kernel(request)
        finally:
            os._exit(1)
    conn.sendall(b"ok")
    for fd in (conn.fileno(), stdin, stdout, stderr):
        os.close(fd)
    _, wait_status = os.waitpid(kernel, 0)
    try:
        os.write(status, f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
    except OSError:
        pass  # the holder is gone already
    os._exit(0)


def serve(address: str, modules: list[str]) -> None:
    """Import ``modules``, then fork a child per request on ``address`` (until the parent dies)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.environ.get("MPLBACKEND") or os.environ.update(MPLBACKEND="module://matplotlib_inline.backend_inline")
    for name in modules:
        __import__(name)
    # What was imported lives as long as every kernel: the garbage collector need never scan it (a full
    # collection would take 0.15 s in each kernel, and copy the pages it touches).
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per request
    server.bind(address)
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        fds: list[int] = []
        try:
            conn.settimeout(30)  # a client that connects and says nothing must not stop the others
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            if len(fds) != 4:
                raise ValueError(f"{len(fds)} file descriptors instead of 4")
            request = json.loads(message)
            if os.fork() == 0:
                server.close()
                child(conn, request, fds)
        except Exception as error:  # noqa: BLE001 - one bad request must not stop the zygote
            try:
                conn.sendall(f"failed: {error!r}".encode())
            except OSError:
                pass
        finally:
            conn.close()
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
