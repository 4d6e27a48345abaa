"""Sandboxed kernels forked from one zygote per test process, as grading forks a run's first submission's.

A kernel that imports PyTorch in its sandbox costs seconds of CPU; grading forks its kernels from its fork server's
zygote (:mod:`autograder.engine.zygote`) wherever it can (root with bubblewrap), and so do the tests that grade a
notebook in-process: :func:`config` is the configuration of a :class:`~autograder.engine.execute.ResilientExecute`
whose kernels are forked from this process's zygote, started at the first call and stopped when the process ends.
Where no zygote can fork kernels, it is an empty configuration: the kernels are made as grading makes them there.
"""

from __future__ import annotations

import atexit
import os

from traitlets.config import Config

from autograder.engine import kernel_pool, zygote

_made: dict[str, zygote.Zygote] = {}


def config(base: Config | None = None) -> Config:
    """``base`` (default: an empty configuration) with its sandboxed kernels forked from this process's zygote."""
    made = Config() if base is None else base
    if not zygote.usable():
        return made
    running = _made.get("zygote")
    if running is None or not running.alive():
        running = _made["zygote"] = zygote.Zygote(kernel_pool.PRELOAD)
        owner = os.getpid()  # a forked child that exits through Python's exit leaves it to this process
        atexit.register(lambda: os.getpid() == owner and running.close())
    made.SandboxedKernelManager.started_ahead = kernel_pool.StartedAhead([], running.address)
    return made
