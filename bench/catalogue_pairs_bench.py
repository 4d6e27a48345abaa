"""Two mistakes at once: how many pairs of the catalogue's declared variations the hidden checks name, and at what cost.

Every catalogued mistake that is a variation of a reference (:mod:`autograder.grader.variation`) can be made
together with another variation of the same reference. For every exercise, this script makes each such
pair (at most the diagnosis's budget, :data:`autograder.grader.diagnosis.PAIR_BUDGET`, in catalogue order, as
the diagnosis tries them), pastes it as a student's answer and runs the hidden check on it as grading runs
it (every case, :func:`autograder.grader.cases.judging`), and counts what its failing cases name: the pair
together (a case where neither alone gives the answer's result), each of the two in a case of its own
(each case shows one of them), one of them only, or none. It times each failing check twice: with the
pairs tried, and with the budget at 0 (only single mistakes), and prints the median seconds per failing
check of each. Results go to ``bench/results/catalogue_pairs_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.course.repository import assignments  # noqa: E402
from autograder.grader import diagnosis  # noqa: E402
from autograder.grader.cases import judging  # noqa: E402
from autograder.shared.errors import CheckFailed  # noqa: E402
from tests.checks.test_catalogue import module, partners, pasted  # noqa: E402
from tests.course_copy import catalogue  # noqa: E402


def judged(check, answer, partners_) -> tuple[list[str] | None, float]:
    """The ids of the mistakes the check's failing cases name, as grading judges it (None: it passes), and its seconds."""
    start = time.perf_counter()
    try:
        with judging():
            check(answer, *partners_)
    except CheckFailed as failure:
        return [m.id for m in getattr(failure, "mistakes", ())], time.perf_counter() - start
    except Exception:  # noqa: BLE001 - a failure that names nothing
        return [], time.perf_counter() - start
    return None, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="*", default=assignments(), help="the notebooks (default: all)")
    options = parser.parse_args()
    counts: Counter[str] = Counter()
    with_pairs, without_pairs = [], []
    per_exercise = {}
    for assignment in options.notebooks:
        for exercise, listed in catalogue(assignment).items():
            pairs = diagnosis.pairs(listed)
            if not pairs:
                continue
            check = getattr(module(assignment), f"check_{exercise}")
            others = partners(assignment, exercise, True)
            named = Counter()
            for pair in pairs:
                answer = pasted(pair, exercise)
                ids, seconds = judged(check, answer, others)
                first, second = pair.parts
                kind = ("passes" if ids is None else "together" if pair.id in ids
                        else "each in a case" if {first.id, second.id} <= set(ids)
                        else "one" if {first.id, second.id} & set(ids) else "neither")
                named[kind] += 1
                if kind != "passes":
                    with_pairs.append(seconds)
                    budget, diagnosis.PAIR_BUDGET = diagnosis.PAIR_BUDGET, 0
                    try:
                        without_pairs.append(judged(check, answer, others)[1])
                    finally:
                        diagnosis.PAIR_BUDGET = budget
            counts.update(named)
            per_exercise[f"{assignment}/{exercise}"] = dict(named)
            print(f"{assignment}/{exercise}: {len(pairs)} pairs: " + ", ".join(f"{k} {v}" for k, v in named.items()))
    total = sum(counts.values())
    print(f"\n{total} pairs of declared mistakes, judged as grading judges them (every case): named together in a "
          f"case {counts['together']}, each named in a case of its own {counts['each in a case']}, one of the two "
          f"named {counts['one']}, neither {counts['neither']}, the pair passes {counts['passes']}")
    if with_pairs:
        print(f"median seconds per failing check: {statistics.median(with_pairs):.3f} with pairs tried, "
              f"{statistics.median(without_pairs):.3f} with single mistakes only "
              f"(the most: {max(with_pairs):.3f} and {max(without_pairs):.3f})")
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "catalogue_pairs_bench.json").write_text(json.dumps({
        "counts": dict(counts), "per_exercise": per_exercise, "pair_budget": diagnosis.PAIR_BUDGET,
        "median_seconds_with_pairs": statistics.median(with_pairs) if with_pairs else None,
        "median_seconds_single_only": statistics.median(without_pairs) if without_pairs else None,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
