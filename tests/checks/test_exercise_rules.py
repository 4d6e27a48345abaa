"""Every rule a check enforces is stated in its exercise's text.

For every exercise of every notebook in ``source/``, the test runs the visible and the hidden
check on the reference answer and records what the checks enforce, from the code itself:

- every built-in a guard forbids while the student's code runs (each
  :class:`autograder.guard.Guard` made during the check, whatever module made it);
- every error the checks expect the student's code to raise (each call of ``expect_error``).

Then it reads the exercise's text, which is what a student has read when writing the answer:
the notebook's introduction (before its first ``##`` heading), the markdown of the section that
holds the exercise, and the answer cell as released (its docstring; the solution cut out). The
text must name each forbidden built-in in a sentence that forbids it ("do not call", "forbids",
...), by its PyTorch name (``F.scaled_dot_product_attention``, ``torch.softmax``, ...), together
with every other name of it that the notebook itself shows in code (a fused kernel a cell
calls, say); and it must name each error the checks expect (``ValueError``).
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import warnings
from dataclasses import dataclass, field

import pytest

from autograder import guard as guard_module
from autograder import student
from autograder.course.repository import assignments, module_name
from autograder.guard import SDPA

from ..notebook_code import answer_cells, cell_arguments, nbgrader_meta, solution_namespace, source_notebook

#: Words that make a sentence forbid what it names.
FORBIDDING = re.compile(
    r"forbid|not allowed|do not (call|use)|don't (call|use)|may not|must not|never call|not (call|use)|without calling",
    re.I,
)
#: Common abbreviations of PyTorch's module paths, as code writes them.
ABBREVIATIONS = {"torch.nn.functional.": "F.", "torch.nn.": "nn."}
SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION.*?### END SOLUTION[ \t]*\n?", re.S | re.M)
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


@functools.cache
def solution(assignment: str):
    """The reference answers with the notebook's own definitions (built once per notebook)."""
    return solution_namespace(assignment)


def module(assignment: str, kind: str):
    """``autograder.checks.<notebook>`` or ``autograder.hidden.<notebook>``."""
    return importlib.import_module(f"autograder.{kind}.{module_name(assignment)}")


def partners(assignment: str, exercise: str, hidden: bool) -> list:
    """The reference's objects the test cell hands to the check after the exercise (``KVCache``...)."""
    names = cell_arguments(assignment, hidden).get(exercise, [exercise])[1:]
    return [getattr(solution(assignment), name) for name in names]


@dataclass
class Enforced:
    """What the checks of one exercise enforced while they ran."""

    forbidden: dict[str, guard_module.Forbidden] = field(default_factory=dict)
    errors: set[str] = field(default_factory=set)


def enforced_by_checks(assignment: str, exercise: str, monkeypatch) -> Enforced:
    """Run the exercise's visible and hidden checks on the reference; record the guards and expected errors."""
    found = Enforced()
    original_post_init = guard_module.Guard.__post_init__

    def recording_post_init(self) -> None:
        for rule in self.rules:
            found.forbidden[rule.shown_as] = rule
        original_post_init(self)

    expect_error = student.expect_error

    def recording_expect_error(fn, *args, error, **kwargs):
        found.errors.add(error.__name__)
        return expect_error(fn, *args, error=error, **kwargs)

    def record_in_loaded_modules() -> None:
        # Each check module has its own name for the function; student's own stays (a module imported
        # during a check must bind the original, not this test's recorder).
        for name, loaded in list(sys.modules.items()):
            if (name.startswith("autograder.") and name != "autograder.student"
                    and getattr(loaded, "expect_error", None) is expect_error):
                monkeypatch.setattr(loaded, "expect_error", recording_expect_error)

    monkeypatch.setattr(guard_module.Guard, "__post_init__", recording_post_init)
    answer = getattr(solution(assignment), exercise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, hidden in (("checks", False), ("hidden", True)):
            checks = module(assignment, kind)
            record_in_loaded_modules()
            getattr(checks, f"check_{exercise}")(answer, *partners(assignment, exercise, hidden))
    return found


def exercise_text(assignment: str, exercise: str) -> str:
    """The introduction, the markdown of the exercise's section, and its answer cell without the solution."""
    cells = source_notebook(assignment).cells
    sections: list[list] = [[]]
    for cell in cells:
        if cell.cell_type == "markdown" and re.match(r"^##\s", cell.source):
            sections.append([])
        sections[-1].append(cell)
    introduction = [c.source for c in sections[0] if c.cell_type == "markdown"]
    for section in sections:
        answers = [c for c in section if nbgrader_meta(c).get("grade_id") == exercise]
        if answers:
            markdown = [c.source for c in section if c.cell_type == "markdown"]
            return "\n\n".join([*introduction, *markdown, SOLUTION.sub("", answers[0].source)])
    raise AssertionError(f"{assignment}: no answer cell {exercise!r}")


def sentences(text: str) -> list[str]:
    """The text cut into sentences (and list items, and docstring lines)."""
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(])|\n\s*\n|\n\s*[*-]\s", text) if s.strip()]


def ways_to_name(shown_as: str) -> list[str]:
    """How a text may name the built-in shown as ``shown_as``: its dotted path, shortened as code shortens it."""
    match = DOTTED.search(shown_as)
    if match is None:
        return [shown_as]
    path = match.group(0)
    parts = path.split(".")
    names = {".".join(parts[i:]) for i in range(len(parts) - 1)}  # at least one qualifier: nn.functional.x, F.x
    for long, short in ABBREVIATIONS.items():
        if path.startswith(long):
            names.add(short + path[len(long):])
    if parts[0] == "Tensor":  # a method: x.backward()
        names.add(f".{parts[-1]}(")
    return sorted(names, key=len)


def aliases_shown(assignment: str, rule: guard_module.Forbidden) -> list[str]:
    """The other names of ``rule`` (a fused kernel, ...) that the notebook's own code cells use."""
    code = "\n".join(c.source for c in source_notebook(assignment).cells if c.cell_type == "code")
    last = DOTTED.search(rule.shown_as).group(0).rsplit(".", 1)[-1] if DOTTED.search(rule.shown_as) else ""
    return sorted(a for a in rule.names if a != last and re.search(rf"\.{re.escape(a)}\b", code))


def forbids(text: str, names: list[str]) -> bool:
    """Whether a sentence of ``text`` forbids something named by one of ``names``."""
    return any(FORBIDDING.search(s) and any(n in s for n in names) for s in sentences(text))


#: Exercises whose text does not state every rule yet, with what is missing (strict: fixing one fails
#: the test until its entry goes).
NOT_STATED_YET = {
}


def exercises():
    for assignment in assignments():
        for exercise in answer_cells(assignment):
            marks = ()
            if (assignment, exercise) in NOT_STATED_YET:
                marks = pytest.mark.xfail(reason=NOT_STATED_YET[assignment, exercise], strict=True)
            yield pytest.param(assignment, exercise, id=f"{assignment}-{exercise}", marks=marks)


@pytest.mark.parametrize(("assignment", "exercise"), list(exercises()))
def test_every_enforced_rule_is_stated(assignment, exercise, monkeypatch, capsys):
    enforced = enforced_by_checks(assignment, exercise, monkeypatch)
    capsys.readouterr()
    text = exercise_text(assignment, exercise)
    missing = []
    for shown_as, rule in sorted(enforced.forbidden.items()):
        names = ways_to_name(shown_as)
        if not forbids(text, names):
            missing.append(f"the checks forbid {shown_as}, but no sentence of the text forbids it "
                           f"(named as {' or '.join(names)})")
        for alias in aliases_shown(assignment, rule):
            if not forbids(text, [alias]):
                missing.append(f"the checks forbid {alias} (a name of {shown_as} the notebook's code uses), "
                               "but no sentence of the text forbids it")
    for error in sorted(enforced.errors):
        if not re.search(rf"\b{error}\b", text):
            missing.append(f"the checks expect a {error}, which the text never names")
    assert not missing, f"{assignment}, exercise {exercise}:\n  " + "\n  ".join(missing)


def test_the_rules_are_read_from_the_checks(monkeypatch, capsys):
    """The recording sees what a check forbids and the errors it expects (else the test above could not fail)."""
    enforced = enforced_by_checks("08_flash_backward", "softmax_backward", monkeypatch)
    capsys.readouterr()
    assert "torch._softmax_backward_data (softmax's own backward)" in enforced.forbidden
    assert enforced.errors == {"ValueError"}
    assert ways_to_name("torch.nn.functional.scaled_dot_product_attention")[0] == "F.scaled_dot_product_attention"
    assert not forbids("Compare with F.scaled_dot_product_attention. Do not use loops.", ["F.scaled_dot_product_attention"])
    assert forbids("Do not call F.scaled_dot_product_attention inside.", ["F.scaled_dot_product_attention"])


def test_a_text_without_its_forbidding_sentence_fails():
    """Notebook 08's forward pass: its text forbids the fused CPU kernel a cell shows; cut that sentence and it does not."""
    text = exercise_text("08_flash_backward", "flash_attention_forward")
    alias = "_scaled_dot_product_flash_attention_for_cpu"
    assert forbids(text, [alias])
    cut = " ".join(s for s in sentences(text) if not (FORBIDDING.search(s) and alias in s))
    assert not forbids(cut, [alias])
    assert aliases_shown("08_flash_backward", SDPA) == [alias]
