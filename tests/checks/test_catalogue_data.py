"""The mistake catalogue as data (:func:`autograder.grader.diagnosis.read_mistakes`): what an entry makes, and the clear
error, naming the file, the entry and the problem, for every entry it cannot read."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

from autograder.grader.diagnosis import CatalogueError, by_id, read_mistakes
from autograder.grader.variation import decisions

SECTION = "1. A first exercise"


@decisions("scale", "start", "divisor")
def weights(x, *, scale=1.0, start=float("-inf"), divisor="sqrt(d)"):
    """A reference with three decisions."""
    top = torch.maximum(torch.full_like(x[..., :1], start), x.amax(dim=-1, keepdim=True))
    e = torch.exp((x - top) * scale)
    return e / e.sum(dim=-1, keepdim=True) if divisor is not None else e


def weights_by_autograd(x):
    """Another algorithm: a function of its own."""
    return torch.softmax(x, dim=0)


def namespace(folder, text: str) -> dict:
    """The globals of a hidden module ``nb`` in ``folder`` whose data file holds ``text``."""
    (folder / "mistakes").mkdir(exist_ok=True)
    (folder / "mistakes" / "nb.toml").write_text(textwrap.dedent(text))
    return {"__file__": str(folder / "nb.py"), "__name__": __name__, "weights": weights,
            "weights_by_autograd": weights_by_autograd, "torch": torch}


GOOD = '''
    [[weights]]
    id = "nb/weights/started-at-zero"
    name = "the max started at 0"
    section = "1. A first exercise"
    variant = 'weights(start=0.0, divisor=None)'
    explanation = """\\
      start the running max at -inf: \\
      a row far below 0 underflows."""

    [[weights]]
    id = "nb/weights/two-ways"
    name = "unscaled"
    section = "1. A first exercise"
    variant = ["weights(scale=2.0, start=-inf)", "weights(scale=inf)"]
    explanation = "the scale is 1."

    [[weights]]
    id = "nb/weights/by-autograd"
    name = "by autograd"
    section = "1. A first exercise"
    function = "weights_by_autograd"
    explanation = "write the formula."
'''


def test_each_entry_is_a_mistake_in_order_a_list_several_implementations_of_one(tmp_path):
    mistakes = read_mistakes(namespace(tmp_path, GOOD))["weights"]
    assert [m.id for m in mistakes] == ["nb/weights/started-at-zero", "nb/weights/two-ways", "nb/weights/two-ways",
                                        "nb/weights/by-autograd"]
    first = mistakes[0]
    assert (first.name, first.section) == ("the max started at 0", SECTION)
    assert first.explanation == "start the running max at -inf: a row far below 0 underflows."
    assert first.fn.__variation__.reference is weights and first.fn.__variation__.changed == {"start": 0.0, "divisor": None}
    assert mistakes[1].fn.__variation__.changed == {"scale": 2.0, "start": -math.inf}
    assert mistakes[2].fn.__variation__.changed == {"scale": math.inf}
    assert mistakes[3].fn is weights_by_autograd
    x = torch.randn(2, 5, dtype=torch.float64)
    assert torch.equal(first.fn(x), weights(x, start=0.0, divisor=None))


def entry(**keys: str) -> str:
    """One [[weights]] entry (the second in the file, after a good one) with ``keys`` changed; None drops a key."""
    fields = {"id": '"nb/weights/wrong"', "name": '"wrong"', "section": f'"{SECTION}"',
              "variant": "'weights(scale=2.0)'", "explanation": '"why."'}
    fields.update(keys)
    body = "\n".join(f"{k} = {v}" for k, v in fields.items() if v is not None)
    return f'[[weights]]\nid = "nb/weights/good"\nname = "good"\nsection = "{SECTION}"\nfunction = ' \
           f'"weights_by_autograd"\nexplanation = "fine."\n\n[[weights]]\n{body}\n'


@pytest.mark.parametrize(("keys", "problem"), [
    ({"variant": "'softmax(scale=2.0)'"}, "the module has no reference 'softmax'"),
    ({"variant": "'weights(temperature=2.0)'"}, "has no decision ['temperature']; its decisions: ['scale', 'start', 'divisor']"),
    ({"variant": "'weights(scale=x + 1)'"}, "the value of scale is not a constant"),
    ({"variant": "'weights(scale={1: 2})'"}, "a decision's value must be a plain constant"),
    ({"variant": "'weights(2.0)'"}, "must be a reference called with decisions"),
    ({"variant": "'weights(scale=2.0'"}, "is not Python"),
    ({"variant": "'weights()'"}, "changes no decision"),
    ({"variant": "'weights_by_autograd(scale=2.0)'"}, "declares no decisions"),
    ({"explanation": None}, "missing ['explanation']"),
    ({"section": None}, "missing ['section']"),
    ({"name": '""'}, "['name'] must be text"),
    ({"colour": '"red"'}, "unknown keys ['colour']"),
    ({"function": '"weights_by_autograd"'}, "give either variant"),
    ({"variant": None}, "give either variant"),
    ({"variant": None, "function": '"nowhere"'}, "function 'nowhere' is no function or class of this module"),
    ({"variant": None, "function": '"weights"'}, "is a reference with declared decisions"),
    ({"variant": "[]"}, "variant must be text, or a list of texts"),
    ({"id": '"nb/other/wrong"'}, "the id must start with 'nb/weights/'"),
    ({"id": '"nb/weights/good"'}, "the id is also another mistake's"),
])
def test_an_entry_it_cannot_read_is_a_clear_error_naming_the_file_the_entry_and_the_problem(tmp_path, keys, problem):
    with pytest.raises(CatalogueError) as error:
        read_mistakes(namespace(tmp_path, entry(**keys)))
    message = str(error.value)
    assert message.startswith(str(tmp_path / "mistakes" / "nb.toml")), message
    assert "[[weights]] number 2" in message, message
    assert problem in message, message


def test_a_file_that_is_no_toml_or_no_list_of_entries_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogueError, match=r"nb\.toml: .*line 1"):
        read_mistakes(namespace(tmp_path, "[[weights]\n"))
    with pytest.raises(CatalogueError, match=r"nb\.toml: 'weights' is not a list of mistakes: write each one as"):
        read_mistakes(namespace(tmp_path, 'weights = "wrong"\n'))
    with pytest.raises(CatalogueError, match=r"missing\.toml"):
        read_mistakes({**namespace(tmp_path, ""), "__file__": str(tmp_path / "missing.py")})


def test_the_manuals_example_entry_is_the_catalogues_own(tmp_path):
    """The entry docs/architecture.md shows reads as the mistake the catalogue of 08 holds."""
    from autograder.hidden import flash_backward

    page = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    example = re.search(r"```toml\n(.*?)```", page, re.S).group(1)
    (tmp_path / "mistakes").mkdir()
    (tmp_path / "mistakes" / "flash_backward.toml").write_text(example)
    shown = read_mistakes({**vars(flash_backward), "__file__": str(tmp_path / "flash_backward.py")})
    (exercise, (mistake,)), = shown.items()
    held = by_id(flash_backward.MISTAKES[exercise], mistake.id)
    assert (mistake.name, mistake.explanation, mistake.section) == (held.name, held.explanation, held.section)
    assert mistake.fn.__variation__.reference is held.fn.__variation__.reference
    assert mistake.fn.__variation__.changed == held.fn.__variation__.changed
