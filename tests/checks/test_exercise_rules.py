"""Every rule a check enforces is stated in its exercise's text.

For every exercise of every notebook in ``source/``, the test runs the visible and the hidden
check on the reference answer and records what the checks enforce, from the code itself:

- every built-in a guard forbids while the student's code runs (each
  :class:`autograder.kernel.guard.Guard` made during the check, whatever module made it);
- every error the checks expect the student's code to raise (each call of ``expect_error``).

Then it reads the exercise's text, which is what a student has read when writing the answer:
the notebook's introduction (before its first ``##`` heading), the markdown of the section that
holds the exercise, and the answer cell as released (its docstring; the solution cut out). The
text must name each forbidden built-in in a sentence that forbids it ("do not call", "forbids",
...), by its PyTorch name (``F.scaled_dot_product_attention``, ``torch.softmax``, ...), together
with every other name of it that the notebook itself shows in code (a fused kernel a cell
calls, say); and it must name each error the checks expect (``ValueError``).

And the other way round: every error the text tells the student to raise is expected by a check
(the visible or the hidden one); and an exercise whose checks forbid built-ins, whose source the
grader therefore reads, says so in its own section (:data:`READ_PHRASE`), not only in the
introduction.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import warnings
from dataclasses import dataclass, field

import pytest

from autograder.course.repository import assignments, module_name
from autograder.grader import student
from autograder.kernel import guard as guard_module
from autograder.kernel import probe_kinds
from autograder.kernel.guard import SDPA
from autograder.references import serving as serving_references

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
#: What the section of an exercise whose source is read says (the introduction says what the reader accepts).
READ_PHRASE = "reads the code your answer runs"
#: An error the text requires: a sentence that tells the answer to raise it.
RAISES = re.compile(r"\b[Rr]aises?\b|\bin the constructor\b|:\s*`?[A-Z]\w*Error`?\b")
ERROR_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b")


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
    observed: set[str] = field(default_factory=set)  # the probes run whose result is a property seen in the kernel


def enforced_by_checks(assignment: str, exercise: str, monkeypatch) -> Enforced:
    """Run the exercise's visible and hidden checks on the reference; record the guards and expected errors."""
    found = Enforced()
    original_post_init = guard_module.Guard.__post_init__

    def recording_post_init(self) -> None:
        for rule in self.rules:
            found.forbidden[rule.shown_as] = rule
        original_post_init(self)

    expect_error = student.expect_error
    expect_raised = serving_references.expect_raised  # expect_error for an error a probe brought back

    def recording_expect_error(fn, *args, error, **kwargs):
        found.errors.add(error.__name__)
        return expect_error(fn, *args, error=error, **kwargs)

    def recording_expect_raised(raised, error, what, why):
        found.errors.add(error.__name__)
        return expect_raised(raised, error, what, why)

    probe = student.probe

    def recording_probe(examine, *args, **kwargs):
        name = f"{examine.__module__}:{examine.__qualname__}"
        if probe_kinds.PROBE_KINDS.get(name, (probe_kinds.OBSERVED,))[0] == probe_kinds.OBSERVED:
            found.observed.add(name)
        return probe(examine, *args, **kwargs)

    recorders = {"expect_error": (expect_error, recording_expect_error),
                 "expect_raised": (expect_raised, recording_expect_raised), "probe": (probe, recording_probe)}

    def record_in_loaded_modules() -> None:
        # Each check module has its own name for the function; student's own stays (a module imported
        # during a check must bind the original, not this test's recorder). The serving references call
        # their own expect_raised by its global name: patched there, those calls are recorded too.
        for name, loaded in list(sys.modules.items()):
            if not name.startswith("autograder.") or name == "autograder.grader.student":
                continue
            for attribute, (original, recorder) in recorders.items():
                if getattr(loaded, attribute, None) is original:
                    monkeypatch.setattr(loaded, attribute, recorder)

    monkeypatch.setattr(guard_module.Guard, "__post_init__", recording_post_init)
    answer = getattr(solution(assignment), exercise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, hidden in (("checks", False), ("hidden", True)):
            checks = module(assignment, kind)
            record_in_loaded_modules()
            getattr(checks, f"check_{exercise}")(answer, *partners(assignment, exercise, hidden))
    return found


_ENFORCED: dict[tuple[str, str], Enforced] = {}


def enforced(assignment: str, exercise: str) -> Enforced:
    """:func:`enforced_by_checks` once per exercise: the tests below share what its checks enforced."""
    if (assignment, exercise) not in _ENFORCED:
        with pytest.MonkeyPatch.context() as monkeypatch:
            _ENFORCED[assignment, exercise] = enforced_by_checks(assignment, exercise, monkeypatch)
    return _ENFORCED[assignment, exercise]


def exercise_parts(assignment: str, exercise: str) -> tuple[str, str, str]:
    """The introduction, the markdown of the exercise's section, and its answer cell without the solution."""
    cells = source_notebook(assignment).cells
    sections: list[list] = [[]]
    for cell in cells:
        if cell.cell_type == "markdown" and re.match(r"^##\s", cell.source):
            sections.append([])
        sections[-1].append(cell)
    introduction = "\n\n".join(c.source for c in sections[0] if c.cell_type == "markdown")
    for section in sections:
        answers = [c for c in section if nbgrader_meta(c).get("grade_id") == exercise]
        if answers:
            markdown = "\n\n".join(c.source for c in section if c.cell_type == "markdown")
            return introduction, markdown, SOLUTION.sub("", answers[0].source)
    raise AssertionError(f"{assignment}: no answer cell {exercise!r}")


def exercise_text(assignment: str, exercise: str) -> str:
    """What a student has read when writing the answer: the introduction, the section, the answer cell."""
    return "\n\n".join(exercise_parts(assignment, exercise))


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


def stated_errors(text: str) -> set[str]:
    """The errors a sentence of ``text`` tells the answer to raise (``Raise a ValueError when ...``)."""
    return {name for s in sentences(text) if RAISES.search(s) for name in ERROR_NAME.findall(s)}


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
def test_every_enforced_rule_is_stated(assignment, exercise, capsys):
    found = enforced(assignment, exercise)
    capsys.readouterr()
    text = exercise_text(assignment, exercise)
    missing = []
    for shown_as, rule in sorted(found.forbidden.items()):
        names = ways_to_name(shown_as)
        if not forbids(text, names):
            missing.append(f"the checks forbid {shown_as}, but no sentence of the text forbids it "
                           f"(named as {' or '.join(names)})")
        for alias in aliases_shown(assignment, rule):
            if not forbids(text, [alias]):
                missing.append(f"the checks forbid {alias} (a name of {shown_as} the notebook's code uses), "
                               "but no sentence of the text forbids it")
    for error in sorted(found.errors):
        if not re.search(rf"\b{error}\b", text):
            missing.append(f"the checks expect a {error}, which the text never names")
    assert not missing, f"{assignment}, exercise {exercise}:\n  " + "\n  ".join(missing)


#: Exercises whose section does not say yet that the grader reads their code, with why (strict).
READ_NOT_SAID_YET: dict[tuple[str, str], str] = {
}
#: Errors an exercise's text requires that no check expects yet, with why (strict).
ERRORS_NOT_CHECKED_YET: dict[tuple[str, str], str] = {
}


def marked(table: dict):
    for param in exercises():
        assignment, exercise = param.values
        marks = [pytest.mark.xfail(reason=table[assignment, exercise], strict=True)] if (assignment, exercise) in table else []
        yield pytest.param(assignment, exercise, id=param.id, marks=marks)


@pytest.mark.parametrize(("assignment", "exercise"), list(marked(READ_NOT_SAID_YET)))
def test_an_exercise_whose_source_is_read_says_so(assignment, exercise, capsys):
    """The checks forbid a built-in, or run a probe that observes the code in the kernel (before which the grader
    reads the source: autograder.grader.remote), so the grader reads the answer's source: its own section says so."""
    found = enforced(assignment, exercise)
    capsys.readouterr()
    _, section, _ = exercise_parts(assignment, exercise)
    why = [f"forbid {', '.join(sorted(found.forbidden))}"] if found.forbidden else []
    why += [f"run the probes {', '.join(sorted(found.observed))}, which observe the code"] if found.observed else []
    assert not why or READ_PHRASE in section, (
        f"{assignment}, exercise {exercise}: its checks {' and '.join(why)}, so the grader reads the code the answer "
        f"runs, but its section never says that it {READ_PHRASE}")


@pytest.mark.parametrize(("assignment", "exercise"), list(marked(ERRORS_NOT_CHECKED_YET)))
def test_every_stated_error_is_checked(assignment, exercise, capsys):
    """Each error the exercise's section or docstring tells the answer to raise is expected by a check."""
    found = enforced(assignment, exercise)
    capsys.readouterr()
    _, section, answer = exercise_parts(assignment, exercise)
    unchecked = stated_errors(f"{section}\n\n{answer}") - found.errors
    assert not unchecked, (f"{assignment}, exercise {exercise}: the text requires {', '.join(sorted(unchecked))}, but no "
                           "check (visible or hidden) expects it")


def test_the_reverse_rules_can_fail():
    """Cut the phrase from a read exercise's section, or the checks' expected errors: each test above would fail."""
    found = enforced("11_serving", "paged_attention")
    _, section, answer = exercise_parts("11_serving", "paged_attention")
    assert found.forbidden and READ_PHRASE in section and READ_PHRASE not in section.replace(READ_PHRASE, "")
    assert stated_errors(f"{section}\n\n{answer}") == {"ValueError"} <= found.errors
    assert stated_errors("Raise a `ValueError` when n < 1. Then return.") == {"ValueError"}
    assert stated_errors("Compare with SDPA; a KeyError would mean a missing name.") == set()


def test_the_rules_are_read_from_the_checks(monkeypatch, capsys):
    """The recording sees what a check forbids and the errors it expects (else the test above could not fail)."""
    found = enforced_by_checks("08_flash_backward", "softmax_backward", monkeypatch)
    capsys.readouterr()
    assert "torch._softmax_backward_data (softmax's own backward)" in found.forbidden
    assert found.errors == {"ValueError"}
    assert ways_to_name("torch.nn.functional.scaled_dot_product_attention")[0] == "F.scaled_dot_product_attention"
    assert not forbids("Compare with F.scaled_dot_product_attention. Do not use loops.", ["F.scaled_dot_product_attention"])
    assert forbids("Do not call F.scaled_dot_product_attention inside.", ["F.scaled_dot_product_attention"])


def test_the_probes_that_observe_are_read_from_the_checks(capsys):
    """09's KVCache forbids nothing, but its checks count what its appends allocate in the kernel: it is read."""
    found = enforced("09_decoding_and_training", "KVCache")
    capsys.readouterr()
    assert not found.forbidden and found.observed == {"autograder.references.decoding_and_training:cache_allocations"}
    _, section, _ = exercise_parts("09_decoding_and_training", "KVCache")
    assert READ_PHRASE in section


def test_a_text_without_its_forbidding_sentence_fails():
    """Notebook 08's forward pass: its text forbids the fused CPU kernel a cell shows; cut that sentence and it does not."""
    text = exercise_text("08_flash_backward", "flash_attention_forward")
    alias = "_scaled_dot_product_flash_attention_for_cpu"
    assert forbids(text, [alias])
    cut = " ".join(s for s in sentences(text) if not (FORBIDDING.search(s) and alias in s))
    assert not forbids(cut, [alias])
    assert aliases_shown("08_flash_backward", SDPA) == [alias]


#: How the introduction's paragraph on the source reading starts.
READS_HEADING = "**What the grader reads.**"


def what_the_grader_reads(assignment: str) -> str | None:
    """The introduction's paragraph that says what the source reading accepts (None: the notebook has none)."""
    introduction, *_ = exercise_parts(assignment, next(iter(answer_cells(assignment))))
    paragraphs = [p for p in introduction.split("\n\n") if p.startswith(READS_HEADING)]
    return paragraphs[0] if paragraphs else None


def test_every_notebook_says_the_same_of_what_the_grader_reads():
    """One statement of the reader's rules: every notebook with an exercise whose code is read holds the same
    paragraph, and it names what the reader refuses in every exercise (each kind of the evasions by an example)."""
    from autograder.engine.source_check import EVASIONS

    said = {}
    for assignment in assignments():
        sections = [exercise_parts(assignment, exercise)[1] for exercise in answer_cells(assignment)]
        if any(READ_PHRASE in section for section in sections):
            said[assignment] = what_the_grader_reads(assignment)
    assert said and None not in said.values(), f"notebooks without the paragraph: {[a for a, p in said.items() if p is None]}"
    first, paragraph = next(iter(said.items()))
    assert all(p == paragraph for p in said.values()), (
        f"the paragraph differs from {first}'s in {[a for a, p in said.items() if p != paragraph]}")
    kinds: dict[str, list[str]] = {}
    for name, reason in EVASIONS.items():
        kinds.setdefault(reason, []).append(name)
    words = {"thread": "threads", "process": "processes", "guard that watches": "torch._C"}
    for reason, names in kinds.items():
        named = any(re.search(rf"\b{re.escape(n)}\b", paragraph) for n in names) or \
            any(w in reason and said_as in paragraph for w, said_as in words.items())
        assert named, f"the paragraph names nothing the reader refuses because it {reason} ({', '.join(names)})"
