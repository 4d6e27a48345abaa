"""Kernels forked into their sandboxes by the zygote are confined exactly as kernels bubblewrap starts."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from traitlets.config import Config

from autograder.engine import kernel_pool, zygote
from autograder.engine.kernel_manager import SandboxedKernelManager, prestart
from autograder.engine.provisioner import SandboxProvisioner

#: One worker runs this module: its zygote (a module-scoped fixture) starts once (make test: --dist loadgroup).
pytestmark = [pytest.mark.skipif(not zygote.usable(), reason="kernels are forked only where bubblewrap runs as root "
                                                             "with --uid (sandbox.mode() == 'bwrap')"),
              pytest.mark.xdist_group("zygote")]

# What a kernel can see and do, printed as one JSON object.
PROBE = r"""
import ctypes, json, os, resource, socket, sys
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
libc = ctypes.CDLL(None, use_errno=True)
grader_modules = sorted(m for m in sys.modules if m.split(".")[0] in ("autograder", "nbgrader", "sqlalchemy"))
try:
    open("/usr/written-by-a-kernel", "w")
    usr = "written"
except OSError as error:
    usr = error.strerror
package = os.path.dirname(os.path.dirname(__import__("autograder").__file__))
print(json.dumps({
    **{k: status[k].split() for k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                      "NoNewPrivs", "Seccomp")},
    "pid below 10": os.getpid() < 10,
    "root": sorted(os.listdir("/")),
    "cwd": os.getcwd(),
    "cgroups": sorted({line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()}),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "usr": usr,
    "umount /proc": libc.umount2(b"/proc", 2) == 0,
    "hidden checks": sorted(os.listdir(os.path.join(package, "autograder", "hidden"))),
    "environment": sorted(os.environ),
    "secret in /proc/self/environ": b"grader-secret" in open("/proc/self/environ", "rb").read(),
    "private memory": resource.getrlimit(resource.RLIMIT_DATA),
    "cpu seconds": resource.getrlimit(resource.RLIMIT_CPU),
    "torch imported": "torch" in sys.modules,
    "grader's modules": grader_modules,
    "forked": "autograder-zygote-" in open("/proc/self/cmdline").read(),
}))
"""


async def _run_in_pooled_kernel(prepared: kernel_pool.PreparedKernel, code: str, cwd: str, ends: bool = False) -> str:
    """Adopt ``prepared`` as a kernel manager does when grading, run ``code``, return what it printed.

    Code that ``ends`` the kernel gets no reply: then wait (at most a minute) for its sandbox to end.
    """
    manager = SandboxedKernelManager(config=Config({"SandboxedKernelManager": {"started_ahead": prepared}}))
    assert (manager.private, manager.token) == (prepared.private, prepared.token)  # the manager took it
    await manager.start_kernel(cwd=cwd)
    client = manager.client()
    client.start_channels()
    printed: list[str] = []
    try:
        await client.wait_for_ready(timeout=120)
        if ends:
            client.execute(code)
            for _ in range(600):
                if prepared.process.poll() is not None:
                    break
                await asyncio.sleep(0.1)
        else:
            await client.execute_interactive(code, timeout=120, output_hook=lambda m: printed.append(
                m["content"].get("text", "") + m["content"].get("evalue", "")))
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
    return "".join(printed)


def _probe(address: str | None, cwd: str) -> dict:
    prepared = prestart(SandboxedKernelManager(), address)
    assert (prepared.go_pipe is not None) == (address is not None)
    printed = asyncio.run(_run_in_pooled_kernel(prepared, PROBE, cwd))
    return json.loads(printed.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def forker():
    started = zygote.Zygote(kernel_pool.PRELOAD)
    yield started
    started.close()


@pytest.mark.slow
def test_a_forked_kernel_is_confined_as_a_cold_one(forker, tmp_path, monkeypatch):
    monkeypatch.setenv("NBGRADER_DB_URL", "postgresql://grader-secret@localhost/gradebook")
    (tmp_path / "data.txt").write_text("a file of the submission")
    cold, forked = _probe(None, str(tmp_path)), _probe(forker.address, str(tmp_path))
    assert (cold.pop("forked"), forked.pop("forked")) == (False, True)
    for name in ("cwd", "environment"):  # the private folder's name and the token differ per kernel
        assert cold.pop(name) != [] and forked.pop(name) != []
    assert forked == cold
    assert forked["CapBnd"] == forked["CapEff"] == forked["CapPrm"] == ["0000000000000000"]
    assert forked["Uid"] == forked["Gid"] == ["65534"] * 4 and forked["Groups"] == []
    assert forked["NoNewPrivs"] == ["1"] and forked["pid below 10"] and forked["cgroups"] == ["/"]
    assert forked["interfaces"] == ["lo"] and forked["usr"] == "Read-only file system"
    assert not forked["umount /proc"] and forked["hidden checks"] == []
    assert not forked["secret in /proc/self/environ"] and forked["torch imported"]
    assert forked["grader's modules"] == []  # the zygote was started by exec, not forked from the grader
    assert forked["private memory"][0] == SandboxedKernelManager().limits.memory_mb * 2**20


@pytest.mark.slow
def test_a_forked_kernel_sees_its_own_environment_and_files(forker, tmp_path):
    (tmp_path / "data.txt").write_text("a file of the submission")
    code = ("import os, json; print(json.dumps([open('data.txt').read(), os.environ['HOME'], "
            "os.environ['AUTOGRADER_SANDBOX_TOKEN'], os.getcwd()]))")
    prepared = prestart(SandboxedKernelManager(), forker.address)
    token, private = prepared.token, str(prepared.private)
    data, home, seen_token, cwd = json.loads(asyncio.run(_run_in_pooled_kernel(prepared, code, str(tmp_path))))
    assert (data, home, seen_token, cwd) == ("a file of the submission", f"{private}/home", token, f"{private}/cwd")


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["os._exit(3)", "os.kill(os.getpid(), 9)"])
def test_the_sandbox_ends_with_its_forked_kernel_and_says_how(forker, tmp_path, ending):
    codes = []
    for address in (None, forker.address):
        prepared = prestart(SandboxedKernelManager(), address)
        asyncio.run(_run_in_pooled_kernel(prepared, f"import os\n{ending}", str(tmp_path), ends=True))
        codes.append(prepared.process.poll())
    assert None not in codes and codes[0] == codes[1] != 0, codes  # None: the sandbox outlived its kernel


def test_when_the_zygote_is_gone_the_kernel_starts_in_its_sandbox():
    gone = zygote.Zygote(kernel_pool.PRELOAD)
    try:
        while not os.path.exists(gone.address):  # it listens, then dies
            assert gone.alive()
            time.sleep(0.1)
        gone.process.kill()
        gone.process.wait()
        prepared = prestart(SandboxedKernelManager(), gone.address)
        try:
            assert prepared.go_pipe is None and prepared.process.poll() is None
        finally:
            prepared.discard()
    finally:
        gone.close()



async def _probes_across_a_restart(prepared: kernel_pool.PreparedKernel, cwd: str, before_restart=None) -> list:
    """Adopt ``prepared``, probe it, restart it as grading does after a crash, probe the new kernel.

    ``before_restart`` is called between the two (e.g. to take the zygote away).
    """
    manager = SandboxedKernelManager(config=Config({"SandboxedKernelManager": {"started_ahead": prepared}}))
    await manager.start_kernel(cwd=cwd)
    assert isinstance(manager.provisioner, SandboxProvisioner)  # jupyter_client took it from the kernel spec
    probes = []
    try:
        for restart in (False, True):
            if restart:
                if before_restart is not None:
                    before_restart()
                await manager.restart_kernel(now=True)
            client = manager.client()
            client.start_channels()
            printed: list[str] = []
            try:
                await client.wait_for_ready(timeout=120)
                await client.execute_interactive(PROBE + "print(json.dumps(open('data.txt').read()))", timeout=120,
                                                 output_hook=lambda m, out=printed: out.append(
                                                     m["content"].get("text", "")))
            finally:
                client.stop_channels()
            lines = "".join(printed).strip().splitlines()
            probes.append({**json.loads(lines[-2]), "data": json.loads(lines[-1]), "kernel": manager.provisioner.pid})
    finally:
        await manager.shutdown_kernel(now=True)
    return probes


@pytest.mark.slow
def test_a_restarted_kernel_is_forked_again_and_confined_as_the_first(forker, tmp_path, monkeypatch):
    """After a crash or a swallowed interrupt, the kernel of a forked one is forked too (not a cold start)."""
    monkeypatch.setenv("NBGRADER_DB_URL", "postgresql://grader-secret@localhost/gradebook")
    (tmp_path / "data.txt").write_text("a file of the submission")
    first, restarted = asyncio.run(_probes_across_a_restart(prestart(SandboxedKernelManager(), forker.address),
                                                            str(tmp_path)))
    assert first.pop("kernel") != restarted.pop("kernel")  # a new sandbox
    assert first["forked"] and restarted["forked"] and restarted["torch imported"]
    assert restarted == first  # the same confinement, folder, environment and files
    assert restarted["data"] == "a file of the submission"


@pytest.mark.slow
def test_a_restart_starts_cold_when_the_zygote_is_gone(tmp_path):
    (tmp_path / "data.txt").write_text("a file of the submission")
    gone = zygote.Zygote(kernel_pool.PRELOAD)

    def kill():  # it dies; its socket stays
        gone.process.kill()
        gone.process.wait()

    try:
        first, restarted = asyncio.run(_probes_across_a_restart(prestart(SandboxedKernelManager(), gone.address),
                                                                str(tmp_path), before_restart=kill))
    finally:
        gone.close()
    assert first["forked"] and not restarted["forked"] and not restarted["torch imported"]
    assert restarted["data"] == "a file of the submission"
    for name in ("forked", "torch imported", "kernel", "cwd", "environment"):  # as a cold kernel's differ
        first.pop(name), restarted.pop(name)
    assert restarted == first
