"""Run a student's code where it can do no harm: a bubblewrap sandbox with resource limits.

nbgrader runs a submission in an ordinary Jupyter kernel with the grader's rights. Here the
kernel's command is wrapped, so that the kernel (and anything it starts) runs

- in a bubblewrap (``bwrap``) sandbox, as the unprivileged user ``nobody`` when the grader
  is root: its own network namespace with no interface but loopback (no network), its own
  PID namespace (it sees and can signal only its own processes; when the kernel ends, every
  process it left behind is killed by the kernel), a file system made of the system's
  read-only folders, the Python environment read-only, the public part of the ``autograder``
  package (never its instructor-only part, :data:`autograder.INSTRUCTOR_ONLY`: the checks run in the grader's
  process, :mod:`autograder.engine.judge`; a copy of that public part where the course's folder is closed to
  other users), and a writable *copy* of the submission's
  folder, a home and a ``TMPDIR``, each a size-limited ``tmpfs`` (what the code writes is
  thrown away, and it cannot fill the grader's disk);
- under resource limits (private memory, CPU seconds, file size, a small private ``TMPDIR``),
  one thread for PyTorch and an environment with nothing of the grader's (no database URL,
  no tokens);
- in its own control group where the grader may make one (:mod:`autograder.engine.cgroup`),
  which caps the number of processes and the memory of the whole sandbox.

The kernel talks to nbgrader through Unix sockets in a private folder (``transport=ipc``),
since it has no network. When ``bwrap`` is missing or cannot create namespaces, the kernel
runs with the resource limits only, the processes it leaves behind are found by a token in
their environment and killed, and :func:`mode` says ``"limits only"``: that is the reduced
protection the manual's "Grading a class safely" (``docs/safety.md``) describes.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import INSTRUCTOR_ONLY
from . import cgroup
from .sandbox_folders import chown_tree, copy_font_cache, prepare_scratch

#: The user the sandboxed code runs as when the grader is root.
NOBODY = 65534
#: The environment variable that marks every process started for one sandbox.
TOKEN_VARIABLE = "AUTOGRADER_SANDBOX_TOKEN"
#: The environment variable that marks every process started to grade one submission (set by grade.py).
RUN_VARIABLE = "AUTOGRADER_RUN"
#: Environment variables passed through to the sandboxed code (everything else is dropped).
PASSED_ENVIRONMENT = ("LANG", "LC_ALL", "TZ", "PYTHONWARNINGS", "PYTHONHASHSEED", "SOURCE_DATE_EPOCH")
#: The package whose public part the sandboxed code may import.
PACKAGE = Path(__file__).resolve().parents[1]
#: Where the sandbox sees the read-only copy of the submission's files, copied from there into its working folder.
INPUT = "/run/submission"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process tree.

    Grading sets them as traits of :class:`~autograder.engine.kernel_manager.SandboxedKernelManager`
    (``nbgrader_config.py``, the environment's overrides read once with the rest of the settings:
    :class:`autograder.course.settings.Settings`).
    """

    memory_mb: int = 4096  # private writable memory of each process (RLIMIT_DATA), and memory of the control group
    cpu_seconds: int = 1200  # CPU time of each process (RLIMIT_CPU)
    file_mb: int = 256  # largest file written (RLIMIT_FSIZE)
    tmp_mb: int = 256  # size of the private /tmp, and of the working folder and of the home (each a tmpfs)
    processes: int = 256  # tasks of the sandbox's control group; RLIMIT_NPROC too when its user is not root
    threads: int = 1  # OMP/MKL threads: same results with any number of workers, no oversubscription
    cpu_percent: int = 100  # CPU of the control group, all its processes together, in percent of one core (0: none)
    bubblewrap: bool = True  # in a bubblewrap sandbox where one can be made; False: with these limits only


def _run_quiet(cmd: Sequence[str]) -> bool:
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _probe() -> list[str]:
    """A sandbox that must be able to start this Python and read the package (either may be unreadable for nobody:
    a Python under /root, a course in a folder only root may enter)."""
    # A Dask worker imports the package from the uploaded zip; its grading processes, from the unpacked folder.
    package = _package_binds() if PACKAGE.is_dir() else []
    read = f"import os; os.listdir({str(PACKAGE)!r})" if package else "pass"
    return ["--unshare-all", "--die-with-parent", *_system_binds(), *_python_binds(), *package, "--proc", "/proc",
            "--dev", "/dev", sys.executable, "-S", "-c", read]


def mode(bubblewrap: bool = True) -> str:
    """How sandboxed code runs here: ``"bwrap as nobody"``, ``"bwrap"`` or ``"limits only"``.

    ``bubblewrap`` False (:attr:`Limits.bubblewrap`: ``--no-sandbox``, ``AUTOGRADER_SANDBOX=off``)
    forces ``"limits only"``.
    """
    return _probed_mode() if bubblewrap else "limits only"


@functools.cache
def _probed_mode() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "limits only"
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv and _run_quiet([*_as_nobody(setpriv), bwrap, *_probe()]):
            return "bwrap as nobody"
        if _run_quiet([bwrap, "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL", *_probe()]):
            return "bwrap"
        return "limits only"
    return "bwrap" if _run_quiet([bwrap, *_probe()]) else "limits only"


def why_not(bubblewrap: bool = True) -> str:
    """Why :func:`mode` is ``"limits only"`` here, in words ("" when a sandbox can be made)."""
    if mode(bubblewrap) != "limits only":
        return ""
    if not bubblewrap:
        return "the sandbox is turned off (AUTOGRADER_SANDBOX=off, or SandboxedKernelManager.bubblewrap)"
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    return "bwrap is installed but cannot create namespaces here (a container that forbids them?)"


def _as_nobody(setpriv: str) -> list[str]:
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all", "--"]


_LIMIT_SNIPPET = (
    "import json,os,resource,shutil,sys\n"
    "for name,(soft,hard) in json.loads(sys.argv[1]).items():\n"
    "    resource.setrlimit(getattr(resource,name),(soft,hard))\n"
    f"os.path.isdir({INPUT!r}) and shutil.copytree({INPUT!r},'.',dirs_exist_ok=True)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def rlimits(limits: Limits) -> dict[str, tuple[int, int]]:
    """The per-process resource limits (``resource`` module names, soft and hard) of ``limits``."""
    mb = 2**20
    found = {
        # Private writable memory (heap, anonymous maps, libraries' data), not address space: PyPI's CUDA build of
        # PyTorch (every Python but this machine's 3.11) maps 3.4 GB of library code at import, 0.9 GB for the CPU build.
        "RLIMIT_DATA": (limits.memory_mb * mb, limits.memory_mb * mb),
        "RLIMIT_CPU": (limits.cpu_seconds, limits.cpu_seconds + 5),
        "RLIMIT_FSIZE": (limits.file_mb * mb, limits.file_mb * mb),
        "RLIMIT_CORE": (0, 0),
    }
    if sandbox_owner(limits.bubblewrap) is not None or os.geteuid() != 0:
        found["RLIMIT_NPROC"] = (limits.processes, limits.processes)
    return found


def limited(cmd: Sequence[str], limits: Limits, python: str = sys.executable) -> list[str]:
    """``cmd`` run under ``limits`` (a tiny exec wrapper: no dependency on ``prlimit``)."""
    return [python, "-S", "-c", _LIMIT_SNIPPET, json.dumps(rlimits(limits)), *cmd]


#: What of /etc the code may see: enough to run, nothing secret (no shadow, no keys).
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "localtime", "nsswitch.conf", "hosts",
       "mime.types", "alternatives", "os-release", "fonts")


def _system_binds() -> list[str]:
    args = []
    for folder in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for name in ETC:
        path = f"/etc/{name}"
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _python_binds() -> list[str]:
    """The Python installation and environment, read-only (never the course around them)."""
    folders = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return [a for f in sorted(folders) if not f.startswith("/usr/") for a in ("--ro-bind", f, f)]


def _package_binds() -> list[str]:
    """The autograder package read-only, without its instructor-only parts (an empty folder or file in their place).

    Where every user may read the package, the package itself is bound, its instructor-only parts
    hidden. Where not (a course closed to every user but its instructor: the hub's guide), bubblewrap
    could not reach it (started as ``nobody``, or by root in a user namespace, which has no right over
    another user's files): a copy of its public part (:func:`public_copy`) is bound at its path instead.
    """
    pkg = str(PACKAGE)
    if not _readable_by_all(PACKAGE):
        return ["--ro-bind", str(public_copy()), pkg]
    args = ["--ro-bind", pkg, pkg]
    for private in INSTRUCTOR_ONLY:
        path = f"{pkg}/{private}"
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _readable_by_all(package: Path) -> bool:
    """Whether every user may enter every folder down to ``package`` and read it."""
    try:
        return bool(package.stat().st_mode & 0o004) and all(p.stat().st_mode & 0o001 for p in (package, *package.parents))
    except OSError:
        return False


def public_copy() -> Path:
    """The package without its instructor-only parts, readable by every user, in the temporary folder.

    One copy per version of the package and temporary folder (a grading run's, removed with the run),
    shared by the run's processes, rather than one per process; a folder of that name that is not this
    user's own, closed to others' writes, is never used (another one is made, removed at exit).
    """
    named = Path(tempfile.gettempdir()) / f"autograder-package-{os.geteuid()}-{_version_of(PACKAGE)}"
    if _own_closed_folder(named):
        return named / PACKAGE.name
    made = Path(tempfile.mkdtemp(prefix="autograder-package-"))
    _copy_public_part(made / PACKAGE.name)
    try:
        os.rename(made, named)  # whole or not at all; a second process's copy loses the race and goes
        return named / PACKAGE.name
    except OSError:
        if _own_closed_folder(named):
            shutil.rmtree(made, ignore_errors=True)
            return named / PACKAGE.name
    atexit.register(shutil.rmtree, made, True)
    return made / PACKAGE.name


def _copy_public_part(target: Path) -> None:
    def left_out(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or n.endswith(".pyc")
                or (Path(folder) == PACKAGE and n in INSTRUCTOR_ONLY)]

    shutil.copytree(PACKAGE, target, ignore=left_out)
    for private in INSTRUCTOR_ONLY:
        if (PACKAGE / private).is_dir():
            (target / private).mkdir()
        elif (PACKAGE / private).exists():
            (target / private).touch()
    for path in (target.parent, target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


@functools.cache
def _version_of(package: Path) -> str:
    """A name for the package's files as they are now (paths, sizes and times of its public files)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] not in INSTRUCTOR_ONLY:
            info = path.stat()
            digest.update(f"{relative}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _own_closed_folder(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def environment(limits: Limits, home: str, token: str) -> dict[str, str]:
    """The whole environment of sandboxed code."""
    env = {k: os.environ[k] for k in PASSED_ENVIRONMENT if k in os.environ}
    bindir = os.path.dirname(sys.executable)
    env.update(
        PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        HOME=home,
        TMPDIR=os.path.join(os.path.dirname(home), "tmp"),
        IPYTHONDIR=f"{home}/.ipython",
        MPLCONFIGDIR=f"{home}/.matplotlib",
        PYTHONDONTWRITEBYTECODE="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        # the package grading imported (a worktree's, a cluster worker's unpacked course), not whichever one
        # the environment has installed: only this one is in the sandbox
        PYTHONPATH=str(PACKAGE.parent),
        OMP_NUM_THREADS=str(limits.threads),
        MKL_NUM_THREADS=str(limits.threads),
        OPENBLAS_NUM_THREADS=str(limits.threads),
        **{TOKEN_VARIABLE: token},
    )
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def wrap(
    cmd: Sequence[str],
    *,
    workdir: str,
    scratch: str,
    private: str,
    limits: Limits,
    token: str,
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``cmd`` sandboxed.

    ``workdir`` is the folder the code believes it runs in: a size-limited tmpfs into which
    the files of ``scratch`` (a copy of the submission's files) are copied when it starts.
    ``private`` is mounted at the same path, writable (connection file and sockets of a
    kernel); its ``home`` is a tmpfs too, with the grader's font cache read-only.
    """
    env = environment(limits, os.path.join(private, "home"), token)
    current = mode(limits.bubblewrap)
    if current == "limits only":
        as_nobody = _as_nobody(shutil.which("setpriv") or "setpriv") if sandbox_owner(False) is not None else []
        return as_nobody + limited(cmd, limits), env
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    prefix: list[str] = []
    if current == "bwrap as nobody":
        prefix = _as_nobody(shutil.which("setpriv") or "setpriv")
    args = [bwrap, "--unshare-all", "--die-with-parent", "--clearenv"]
    if current == "bwrap" and os.geteuid() == 0:
        args += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
    if current == "bwrap as nobody":
        args += ["--unshare-user", "--disable-userns"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += _system_binds() + _python_binds()
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += _package_binds()
    size = str(limits.tmp_mb * 2**20)
    args += ["--bind", private, private, "--ro-bind", scratch, INPUT, "--size", size, "--tmpfs", workdir]
    home = env["HOME"]
    args += ["--size", size, "--tmpfs", home]
    for dirpath, _, filenames in os.walk(home):  # the font cache, read-only in the tmpfs home
        for name in filenames:
            path = os.path.join(dirpath, name)
            args += ["--ro-bind", path, path]
    args += ["--chdir", workdir, "--size", size, "--tmpfs", env["TMPDIR"]]
    # Nothing outside the submission's folder and its private folder is writable (not even /tmp).
    args += ["--remount-ro", "/"]
    # Outside the sandbox, bwrap itself keeps the grading run's mark, so a run that is
    # stopped can find and kill it (and with it every process in the sandbox).
    env_outside = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if RUN_VARIABLE in os.environ:
        env_outside[RUN_VARIABLE] = os.environ[RUN_VARIABLE]
    return prefix + args + limited(cmd, limits), env_outside


def open_to_sandbox_user(folder: Path) -> None:
    """Let the sandbox user pass through ``folder`` (a root grader's) to a folder of its own inside, and no one else.

    A grading run's temporary folder holds every kernel's private folder; where bubblewrap itself runs as
    ``nobody`` it must reach the one it binds. ``nobody``'s group may enter ``folder`` but not list it; other
    users may do neither (the copies of submissions are in there). Nothing to do for a grader that is not root.
    """
    if os.geteuid() == 0:
        os.chown(folder, -1, NOBODY)
        os.chmod(folder, 0o710)


def control_group(token: str, limits: Limits) -> cgroup.Group | None:
    """A control group that caps the sandbox's processes, memory and CPU in all (None where groups cannot be made)."""
    return cgroup.create(token, processes=limits.processes, memory_bytes=limits.memory_mb * 2**20,
                         cpu_percent=limits.cpu_percent)


def sandbox_owner(bubblewrap: bool = True) -> int | None:
    """The uid the sandboxed code runs as and that must own its writable folders (None: the grader's own).

    A root grader runs it as ``nobody``: in the bubblewrap sandbox, and also with the limits
    only (no bubblewrap), where ``nobody`` can run this Python; the code then cannot write what
    root owns (the gradebook, a Gradescope ``results.json``). ``bubblewrap``: :attr:`Limits.bubblewrap`.
    """
    current = mode(bubblewrap)
    if current == "bwrap as nobody" or (current == "limits only" and _nobody_runs_python()):
        return NOBODY
    return None


def sealed_owner(bubblewrap: bool = True) -> int | None:
    """Who owns a kernel's private folder once the kernel has started, so that it cannot write there.

    Root where the sandboxed code runs as ``nobody``. ``nobody`` where it runs as root outside its
    user namespace (a root grader's ``bwrap`` mode): without capabilities there, that root is only
    the owner of root's files, and a folder of nobody's is closed to it. None where the code runs as
    the grader's own user, who could take any right back.
    """
    if sandbox_owner(bubblewrap) is not None:
        return 0
    if mode(bubblewrap) == "bwrap" and os.geteuid() == 0:
        return NOBODY
    return None


@functools.cache
def _nobody_runs_python() -> bool:
    # Python as nobody must start this Python again (the kernel is an exec from the limits wrapper): the first
    # exec, by setpriv, can find a path that nobody alone cannot (a Python under a root-only /root).
    setpriv = shutil.which("setpriv")
    again = "import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'import json'])"
    return os.geteuid() == 0 and setpriv is not None and _run_quiet([*_as_nobody(setpriv), sys.executable, "-S", "-c", again])


def kill_leftovers(token: str, variable: str = TOKEN_VARIABLE, prefix: bool = False) -> int:
    """Kill every process whose environment has ``variable=token`` (``prefix``: a value that starts with
    ``token``), and wait until they are gone; return how many were killed.

    A scan sees the processes that lived when it began: a marked process may fork while one runs, and its child,
    marked too, would go on (making files in a folder about to be removed). So the scans repeat until one finds
    none, each after the processes it killed have ended.
    """
    import psutil

    killed = 0
    me = os.getpid()
    for _ in range(50):  # each round kills what the last one's processes started before they died: a handful at most
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                value = proc.environ().get(variable)
                if value == token or (prefix and value is not None and value.startswith(token)):
                    proc.kill()
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        if not found:
            break
        killed += len(found)
        _until_ended(found, seconds=5)
    return killed


def _until_ended(procs: list, seconds: float) -> None:
    """Wait until each of ``procs`` (killed) has ended or is a zombie; not reaped here: a child's parent reaps it."""
    import psutil

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                continue
        if not alive:
            return
        procs = alive
        time.sleep(0.01)


def run(
    cmd: Sequence[str],
    *,
    stdin: bytes,
    timeout: float,
    limits: Limits | None = None,
) -> tuple[int | None, bytes, bytes]:
    """Run ``cmd`` sandboxed with ``stdin``; return (exit code or None on timeout, stdout, stderr).

    On timeout the whole sandbox is killed; nothing it started survives.
    """
    limits = limits or Limits()
    private = Path(tempfile.mkdtemp(prefix="autograder-run-"))
    token = uuid.uuid4().hex
    group = control_group(token, limits)
    try:
        scratch = private / "work"
        owner = sandbox_owner(limits.bubblewrap)
        prepare_scratch(None, scratch, owner)
        home = private / "home"
        copy_font_cache(home)
        if owner is not None:
            chown_tree(private, owner)
        full, env = wrap(cmd, workdir=str(private / "cwd"), scratch=str(scratch), private=str(private), limits=limits,
                         token=token)
        full = cgroup.join_command(group, full)
        proc = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=str(scratch), env=env, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            code = None
        kill_group(proc.pid)
        return code, out, err
    finally:
        kill_leftovers(token)
        cgroup.remove(group)
        shutil.rmtree(private, ignore_errors=True)


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid``; a group already gone is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
