"""Grading throughput: a synthetic class graded one at a time and in parallel, against plain nbclient.

``make bench-grading`` runs this script. It builds a throwaway course with every notebook of
``source/`` and a class of ``--students`` (default 40) students, each submitting one notebook
(round robin over the notebooks): half the reference answers, three in ten with one
catalogued mistake (partly wrong), one in ten the untouched release, one in ten broken (a
syntax error and an exception). It then measures

* **a sweep of workers**: ``grade.autograde`` with ``Grading.workers`` W for W = 1, 2, 4, ... up to ``--workers``
  (default: the number of cores), the whole pipeline (staging, nbgrader, the student's cells in
  the sandbox with the warm kernel pool, the test cells judged in nbgrader's process); W = 1 is
  **serial**, the largest W **parallel**; each W's speedup (serial / its time) and parallel
  efficiency (speedup / W);
* **without the pool**: ``workers=1`` with ``AUTOGRADER_KERNEL_POOL=0`` (``--no-compare`` skips it);
* **plain**: the same graded notebooks (hidden tests included) executed one at a time by
  plain ``nbclient`` in an ordinary kernel (no nbgrader, no sandbox), with the same one
  thread per kernel that grading uses;

each over the whole class in one command, as an instructor runs it. On a machine shared with
other work, ``--batch K`` alternates the measures over batches of K students instead, so that a
change in the load weighs on them alike; each batch then pays once more for what a grading
command does once (starting the fork server, preparing the gradebook, the first kernel, which
is never started ahead) and for its last submission running alone, which lowers the speedup.

It prints submissions per minute, the speedup and efficiency of each worker count and the
overhead of grading over plain execution (serial time / plain time). Every grading run must
export the same grades (``nbgrader export``). Results go to ``bench/results/grading_bench.json``.
The figures depend on the machine and on what else runs on it (the load average is recorded).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbclient  # noqa: E402
import nbformat  # noqa: E402

from autograder.course.repository import assignments, module_name, nbgrader  # noqa: E402
from autograder.course.settings import Settings  # noqa: E402
from autograder.engine import kernel_pool, sandbox  # noqa: E402
from autograder.grading import grade  # noqa: E402
from tests.course_copy import fill, make_course, mistake_source, reference_answers, released, submit  # noqa: E402

BROKEN = "def {name}(*args, **kwargs):\n    raise RuntimeError('not finished')\n"


def build_class(course: Path, names: list[str], students: int) -> dict[str, int]:
    """Submit one notebook per student; return how many submissions of each kind."""
    kinds = {"correct": 0, "partly wrong": 0, "untouched": 0, "broken": 0}
    for i in range(students):
        assignment = names[i % len(names)]
        rel, ref = released(course, assignment), reference_answers(assignment)
        kind = ("correct",) * 5 + ("partly wrong",) * 3 + ("untouched", "broken")
        kind = kind[(i // len(names) + i) % 10]
        answers = dict(ref)
        if kind == "partly wrong":
            mistakes = importlib.import_module(f"autograder.hidden.{module_name(assignment)}").MISTAKES
            catalogue = sorted(mistakes.items())
            exercise, options = catalogue[i % len(catalogue)]
            answers[exercise] = mistake_source(options[i % len(options)], exercise)
        elif kind == "broken":
            first, second = sorted(ref)[:2] if len(ref) > 1 else (sorted(ref)[0], None)
            answers[first] = ref[first].replace("def ", "def (", 1)  # a syntax error
            if second:
                answers[second] = BROKEN.format(name=second)
        notebook = rel if kind == "untouched" else fill(rel, answers)
        submit(course, assignment, f"student{i:02d}", notebook)
        kinds[kind] += 1
    return kinds


def export(course: Path, name: str) -> bytes:
    path = course / name
    nbgrader("export", "--to", str(path), f"--db={grade.db_url(Settings.load(course))}", "--log-level=WARN", root=course)
    return path.read_bytes()


def plain_execution(course: Path, jobs: list[tuple[str, str]]) -> float:
    """Seconds to execute every graded notebook with plain nbclient, one at a time."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    total = 0.0
    for assignment, student in jobs:
        path = course / "autograded" / student / assignment / f"{assignment}.ipynb"
        if not path.is_file():
            continue
        notebook = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory() as workdir:
            client = nbclient.NotebookClient(notebook, timeout=60, allow_errors=True, kernel_name="python3",
                                             resources={"metadata": {"path": workdir}})
            start = time.monotonic()
            client.execute()
            total += time.monotonic() - start
    return total


def sweep(top: int) -> list[int]:
    """1, 2, 4, ... up to ``top``, and ``top`` itself."""
    counts = [1]
    while counts[-1] * 2 <= top:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == top else [*counts, top]


def run(course: Path, workers: int, batch: list[str], pool: bool, name: str) -> tuple[float, bytes, int]:
    """Grade ``batch`` with ``workers`` at once, with or without the kernel pool: (seconds, exported grades, failed).

    The bench grades its own (trusted) class: without bubblewrap it measures grading without the sandbox.
    """
    settings = Settings.load(course, {"Grading.workers": workers, "KernelPool.enabled": pool,
                                      "Grading.sandbox": sandbox.mode() != "limits only"})
    summary = grade.autograde(settings=settings, progress=False, students=batch)
    return summary.seconds, export(course, name), len(summary.failed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="the most workers of the sweep 1, 2, 4, ... (default: the number of cores)")
    parser.add_argument("--batch", type=int, default=0,
                        help="students per batch, the measures alternating (default: the whole class at once)")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip grading the class one at a time without the kernel pool")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grading_bench.json")
    args = parser.parse_args()

    names = assignments(ROOT)
    counts = sweep(args.workers)
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        course = make_course(Path(tmp), names)
        kinds = build_class(course, names, args.students)
        jobs = grade.submissions(course)
        print(f"{len(jobs)} submissions of {len(names)} notebooks ({kinds}); sandbox: {sandbox.mode()}; "
              f"workers: {counts}; load average before: {os.getloadavg()[0]:.1f}", flush=True)

        # The measures alternate over batches of the class, so that a machine whose load
        # changes (other work on it) weighs on all of them alike.
        students = sorted({s for _, s in jobs})
        size = args.batch if args.batch > 0 else len(students)
        seconds = dict.fromkeys(counts, 0.0)
        cold = plain = 0.0
        exports: dict[str, list[bytes]] = {}
        failed = 0
        for first in range(0, len(students), size):
            batch = students[first:first + size]
            line = []
            for workers in counts:
                took, csv, bad = run(course, workers, batch, True, f"workers-{workers}.csv")
                seconds[workers] += took
                exports.setdefault(f"{workers} workers", []).append(csv)
                failed += bad
                line.append(f"{workers} workers {took:.1f} s")
            if not args.no_compare:
                took, csv, bad = run(course, 1, batch, False, "without-pool.csv")
                cold += took
                exports.setdefault("1 worker without the pool", []).append(csv)
                failed += bad
                line.append(f"1 worker without the pool {took:.1f} s")
            took = plain_execution(course, [(a, s) for a, s in jobs if s in batch])
            plain += took
            print(f"students {first + 1}-{first + len(batch)}: {', '.join(line)}, plain nbclient {took:.1f} s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)

    n = len(jobs)
    if failed:
        raise SystemExit(f"{failed} gradings of the class failed: the figures would mean nothing (run make autograde on "
                         "a copy of the class to see why)")
    serial_s, parallel_s = seconds[1], seconds[counts[-1]]
    same = len({tuple(v) for v in exports.values()}) == 1
    results = {
        "submissions": n,
        "notebooks": names,
        "kinds": kinds,
        "workers": counts[-1],
        "batch": size,
        "cores": os.cpu_count(),
        "sandbox": sandbox.mode(),
        "kernel_pool": kernel_pool.wanted(Settings.load(ROOT).make(kernel_pool.KernelPool), True),
        "serial_seconds": round(serial_s, 1),
        "parallel_seconds": round(parallel_s, 1),
        "plain_nbclient_seconds": round(plain, 1),
        "serial_per_minute": round(n / serial_s * 60, 2),
        "parallel_per_minute": round(n / parallel_s * 60, 2),
        "speedup": round(serial_s / parallel_s, 2),
        "overhead_vs_plain_nbclient": round(serial_s / plain, 2),
        "seconds_per_submission": {"serial": round(serial_s / n, 2), "plain": round(plain / n, 2)},
        "sweep": [{"workers": w, "seconds": round(seconds[w], 1), "per_minute": round(n / seconds[w] * 60, 2),
                   "speedup": round(serial_s / seconds[w], 2), "efficiency": round(serial_s / seconds[w] / w, 2)}
                  for w in counts],
        "failed": failed,
        "same_grades": same,
        "load_average_after": round(os.getloadavg()[0], 1),
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    if not args.no_compare:
        results["without_pool"] = {"serial_seconds": round(cold, 1), "seconds_per_submission": round(cold / n, 2),
                                   "overhead_vs_plain_nbclient": round(cold / plain, 2)}
    print("\nworkers  submissions/min  speedup  efficiency")
    for row in results["sweep"]:
        print(f"{row['workers']:>7}  {row['per_minute']:>15}  {row['speedup']:>6}x  {row['efficiency']:>10}")
    print(
        f"\nspeedup:  {results['speedup']}x with {counts[-1]} workers (target >= 1.9x on 2 cores)\n"
        f"overhead: {results['overhead_vs_plain_nbclient']}x plain nbclient "
        f"({results['seconds_per_submission']['serial']} s vs {results['seconds_per_submission']['plain']} s "
        "per submission; target <= 0.8x)"
    )
    if not args.no_compare:
        print(f"without the kernel pool: {results['without_pool']['seconds_per_submission']} s per submission "
              f"({results['without_pool']['overhead_vs_plain_nbclient']}x plain nbclient)")
    print(f"same grades in every run ({', '.join(exports)}): {same}; failed: {failed}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
