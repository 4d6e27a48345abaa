"""``make docs``: the manual builds with warnings as errors, its links resolve, and its settings table is the code's.

The manual is built once, by ``make docs`` typed in a fresh clone (its front door); the tests read what it built.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.course import settings

from ..frontdoor import user
from ..notebook_code import ROOT

#: sphinx-build's options in ``make docs``: a fresh environment, every warning an error, all of them reported.
OPTIONS = ["-E", "-W", "--keep-going"]
SPHINX = [sys.executable, "-m", "sphinx", "-b", "html", *OPTIONS]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("docs")]  # one build, on one worker


def build(source: Path, out: Path) -> subprocess.CompletedProcess:
    """``make docs``'s build of the manual in ``source`` into ``out`` (its doctrees beside)."""
    return subprocess.run([*SPHINX, "-d", str(out / "doctrees"), str(source), str(out / "html")],
                          capture_output=True, text=True, timeout=600)


def text_of(page: Path) -> str:
    """A built page's text, without its markup, and with straight quotes where Sphinx printed curly ones."""
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    return text.translate(str.maketrans("\u2018\u2019\u201c\u201d", "''\"\""))


def test_make_docs_builds_with_these_options():
    recipe = re.search(r"^docs:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "sphinx-build -M html docs docs/_build" in recipe
    assert all(option in recipe.split() for option in OPTIONS), recipe


@pytest.fixture(scope="module")
def made():
    """``make docs`` typed in a fresh clone: the clone, and what make gave."""
    if user.why_not():
        pytest.skip(user.why_not())
    course = user.clone()
    try:
        yield course, user.make(course, "docs")
    finally:
        user.remove(course)


@pytest.fixture(scope="module")
def built(made) -> Path:
    course, done = made
    assert done.returncode == 0, user.said(done)
    return course / "docs" / "_build" / "html"


def test_make_docs_builds_the_manual_without_a_warning(made):
    course, done = made
    assert done.returncode == 0, user.said(done)  # -W: a warning is an error
    assert "build succeeded." in done.stdout and "WARNING" not in done.stderr, user.said(done)  # not "succeeded, 1 warning"
    for page in ("index", "term", "settings", "safety", "architecture", "api/autograder.engine.sandbox"):
        assert (course / "docs" / "_build" / "html" / f"{page}.html").is_file(), page


def test_the_settings_page_holds_the_codes_table(built):
    """The table is printed by :func:`autograder.course.settings.table` as the page is built: every row is there."""
    rows = [line for line in settings.table(ROOT).splitlines() if line.startswith("| `")]
    text = " ".join(text_of(built / "settings.html").split())
    for row in rows:
        name, value = (cell.strip().strip("`") for cell in row.strip("|").split(" | ")[:2])
        assert f"{name} {value}".strip() in text, row
    assert (built / "settings.html").read_text().count("<tr") == len(rows) + 1  # and the header


def plain(text: str) -> str:
    """``text`` without reST's literal marks and quotes, its spacing made single."""
    return " ".join(re.sub(r"[`'\"]", "", text).split())


def test_an_api_page_is_the_modules_docstring(built):
    from autograder.engine import sandbox

    page = plain(text_of(built / "api" / "autograder.engine.sandbox.html"))
    assert plain(sandbox.__doc__.split("\n\n")[0]) in page
    assert "mode()" in page and plain(sandbox.mode.__doc__.split("\n\n")[0]) in page


BROKEN = {"a heading": "[the sandbox](safety.md#no-such-heading)", "a page": "[a page](no-such-page.md)",
          "an anchor": "[above](#no-such-anchor)", "a page in a toctree": "```{toctree}\nno-such-chapter\n```",
          "a module": "{mod}`autograder.no_such_module`", "a function": "{func}`autograder.engine.sandbox.no_such_function`"}


def test_a_broken_internal_link_fails_the_build(tmp_path):
    """A copy of the manual with broken links and cross references in a page: the build fails and names each.

    The copy leaves out the API pages (architecture.md lists them: autodoc imports the whole package to write them),
    which none of these links is about; its toctree's entry for that page is one more warning, not asserted on.
    """
    course = tmp_path / "course"
    shutil.copytree(ROOT / "docs", course / "docs", ignore=shutil.ignore_patterns("_build", "api", "architecture.md"))
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")  # the settings table reads it
    page = course / "docs" / "tests.md"
    page.write_text(page.read_text() + "".join(f"\n{link}\n" for link in BROKEN.values()))
    done = build(course / "docs", tmp_path / "out")
    assert done.returncode != 0
    for target in ("no-such-heading", "no-such-page.md", "no-such-anchor", "no-such-chapter", "no_such_module",
                   "no_such_function"):
        assert re.search(rf"tests\.md:\d+: WARNING: .*{re.escape(target)}", done.stderr), (target, done.stderr[-3000:])
