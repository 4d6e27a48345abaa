"""The maths of a feedback page written as MathML, which a browser renders itself: no script, no network, no file beside it.

A page the grading service releases reaches the student through nbgrader's exchange: ``nbgrader
fetch_feedback`` (the Assignment List's *Fetch Feedback*) copies one file per notebook, found by the
hash of its name, into ``<assignment>/feedback/<time>/`` of the student's home, and nothing beside it.
MathJax, which ``make feedback`` copies next to its own pages, cannot travel with the page that way,
and the student's Jupyter server serves the page from a sandboxed, opaque origin
(``sandbox allow-scripts``). So each formula of a markdown cell is converted to MathML when the page
is written (with ``latex2mathml``, a pure-Python converter): Chromium, Firefox and Safari render
MathML natively, so the maths reads the same opened from disk, from the student's server or from
the course, and the page's Content-Security-Policy needs nothing more (no inline script, no eval).
Where the page does find MathJax (``make feedback``'s pages), MathJax typesets the MathML as well.

How, safely: nbconvert's markdown renderer (:class:`MathMLRenderer`) writes each formula it parses
as a placeholder, the page's HTML is cleaned (the caller's ``clean``, which removes every tag it does
not know, MathML's too), then each placeholder becomes the formula's MathML (:func:`mathml`), built
element by element from an allowlist of MathML elements and attributes, its text escaped. A formula
in an attribute (an image's ``alt``) is written back as its TeX, escaped.

What it does not do: a formula ``latex2mathml`` cannot convert (an unknown command or environment)
stays TeX, as nbconvert writes it, for MathJax where there is one; maths outside markdown cells
(a ``text/latex`` output) is left to MathJax too.
"""

from __future__ import annotations

import functools
import html
import re
import secrets
from collections.abc import Callable
from typing import Any
from xml.etree.ElementTree import Element, tostring

from latex2mathml.converter import convert_to_element
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

#: The MathML elements a page may hold (those ``latex2mathml`` writes; MathML Core's presentation elements).
ELEMENTS = frozenset({
    "math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "mfrac", "msqrt", "mroot", "msub", "msup",
    "msubsup", "munder", "mover", "munderover", "mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd",
    "mstyle", "mpadded", "mphantom", "menclose", "merror",
})
#: Their presentation attributes a page may keep (no ``href``, ``style``, ``class``, ``id`` or event handler).
ATTRIBUTES = frozenset({
    "display", "mathvariant", "mathsize", "mathcolor", "mathbackground", "displaystyle", "scriptlevel", "stretchy",
    "fence", "separator", "form", "largeop", "movablelimits", "accent", "accentunder", "lspace", "rspace",
    "minsize", "maxsize", "symmetric", "linethickness", "width", "height", "depth", "voffset", "notation",
    "columnalign", "rowalign", "columnspacing", "rowspacing", "columnlines", "rowlines", "frame", "columnspan",
    "rowspan", "linebreak",
})
#: What an attribute's value may be: words, numbers, lengths and colours (``#a0b``, ``0.5em``, ``-1pt``).
VALUE = re.compile(r"[A-Za-z0-9#.%+\- ]{0,64}")
MATHML_NAMESPACE = "http://www.w3.org/1998/Math/MathML"
#: Operator names ``latex2mathml`` does not know, written as ``\\operatorname{...}``, which it does.
OPERATOR_NAMES = re.compile(r"\\(arg)(?![A-Za-z])")
#: A character TeX escapes, as ``latex2mathml`` leaves it in text (``\\texttt{max\\_len}``).
TEXT_ESCAPE = re.compile(r"\\([_&%$#{}])")
#: A tag of cleaned HTML (its attribute values double-quoted, as the cleaner writes them), or the text between tags.
TAG = re.compile(r"""(<[^<>"]*(?:"[^"]*"[^<>"]*)*>)""")


def _safe(element: Element) -> Element:
    """A copy of ``latex2mathml``'s ``element`` with only :data:`ELEMENTS` and :data:`ATTRIBUTES`, its text plain.

    An element not allowed becomes an ``mrow`` of its children (its content stays, it does not). The
    converter keeps character references (``&#x0221A;``) in its texts, and TeX's escapes in text
    (``\\_``): both are decoded here, and every text is escaped again when the tree is written."""
    tag = element.tag if element.tag in ELEMENTS else "mrow"
    safe = Element(tag, {name: value for name, value in element.attrib.items()
                         if name in ATTRIBUTES and VALUE.fullmatch(value)})
    if tag == "math":
        safe.set("xmlns", MATHML_NAMESPACE)
    safe.text = html.unescape(element.text) if element.text else None
    if tag == "mtext" and safe.text:
        safe.text = TEXT_ESCAPE.sub(r"\1", safe.text)
    for child in element:
        copy = _safe(child)
        copy.tail = html.unescape(child.tail) if child.tail else None
        safe.append(copy)
    return safe


@functools.lru_cache(maxsize=4096)  # a class's pages share the notebook's formulas: each is converted once
def mathml(tex: str, display: bool) -> str | None:
    """The MathML of the formula ``tex`` (a block when ``display``), or None when ``latex2mathml`` cannot convert it."""
    try:
        element = convert_to_element(OPERATOR_NAMES.sub(r"\\operatorname{\1}", tex), display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - any formula it cannot read stays TeX
        return None
    return tostring(_safe(element), encoding="unicode", short_empty_elements=True)


class MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer, each formula written as a placeholder (kept in :attr:`formulas`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.token = secrets.token_hex(8)  # a student cannot write a placeholder of this page
        self.formulas: list[tuple[str, bool]] = []

    def placeholder(self, index: int) -> str:
        return f"mathml{self.token}n{index}x"

    def _hold(self, tex: str, display: bool) -> str:
        self.formulas.append((tex, display))
        return self.placeholder(len(self.formulas) - 1)

    def block_math(self, body: str) -> str:
        return self._hold(body, True)

    def inline_math(self, body: str) -> str:
        return self._hold(body, False)

    def latex_environment(self, name: str, body: str) -> str:
        return self._hold(f"\\begin{{{name}}}{body}\\end{{{name}}}", True)

    def fill(self, cleaned: str) -> str:
        """``cleaned`` (this renderer's HTML, cleaned) with each placeholder replaced: MathML in text, TeX in a tag."""
        tex = {self.placeholder(i): (f, d) for i, (f, d) in enumerate(self.formulas)}
        if not tex:
            return cleaned
        pattern = re.compile(rf"mathml{self.token}n\d+x")

        def in_text(match: re.Match) -> str:
            formula, display = tex[match[0]]
            written = mathml(formula, display)
            if written is not None:
                return written
            escaped = html.escape(formula, quote=False)  # as nbconvert writes it
            if formula.startswith("\\begin"):
                return escaped
            return f"$${escaped}$$" if display else f"${escaped}$"

        parts = TAG.split(cleaned)
        for i, part in enumerate(parts):
            if i % 2:  # a tag: an attribute's value is text, so the formula's source
                parts[i] = pattern.sub(lambda m: html.escape(tex[m[0]][0], quote=True), part)
            else:
                parts[i] = pattern.sub(in_text, part)
        return "".join(parts)


def markdown2html(exporter: HTMLExporter, context: dict, source: str, clean: Callable[[str], str]) -> str:
    """``source`` rendered as nbconvert's ``HTMLExporter.markdown2html`` renders it, cleaned by ``clean``, its maths
    MathML."""
    cell = context.get("cell", {})
    renderer = MathMLRenderer(
        escape=False, attachments=cell.get("attachments", {}), embed_images=exporter.embed_images,
        path=context.get("resources", {}).get("metadata", {}).get("path", ""),
        anchor_link_text=exporter.anchor_link_text, exclude_anchor_links=exporter.exclude_anchor_links,
        **exporter.lexer_options)
    return renderer.fill(clean(MarkdownWithMath(renderer=renderer).render(source)))
