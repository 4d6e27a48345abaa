"""The grading service's latency: time from *Submit* to the feedback being there to fetch, per submission.

``make bench-hub`` runs this script. It builds a throwaway course with notebook 01 and an exchange
of its own, releases the assignment, and starts the grading service (``python -m autograder
serve``'s :class:`~autograder.service.serve.Service`, with the course's settings, in a thread).
Students work through nbgrader's own exchange code, as the Assignment List does
(:mod:`tests.exchange_class`): each fetches the assignment and submits the reference answers.

1. **one student**: one submission, the service idle (its fork server started at its first
   grading, so this is the first submission of a term or after a restart), then one more with
   the service warm;
2. **a class at once**: ``--students`` (default 20) students submit within a second.

For each submission it measures the time from the moment ``nbgrader submit`` returned to the
moment the feedback page is in the exchange under the name that student's *Fetch Feedback* looks
for (polled every 0.2 s), and prints each figure, the median, the largest and their ratio.
The hub itself adds nothing to this path: its Assignment List calls the same exchange code, and
the service reads the same folder. ``--workers N`` grades N submissions at once. Results go to
``bench/results/hub_bench.json``, one entry per number of workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nbgrader.utils import notebook_hash  # noqa: E402

from autograder.engine import sandbox  # noqa: E402
from autograder.service.serve import Service  # noqa: E402
from tests.course_copy import fill, grading_settings, make_course, reference_answers  # noqa: E402
from tests.exchange_class import COURSE_ID, Student, release  # noqa: E402

A = "01_soft_lookup"
RESULTS = ROOT / "bench" / "results" / "hub_bench.json"


def feedback_file(student: Student, exchange: Path) -> Path:
    """Where the feedback of the student's last submission will be (named by its secret)."""
    cache = student.home / ".nbgrader-cache" / COURSE_ID
    newest = max(cache.glob(f"*+{A}+*"), key=lambda p: p.name.split("+")[2])
    secret = (newest / "submission_secret.txt").read_text()
    return exchange / COURSE_ID / "feedback" / f"{notebook_hash(secret=secret, notebook_id=A)}.html"


def submit_and_wait(student: Student, exchange: Path, notebook, timeout: float) -> float:
    """Submit, then seconds until the feedback of that submission is in the exchange."""
    student.submit(A, notebook)
    start = time.monotonic()
    target = feedback_file(student, exchange)
    while not target.exists():
        if time.monotonic() - start > timeout:
            return float("nan")
        time.sleep(0.2)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=20, help="students submitting at once (default 20)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait for one feedback")
    parser.add_argument("--workers", type=int, default=None,
                        help="submissions the service grades at once (default: GradingService.workers: the cores)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "course").mkdir()
        course = make_course(tmp / "course", [A])
        exchange = tmp / "exchange"
        release(course, exchange, A)
        students = [Student(f"student{i:02d}", tmp / f"student{i:02d}", exchange) for i in range(args.students)]
        notebook = None
        for student in students:  # each fetches as the Assignment List does (not timed)
            notebook = fill(student.fetch(A), reference_answers(A))
        service = Service(course, exchange=exchange, settings=grading_settings(course, {"GradingService.workers": args.workers}))
        stop = threading.Event()
        thread = threading.Thread(target=service.serve, kwargs={"stop": stop}, daemon=True)
        thread.start()
        try:
            # Submissions of the same student within one cycle would replace each other: one student per measure.
            cold = submit_and_wait(students[0], exchange, notebook, args.timeout)
            warm = submit_and_wait(students[1], exchange, notebook, args.timeout)
            print(f"one student: {cold:.1f} s (the service's first grading), {warm:.1f} s (warm)", flush=True)
            with ThreadPoolExecutor(max_workers=args.students) as pool:
                waits = list(pool.map(lambda s: submit_and_wait(s, exchange, notebook, args.timeout), students))
        finally:
            stop.set()
            thread.join()
        graded = sum(1 for r in service.state.records.values() if r.status == "graded")
    median, longest = statistics.median(waits), max(waits)
    print(f"{args.students} students at once: median {median:.1f} s, largest {longest:.1f} s "
          f"({longest / median:.2f}x the median), each: " + ", ".join(f"{w:.0f}" for w in sorted(waits)))
    print(f"graded {graded} submissions; workers {service.workers}; protection: {sandbox.mode()}; "
          f"load average at the end: {os.getloadavg()[0]:.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[f"workers={service.workers}"] = {  # one entry per number of workers, the latest run of each
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "sandbox": sandbox.mode(),
                    "load_average_1min_at_end": os.getloadavg()[0]},
        "workers": service.workers, "one_student_cold_s": cold, "one_student_warm_s": warm,
        "students": args.students, "class_waits_s": waits, "class_median_s": median, "class_max_s": longest,
        "max_over_median": longest / median}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
