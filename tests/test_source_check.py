"""Reading the student's source for forbidden built-ins: what the kernel cannot fake, and no false alarm."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from autograder.guard import ATTENTION_BUILTINS, MULTI_HEAD_ATTENTION, SOFTMAX_BUILTINS
from autograder.pipeline.source_check import definition_closure, forbidden_use

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def sdpa(body: str) -> str:
    return "def sdpa(Q, K, V):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())


CAUGHT = {
    "called": sdpa("return F.scaled_dot_product_attention(Q, K, V)"),
    "renamed import": "from torch.nn.functional import scaled_dot_product_attention as f\n" + sdpa("return f(Q, K, V)"),
    "through a helper": "def helper(q, k, v):\n    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)\n"
                        + sdpa("return helper(Q, K, V)"),
    "helper of a helper": "def inner(q):\n    return F.scaled_dot_product_attention(q, q, q)\n"
                          "def outer(q):\n    return inner(q)\n" + sdpa("return outer(Q)"),
    "a global alias": "impl = F.scaled_dot_product_attention\n" + sdpa("return impl(Q, K, V)"),
    "getattr of a glued string": sdpa("g = getattr(F, 'scaled_dot_' + 'product_attention')\nreturn g(Q, K, V)"),
    "getattr of a joined string": sdpa("g = getattr(F, ''.join(['scaled_dot_product', '_attention']))\nreturn g(Q, K, V)"),
    "passed on": sdpa("import functools\nreturn functools.partial(F.scaled_dot_product_attention, Q)(K, V)"),
    "a method of a class": "class Attention:\n    def run(self, q, k, v):\n"
                           "        return F.scaled_dot_product_attention(q, k, v)\n" + sdpa("return Attention().run(Q, K, V)"),
    "guard switched off": sdpa("with torch._C.DisableTorchFunction():\n    return Q"),
    "guard switched off by name": "from torch._C import DisableTorchFunctionSubclass as off\n"
                                  + sdpa("with off():\n    return Q"),
    "a thread": sdpa("import threading\nthreading.Thread(target=print).start()\nreturn Q"),
    "a process pool": sdpa("from concurrent.futures import ProcessPoolExecutor\nreturn Q"),
    "a magic in the cell": "%time x = 1\n" + sdpa("return F.scaled_dot_product_attention(Q, K, V)"),
}

ALLOWED = {
    "honest": sdpa("'''Like F.scaled_dot_product_attention, written out.'''\n"
                   "w = torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1)\nreturn w @ V, w"),
    "the built-in elsewhere in the notebook": "check = F.scaled_dot_product_attention(torch.ones(1, 2, 2), torch.ones(1, 2, 2), "
                                             "torch.ones(1, 2, 2))\nprint(F.scaled_dot_product_attention)\n"
                                             + sdpa("return Q @ K.mT"),
    "its name in a message": sdpa("raise ValueError('unlike scaled_dot_product_attention, Q and K must match')"),
    "a class named in isinstance": sdpa("if isinstance(Q, nn.MultiheadAttention):\n    raise TypeError('no')\nreturn Q"),
    "an annotation": "def sdpa(Q: torch.Tensor, K, V, m: nn.MultiheadAttention | None = None) -> torch.Tensor:\n    return Q\n",
    "a local variable with the name": sdpa("scaled_dot_product_attention = Q @ K.mT\nreturn scaled_dot_product_attention"),
    "a cell that does not parse": "def broken(:\n" + sdpa("return Q"),
    "a cell too deep to parse": "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n" + sdpa("return Q"),
}


@pytest.mark.parametrize("case", list(CAUGHT))
def test_a_forbidden_built_in_or_a_way_round_the_guard_is_found(case):
    rules = ATTENTION_BUILTINS
    message = forbidden_use([HEADER, CAUGHT[case]], "sdpa", rules, "sdpa")
    assert message is not None and message.startswith("sdpa's code uses"), case


@pytest.mark.parametrize("case", list(ALLOWED))
def test_honest_code_is_left_alone(case):
    assert forbidden_use([HEADER, ALLOWED[case]], "sdpa", ATTENTION_BUILTINS + (MULTI_HEAD_ATTENTION,), "sdpa") is None


def test_only_the_code_the_exercise_reaches_is_read():
    cells = [HEADER, "def unrelated():\n    return F.softmax(torch.ones(2), 0)\n",
             "def helper(x):\n    return x.exp()\n", "def mine(x):\n    return helper(x) / helper(x).sum()\n"]
    names = {getattr(s, "name", None) for s in definition_closure(cells, "mine")}
    assert names == {"mine", "helper"}
    assert forbidden_use(cells, "mine", SOFTMAX_BUILTINS, "mine") is None
    assert forbidden_use(cells, "unrelated", SOFTMAX_BUILTINS, "unrelated") is not None


# -- a notebook read cell by cell (tests/fixtures/scan_cells.ipynb) -------------------------------


def fixture_cells() -> list[str]:
    notebook = nbformat.read(Path(__file__).parent / "fixtures" / "scan_cells.ipynb", as_version=4)
    return [c.source for c in notebook.cells if c.cell_type == "code"]


@pytest.mark.parametrize(("name", "caught"), [
    ("via_alias", True),  # through a helper of its own, to an alias made two cells earlier
    ("rebound", True),  # the definition that runs is the second one
    ("honest", False),  # the built-in printed at top level elsewhere in the notebook is not the exercise's
])
def test_a_notebook_is_read_across_its_cells(name, caught):
    message = forbidden_use(fixture_cells(), name, ATTENTION_BUILTINS, name)
    assert (message is not None) == caught, message
    if caught:
        assert message.startswith(f"{name}'s code uses"), message


def test_the_closure_follows_globals_across_cells_past_a_cell_that_does_not_parse():
    read = "\n".join(ast.unparse(s) for s in definition_closure(fixture_cells(), "via_alias"))
    assert "def via_alias" in read and "def helper" in read and "impl = F.scaled_dot_product_attention" in read
    assert "def honest" not in read and "print(" not in read
