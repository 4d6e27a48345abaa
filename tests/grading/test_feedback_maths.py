"""The maths of feedback pages as MathML: rendered without MathJax, and nothing a student writes in a formula runs.

Each test renders markdown as a feedback page renders it (the course's exporter, its cleaning), with
what each protection stops: markup inside a formula, a link command, a formula in an attribute.
"""

from __future__ import annotations

import nbformat

from autograder.grading import feedback, feedback_maths

from .test_feedback import Elements


def tags(fragment: str) -> list[tuple[str, dict[str, str]]]:
    parser = Elements()
    parser.feed(fragment)
    return parser.tags


def rendered(markdown: str) -> str:
    """``markdown`` as a markdown cell of a feedback page is rendered."""
    return feedback.FeedbackExporter().markdown2html({"cell": {}}, markdown)


def test_a_markdown_cells_maths_is_mathml():
    text = rendered("Attention: $$\\mathrm{softmax}\\left(\\frac{QK^\\top}{\\sqrt{d_k}}\\right)V$$ "
                    "where $d_k$ is the key size and $a < b$.\n\n\\begin{align} a &= b \\\\ c &= d \\end{align}")
    found = [tag for tag, _ in tags(text)]
    assert found.count("math") == 4, text
    assert {"mfrac", "msqrt", "msub", "mtable"} <= set(found), text
    assert "$" not in text and "\\frac" not in text and "\\begin" not in text, text
    assert '<math display="block"' in text and '<math display="inline"' in text
    assert "<mo>&lt;</mo>" in text  # "<" is maths, written escaped


def test_a_whole_page_has_mathml_and_no_script_for_it():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("The scale: $\\frac{1}{\\sqrt{d_k}}$.")])
    page, _ = feedback.FeedbackExporter().from_notebook_node(notebook)
    assert "<math " in page and "<msqrt>" in page and "$\\frac" not in page
    without, _ = feedback.FeedbackExporter().from_notebook_node(nbformat.v4.new_notebook())
    scripts = [[attrs for tag, attrs in tags(text) if tag == "script"] for text in (page, without)]
    assert scripts[0] == scripts[1], scripts


def test_markup_in_a_formula_is_text():
    text = rendered("$\\text{<script>window.pwned = 1</script><img src=x onerror=alert(1)>}$ and "
                    "$\\text{&lt;b&gt;}$")
    found = tags(text)
    assert {tag for tag, _ in found} <= feedback_maths.ELEMENTS | {"p"}, found
    assert "&lt;script&gt;" in text and "<script" not in text and "<img" not in text, text


def test_a_formula_keeps_only_presentation_attributes():
    text = rendered("$\\href{javascript:window.pwned=1}{x}$ $\\color{red}{y}$ $\\style{background:url(x)}{z}$ "
                    "$\\class{evil}{w}$")
    found = tags(text)
    assert found and all(name in feedback_maths.ATTRIBUTES | {"xmlns"} for _, attrs in found for name in attrs), found
    assert "javascript" not in text and "url(" not in text and "evil" not in text, text
    assert ("mstyle", {"mathcolor": "red"}) in found, found  # what maths needs stays


def test_a_formula_in_an_attribute_is_its_source_escaped():
    text = rendered('![$x" onerror="window.pwned=1$](x.png) ![$y^2$](y.png)')
    images = [attrs for tag, attrs in tags(text) if tag == "img"]
    assert [image.get("alt") for image in images] == ['x" onerror="window.pwned=1', "y^2"], text
    assert not [name for image in images for name in image if name.startswith("on")], images


def test_code_and_an_unreadable_formula_stay_as_written():
    text = rendered("`$x$` and $\\frac{$ and\n\n    code $y$")
    assert "<code>$x$</code>" in text and "$\\frac{$" in text and "code $y$" in text, text
    assert "<math" not in text


def test_a_written_placeholder_is_not_a_formula():
    renderer = feedback_maths.MathMLRenderer(escape=False)
    assert renderer.fill(renderer.placeholder(0)) == renderer.placeholder(0)  # nothing held: left as it is
    other = feedback_maths.MathMLRenderer(escape=False)
    assert other.token != renderer.token


def test_every_formula_of_the_course_is_mathml_with_no_command_left_as_text():
    """The notebooks' maths reads on a fetched page: each formula converts, and no TeX command is shown as text."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    from autograder.course.repository import ROOT, assignments

    formulas, left = 0, []
    for name in assignments(ROOT):
        for cell in nbformat.read(ROOT / "source" / name / f"{name}.ipynb", as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            renderer = feedback_maths.MathMLRenderer(escape=False)
            MarkdownWithMath(renderer=renderer).render(cell.source)
            for tex, display in renderer.formulas:
                formulas += 1
                written = feedback_maths.mathml(tex, display)
                if written is None or "\\" in written:
                    left.append((name, tex))
    assert formulas > 100 and not left, left
