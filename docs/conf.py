"""Sphinx's configuration of the course's manual (``make docs``).

The pages are Markdown (MyST); the API pages are autodoc's, from the docstrings of the package;
the settings page's table is printed here, at build time, by the code that reads the settings.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "Attention, from soft lookup to FlashAttention"
author = "The course's instructors"
copyright = "the course's instructors, MIT licence"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}  # .rst: the API pages autosummary writes
exclude_patterns = ["_build"]
templates_path = ["_templates"]

# [text](#a-heading) and [text](page.md#a-heading) resolve, and a link to a heading that is not there is a warning.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autosummary_generate = True
# autosummary writes the API pages on every build but never deletes one: a module moved or removed would keep
# a page that no longer imports (a warning, so an error) in a checkout that built the manual before.
shutil.rmtree(ROOT / "docs" / "api", ignore_errors=True)
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# The manual is read offline too: nothing is fetched while it builds (no intersphinx, no linkcheck).
html_theme = "alabaster"
html_title = "Attention course: the manual"
html_theme_options = {"description": "An autograded course on attention, built on nbgrader", "fixed_sidebar": True}


class SettingsTable(SphinxDirective):
    """The table ``python -m autograder settings`` prints: every setting, its value in this course, where to set it."""

    def run(self) -> list[nodes.Node]:
        from autograder.course import settings

        return self.parse_text_to_nodes(literal_values(settings.table(ROOT)))


def literal_values(table: str) -> str:
    """The table with its "value here" column read literally: ``*.pyc, __pycache__`` is not emphasis in Markdown."""
    lines = table.splitlines()
    for i, line in enumerate(lines[2:], start=2):  # below the header and its rule
        cells = line.split(" | ")
        cells[1] = re.sub(r"([\\`*_\[\]<>~])", r"\\\1", cells[1])
        lines[i] = " | ".join(cells)
    return "\n".join(lines) + "\n"


def strict_pages(app, env, node, contnode):
    """A Python cross reference of the manual's own pages that names nothing is a warning.

    The API pages' references are the docstrings', read as Sphinx reads them without ``nitpicky``:
    their type hints name PyTorch's, nbgrader's and the standard library's classes, whose
    documentation is not fetched (the manual builds offline).
    """
    if node.get("refdomain") == "py" and not node.get("refdoc", "").startswith("api/"):
        logger.warning("Python cross reference not found: %s", node["reftarget"], location=node,
                       type="ref", subtype="manual")


def setup(app):
    app.add_directive("settings-table", SettingsTable)
    app.connect("missing-reference", strict_pages)
    return {"parallel_read_safe": True}
