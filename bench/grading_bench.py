"""Grading throughput: a synthetic class graded one at a time and in parallel, against plain nbclient.

``make bench-grading`` runs this script. It builds a throwaway course with every notebook of
``source/`` and a class of ``--students`` (default 40) students, each submitting one notebook
(round robin over the notebooks): half the reference answers, three in ten with one
catalogued mistake (partly wrong), one in ten the untouched release, one in ten broken (a
syntax error and an exception). It then measures

* **serial**: ``grade.autograde(workers=1)``, the whole pipeline (staging, nbgrader, the
  student's cells in the sandbox, the test cells judged in nbgrader's process);
* **parallel**: ``grade.autograde(workers=N)`` (default: the number of cores) on the same class;
* **plain**: the same graded notebooks (hidden tests included) executed one at a time by
  plain ``nbclient`` in an ordinary kernel (no nbgrader, no sandbox), with the same one
  thread per kernel that grading uses;

each over the whole class in one command, as an instructor runs it. On a machine shared with
other work, ``--batch K`` alternates the three over batches of K students instead (serial,
parallel, plain for each batch), so that a change in the load weighs on the three alike; each
batch then pays once more for what a grading command does once (starting the fork server,
preparing the gradebook) and for its last submission running alone, which lowers the speedup.

It prints submissions per minute, the parallel speedup (serial / parallel time) and the
overhead of grading over plain execution (serial time / plain time). Both grading runs must
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

from autograder.pipeline import grade, sandbox  # noqa: E402
from autograder.pipeline.course import assignments, module_name, nbgrader  # noqa: E402
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
    nbgrader("export", "--to", str(path), f"--db={grade.db_url(course)}", "--log-level=WARN", root=course)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch", type=int, default=0,
                        help="students per batch, the measures alternating (default: the whole class at once)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grading_bench.json")
    args = parser.parse_args()

    names = assignments(ROOT)
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        course = make_course(Path(tmp), names)
        kinds = build_class(course, names, args.students)
        jobs = grade.submissions(course)
        print(f"{len(jobs)} submissions of {len(names)} notebooks ({kinds}); sandbox: {sandbox.mode()}; "
              f"load average before: {os.getloadavg()[0]:.1f}", flush=True)

        # The three measures alternate over batches of the class, so that a machine whose load
        # changes (other work on it) weighs on all three alike.
        students = sorted({s for _, s in jobs})
        # the bench grades its own (trusted) class: without bubblewrap it measures grading without the sandbox
        options = grade.Options(sandbox=sandbox.mode() != "limits only")
        size = args.batch if args.batch > 0 else len(students)
        serial_s = parallel_s = plain = 0.0
        serial_csv, parallel_csv, failed = [], [], 0
        for first in range(0, len(students), size):
            batch = students[first:first + size]
            serial = grade.autograde(workers=1, root=course, progress=False, students=batch, options=options)
            serial_csv.append(export(course, "serial.csv"))
            parallel = grade.autograde(workers=args.workers, root=course, progress=False, students=batch,
                                       options=options)
            parallel_csv.append(export(course, "parallel.csv"))
            seconds = plain_execution(course, [(a, s) for a, s in jobs if s in batch])
            serial_s, parallel_s, plain = serial_s + serial.seconds, parallel_s + parallel.seconds, plain + seconds
            failed += len(serial.failed) + len(parallel.failed)
            print(f"students {first + 1}-{first + len(batch)}: serial {serial.seconds:.1f} s, "
                  f"parallel {parallel.seconds:.1f} s, plain nbclient {seconds:.1f} s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)

    n = len(jobs)
    if failed:
        raise SystemExit(f"{failed} gradings of the class failed: the figures would mean nothing (run make autograde on "
                         "a copy of the class to see why)")
    results = {
        "submissions": n,
        "notebooks": names,
        "kinds": kinds,
        "workers": args.workers,
        "batch": size,
        "cores": os.cpu_count(),
        "sandbox": sandbox.mode(),
        "serial_seconds": round(serial_s, 1),
        "parallel_seconds": round(parallel_s, 1),
        "plain_nbclient_seconds": round(plain, 1),
        "serial_per_minute": round(n / serial_s * 60, 2),
        "parallel_per_minute": round(n / parallel_s * 60, 2),
        "speedup": round(serial_s / parallel_s, 2),
        "overhead_vs_plain_nbclient": round(serial_s / plain, 2),
        "seconds_per_submission": {"serial": round(serial_s / n, 1), "plain": round(plain / n, 1)},
        "failed": failed,
        "same_grades": serial_csv == parallel_csv,
        "load_average_after": round(os.getloadavg()[0], 1),
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    print(
        f"\nserial:   {results['serial_per_minute']} submissions/min ({results['serial_seconds']} s)\n"
        f"parallel: {results['parallel_per_minute']} submissions/min ({results['parallel_seconds']} s, "
        f"{args.workers} workers)\n"
        f"speedup:  {results['speedup']}x (target >= 1.8x on 2 cores)\n"
        f"overhead: {results['overhead_vs_plain_nbclient']}x plain nbclient "
        f"({results['seconds_per_submission']['serial']} s vs {results['seconds_per_submission']['plain']} s "
        "per submission; target <= 1.3x)\n"
        f"same grades serial and parallel: {results['same_grades']}; "
        f"failed: {results['failed']}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
