"""``make similarity``: planted copies rank above honest answers, hostile text stays text, nothing runs or changes.

The class is tests/similarity_class.py's: honest answers to two exercises of notebook 01, each in
its own style, and copies planted among them (identical, renamed, restyled, reordered, the
reference solution renamed). No nbgrader run: the course folder holds notebook 01's source and
release, which is all the report reads.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.__main__ import main
from autograder.checks import soft_lookup as checks
from autograder.grading import report, similarity, similarity_page
from autograder.grading.feedback import with_policy

from ..course_copy import fill, submit
from ..similarity_class import (
    ASSIGNMENT,
    HARD,
    HONEST,
    SDPA,
    honest_answers,
    make_class_course,
    planted_class,
    release,
    rename_locals,
    reorder,
    restyle,
)

HOSTILE = "</script><img src=x onerror=alert(document.domain)><script>alert(1)</script>"


@pytest.fixture
def course(tmp_path):
    return make_class_course(tmp_path)


def pairs_of(exercise: similarity.Exercise, families: list[set[str | None]]):
    """(planted, honest) lists of (similarity, first, second) over every pair of the exercise's answers."""
    planted, honest = [], []
    for a, b in itertools.combinations([*exercise.compared, None], 2):
        family = [i for i, f in enumerate(families) if a in f] == [i for i, f in enumerate(families) if b in f]
        (planted if family else honest).append((exercise.similarity(a, b), a, b))
    return planted, honest


@pytest.mark.parametrize("exercise", list(HONEST))
def test_honest_answers_are_right_answers_in_other_styles(exercise):
    """The class's honest answers, and the copies made of them, all pass the visible checks (these are real answers)."""
    check = getattr(checks, f"check_{exercise}")
    for text in honest_answers(exercise):
        for variant in (text, rename_locals(text, seed=3), restyle(text)):
            namespace = {"math": math, "torch": torch, "F": F}
            exec(compile(variant, "<answer>", "exec"), namespace)  # the test's own answers, never a submission
            check(namespace[exercise])


def test_planted_copies_rank_above_every_honest_pair(course, capsys):
    families = planted_class(course)
    result = similarity.compare_assignment(ASSIGNMENT, course)
    exercises = {x.name: x for x in result.exercises}
    figures = []
    for name, family in families.items():
        exercise = exercises[name]
        assert sorted(exercise.compared) == sorted(s for f in family for s in f if s is not None)
        planted, honest = pairs_of(exercise, family)
        assert len(planted) == sum(len(f) * (len(f) - 1) // 2 for f in family) and len(honest) > 20
        lowest, highest = min(planted, key=lambda p: p[0]), max(honest, key=lambda p: p[0])
        assert lowest[0] > highest[0], f"{name}: the planted pair {lowest} ranks below the honest pair {highest}"
        found = sum(s >= similarity.THRESHOLD for s, _, _ in planted)
        false = sum(s >= similarity.THRESHOLD for s, _, _ in honest)
        assert found == len(planted) and false == 0, (name, planted, highest)
        # The listed pairs are exactly the planted ones, highest first; the reference copy is flagged.
        listed = {(p.first, p.second) for p in exercise.pairs}
        assert listed == {(a, b) if b is not None else (a, None) for _, a, b in planted}
        assert [p.similarity for p in exercise.pairs] == sorted((p.similarity for p in exercise.pairs), reverse=True)
        assert [p.first for p in exercise.pairs if p.reference] == [f"{name}-ref"]
        # How many other students either answer of a pair is alike with: the rest of its family.
        assert [p.others for p in exercise.pairs] == [len(next(f for f in family if p.first in f)) - 2
                                                      for p in exercise.pairs]
        assert exercise.above_reference == 1 and exercise.above == len(planted) - 1
        figures.append(f"{name}: {found} of {len(planted)} planted pairs at or above {similarity.THRESHOLD} "
                       f"(lowest {lowest[0]:.2f}), {false} of {len(honest)} honest pairs (highest {highest[0]:.2f})")
    # The other exercises were left as released by everyone: nothing to compare, nothing listed.
    for name in set(exercises) - set(families):
        assert exercises[name].compared == [] and exercises[name].pairs == []
        assert len(exercises[name].unanswered) == len(result.students)
    with capsys.disabled():
        print("\n" + "\n".join(figures))


def test_each_disguise_alone_keeps_the_copy_above_the_threshold():
    """Renaming, restyling and reordering, one at a time, on every honest answer that allows them."""
    for exercise in HONEST:
        for text in honest_answers(exercise):
            disguises = [rename_locals(text, seed=5), restyle(text)]
            try:
                disguises.append(reorder(text))
            except ValueError:
                pass
            for copy in disguises:
                x = similarity.Exercise(exercise, released="", answers={"a": text, "b": copy})
                similarity.compare_exercise(x)
                assert x.similarity("a", "b") >= similarity.THRESHOLD, copy


def test_the_released_cell_does_not_count(course):
    """Two different short answers that keep the release's `raise NotImplementedError()` are not alike because of it."""
    released = similarity.released_answers(course, ASSIGNMENT)[HARD]
    assert "raise NotImplementedError()" in released
    # Each writes above the release's last line, which stays (it is never reached).
    first = released.replace("    raise", "    return values[torch.argmax(keys @ query)]\n    raise")
    second = released.replace("    raise", "    i = (keys * query).sum(1).argmax()\n    return values[i]\n    raise")
    untouched = similarity.Exercise(HARD, released=released, answers={"a": first, "b": second, "c": released + "\n"})
    similarity.compare_exercise(untouched)
    assert untouched.unanswered == ["c"]  # handed in as released: nothing to compare
    assert untouched.similarity("a", "b") < 0.1
    # The same answers without the release taken out share its fingerprints, and look ten times as alike.
    kept = similarity.Exercise(HARD, released="", answers={"a": first, "b": second})
    similarity.compare_exercise(kept)
    assert kept.similarity("a", "b") > 0.3


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` with its kind, bytes, mode and modification time."""
    found = {}
    for path in sorted(folder.rglob("*")):
        stat = path.lstat()
        content = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
        found[str(path.relative_to(folder))] = (stat.st_mode, stat.st_mtime_ns, content)
    return found


def test_hostile_class_runs_nothing_changes_nothing_and_stays_text(course, tmp_path):
    student_version = release(course)
    marker = tmp_path / "ran"
    secret = tmp_path / "secret.ipynb"
    secret.write_text(json.dumps(fill(student_version, {HARD: "# SECRET-OUTSIDE-THE-COURSE\n"})))
    run_me = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
              f"def hard_lookup(query, keys, values):\n    pathlib.Path({str(marker)!r}).write_text('ran')\n"
              "    return values[int(torch.argmax(keys @ query))]\n")
    hostile = honest_answers(HARD)[0].replace('"""The value of the best key."""', f'"""{HOSTILE}"""  # {HOSTILE}')
    huge = honest_answers(HARD)[0] + "    x = [1, 2, 3]\n" * 20_000  # 300,000 characters: listed, not lexed
    answers = {"runs-code": run_me, "copies-it": rename_locals(run_me, seed=4), "<svg onload=alert(2)>": hostile,
               "copies-hostile": restyle(hostile), "huge": huge}
    for student, text in answers.items():
        notebook = fill(student_version, {HARD: text})
        notebook.cells.insert(0, nbformat.v4.new_code_cell(f"open({str(marker)!r}, 'w').write('ran')"))
        submit(course, ASSIGNMENT, student, notebook)
    # Unreadable in every way: not JSON, JSON but not a notebook, a link out of the course, nothing at all.
    for student, text in (("not-json", '{"cells": [ not json'), ("not-a-notebook", '{"cells": 3}')):
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{ASSIGNMENT}.ipynb").write_text(text)
    linked = course / "submitted" / "link" / ASSIGNMENT
    linked.mkdir(parents=True)
    (linked / f"{ASSIGNMENT}.ipynb").symlink_to(secret)
    (course / "submitted" / "empty" / ASSIGNMENT).mkdir(parents=True)
    lost = fill(student_version, {HARD: honest_answers(HARD)[1]})
    lost.cells = [c for c in lost.cells if c.metadata.get("nbgrader", {}).get("grade_id") != SDPA]
    submit(course, ASSIGNMENT, "lost-a-cell", lost)
    before = snapshot(course / "submitted")

    found = similarity_page.write([ASSIGNMENT], course)

    assert not marker.exists(), "student code ran"
    assert snapshot(course / "submitted") == before, "submitted/ changed"
    assignment = found[0]
    unreadable = dict(assignment.unreadable)
    assert set(unreadable) == {"not-json", "not-a-notebook", "link", "empty"}, unreadable
    assert "could not be read as a notebook" in unreadable["not-json"]
    assert "symbolic link" in unreadable["link"] and "not in your submission" in unreadable["empty"]
    exercises = {x.name: x for x in assignment.exercises}
    assert exercises[SDPA].missing == ["lost-a-cell"]
    assert exercises[HARD].too_long == ["huge"] and "huge" not in exercises[HARD].compared
    assert exercises[HARD].similarity("copies-it", "runs-code") == 1.0
    assert exercises[HARD].similarity("<svg onload=alert(2)>", "copies-hostile") == 1.0
    pages = {p.name: p.read_text() for p in (course / "report" / "similarity").glob("*.html")}
    assert set(pages) == {"index.html", f"{ASSIGNMENT}.html"}
    page = pages[f"{ASSIGNMENT}.html"]
    for text in pages.values():
        head = text[text.index("<head>"):text.index("</head>")]  # the policy comes first, before anything it governs
        assert head.startswith(f'<head><meta http-equiv="Content-Security-Policy" content="{similarity_page.CSP}">')
        assert "default-src 'none'" in similarity_page.CSP and "script-src" not in similarity_page.CSP
        assert "<script" not in text.lower() and "<img" not in text.lower() and "<svg onload" not in text
    assert html_escaped(HOSTILE) in page and "&lt;svg onload=alert(2)&gt;" in page
    assert "SECRET-OUTSIDE-THE-COURSE" not in page
    for student in ("not-json", "not-a-notebook", "link", "empty"):
        assert f"<td>{student}</td>" in page
    assert "<details><summary>1 without this answer cell</summary><p>lost-a-cell</p></details>" in page
    assert "<details><summary>1 too long to compare (over 100,000 characters)</summary><p>huge</p></details>" in page


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)


def test_histogram_bins_and_threshold():
    svg = similarity_page.histogram(np.array([0.0, 0.01, 0.02, 0.56, 1.0]), 0.5)
    bars = re.findall(r"<rect [^>]*fill='(#[0-9a-f]+)'><title>(\d+) pairs with a similarity from ([\d.]+)", svg)
    assert bars == [("#4477aa", "3", "0.00"), ("#c33", "1", "0.55"), ("#c33", "1", "0.95")]
    assert "threshold 0.5" in svg and "<script" not in svg


def test_command_line(capsys):
    assert main(["similarity", "--threshold", "1.5"]) == 2
    assert "from 0 to 1" in capsys.readouterr().out
    assert main(["similarity", "99_nothing"]) == 2
    assert "no such assignment in source/: 99_nothing" in capsys.readouterr().out


def test_class_report_links_to_it():
    assert "similarity/index.html" not in report.page(report.ClassReport())
    assert "make similarity" in report.page(report.ClassReport())
    assert "<a href='similarity/index.html'>" in report.page(report.ClassReport(), similarity=True)


# -- the page in a real browser (Playwright driving Debian's chromium, as tests/grading/test_browser.py) --------


def browser_missing() -> str | None:
    from .test_browser import CHROMIUM, sync_playwright

    if sync_playwright is None:
        return "the playwright package is not installed (pip install -e .)"
    if CHROMIUM is None:
        return "no chromium on PATH (Debian: apt-get install chromium; .ci/run does)"
    return None


@pytest.mark.slow
@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_similarity_page_in_a_browser(course, tmp_path):
    """The pages render offline: histograms, ranked pairs, the reference flagged, a hostile answer as text, nothing run."""
    from playwright.sync_api import expect, sync_playwright

    from .test_browser import CHROMIUM, Steps, no_overflow

    planted_class(course)
    hostile = honest_answers(HARD)[3].replace('"""The value of the best key."""', f'"""{HOSTILE}"""')
    for student, text in (("hostile", hostile), ("hostile-copy", rename_locals(hostile, seed=9))):
        submit(course, ASSIGNMENT, student, fill(release(course), {HARD: text}))
    similarity_page.write([ASSIGNMENT], course)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
            requests, dialogs, errors = [], [], []
            context.on("request", lambda r: requests.append(r.url))
            page = context.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            steps = Steps(page, tmp_path / "screenshots")
            page.goto((course / "report" / "similarity" / "index.html").as_uri())
            expect(page.locator("h1")).to_have_text("Similar answers, exercise by exercise")
            row = page.locator("tr", has=page.get_by_role("link", name=ASSIGNMENT))
            expect(row).to_contain_text("2")  # answers matching the reference: one per exercise
            steps.shot("similarity-index")
            page.get_by_role("link", name=ASSIGNMENT).click()
            expect(page.locator("h1")).to_have_text(f"Similar answers: {ASSIGNMENT}")
            histograms = page.locator("svg.histogram")
            expect(histograms).to_have_count(2)  # two exercises were answered; the others say so instead
            expect(page.get_by_text("No two answers to compare.")).to_have_count(2)
            section = page.locator(f"h2:has-text('{SDPA}')")
            section.scroll_into_view_if_needed()
            steps.shot("similarity-histogram-and-ranking")
            box = histograms.nth(1).bounding_box()
            assert box and box["width"] > 400 and box["height"] > 100
            assert histograms.nth(1).locator("rect[fill='#c33']").count() >= 1  # pairs above the threshold, in red
            ranking = page.locator(f"xpath=//h2[text()='{SDPA}']/following-sibling::table[1]")
            first_row = ranking.locator("tbody tr").first
            expect(first_row.locator(".reference")).to_have_text("reference solution")
            hard = page.locator(f"xpath=//h2[text()='{HARD}']/following-sibling::table[1]")
            row = hard.locator("tbody tr", has_text="hostile-copy").filter(
                has=page.locator("td").get_by_text("hostile", exact=True))
            row.get_by_text("side by side").click()
            pair = page.locator(".pair", has=page.locator("h4", has_text=re.compile("^hostile(-copy)? and hostile"))).first
            expect(pair.locator("pre").first).to_contain_text(HOSTILE)
            assert pair.locator("mark").count() >= 2
            assert no_overflow(pair)
            steps.shot("similarity-hostile-pair-side-by-side")
            assert page.locator("img, script, iframe").count() == 0
            assert dialogs == [] and errors == []
            assert not [u for u in requests if not u.startswith("file:")], requests
            # The pages' policy itself stops a script and a handler that escaping would have let through.
            probe = tmp_path / "probe.html"
            probe.write_text(with_policy("<html><head><title>inert</title></head><body><script>document.title = 'ran'"
                                         "</script><img src=x onerror=\"document.title = 'ran'\"></body></html>",
                                         similarity_page.CSP))
            page.goto(probe.as_uri())
            page.wait_for_timeout(500)
            assert page.title() == "inert"
        finally:
            browser.close()


def test_an_answer_the_tokenizer_fails_on_is_listed_and_the_rest_compared(monkeypatch):
    import copydetect

    real = copydetect.CodeFingerprint

    def choking(*args, fp=None, **kwargs):
        text = fp.read()
        if "CHOKE" in text:
            raise RecursionError("maximum recursion depth exceeded <in the lexer>")
        return real(*args, fp=io.StringIO(text), **kwargs)

    monkeypatch.setattr(copydetect, "CodeFingerprint", choking)
    text = honest_answers(SDPA)[0]
    exercise = similarity.Exercise(SDPA, released="", answers={"a": text, "b": rename_locals(text), "c": text + "# CHOKE"})
    similarity.compare_exercise(exercise)
    assert exercise.compared == ["a", "b"] and exercise.similarity("a", "b") == 1.0
    assert exercise.failed == [("c", "RecursionError: maximum recursion depth exceeded <in the lexer>")]
    page = similarity_page.exercise_html(exercise, similarity.THRESHOLD, 0)
    assert "<li>c: RecursionError: maximum recursion depth exceeded &lt;in the lexer&gt;</li>" in page
