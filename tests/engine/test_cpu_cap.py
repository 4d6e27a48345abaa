"""Each sandbox's CPU is capped, all its processes together (:mod:`autograder.engine.cgroup`).

Without a cap, a submission that started dozens of busy processes slowed a classmate graded beside it
until that classmate's cells ran out of time. The verdicts below are upper bounds on CPU time used:
a busy machine only lowers what the sandbox gets, so none depends on the machine's speed.
"""

from __future__ import annotations

import re
import sys

import pytest

from autograder.engine import cgroup, sandbox

needs_cpu = pytest.mark.skipif("cpu" not in cgroup.controllers(), reason="no CPU control group can be made here "
                               "(not root, or cgroup v2 without the cpu controller delegated): a sandbox's CPU is "
                               "then not capped, as docs/safety.md says")

#: Four busy processes for two seconds of wall-clock time each; the parent prints the CPU they used.
BUSY = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
t = os.times()
print("cpu", t.children_user + t.children_system)
"""


@needs_cpu
def test_a_sandbox_with_busy_processes_gets_its_share_of_one_core_only():
    limits = sandbox.Limits(cpu_percent=50)
    code, out, err = sandbox.run([sys.executable, "-c", BUSY], stdin=b"", timeout=120, limits=limits)
    assert code == 0, err.decode()[-2000:]
    used = float(re.search(r"cpu ([\d.]+)", out.decode()).group(1))
    # 2 s at half a core is 1 CPU-second; four uncapped processes on two cores would use about 4
    assert used < 1.5, f"the sandbox's processes used {used:.2f} CPU-seconds in 2 s at a cap of half a core"


@needs_cpu
def test_the_cap_is_written_as_the_limits_say():
    group = sandbox.control_group("cpu-cap-test", sandbox.Limits(cpu_percent=150))
    try:
        (folder,) = [f for f in group.folders if (f / "cpu.cfs_quota_us").exists() or (f / "cpu.max").exists()]
        text = (folder / ("cpu.cfs_quota_us" if (folder / "cpu.cfs_quota_us").exists() else "cpu.max")).read_text()
        assert text.split()[0] == "150000"
    finally:
        cgroup.remove(group)
    uncapped = sandbox.control_group("cpu-cap-test-none", sandbox.Limits(cpu_percent=0))
    try:
        assert not any((f / "cpu.cfs_quota_us").exists() for f in uncapped.folders)
        assert all("-1" in (f / "cpu.max").read_text() or "max" in (f / "cpu.max").read_text()
                   for f in uncapped.folders if (f / "cpu.max").exists())
    finally:
        cgroup.remove(uncapped)


def test_a_quota_is_what_each_cgroup_version_takes():
    assert cgroup.cpu_quota(100, 1) == "100000"
    assert cgroup.cpu_quota(250, 2) == "250000 100000"
    assert cgroup.cpu_quota(0, 1) is None and cgroup.cpu_quota(-5, 2) is None
    assert cgroup.cpu_quota(1, 1) == "1000"  # never under the 1 ms the kernel takes
