"""A control group for each sandbox: a cap on its processes, its memory and its CPU in all.

The resource limits of :mod:`autograder.engine.sandbox` are per process, and the cap on
processes (``RLIMIT_NPROC``) counts the processes of a *user*: it does nothing when the
sandboxed code is root outside its user namespace (a grader running as root whose Python
installation the real ``nobody`` cannot read), so a fork bomb could slow the machine until
the notebook's time was up. A control group counts the processes (``pids.max``) and the
memory (``memory.limit_in_bytes`` / ``memory.max``) of one sandbox, whoever runs them, and caps their
CPU together (``cpu.cfs_quota_us`` / ``cpu.max``): a sandbox that starts dozens of busy processes
gets its share of the cores, and a classmate graded beside it keeps theirs. The cap is a quota per
period, not a deadline: a throttled sandbox is slower, and its own cell limits are what stop it.

Groups are made under the grader's own group of each hierarchy (cgroup v1, or v2 where the
grader's group already delegates the controller) and need the right to write there, which
root usually has; elsewhere :func:`controllers` is empty and the per-process limits are all
there is. A sandbox's command is prefixed by :func:`join_command`, which moves the process
into the group before it becomes the sandbox, so everything the code starts is counted;
:func:`remove` kills what is left in the group and deletes it.

The memory controller also measures: :class:`PeakMeter` reads the highest a group's memory reached
during a stretch of time (one call of a student's function), from its counters, which nothing in the
group can change: cgroup v1's ``memory.max_usage_in_bytes`` (reset by writing 0), or v2's ``memory.peak``
(reset for one open descriptor, Linux 6.12 and later). Where it cannot be reset, a kernel started for one
measured call has its processes moved, right before the call, into a group made for it beside its own
(:meth:`PeakMeter.for_call`): the figure is what its own group still holds then plus the new group's
whole-life peak. Where no group can be made beside it, the peak of its own group's whole life is read
(which also counts what loading its answer cells did); where there is no peak at all (cgroup v2 before
Linux 5.19) there is no meter.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: The controllers used, and the file that sets each one's limit in cgroup v1 and v2.
LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max"),
               "cpu": ("cpu.cfs_quota_us", "cpu.max")}
#: The scheduler's period of a CPU quota, in microseconds (the kernel's default).
CPU_PERIOD_US = 100_000
PREFIX = "autograder-"

_JOIN_SNIPPET = (
    "import os,sys\n"
    "for path in sys.argv[1].split(os.pathsep):\n"
    "    try:\n"
    "        with open(path,'w') as f: f.write(str(os.getpid()))\n"
    "    except OSError as e:\n"
    "        print('autograder: could not join the control group:', e, file=sys.stderr)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


@dataclass(frozen=True)
class Group:
    """One sandbox's group: a folder per hierarchy it lives in."""

    folders: tuple[Path, ...]

    def procs_files(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.folders]


def _mounts() -> list[tuple[Path, str, set[str]]]:
    """(mount point, "cgroup" or "cgroup2", controllers) of every cgroup file system."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((Path(fields[4]), tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """The grader's group in each hierarchy: controller name (or "" for v2) -> path."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def _parent(controller: str) -> tuple[Path, int] | None:
    """Where a group with ``controller`` can be made, and the cgroup version there."""
    own = _own_paths()
    for mount, kind, options in _mounts():
        if kind == "cgroup" and controller in options and controller in own:
            return mount / own[controller].lstrip("/"), 1
    for mount, kind, _ in _mounts():
        if kind == "cgroup2" and "" in own:
            folder = mount / own[""].lstrip("/")
            try:
                delegated = (folder / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if controller in delegated:
                return folder, 2
    return None


@functools.cache
def controllers() -> tuple[str, ...]:
    """The controllers whose groups can be made here (probed once by making and removing one)."""
    usable = []
    for controller in LIMIT_FILES:
        place = _parent(controller)
        if place is None:
            continue
        probe = place[0] / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
            usable.append(controller)
        except OSError:
            continue
        finally:
            try:
                probe.rmdir()
            except OSError:
                pass
    return tuple(usable)


def cpu_quota(cpu_percent: int, version: int) -> str | None:
    """What the CPU controller's file takes for ``cpu_percent`` of one core (None: no cap)."""
    if cpu_percent <= 0:
        return None
    quota = max(1000, CPU_PERIOD_US * cpu_percent // 100)  # the kernel refuses a quota under 1 ms
    return str(quota) if version == 1 else f"{quota} {CPU_PERIOD_US}"


def create(name: str, processes: int, memory_bytes: int, cpu_percent: int = 0) -> Group | None:
    """A new group limited to ``processes`` tasks, ``memory_bytes`` and ``cpu_percent`` of one core (0: no CPU
    cap); None when there are no controllers."""
    folders: list[Path] = []
    for controller in controllers():
        place = _parent(controller)
        if place is None:
            continue
        parent, version = place
        limit = {"pids": str(processes), "memory": str(memory_bytes),
                 "cpu": cpu_quota(cpu_percent, version)}[controller]
        if limit is None:
            continue
        folder = parent / f"{PREFIX}{name}"
        try:
            if folder not in folders:
                folder.mkdir(exist_ok=True)
                folders.append(folder)
            if version == 1 and controller == "cpu":
                (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (folder / LIMIT_FILES[controller][version - 1]).write_text(limit)
        except OSError:
            continue
    return Group(tuple(folders)) if folders else None


def join_command(group: Group | None, cmd: list[str], python: str = sys.executable) -> list[str]:
    """``cmd`` started inside ``group`` (``cmd`` itself when there is no group)."""
    if group is None:
        return cmd
    return [python, "-S", "-c", _JOIN_SNIPPET, os.pathsep.join(map(str, group.procs_files())), *cmd]


def members(group: Group) -> set[int]:
    """The processes in the group now."""
    pids: set[int] = set()
    for path in group.procs_files():
        try:
            pids |= {int(p) for p in path.read_text().split()}
        except (OSError, ValueError):
            continue
    return pids


def remove(group: Group | None, wait: float = 10.0) -> None:
    """Kill every process left in ``group`` and delete it (never raises).

    A group can be deleted only once its last process has been reaped, which may come a
    little after the kill: both are tried again until ``wait`` seconds have passed.
    """
    if group is None:
        return
    deadline = time.monotonic() + wait
    left = list(group.folders)
    while left:
        for pid in members(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for folder in list(left):
            try:
                folder.rmdir()
                left.remove(folder)
            except FileNotFoundError:
                left.remove(folder)
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.02)


#: The files of the memory controller a :class:`PeakMeter` reads, in cgroup v1 and v2: usage now, peak.
USAGE_FILES = {1: ("memory.usage_in_bytes", "memory.max_usage_in_bytes"), 2: ("memory.current", "memory.peak")}


def memory_folder(group: Group | None) -> tuple[Path, int] | None:
    """The folder of ``group`` in the memory hierarchy, and its cgroup version (None: no memory controller)."""
    for folder in group.folders if group is not None else ():
        for version, (usage, _) in USAGE_FILES.items():
            if (folder / usage).exists():
                return folder, version
    return None


def usage(folder: Path, version: int) -> int | None:
    """The memory a group's processes hold now, in bytes (None: it could not be read)."""
    try:
        return int((folder / USAGE_FILES[version][0]).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class PeakMeter:
    """The highest a group's memory reached from :meth:`start` to :meth:`stop`, above a base.

    The group's own counters count every page its processes touch (their heap, PyTorch's buffers,
    Python's objects, a child process, files written to a tmpfs), whatever the code in it believes
    it is doing. Where the peak cannot be reset (cgroup v2 before Linux 6.12), a meter of a group
    made for the stretch measured (``whole_life``) reads the peak of the group's whole life instead:
    never less than the peak of the stretch, so code in the group cannot lower it, and equal to it unless
    something before the stretch reached higher (what loading a kernel's answer cells did and freed):
    :meth:`for_call` moves the processes into a group made for the stretch, so that it does not count.

    Pages are counted, not bytes in use: what a process's allocator keeps after a ``free`` counts as held
    (see :mod:`autograder.kernel.allocator`, which a measured kernel runs first).
    """

    def __init__(self, folder: Path, version: int) -> None:
        self.folder, self.version = folder, version
        self._peak: IO[str] | None = None
        self._start = 0
        self.reset = True  # False: the peak is the group's whole life's (it could not be reset)
        #: a meter of :meth:`for_call` whose processes were moved: the group they left, and what it still held
        #: once the last one had left (None: one is still there, so its whole life's peak is counted instead)
        self.left: tuple[Path, int | None] | None = None
        #: the group made for the call (:meth:`for_call`), which the caller removes once the kernel is stopped
        self.made: Group | None = None

    @classmethod
    def of(cls, group: Group | None, whole_life: bool = False) -> PeakMeter | None:
        """A meter of ``group``'s memory, or None where it has none whose peak can be reset (or, with
        ``whole_life``, read)."""
        found = memory_folder(group)
        if found is None:
            return None
        meter = cls(*found)
        try:
            meter.start()
            return meter
        except (OSError, ValueError):
            meter.close()
        if not whole_life:
            return None
        meter.reset = False
        try:
            meter._start = meter._read(USAGE_FILES[meter.version][0])
            meter._read(USAGE_FILES[meter.version][1])
        except (OSError, ValueError, IndexError):
            return None
        return meter

    @classmethod
    def for_call(cls, group: Group | None) -> PeakMeter | None:
        """A meter of one call that the processes of ``group``, a group made for that call's kernel, are about to make.

        Where the peak can be reset, it is (:meth:`of`). Elsewhere (cgroup v2 before Linux 6.12) every
        process of ``group`` is moved into a new group beside it, with its limits (the memory less what
        ``group`` still holds), and the figure is what ``group`` held once the last process had left plus
        the new group's whole-life peak. It is never below the call's own peak: pages stay charged to
        the group that took them when their process moves (cgroup v2 never moves them; v1 does only with
        ``memory.move_charge_at_immigrate``, read after the move, so a moved charge is counted in the new
        group), and a group without processes takes no new pages, so ``group`` can only shrink. A process
        still in ``group`` after the move (one started meanwhile, again and again) makes ``group``'s whole
        life's peak count instead. Where no group can be made beside it, the whole life's peak of ``group``
        (:meth:`of` with ``whole_life``), which also counts what was done before the call.
        """
        meter = cls.of(group)
        if meter is not None:
            return meter
        found = memory_folder(group)
        if found is None:
            return None
        old, version = found
        made = _beside(old, version)
        if made is None:
            return cls.of(group, whole_life=True)
        meter = cls.of(Group((made,)), whole_life=True)
        if meter is None:
            remove(Group((made,)))
            return cls.of(group, whole_life=True)
        meter.made = Group((made,))
        still_there = _move_all(old, made)
        meter.left = (old, None if still_there else usage(old, version))
        return meter

    def _read(self, name: str) -> int:
        return int((self.folder / name).read_text().split()[0])

    def start(self) -> None:
        """Reset the peak to the usage now, and remember that usage."""
        usage, peak = USAGE_FILES[self.version]
        if self.version == 1:
            (self.folder / peak).write_text("0")  # v1: the peak becomes the usage now
        else:
            self.close()
            self._peak = open(self.folder / peak, "r+")  # noqa: SIM115 - held open: the reset is per descriptor
            self._peak.write("reset\n")
            self._peak.flush()
        self._start = self._read(usage)

    def stop(self, base: int | None = None) -> int | None:
        """Bytes of the highest usage since :meth:`start` above ``base`` (default: the usage at the start;
        None: it could not be read)."""
        try:
            if self._peak is not None:
                self._peak.seek(0)
                peak = int(self._peak.read().split()[0])
            else:  # v1 (reset by writing 0), or a peak never reset
                peak = self._read(USAGE_FILES[self.version][1])
            if self.left is not None:  # processes moved here (for_call): what the group they left held counts too
                folder, held = self.left
                peak += held if held is not None else int((folder / USAGE_FILES[self.version][1]).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        finally:
            self.close()
        if base is None and (not self.reset or self.left is not None):
            return None  # a whole life's peak, or two groups', says nothing about a rise from the start
        return max(0, peak - (self._start if base is None else base))

    def close(self) -> None:
        if self._peak is not None:
            try:
                self._peak.close()
            except OSError:
                pass
            self._peak = None


#: Rounds of moving a group's processes (:func:`_move_all`): each moves every process listed, and one started
#: meanwhile is listed in the next.
MOVE_ROUNDS = 20


def _beside(folder: Path, version: int) -> Path | None:
    """A new group beside ``folder`` with its limits, its memory's less what ``folder`` holds now (None: not made)."""
    made = folder.with_name(f"{folder.name}-call-{uuid.uuid4().hex[:8]}")
    held = usage(folder, version) or 0
    try:
        made.mkdir()
        for files in LIMIT_FILES.values():
            name = files[version - 1]
            if not (folder / name).exists():
                continue
            limit = (folder / name).read_text().strip()
            if name == LIMIT_FILES["memory"][version - 1] and limit.isdigit():
                limit = str(max(int(limit) - held, 2**20))  # the two groups together stay within the kernel's limit
            (made / name).write_text(limit)
    except OSError:
        remove(Group((made,)))
        return None
    return made


def _move_all(source: Path, target: Path) -> bool:
    """Move every process of ``source`` into ``target`` (a thread group at a time); whether one is still in ``source``."""
    for _ in range(MOVE_ROUNDS):
        pids = members(Group((source,)))
        if not pids:
            return False
        for pid in pids:
            try:
                (target / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue  # it ended meanwhile
            except OSError:
                return bool(members(Group((source,))))
    return bool(members(Group((source,))))
