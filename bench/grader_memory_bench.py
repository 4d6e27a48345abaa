"""The memory of the grader's own processes while it grades the hostile class.

Each submission is graded by an ``nbgrader autograde`` process forked from the fork server
(:mod:`autograder.engine.forkserver`); the checks run in that process and judge what the student's
kernel answers. This grades the class of hostile submissions of ``tests/engine/test_hostile_submissions.py``
(replies built to be large, output floods, deep nesting, ...) with two workers, samples every
process forked from the fork server five times a second, and prints the peak of each one's resident
memory (RSS, which counts the pages it shares with the server) and of its own memory (USS, what it
alone holds). The students' kernels are not counted: they run in the sandbox, under its limits.
Results in ``bench/results/grader_memory_bench.json``. Needs bubblewrap, as grading hostile code does.

Run: ``.venv/bin/python bench/grader_memory_bench.py``
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.engine import sandbox  # noqa: E402
from tests.course_copy import make_course  # noqa: E402
from tests.engine.test_hostile_submissions import CASES, A, grade_the_class  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SERVER = "autograder.engine.forkserver"


def sample(stop: threading.Event, peaks: dict[int, tuple[int, int]]) -> None:
    """Until ``stop``: the peak (RSS, USS) of every process forked from a fork server (its own command line)."""
    while not stop.wait(0.2):
        for server in psutil.process_iter(["cmdline"]):
            try:
                if SERVER not in " ".join(server.info["cmdline"] or []):
                    continue
                for child in server.children():
                    if SERVER not in " ".join(child.cmdline()):
                        continue  # a zygote or a kernel runs a command of its own
                    memory = child.memory_full_info()
                    rss, uss = peaks.get(child.pid, (0, 0))
                    peaks[child.pid] = (max(rss, memory.rss), max(uss, memory.uss))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass


def main() -> None:
    if sandbox.mode() == "limits only":
        raise SystemExit(f"no sandbox here ({sandbox.why_not()}): grading refuses hostile code without one")
    peaks: dict[int, tuple[int, int]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(stop, peaks), daemon=True)
    with tempfile.TemporaryDirectory() as folder:
        course = make_course(Path(folder), [A])
        sampler.start()
        try:
            summary, errors, _, _ = grade_the_class(course)
        finally:
            stop.set()
            sampler.join()
    mib = 2**20
    rss = sorted(r for r, _ in peaks.values())
    uss = sorted(u for _, u in peaks.values())
    results = {
        "submissions": len(CASES),
        "graded": len(summary.graded),
        "could_not_be_graded": len(summary.failed),
        "processes_sampled": len(peaks),
        "peak_rss_mib": {"max": round(rss[-1] / mib), "median": round(statistics.median(rss) / mib)} if rss else None,
        "peak_uss_mib": {"max": round(uss[-1] / mib), "median": round(statistics.median(uss) / mib)} if uss else None,
        "sandbox": sandbox.mode(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grader_memory_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['graded']} of {results['submissions']} hostile submissions graded ({errors or 'feedback written'}); "
          f"{len(peaks)} grading processes sampled")
    if rss:
        print(f"peak memory of one grading process: RSS max {results['peak_rss_mib']['max']} MiB, median "
              f"{results['peak_rss_mib']['median']} MiB (shared pages of the fork server included); its own (USS) "
              f"max {results['peak_uss_mib']['max']} MiB, median {results['peak_uss_mib']['median']} MiB")


if __name__ == "__main__":
    main()
