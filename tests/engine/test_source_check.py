"""Reading the student's source for forbidden built-ins: what the kernel cannot fake, and no false alarm."""

from __future__ import annotations

import ast

import pytest

from autograder.engine.source_check import definition_closure, forbidden_use
from autograder.kernel.guard import ATTENTION_BUILTINS, MULTI_HEAD_ATTENTION, SOFTMAX_BUILTINS

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
    "a transformer layer": sdpa("return nn.TransformerEncoderLayer(Q.shape[-1], 1, batch_first=True)(Q)"),
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
    "imports inside the function": sdpa("from torch.nn import functional as nnf\nimport math as m\n"
                                        "return nnf.softmax(Q @ K.mT / m.sqrt(Q.shape[-1]), dim=-1) @ V"),
    "a profiler label": sdpa("with torch.profiler.record_function('scores'):\n    s = Q @ K.mT\nreturn s @ V"),
}


#: Code the grader cannot read for the built-ins it runs, and built-ins of a forbidden one's family: each case one
#: cell before the exercise's (or none) and the exercise, and what the message must say.
UNREAD = {
    "exec of a decoded string": ("", sdpa("import base64\nexec(base64.b64decode('cmV0dXJu').decode())\nreturn Q"),
                                 "runs code from a string"),
    "eval of a computed string": ("", sdpa("code = ''.join(map(chr, [70]))\nreturn eval(code)(Q, K, V)"),
                                  "runs code from a string"),
    "getattr of a computed name": ("", sdpa("name = ''.join(reversed('noitnetta_tcudorp_tod_delacs'))\n"
                                            "return getattr(F, name)(Q, K, V)"), "a name computed at run time"),
    "swapped in globals() after an honest def": (
        "", sdpa("return Q @ K.mT") + "globals()['sdpa'] = lambda Q, K, V: F.scaled_dot_product_attention(Q, K, V)\n",
        "reaches functions through the notebook's namespace"),
    "the namespace written through an alias": ("def sdpa_honest(Q, K, V):\n    return Q\n"
                                               "space = globals()\nspace['sdpa'] = sdpa_honest\n", sdpa("return Q"),
                                               "reaches functions through the notebook's namespace"),
    "a module written at run time": ("open('helpers.py', 'w').write('import torch')\nimport helpers\n",
                                     sdpa("return helpers.attend(Q, K, V)"), "imports helpers"),
    "importlib": ("", sdpa("import importlib\nreturn importlib.import_module('torch').nn.functional.relu(Q)"),
                  "imports importlib"),
    "honest unless graded": ("", sdpa("import os\nif 'AUTOGRADER_RUN' in os.environ:\n    return Q\nreturn Q @ K.mT"),
                             "imports os"),
    "the caller's frame": ("import torch\n", sdpa("import sys\nreturn Q if sys._getframe(1) else K"), "imports sys"),
    "a %run magic": ("%run cheat.py\n", sdpa("return Q"), "uses an IPython magic or shell command"),
    "a module's namespace": ("import sys\nsetattr(sys.modules[__name__], 'sdpa', print)\n", sdpa("return Q"),
                             "changes what the module sys holds"),
    "a probe of the checks replaced": ("import autograder.checks.flash_backward as fb\n"
                                       "fb.function_record = lambda *args, **kwargs: {}\n", sdpa("return Q"),
                                       "changes what the module fb holds"),
    "a probe replaced through an alias": ("from autograder import checks\nfb = checks.flash_backward\n"
                                          "setattr(fb, 'function_record', print)\n", sdpa("return Q"),
                                          "uses the module checks.flash_backward as a value"),
    "torch's softmax rebound": ("torch.softmax = lambda x, dim: x\n", sdpa("return Q"),
                                "changes what the module torch holds"),
    "mock.patch": ("from unittest import mock\nmock.patch('autograder.grader.remote.serve', print).start()\n",
                   sdpa("return Q"), "imports unittest"),
    "native multi-head attention by its name": ("", sdpa("return torch._native_multi_head_attention(Q, K, V, 4, 1)"),
                                                "_native_multi_head_attention (`torch._native_multi_head_attention"),
    "flex attention": ("from torch.nn.attention.flex_attention import flex_attention\n",
                       sdpa("return flex_attention(Q, K, V)"), "flex_attention"),
    "an alias of torch.ops": ("", sdpa("aten = torch.ops.aten\nreturn aten._fused_sdp_choice(Q, K, V)"),
                              "_fused_sdp_choice"),
    "the watches blinded": ("", sdpa("with torch.utils._python_dispatch._disable_current_modes():\n    return Q @ K.mT"),
                            "_disable_current_modes"),
    "a watch looked for": ("", sdpa("if torch._C._len_torch_function_stack():\n    return Q\nreturn Q @ K.mT"),
                           "_len_torch_function_stack"),
    "a cell magic around the definition": ("", "%%time\n" + sdpa("return F.scaled_dot_product_attention(Q, K, V)"),
                                           "uses torch.nn.functional.scaled_dot_product_attention"),
}

STILL_ALLOWED = {
    "%time and %%time in exercise cells": ("%time y = torch.ones(2)\n", "%%time\n" + sdpa("return Q @ K.mT")),
    "getattr with a constant name": ("", sdpa("return getattr(Q, 'mT') @ K")),
    "notebook 03's mask helper": ("from torch.nn.attention.bias import causal_lower_right\n",
                                  sdpa("bias = causal_lower_right(Q.shape[-2], K.shape[-2])\nreturn Q @ K.mT")),
    "attributes of its own named after attention": (
        "class Block:\n    def __init__(self):\n        self.attention_scale = 2.0\n",
        sdpa("block = Block()\nreturn block.attention_scale * Q @ K.mT")),
    "the namespace read elsewhere": ("def other():\n    print(globals().get('In', [''])[-1], 'x' in globals())\n",
                                     sdpa("return Q @ K.mT")),
    "attributes of tensors at top level": ("x = torch.ones(2)\nx.requires_grad = True\nw = F.softmax(x, 0)\n"
                                           "w.data[0] = 1.0\n", sdpa("return Q @ K.mT")),
    "inference mode and no_grad": ("", sdpa("with torch.inference_mode(), torch.no_grad():\n    return Q @ K.mT")),
    "numpy and einops": ("import numpy as np\n", sdpa("from math import sqrt\nreturn Q @ K.mT / np.sqrt(sqrt(4.0))")),
}


@pytest.mark.parametrize("case", list(UNREAD))
def test_code_the_grader_cannot_read_or_a_built_ins_kin_is_refused(case):
    before, exercise, said = UNREAD[case]
    message = forbidden_use([HEADER, before, exercise], "sdpa", ATTENTION_BUILTINS, "sdpa")
    assert message is not None and said in message, (case, message)


@pytest.mark.parametrize("case", list(STILL_ALLOWED))
def test_honest_code_in_other_styles_is_still_read_as_honest(case):
    before, exercise = STILL_ALLOWED[case]
    assert forbidden_use([HEADER, before, exercise], "sdpa", ATTENTION_BUILTINS, "sdpa") is None


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


# -- a notebook read cell by cell -------------------------------------------------------------------

CELLS = [
    "import torch\nimport torch.nn.functional as F",
    "impl = F.scaled_dot_product_attention  # an alias, two cells before its use",
    "def helper(q, k, v):\n    return impl(q, k, v)",
    "def via_alias(Q, K, V):\n    return helper(Q, K, V)",
    "def honest(Q, K, V):\n    w = torch.softmax(Q @ K.mT, dim=-1)\n    return w @ V",
    "print(F.scaled_dot_product_attention)  # the built-in at top level, outside any exercise",
    "def rebound(Q, K, V):\n    return Q\n\n\ndef rebound(Q, K, V):\n    return F.scaled_dot_product_attention(Q, K, V)",
]


@pytest.mark.parametrize(("name", "caught"), [
    ("via_alias", True),  # through a helper of its own, to an alias made two cells earlier
    ("rebound", True),  # the definition that runs is the second one
    ("honest", False),  # the built-in printed at top level elsewhere in the notebook is not the exercise's
])
def test_a_notebook_is_read_across_its_cells(name, caught):
    message = forbidden_use(CELLS, name, ATTENTION_BUILTINS, name)
    assert (message is not None) == caught, message
    if caught:
        assert message.startswith(f"{name}'s code uses"), message


def test_the_closure_follows_globals_across_cells():
    read = "\n".join(ast.unparse(s) for s in definition_closure(CELLS, "via_alias"))
    assert "def via_alias" in read and "def helper" in read and "impl = F.scaled_dot_product_attention" in read
    assert "def honest" not in read and "print(" not in read
