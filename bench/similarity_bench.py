"""``make similarity`` on a large class: the time to compare 1000 submissions of one notebook, and what it found.

``make bench-similarity`` runs this script. It builds a throwaway course with notebook 01
(its source and release: all that ``make similarity`` reads) and a class of ``--students``
(default 1000) submissions:

* every student answers ``hard_lookup`` and ``scaled_dot_product_attention`` in one of the
  honest styles of ``tests/similarity_class.py``, with variables of their own, 0 to 3 lines of
  their own (a shape check, a conversion) at the top, and half of them with other comments and
  spacing (so same-style answers are alike, as in a real class);
* ``soft_lookup`` and ``nadaraya_watson`` are the reference solution with renamed variables for
  one student in ten (a leak), and left as released for the others;
* ``--planted`` students (default 20) hand in another student's notebook with its variables
  renamed; two submissions are not notebooks (not JSON) and one has lost an answer cell.

It times the whole command (reading every submission as grading stages it, the fingerprints,
every pair of every exercise, the pages) and prints the figures, the planted pairs found, how many
of them are among the pairs a page shows (the same-style honest answers of this generated class are
often token for token the same: many pairs tie at 1.0), and the pairs at or above the threshold.
Results go to ``bench/results/similarity_bench.json``. The ranking quality on hand-written honest
answers is the test's (tests/grading/test_similarity.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.grading import similarity_page  # noqa: E402
from autograder.grading.similarity import THRESHOLD  # noqa: E402
from tests.course_copy import fill, reference_answers, submit  # noqa: E402
from tests.similarity_class import (  # noqa: E402
    ASSIGNMENT,
    HARD,
    HONEST,
    SDPA,
    answer,
    make_class_course,
    release,
    rename_locals,
    restyle,
)

#: Lines students add of their own accord (checks, conversions), put at the top of an answer: 0 to 3 of them.
EXTRAS = {
    SDPA: ["    assert Q.dim() == K.dim() == V.dim()\n", "    Q, K, V = Q.contiguous(), K.contiguous(), V.contiguous()\n",
           "    n_queries = Q.shape[-2]\n", "    assert torch.isfinite(Q).all() and torch.isfinite(K).all()\n",
           "    K = K.to(Q.dtype)\n", "    batch_shape = Q.shape[:-2]\n", "    V = V.to(Q.dtype)\n",
           "    assert Q.shape[:-2] == K.shape[:-2], 'batch dimensions differ'\n"],
    HARD: ["    assert query.dim() == 1\n", "    keys = keys.to(query.dtype)\n", "    m = keys.shape[0]\n",
           "    assert keys.shape[1] == query.shape[0]\n", "    values = values.contiguous()\n",
           "    assert torch.isfinite(query).all()\n", "    query = query.flatten()\n", "    n_values = len(values)\n"],
}


def with_extras(exercise: str, body: str, rng: random.Random) -> str:
    return "".join(rng.sample(EXTRAS[exercise], rng.randrange(4))) + body


def build_class(course: Path, students: int, planted: int, seed: int = 0) -> list[tuple[str, str]]:
    """Submit the class; return the planted (original, copier) pairs."""
    rng = random.Random(seed)
    student_version = release(course)
    reference = reference_answers(ASSIGNMENT)
    answers = {}
    for i in range(students):
        chosen = {}
        for exercise, bodies in HONEST.items():
            text = rename_locals(answer(exercise, with_extras(exercise, rng.choice(bodies), rng)), seed=rng.randrange(10**6))
            chosen[exercise] = restyle(text) if rng.random() < 0.5 else text
        for exercise in ("soft_lookup", "nadaraya_watson"):
            if rng.random() < 0.1:
                chosen[exercise] = rename_locals(reference[exercise], seed=rng.randrange(10**6))
        answers[f"student-{i:04d}"] = chosen
    pairs = []
    for j in range(planted):
        original = f"student-{rng.randrange(students):04d}"
        copier = f"copier-{j:02d}"
        answers[copier] = {e: rename_locals(t, seed=j) for e, t in answers[original].items()}
        pairs.append((original, copier))
    for student, chosen in answers.items():
        submit(course, ASSIGNMENT, student, fill(student_version, chosen))
    for name in ("broken-0", "broken-1"):
        folder = course / "submitted" / name / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{ASSIGNMENT}.ipynb").write_text('{"cells": [ not json')
    notebook = fill(student_version, answers["student-0000"])
    notebook.cells = [c for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != "hard_lookup"]
    submit(course, ASSIGNMENT, "lost-a-cell", notebook)
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=1000)
    parser.add_argument("--planted", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="similarity-bench-") as tmp:
        course = make_class_course(Path(tmp))
        start = time.perf_counter()
        planted = build_class(course, args.students, args.planted)
        built = time.perf_counter() - start
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        found = similarity_page.write([ASSIGNMENT], course)
        seconds = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        assignment = found[0]
        pages = sum(p.stat().st_size for p in (course / "report" / "similarity").glob("*.html"))
        exercises = {x.name: x for x in assignment.exercises}
        found_planted = sum(all(x.similarity(a, b) >= THRESHOLD for x in exercises.values()
                                if a in x.compared and b in x.compared) for a, b in planted)
        result = {
            "submissions": len(assignment.students) + len(assignment.unreadable),
            "read": len(assignment.students),
            "could not be read": len(assignment.unreadable),
            "seconds": round(seconds, 1),
            "cpu seconds": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
            "seconds to build the class": round(built, 1),
            "page bytes": pages,
            "threshold": THRESHOLD,
            "planted copies found": f"{found_planted} of {len(planted)} (at or above the threshold on every exercise)",
            "planted pairs among the pairs shown": {
                x.name: sum({(p.first, p.second) for p in x.pairs} & {(a, b), (b, a)} != set() for a, b in planted)
                for x in assignment.exercises},
            "exercises": {x.name: {"compared": len(x.compared), "pairs": len(x.compared) * (len(x.compared) - 1) // 2,
                                   "pairs at or above the threshold": x.above,
                                   "matching the reference": x.above_reference,
                                   "left as released": len(x.unanswered), "no answer cell": len(x.missing)}
                          for x in assignment.exercises},
            "machine": {"cpus": os.cpu_count(), "load average": os.getloadavg(), "python": platform.python_version()},
        }
    print(json.dumps(result, indent=1))
    print(f"make similarity: {result['submissions']} submissions of {ASSIGNMENT} in {seconds:.1f} s "
          f"({result['cpu seconds']} s of CPU); planted copies found: {result['planted copies found']}")
    out = ROOT / "bench" / "results" / "similarity_bench.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
