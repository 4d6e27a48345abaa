"""What a test cell judged by the grader says failed (shared by the tests that grade one cell)."""

from __future__ import annotations

from autograder.engine import judge


def failure(outputs: list) -> str | None:
    """What failed in a judged test cell: the messages of its failed cases (the others may keep their share of
    the points), or its error; None when everything passed."""
    record = judge.case_record({"outputs": outputs})
    failed = [c["message"] for c in (record or {}).get("cases", []) if not c["passed"]]
    if record and (failed or record["stopped"]):
        return "\n".join(failed) or record["stopped"]
    return next((o["evalue"] for o in outputs if o.get("output_type") == "error"), None)
