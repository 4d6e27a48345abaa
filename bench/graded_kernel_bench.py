"""The graded kernel's start on a submission's critical path: started ahead by the pool, or forked from the zygote.

Each submission's checks call its functions in the graded kernel (:mod:`autograder.engine.graded_kernel`),
a second sandboxed kernel launched once the notebook's kernel is ready. This script grades one
notebook (reference answers, hidden tests; ``--notebook``, default 01) ``--runs`` times in this process,
as nbgrader's preprocessor runs it, each time with kernels started ahead as the fork server's pool
starts them (forked from a zygote that imported PyTorch once), in two ways:

* **forked at launch**: one kernel started ahead, the notebook's; the graded kernel is forked from the
  zygote when it is launched (the sandbox, its folder and control group made then);
* **started ahead**: two, the notebook's and the graded kernel's (what the pool does now).

It prints, per way, the median seconds of: launching the graded kernel (done while the grader waits,
before the notebook's first cell runs), the first test cell's wait for it to be ready, both together
(the graded kernel's start on the critical path), and the whole notebook. Results go to
``bench/results/graded_kernel_bench.json``. Needs the bubblewrap sandbox and the zygote (root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traitlets.config import Config  # noqa: E402

from autograder.course.settings import Settings  # noqa: E402
from autograder.engine import graded_kernel, kernel_manager, kernel_pool, sandbox, zygote  # noqa: E402
from autograder.engine.execute import ResilientExecute  # noqa: E402
from tests.notebook_code import nbgrader_meta, source_notebook  # noqa: E402

WAYS = {"forked at launch": 1, "started ahead": 2}


class Timed:
    """Seconds spent in the graded kernel's launch and in its first connection, in one grading."""

    def __init__(self) -> None:
        self.seconds = {"launch": 0.0, "wait at the first test cell": 0.0}

    def wrap(self, name: str, method: str) -> None:
        old = getattr(graded_kernel.GradedKernel, method)
        seconds = self.seconds

        async def timed(kernel, *args, **kwargs):
            start = time.monotonic()
            try:
                return await old(kernel, *args, **kwargs)
            finally:
                if kernel.restarts == 0:
                    seconds[name] += time.monotonic() - start

        setattr(graded_kernel.GradedKernel, method, timed)


def grade_once(notebook_name: str, kernels: int, address: str, settings: Settings, folder: Path) -> dict:
    """Grade ``notebook_name`` once with ``kernels`` kernels started ahead (given time to import); its times."""
    originals = {m: getattr(graded_kernel.GradedKernel, m) for m in ("launch", "_connect")}
    timed = Timed()
    timed.wrap("launch", "launch")
    timed.wrap("wait at the first test cell", "_connect")
    started = kernel_manager.prepare(settings, address, kernels)
    time.sleep(5)  # as in the pool: the kernels wait while the previous submission is graded
    config = Config(settings.config())  # the course's limits: those the kernels were started ahead with
    config.CourseDirectory.root = str(ROOT)
    config.SandboxedKernelManager.started_ahead = started
    notebook = source_notebook(notebook_name)
    notebook.cells = [c for c in notebook.cells
                      if c.cell_type != "code" or nbgrader_meta(c) or c.source.startswith("import")]
    start = time.monotonic()
    try:
        ResilientExecute(timeout=600, config=config).preprocess(
            notebook, {"metadata": {"path": str(folder)},
                       "nbgrader": {"assignment": notebook_name, "notebook": notebook_name}})
    finally:
        whole = time.monotonic() - start
        started.discard()
        for method, old in originals.items():
            setattr(graded_kernel.GradedKernel, method, old)
    times = dict(timed.seconds)
    times["on the critical path"] = times["launch"] + times["wait at the first test cell"]
    times["whole notebook"] = whole
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--notebook", default="01_soft_lookup")
    parser.add_argument("--runs", type=int, default=5, help="gradings per way, alternated")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "graded_kernel_bench.json")
    args = parser.parse_args()
    if sandbox.mode() == "limits only" or not zygote.usable():
        raise SystemExit("this measure needs the bubblewrap sandbox and the zygote (bubblewrap as root)")

    settings = Settings.load(ROOT)
    forker = zygote.Zygote(kernel_pool.PRELOAD)
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    load = os.getloadavg()[0]
    try:
        time.sleep(10)  # the zygote's imports
        with tempfile.TemporaryDirectory(prefix="graded-kernel-bench-") as tmp:
            for run in range(args.runs):
                for way, kernels in WAYS.items():
                    runs[way].append(grade_once(args.notebook, kernels, forker.address, settings,
                                                Path(tmp) / f"{run}-{kernels}"))
    finally:
        forker.close()
    load = (load + os.getloadavg()[0]) / 2

    medians = {way: {k: round(statistics.median(r[k] for r in done), 3) for k in done[0]} for way, done in runs.items()}
    print(f"{args.notebook}, {args.runs} gradings per way, alternated; load average {load:.1f}")
    names = list(next(iter(medians.values())))
    print(f"{'median seconds':<20}" + "".join(f"{n:>30}" for n in names))
    for way, values in medians.items():
        print(f"{way:<20}" + "".join(f"{values[n]:>30.3f}" for n in names))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"notebook": args.notebook, "runs": args.runs, "load_average": round(load, 1),
                                    "median_seconds": medians, "all": runs}, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
