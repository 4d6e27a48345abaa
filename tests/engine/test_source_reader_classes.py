"""The source reader by class: each way round it, in several styles, is refused; it fails closed; honest habits pass.

Every case is the list of sources the graded kernel loads (the imports, then the answer cells, as submitted):
the reader reads exactly that. A hostile case is refused when the reader returns a message (a forbidden use
or "cannot verify"); an honest one when it returns None.
"""

from __future__ import annotations

import pytest

from autograder.engine import source_check
from autograder.engine.source_check import MAX_DEPTH, forbidden_use
from autograder.kernel.guard import ATTENTION_BUILTINS, SOFTMAX_BUILTINS

IMPORTS = "import math\nimport functools\nimport operator\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F"
HONEST = "def sdpa(Q, K, V):\n    return torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V\n"
NAME = "'scaled_dot_' + 'product_attention'"  # a constant, glued: the reader folds it
COMPUTED = "''.join(reversed('noitnetta_tcudorp_tod_delacs'))"  # a name computed at run time


def answer(body: str) -> str:
    return "def sdpa(Q, K, V):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())


#: Each class of the ways round the reader, each as several answers (the cells after the imports).
HOSTILE: dict[str, list[list[str]]] = {
    "a global statement rebinding a name": [
        [HONEST, "def setup():\n    global sdpa\n    sdpa = F.scaled_dot_product_attention\nsetup()"],
        [answer("global sdpa\nsdpa = torch.nn.functional.scaled_dot_product_attention\nreturn Q")],
        [HONEST, "class Setup:\n    def go(self):\n        global sdpa\n"
                 "        from torch.nn.functional import scaled_dot_product_attention as sdpa\nSetup().go()"],
        [HONEST, "[sdpa := F.scaled_dot_product_attention for _ in range(1)]"],
    ],
    "a match capture pattern": [
        [HONEST, "match F.scaled_dot_product_attention:\n    case sdpa:\n        pass"],
        [HONEST, "match [F.scaled_dot_product_attention]:\n    case [sdpa]:\n        pass"],
        [HONEST, "match {'f': F.scaled_dot_product_attention}:\n    case {'f': sdpa}:\n        pass"],
        [HONEST, "match (1, F.scaled_dot_product_attention):\n    case (_, *rest):\n        sdpa = rest[0]"],
    ],
    "an alias of globals, vars, builtins or __builtins__": [
        [HONEST, "g = globals\ng()['sdpa'] = F.scaled_dot_product_attention"],
        [HONEST, "space = vars()\nspace.update(sdpa=F.scaled_dot_product_attention)"],
        [HONEST, "(lambda: globals)()()['sdpa'] = F.scaled_dot_product_attention"],
        [HONEST, "b = __builtins__\nb.sdpa = F.scaled_dot_product_attention"],
        [HONEST, "import builtins as b\nb.attend = F.scaled_dot_product_attention"],
        [answer("space = globals\nreturn space()['attend'](Q, K, V)")],
    ],
    "free names resolved through builtins": [
        ["import builtins\nbuiltins.attend = F.scaled_dot_product_attention", answer("return attend(Q, K, V)")],
        ["setattr(__builtins__, 'attend', F.scaled_dot_product_attention)", answer("return attend(Q, K, V)")],
        ["__builtins__.__dict__['attend'] = F.scaled_dot_product_attention", answer("return attend(Q, K, V)")],
        [answer("return attend(Q, K, V)")],  # defined where the grader does not load it (a scratch cell)
    ],
    "IPython's user_ns, get_ipython() and input transformers": [
        [HONEST, "get_ipython().user_ns['sdpa'] = F.scaled_dot_product_attention"],
        [HONEST, "ip = get_ipython()\nip.input_transformers_post.append(lambda lines: lines)"],
        [HONEST, "get_ipython().push({'sdpa': F.scaled_dot_product_attention})"],
        [HONEST, "from IPython import get_ipython as g\ng().user_ns.update(sdpa=F.scaled_dot_product_attention)"],
        [answer("return get_ipython().user_ns['attend'](Q, K, V)")],
    ],
    "a line magic binding a name": [
        [HONEST, "%time sdpa = F.scaled_dot_product_attention"],
        [HONEST, "%timeit -n1 -r1 global sdpa; sdpa = F.scaled_dot_product_attention"],
        [HONEST, "%store -r sdpa"],
        [HONEST, "%%capture\nsdpa = F.scaled_dot_product_attention"],
        [HONEST, "x = 1\n%run -i cheat.py"],
    ],
    "a registry filled in one cell and read in another": [
        ["REGISTRY = []", "REGISTRY.append(F.scaled_dot_product_attention)", answer("return REGISTRY[0](Q, K, V)")],
        ["REGISTRY = {}", "REGISTRY['attend'] = F.scaled_dot_product_attention", answer("return REGISTRY['attend'](Q, K, V)")],
        ["REGISTRY = {}", "def fill(table):\n    table.update(attend=F.scaled_dot_product_attention)", "fill(REGISTRY)",
         answer("return REGISTRY['attend'](Q, K, V)")],
        ["REGISTRY = []", "def fill():\n    REGISTRY.append(F.scaled_dot_product_attention)", "fill()",
         answer("return REGISTRY[0](Q, K, V)")],
        ["class Registry:\n    pass", "Registry.attend = staticmethod(F.scaled_dot_product_attention)",
         answer("return Registry.attend(Q, K, V)")],
        ["REGISTRY = []", "REGISTRY.append(torch._C.DisableTorchFunction)",
         answer("with REGISTRY[0]():\n    return Q @ K.mT")],
    ],
    "a decorator taken from a container": [
        ["DECORATORS = [lambda f: F.scaled_dot_product_attention]", "@DECORATORS[0]\n" + answer("return Q")],
        ["DECORATORS = {}", "DECORATORS['x'] = lambda f: F.scaled_dot_product_attention",
         "@DECORATORS['x']\n" + answer("return Q")],
        ["DECORATORS = []", "DECORATORS.append(lambda f: F.scaled_dot_product_attention)",
         "@DECORATORS[-1]\n" + answer("return Q")],
        ["def pick(table):\n    return table[0]", "TABLE = [lambda f: F.scaled_dot_product_attention]",
         "@pick(TABLE)\n" + answer("return Q")],
    ],
    "a class whose __call__ does it": [
        ["class Attend:\n    def __call__(self, q, k, v):\n        return F.scaled_dot_product_attention(q, k, v)",
         "sdpa = Attend()"],
        ["class Attend:\n    __call__ = F.scaled_dot_product_attention", "sdpa = Attend()"],
        ["Attend = type('Attend', (), {'__call__': lambda s, *a: F.scaled_dot_product_attention(*a)})",
         "sdpa = Attend()"],
        ["class Meta(type):\n    def __call__(cls, *a):\n        return F.scaled_dot_product_attention(*a)",
         "class sdpa(metaclass=Meta):\n    pass"],
        ["class Attend:\n    def __call__(self, q, k, v):\n        return getattr(F, " + COMPUTED + ")(q, k, v)",
         "sdpa = Attend()"],
    ],
    "operator.attrgetter and methodcaller": [
        [answer(f"return operator.attrgetter({COMPUTED})(F)(Q, K, V)")],
        ["from operator import attrgetter as pick", answer(f"return pick({COMPUTED})(F)(Q, K, V)")],
        [answer(f"return operator.methodcaller({COMPUTED}, Q, K, V)(F)")],
        [answer(f"return operator.attrgetter('nn.functional.' + {COMPUTED})(torch)(Q, K, V)")],
        ["from operator import attrgetter", answer("return attrgetter('__cl' + 'ass__.__init__')(Q)")],
        ["from typing import get_type_hints as hints",
         "def hinted(x: 'torch._C.DisableTorchFunction'):\n    pass",
         answer("with hints(hinted)['x']():\n    return F.softmax(Q @ K.mT, -1) @ V")],
    ],
    "functools.reduce(getattr, ...)": [
        [answer(f"return functools.reduce(getattr, ['nn', 'functional', {COMPUTED}], torch)(Q, K, V)")],
        [answer(f"g = getattr\nreturn g(F, {COMPUTED})(Q, K, V)")],
        [answer(f"return list(map(getattr, [F], [{COMPUTED}]))[0](Q, K, V)")],
        ["def reach(obj, name):\n    return getattr(obj, name)", answer(f"return reach(F, {COMPUTED})(Q, K, V)")],
        ["def reach(obj, name):\n    return getattr(obj, name)",
         answer("cls = reach(Q, '__cl' + 'ass__')\nreturn reach(reach(cls, '__deep' + 'copy__'), '__glo' + 'bals__')")],
    ],
    "TorchScript and compiled code": [
        ["UNIT = torch.jit.CompilationUnit('def f(q, k, v):\\n    return torch.nn.functional.scaled_dot_product_"
         "attention(q, k, v)\\n')", answer("return UNIT.f(Q, K, V)")],
        ["from torch import jit", "UNIT = jit.CompilationUnit('def f(q):\\n    return q\\n')", answer("return UNIT.f(Q)")],
        [answer("return torch.jit.script(lambda q: q)(Q)")],
        [answer("return torch.compile(lambda q, k, v: q @ k.mT @ v)(Q, K, V)")],
        [answer("return torch.load('cheat.pt', weights_only=False)(Q, K, V)")],
        ["from torch.jit import script as compiled", answer("return compiled(lambda q: q)(Q)")],
    ],
    "a builtins.getattr hook": [
        ["import builtins\nreal = builtins.getattr\nbuiltins.getattr = lambda o, n, *d: real(o, n, *d)", HONEST],
        ["__builtins__.getattr = lambda o, n, *d: F.scaled_dot_product_attention", HONEST],
        ["setattr(__builtins__, 'getattr', print)", HONEST],
        ["vars(__builtins__)['getattr'] = print", HONEST],
    ],
    "the fused path of the transformer layers (the forbidden family)": [
        [answer("layer = nn.TransformerEncoderLayer(Q.shape[-1], 1, batch_first=True).eval()\nreturn layer(Q)")],
        [answer("layer = nn.TransformerDecoderLayer(Q.shape[-1], 1, batch_first=True)\nreturn layer(Q, K)")],
        ["from torch.nn import TransformerEncoder", answer("return TransformerEncoder(None, 1)(Q)")],
        [answer("return nn.modules.activation.MultiheadAttention(Q.shape[-1], 1)(Q, K, V)[0]")],
        [answer("return torch._transformer_encoder_layer_fwd(Q)")],
    ],
    "a star import": [
        ["from torch.nn.functional import *", answer("return scaled_dot_product_attention(Q, K, V)")],
        ["from torch import *", answer("return softmax(Q @ K.mT, -1) @ V")],
        ["from einops import *", HONEST],
    ],
    "getattr with a computed name on what may be a module": [
        [answer(f"return getattr(F, {COMPUTED})(Q, K, V)")],
        [answer(f"mods = [F]\nreturn getattr(mods[0], {COMPUTED})(Q, K, V)")],
        [answer(f"functional = torch.nn.functional\nreturn getattr(functional, {COMPUTED})(Q, K, V)")],
        ["class Box:\n    def get(self, name):\n        return getattr(self, name)",
         answer(f"return Box.get(torch.nn.functional, {COMPUTED})(Q, K, V)")],
        [answer(f"gen = (x for x in [])\nreturn getattr(gen, 'gi_' + {COMPUTED})")],
        [answer(f"def inner(o, n):\n    return getattr(o, n)\nreturn inner(Q, {COMPUTED})")],
        ["class Box:\n    def __new__(cls):\n        return (x for x in [])",
         answer(f"box = Box()\nreturn getattr(box, 'gi_' + {COMPUTED})")],
        ["class Box:\n    pass", answer(f"box = Box()\nbox = (x for x in [])\nreturn getattr(box, 'gi_' + {COMPUTED})")],
        ["class Box:\n    def to(self):\n        return (x for x in [])",
         answer(f"box = Box().to()\nreturn getattr(box, 'gi_' + {COMPUTED})")],
    ],
}

#: The reader's own limits and errors: each is "cannot verify", never "allowed", with the forbidden call beside it.
FORBIDDEN_BESIDE = answer("return F.scaled_dot_product_attention(Q, K, V)")
FAILS_CLOSED = {
    "a 600-deep sum": ["x = " + " + ".join(["1"] * 600), FORBIDDEN_BESIDE],
    "a 600-deep sum inside the answer": [answer("x = " + " + ".join(["Q"] * 600) + "\nreturn x")],
    "a deep attribute chain": ["y = Q" + ".T" * 900, FORBIDDEN_BESIDE],
    "a deep not": ["z = " + "not " * 900 + "True", FORBIDDEN_BESIDE],
    "nested parentheses": ["w = " + "(" * 300 + "1" + ")" * 300, FORBIDDEN_BESIDE],
    "a cell that does not parse": ["def broken(:\n    pass", FORBIDDEN_BESIDE],
    "too much source": ["s = '" + "x" * source_check.MAX_CHARS + "'", FORBIDDEN_BESIDE],
}


def cells_of(case: list[str]) -> list[str]:
    return [IMPORTS, *case]


@pytest.mark.parametrize(("kind", "number"), [(k, i) for k, cases in HOSTILE.items() for i in range(len(cases))])
def test_each_way_round_the_reader_is_refused(kind, number):
    message = forbidden_use(cells_of(HOSTILE[kind][number]), "sdpa", ATTENTION_BUILTINS, "sdpa")
    assert message is not None, (kind, HOSTILE[kind][number])
    assert message.startswith(("sdpa's code uses", "Cannot verify sdpa")), message


def test_every_class_has_several_submissions():
    assert all(len(cases) >= 3 for cases in HOSTILE.values()), {k: len(v) for k, v in HOSTILE.items()}


@pytest.mark.parametrize("case", list(FAILS_CLOSED))
def test_what_the_reader_cannot_read_is_cannot_verify(case):
    message = forbidden_use(cells_of(FAILS_CLOSED[case]), "sdpa", ATTENTION_BUILTINS, "sdpa")
    assert message is not None and message.startswith("Cannot verify sdpa"), (case, message)


def test_the_depth_is_bounded_before_anything_recurses():
    assert MAX_DEPTH <= 200  # far below the recursion limit, for ast.unparse and symtable
    deep = "x = " + " + ".join(["1"] * (MAX_DEPTH + 5))
    assert "nested more than" in forbidden_use([IMPORTS, deep, HONEST], "sdpa", ATTENTION_BUILTINS, "sdpa")


def test_an_error_of_the_reader_s_own_is_cannot_verify(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(source_check, "_closure", broken)
    message = forbidden_use([IMPORTS, HONEST], "sdpa", ATTENTION_BUILTINS, "sdpa")
    assert message is not None and message.startswith("Cannot verify sdpa") and "KeyError" in message


def test_a_cannot_verify_message_says_what_to_write_instead():
    message = forbidden_use(cells_of(HOSTILE["functools.reduce(getattr, ...)"][1]), "sdpa", ATTENTION_BUILTINS, "sdpa")
    assert "getattr" in message and "call functions by their names" in message
    message = forbidden_use(cells_of(HOSTILE["free names resolved through builtins"][3]), "sdpa", ATTENTION_BUILTINS,
                            "sdpa")
    assert "attend" in message and "define it in an exercise cell" in message


# -- honest habits: what the graded kernel loads of an honest notebook is read as honest ---------------------------

MHA = """class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        self.h = num_heads
        for name in "qkvo":
            setattr(self, f"w_{name}", nn.Linear(d_model, d_model, bias=bias))

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        q, k, v = (getattr(self, f"w_{name}")(x) for name, x in zip("qkv", (query, key, value)))
        B, n, D = q.shape
        q, k, v = (t.reshape(B, -1, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        w = torch.softmax(q @ k.mT / math.sqrt(D // self.h), dim=-1)
        return self.w_o((w @ v).transpose(1, 2).reshape(B, n, D)), w.mean(1)
"""

HABITS = {
    # the imports cell with magics: the graded kernel loads its import lines only
    "autoreload in the imports cell": ("sdpa", ["import math\nimport torch\nimport torch.nn.functional as F", HONEST]),
    "the imports cell written another way": ("sdpa", [
        "import math\nimport torch\nfrom torch.nn import functional as F\nimport torch.nn.functional as nnf",
        answer("return nnf.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V")]),
    "imports inside the function": ("sdpa", [
        answer("import math\nimport torch\nreturn torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), -1) @ V")]),
    "a profiler label around the work": ("sdpa", [IMPORTS, answer(
        "with torch.profiler.record_function('attention scores'):\n    s = Q @ K.mT / math.sqrt(Q.shape[-1])\n"
        "return torch.softmax(s, dim=-1) @ V")]),
    "a profiler label named after the built-in": ("sdpa", [IMPORTS, answer(
        "with torch.profiler.record_function('scaled_dot_product_attention'):\n"
        "    return torch.softmax(Q @ K.mT, dim=-1) @ V")]),
    "%%time on an exercise cell": ("sdpa", [IMPORTS, "%%time\n" + HONEST]),
    "getattr and setattr with computed names on self": ("MultiHeadAttention", [IMPORTS, MHA]),
    "getattr with a computed name on the exercise's argument": ("forward_of", [IMPORTS, MHA,
        "def forward_of(mha, x):\n    return sum(getattr(mha, f'w_{n}')(x) for n in 'qkv')"]),
    "getattr with a computed name on an instance made in a classmethod": ("MultiHeadAttention", [IMPORTS, MHA + """
    @classmethod
    def from_torch(cls, mha):
        module = cls(mha.embed_dim, mha.num_heads).to(dtype=mha.in_proj_weight.dtype)
        with torch.no_grad():
            for name, w in zip("qkv", mha.in_proj_weight.chunk(3)):
                getattr(module, f"w_{name}").weight.copy_(w)
        return module
"""]),
    "a helper and a dataclass in the answer cells": ("sdpa", [
        IMPORTS, "from dataclasses import dataclass\n\n@dataclass\nclass Shapes:\n    n: int\n    m: int",
        "def scores(Q, K):\n    return Q @ K.mT / math.sqrt(Q.shape[-1])",
        answer("s = Shapes(Q.shape[-2], K.shape[-2])\nassert s.n > 0\nreturn torch.softmax(scores(Q, K), -1) @ V")]),
    "the referee at the top level of an answer cell": ("sdpa", [IMPORTS, HONEST,
        "Q = torch.randn(2, 3, 4)\nprint((sdpa(Q, Q, Q) - F.scaled_dot_product_attention(Q, Q, Q)).abs().max())"]),
    "type(self).__name__ in a message": ("MultiHeadAttention", [IMPORTS, MHA.replace(
        'raise ValueError(f"d_model', 'raise ValueError(f"{type(self).__name__}: d_model')]),
}


@pytest.mark.parametrize("habit", list(HABITS))
def test_an_honest_habit_is_read_as_honest(habit):
    name, cells = HABITS[habit]
    assert forbidden_use(cells, name, ATTENTION_BUILTINS, name) is None


def test_a_softmax_exercise_reads_the_same_way():
    cells = [IMPORTS, "def stable_softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n"
                      "    return e / e.sum(dim, keepdim=True)"]
    assert forbidden_use(cells, "stable_softmax", SOFTMAX_BUILTINS, "stable_softmax") is None
    cells[1] += "\n    return getattr(torch, ''.join(['soft', 'max']))(x, dim)"
    assert forbidden_use(cells, "stable_softmax", SOFTMAX_BUILTINS, "stable_softmax") is not None
