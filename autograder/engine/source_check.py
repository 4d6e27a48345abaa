"""Read a student's source for the built-ins an exercise forbids: what the kernel cannot fake.

In the student's kernel the guard (:mod:`autograder.kernel.guard`) stops a forbidden built-in when
it is called, which is what an honest student needs. Code in that kernel can also switch the
guard off (``torch._C.DisableTorchFunction``), call the built-in from another thread, or
replace the guard, or a watch a probe runs. So, before the grader asks the kernel to run an exercise
that forbids built-ins, and before every probe that observes the student's code there (a probe of
:data:`autograder.kernel.probe_kinds.OBSERVED` kind, in any exercise: read with nothing forbidden),
it reads, in the grader's process, exactly what the graded kernel loads (the
release's own imports and definitions, the student's import statements, the answer cells) and
in it:

- the definition of the exercise and, transitively, every top-level statement that binds a
  name that code reads as a global (a definition, an assignment, an import, a ``global``
  statement in a function, a ``match`` capture: Python's own symbol tables say which) or that
  hands such a name on or changes what it holds (``registry.append(f)``, ``table[0] = f``,
  ``fill(registry)``);
- in that code, a forbidden built-in *called* or *passed on* (``F.scaled_dot_product_attention(...)``,
  ``torch.ops.aten._softmax``, ``f = torch.softmax``, ``from torch import softmax``, a
  string naming it for ``getattr``, even one glued together from constants), a PyTorch entry of
  the forbidden built-in's *family* (:attr:`autograder.kernel.guard.Forbidden.family`:
  ``torch._native_multi_head_attention``, ``nn.TransformerEncoderLayer``), and the ways round the
  guard (``DisableTorchFunction``, threads, processes). Mentioning a forbidden class in
  ``isinstance`` or an annotation is fine.

It fails closed: what it cannot resolve statically is "cannot verify", a failing verdict whose
message says what to write instead, never "allowed". In an exercise that forbids built-ins, the code
the answer reaches may reach functions only by names the reader resolves to their definitions: every
free name is defined in what is loaded or is one of Python's plain built-ins; a module is used only
through its attributes (``F.relu(x)``; never passed, stored or listed, so ``getattr`` never reaches
one); ``getattr``/``setattr`` with a computed name only on ``self``, on a parameter of the
exercise's own function or on an instance of the student's class made in the function (the student's
objects and the grader's arguments, one step deep); no dunder beyond a few plain ones (``__init__``,
``__name__``, ...); no ``exec``, ``eval``, ``globals()``, ``vars``, ``__builtins__``,
``get_ipython()``, magics (``%time``'s and ``%%time``'s Python is read in their place),
``operator.attrgetter``/``methodcaller``, star imports, TorchScript or compiled code
(``torch.jit``, ``torch.compile``, ``torch.load``), PyTorch's private names, or a module outside
:data:`IMPORTABLE`. Anywhere in what is loaded, nothing may write the notebook's namespace
(``globals()[...] = ``, ``__builtins__``, ``import builtins``) or change what an imported module
holds (``torch.softmax = f``, a probe of the public checks replaced), change a class through one of its
objects (``type(meter).__torch_dispatch__ = f``, ``x.__class__.f = g``) or reach a frame
(``sys._getframe()``, ``f_builtins``). A source that does not parse,
an expression nested deeper than :data:`MAX_DEPTH`, more than :data:`MAX_CHARS` of source, and any
error of the reader's own are "cannot verify" too. A function that behaves differently when it is
graded gains nothing: its source is what is read.

What it does not see: cells the graded kernel does not load (scratch cells, set-up cells, the
magics of the imports cell: they cannot change a verdict there), code that is not Python source
(a compiled extension this environment already has), a family that no pattern describes, what a
PyTorch object reached in one ``getattr`` step from the student's own objects does when called
(the guard sees that at run time), the calls of an exercise that forbids no built-in other than its
probes that observe (what they return is judged against a reference), and a property an answer
games in plain code that a probe measures as it should. Those are left to the guard, to the
pristine graded kernel, and to the instructor reading the code.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
import symtable
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..kernel.guard import Forbidden

#: Names whose use in an exercise's code gets round the guard or the probes: turning torch function
#: modes off, running the work in another thread or process, where the guard is not, or hooks of
#: autograd's own (what it saves for backward, what it runs there), which the probes rely on.
EVASIONS = {
    "DisableTorchFunction": "turns off the guard that watches for forbidden built-ins",
    "DisableTorchFunctionSubclass": "turns off the guard that watches for forbidden built-ins",
    "_DisableTorchDispatch": "turns off the guard that watches for forbidden built-ins",
    "_disabled_torch_function_impl": "turns off the guard that watches for forbidden built-ins",
    "_pop_mode": "turns off the guard that watches for forbidden built-ins",
    "_pop_torch_function_stack": "turns off the guard that watches for forbidden built-ins",
    "Thread": "runs code in another thread, where the guard does not watch",
    "ThreadPoolExecutor": "runs code in another thread, where the guard does not watch",
    "ProcessPoolExecutor": "runs code in another process, where the guard does not watch",
    "Process": "runs code in another process, where the guard does not watch",
    "Pool": "runs code in another process, where the guard does not watch",
    "fork": "runs code in another process, where the guard does not watch",
    "Popen": "runs code in another process, where the guard does not watch",
    "start_new_thread": "runs code in another thread, where the guard does not watch",
    "multiprocessing": "runs code in another process, where the guard does not watch",
    "DataLoader": "can run code in other processes, where the guard does not watch",
    "saved_tensors_hooks": "changes what autograd saves for the backward pass (what the checks watch)",
    "save_on_cpu": "changes what autograd saves for the backward pass (what the checks watch)",
    "disable_saved_tensors_hooks": "changes what autograd saves for the backward pass (what the checks watch)",
    "register_hook": "runs code in the backward pass outside the functions the checks call",
    "register_prehook": "runs code in the backward pass outside the functions the checks call",
    "register_multi_grad_hook": "runs code in the backward pass outside the functions the checks call",
    "register_post_accumulate_grad_hook": "runs code in the backward pass outside the functions the checks call",
}
#: What an exercise that forbids built-ins may import: PyTorch and what honest answers use beside it. Any
#: other module may run code the grader does not read (``importlib``, one the code writes at run time, a
#: pickle), reach attributes by computed names (``string.Formatter``), or tell grading from a run in the
#: notebook (``os.environ``, ``sys._getframe``, ``inspect``).
IMPORTABLE = frozenset({
    "torch", "math", "cmath", "numpy", "einops", "functools", "itertools", "operator", "collections", "typing",
    "dataclasses", "abc", "enum", "numbers", "fractions", "decimal", "random", "statistics", "re", "copy",
    "contextlib", "heapq", "bisect", "warnings", "time", "__future__",
})
#: Python's built-ins that run code from a string, reach a namespace or an attribute by a computed name.
DYNAMIC_CALLS = {
    "exec": "runs code from a string", "eval": "runs code from a string", "compile": "makes code from a string",
    "__import__": "imports a module by a computed name", "globals": "reaches functions through the notebook's namespace",
    "locals": "reaches functions through a namespace", "vars": "reaches functions through a namespace",
    "breakpoint": "stops in a debugger", "get_ipython": "reaches the notebook's kernel",
    "__build_class__": "builds a class by hand", "__loader__": "reaches the import machinery",
    "__spec__": "reaches the import machinery", "__builtins__": "reaches Python's built-ins by name",
}
#: Attributes that reach code, frames or namespaces rather than values (dunders are refused apart from
#: :data:`PLAIN_DUNDERS`).
DYNAMIC_ATTRIBUTES = frozenset({
    "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "cr_frame", "ag_frame", "tb_frame",
    "tb_next", "co_code", "_getframe", "attrgetter", "methodcaller", "get_type_hints", "ForwardRef",
})
#: Dunders an honest answer uses, that reach no code: ``super().__init__()``, ``type(self).__name__``.
PLAIN_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__class__", "__len__", "__call__"})
#: Parts of PyTorch and NumPy that compile, load or run code the reader cannot read (TorchScript strings,
#: pickles, C++ sources, traced graphs).
UNREADABLE = frozenset({
    "jit", "compile", "_dynamo", "fx", "export", "library", "cpp_extension", "load_inline", "load_library",
    "package", "hub", "load", "classes", "ctypeslib", "utils",
})
#: PyTorch's machinery of modes and dispatch (switching the guard or a watch off, or looking for them), by its
#: names' shape rather than a list: ``torch._C._disable_current_modes``, ``torch.overrides._pop_mode``, ...
GUARD_MACHINERY = (r"(?i)dispatch|torch_function|function_mode|current_modes?|mode_stack|_len_torch|disable"
                   r"|^_pop|^_push|_unset|overrides")
#: Calls that reach an attribute by name: fine with a constant name, with a computed one only on own objects.
BY_NAME = {"getattr", "setattr", "delattr"}
#: Calls whose arguments only name a class (never call it).
NAMING_ONLY = {"isinstance", "issubclass", "type"}
#: Bounds on what is read, checked before anything recurses: honest answers stay far below them.
MAX_DEPTH = 100
MAX_CHARS = 2_000_000
#: Python's built-ins an answer may name (the others are in :data:`DYNAMIC_CALLS`; :data:`BY_NAME` is read apart).
PLAIN_BUILTINS = frozenset(dir(builtins)) - set(DYNAMIC_CALLS)
#: ``nn.Module``'s methods that return the module itself: an instance of the student's class stays one through them.
RETURN_THE_MODULE = frozenset({"to", "float", "double", "half", "cpu", "train", "eval", "requires_grad_"})
#: IPython's magics whose argument or body is Python that runs in the notebook's namespace: it is read instead.
PYTHON_MAGICS = frozenset({"time", "capture"})


class CannotVerify(Exception):
    """What the reader cannot resolve statically, and where: the verdict is "cannot verify"."""

    def __init__(self, problem: str, node: ast.AST | str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = node if isinstance(node, str) or node is None else _shown(node)


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 80 else text[:77] + "..."


def _statements(sources: Iterable[str]) -> list[ast.stmt]:
    sources = list(sources)
    if sum(len(s) for s in sources) > MAX_CHARS:
        raise CannotVerify(f"is more than {MAX_CHARS:,} characters of code")
    return [statement for source in sources for statement in _cell_statements(source)]


# Every check of a notebook reads the cells before it again: each cell is parsed once per process
# (a grading process serves one submission), and the parsed statements are only read, never changed.
@functools.lru_cache(maxsize=4096)
def _cell_statements(source: str) -> tuple[ast.stmt, ...]:
    from IPython.core.inputtransformer2 import TransformerManager

    first = source.strip().splitlines()[0][:60] if source.strip() else ""
    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError as error:
        raise CannotVerify(f"has a cell that is not Python (line {error.lineno}: {error.msg})", first) from None
    except (RecursionError, MemoryError, ValueError):
        raise CannotVerify("has a cell too deeply nested or too large to read", first) from None
    if _depth(tree) > MAX_DEPTH:
        raise CannotVerify(f"has an expression nested more than {MAX_DEPTH} levels deep", first)
    statements: list[ast.stmt] = []
    for statement in tree.body:
        statements += _unmagicked(statement)
    return tuple(statements)


def _depth(tree: ast.AST) -> int:
    """How deep ``tree`` nests, without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _magic(node: ast.AST) -> tuple[str, list[ast.expr]] | None:
    """The magic a transformed magic line calls (``get_ipython().run_line_magic('time', ...)``) and its arguments."""
    call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else node
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("run_line_magic", "run_cell_magic") and call.args
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return call.args[0].value, call.args
    return None


def _unmagicked(statement: ast.stmt) -> list[ast.stmt]:
    """``statement``, or the Python a ``%time``/``%%time``/``%%capture`` magic runs in its place."""
    magic = _magic(statement) if isinstance(statement, ast.Expr) else None
    if magic is not None and magic[0] in PYTHON_MAGICS:
        name, args = magic
        body = args[2] if len(args) == 3 else args[1] if name == "time" and len(args) == 2 else None
        if isinstance(body, ast.Constant) and isinstance(body.value, str):
            return list(_cell_statements(body.value))
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and node.id == "get_ipython":
            raise CannotVerify("uses an IPython magic or shell command (a line starting with % or !) in a cell "
                               "that is graded: put it in a cell of your own", statement)
    return [statement]


@dataclass(frozen=True)
class _Facts:
    """What one top-level statement binds, reads as a global, and hands on or changes (a non-call mention)."""

    binds: frozenset[str]
    reads: frozenset[str]
    touches: frozenset[str]


def _walrus_targets(statement: ast.stmt, parents: dict[int, ast.AST]) -> set[str]:
    """The names a walrus binds in the statement's own scope: one in a comprehension binds there too (PEP 572).

    Read from the syntax tree, because the symbol tables do not say it alike on every Python: from 3.12 a
    comprehension is inlined (PEP 709) and its walrus target no longer shows as assigned.
    """
    found = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            child, scope = node, parents.get(id(node))
            while scope is not None and not _in_body(child, scope):  # a default or decorator is outside it
                child, scope = scope, parents.get(id(scope))
            if scope is None:
                found.add(node.target.id)
    return found


def _in_body(child: ast.AST, scope: ast.AST) -> bool:
    """Whether ``child`` of ``scope`` runs in the scope of a function or lambda ``scope``."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return child in scope.body
    return isinstance(scope, ast.Lambda) and child is scope.body


@functools.lru_cache(maxsize=16384)
def _facts(statement: ast.stmt) -> _Facts:
    table = symtable.symtable(ast.unparse(statement), "<cell>", "exec")
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    todo = list(table.get_children())
    while todo:
        child = todo.pop()
        todo += child.get_children()
        for s in child.get_symbols():
            if s.is_global() and (s.is_assigned() or s.is_imported()):  # ``global x; x = ...``, a walrus
                binds.add(s.get_name())
            if s.is_global() or (child.get_type() == "class" and s.is_referenced() and not s.is_assigned()):
                reads.add(s.get_name())
    parents = _parents(statement)
    binds |= _walrus_targets(statement, parents)
    touches = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            parent = parents.get(id(node))
            if not (isinstance(parent, ast.Call) and parent.func is node):
                touches.add(node.id)
    return _Facts(frozenset(binds), frozenset(reads), frozenset(touches & reads))


def definition_closure(sources: Sequence[str], name: str) -> list[ast.stmt]:
    """Every top-level statement that binds ``name`` or a global it reads, or hands one on or changes it,
    transitively."""
    return _closure(_statements(sources), name)


def _closure(statements: Sequence[ast.stmt], name: str) -> list[ast.stmt]:
    # What a module holds is changed only where the whole of what is loaded is read (``torch.softmax = f``):
    # a statement that only mentions a module is not part of the code that reaches it.
    # Nor does a statement that only mentions one of Python's built-ins that nothing loaded rebinds.
    bound = set().union(*(_facts(s).binds for s in statements))
    modules = set(_imported(statements)) | (PLAIN_BUILTINS - bound)
    names = {name}
    chosen: set[int] = set()
    grew = True
    while grew:
        grew = False
        for statement in statements:
            if id(statement) in chosen:
                continue
            facts = _facts(statement)
            if facts.binds & names or (facts.touches - modules) & names:
                chosen.add(id(statement))
                names |= facts.reads
                grew = True
    return [s for s in statements if id(s) in chosen]


def _constant_text(node: ast.AST) -> str | None:
    """The string a constant expression makes (``"a" + "b"``, ``"".join(["a", "b"])``, f-strings of constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _constant_text(node.left), _constant_text(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_constant_text(v) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
        glue = _constant_text(node.func.value)
        parts = [_constant_text(e) for e in node.args[0].elts]
        if glue is not None and all(p is not None for p in parts):
            return glue.join(parts)
    return None


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _only_named(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` is only named (in isinstance, an annotation, an except clause), not used."""
    child, parent = node, parents.get(id(node))
    while isinstance(parent, (ast.Attribute, ast.Tuple, ast.List, ast.BinOp, ast.Subscript)):
        child, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.Call) and child is not parent.func:
        return isinstance(parent.func, ast.Name) and parent.func.id in NAMING_ONLY
    if isinstance(parent, ast.ExceptHandler):
        return True
    if isinstance(parent, (ast.arg, ast.AnnAssign)) and getattr(parent, "annotation", None) is child:
        return True
    if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.returns is child:
        return True
    return False


def _chain_root(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (``torch`` in ``torch.ops.aten.x``), if it starts from a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _chain(node: ast.AST) -> list[str] | None:
    """The names of a plain attribute chain (``["torch", "nn", "functional"]``), or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _imported(statements: Sequence[ast.stmt]) -> dict[str, str]:
    """Each name an import binds, and the dotted path of what it stands for (``F``: ``torch.nn.functional``)."""
    paths = {}
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import):
                for a in node.names:
                    paths[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                paths |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return paths


_MISSING = object()


@functools.lru_cache(maxsize=4096)
def _resolve(path: str) -> object:
    """What a dotted path of an importable module stands for in the grader's process (_MISSING: unknown)."""
    parts = path.split(".")
    if parts[0] not in IMPORTABLE:
        return _MISSING
    try:
        value: object = importlib.import_module(parts[0])
        for i, part in enumerate(parts[1:], 1):
            try:
                value = getattr(value, part)
            except AttributeError:
                value = importlib.import_module(".".join(parts[: i + 1]))
    except Exception:  # noqa: BLE001 - a path this environment does not have is simply unknown
        return _MISSING
    return value


def _is_namespace(value: object) -> bool:
    """Whether ``value`` is a module or a namespace of operators (``torch.ops.aten``): what holds functions by name."""
    return value is _MISSING or isinstance(value, types.ModuleType) or "Namespace" in type(value).__name__


def _kin(node: ast.AST, rules: Sequence[Forbidden], torch_names: set[str], parents: dict[int, ast.AST]
         ) -> tuple[Forbidden, str] | None:
    """The rule whose family a PyTorch entry named at ``node`` belongs to, and that entry's name (None: none)."""
    entries = []
    if isinstance(node, ast.Attribute) and _chain_root(node) in torch_names and not _only_named(node, parents):
        entries.append(node.attr)
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
        entries += [a.name for a in node.names]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME
          and len(node.args) >= 2 and _chain_root(node.args[0]) in torch_names):
        entries.append(_constant_text(node.args[1]) or "")
    for entry in entries:
        for rule in rules:
            if rule.family and rule.matches(entry) and entry not in rule.names:
                return rule, entry
    return None


def _torch_names(closure: Sequence[ast.stmt]) -> set[str]:
    """The names that stand for PyTorch (or a part of it) in this code: imports, and names assigned from them."""
    names = {"torch"}
    for statement in closure:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import):
                names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                names |= {a.asname or a.name for a in node.names}
    for _ in range(3):  # aliases of aliases (``ops = torch.ops; aten = ops.aten``)
        for statement in closure:
            for node in ast.walk(statement):
                if isinstance(node, (ast.Assign, ast.NamedExpr)) and _chain_root(node.value) in names:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def forbidden_use(sources: Sequence[str], name: str, rules: Sequence[Forbidden], exercise: str) -> str | None:
    """What in the code behind ``name`` uses a forbidden built-in, gets round the guard, or cannot be verified,
    as a message (None: nothing). ``sources`` are what the graded kernel loads, in load order."""
    try:
        statements = _statements(sources)
        closure = _closure(statements, name)
        return _forbidden_words(closure, rules, exercise) or _Reader(statements, closure, name, rules).check(exercise)
    except CannotVerify as error:
        return _cannot_verify(exercise, error.problem, error.where)
    except Exception as error:  # noqa: BLE001 - anything the reader did not foresee is "cannot verify", never "allowed"
        return _cannot_verify(exercise, f"could not be read by the grader ({type(error).__name__})", None)


def _forbidden_words(closure: Sequence[ast.stmt], rules: Sequence[Forbidden], exercise: str) -> str | None:
    """A forbidden built-in or a way round the guard named in ``closure``, as a message (None: none)."""
    words = {w: rule for rule in rules for w in rule.names}
    imported = {}
    for statement in closure:
        for node in ast.walk(statement):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    last = alias.name.rsplit(".", 1)[-1]
                    if last in words:
                        imported[alias.asname or alias.name] = last
    for statement in closure:
        parents = _parents(statement)
        for node in ast.walk(statement):
            found = None
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = next((a.name.rsplit(".", 1)[-1] for a in node.names if a.name.rsplit(".", 1)[-1] in EVASIONS),
                             None)
            elif isinstance(node, ast.Attribute) and (node.attr in words or node.attr in EVASIONS):
                found = None if _only_named(node, parents) else node.attr
            elif isinstance(node, ast.Name) and node.id in imported and not _only_named(node, parents):
                found = imported[node.id]
            elif isinstance(node, ast.Name) and node.id in EVASIONS:
                found = node.id
            elif _names_an_attribute(node, parents):  # elsewhere a string is a label or a message: it calls nothing
                text = _constant_text(node)
                if text is not None and text.rsplit(".", 1)[-1] in words:
                    found = text.rsplit(".", 1)[-1]
            if found is None:
                continue
            where = _shown(node)
            if found in EVASIONS:
                return (f"{exercise}'s code uses {found} (`{where}`), which {EVASIONS[found]}. Compute the result in "
                        "your function's own thread, with the guard and the checks' watches on.")
            rule = words[found]
            return (f"{exercise}'s code uses {rule.shown_as} (`{where}`), which this exercise asks you to write "
                    "yourself. Outside your function PyTorch's built-in is the referee your answer is compared "
                    "with; inside it, build the result from basic operations (matmul, exp, sum, max, ...).")
    return None


def _names_an_attribute(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` is the name ``getattr``, ``setattr``, ``delattr`` or ``hasattr`` is given."""
    call = parents.get(id(node))
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in {*BY_NAME, "hasattr"}
            and len(call.args) >= 2 and call.args[1] is node)


class _Reader:
    """The static reading of an exercise's code: each use it cannot resolve raises :class:`CannotVerify`."""

    def __init__(self, statements: Sequence[ast.stmt], closure: Sequence[ast.stmt], name: str,
                 rules: Sequence[Forbidden]) -> None:
        self.statements, self.closure, self.name, self.rules = statements, closure, name, rules
        self.imported = _imported(statements)
        self.bound = set().union(*(_facts(s).binds for s in statements))
        self.torch_names = _torch_names(closure)
        self.classes = {s.name: s for s in statements if isinstance(s, ast.ClassDef)}
        # The exercise's own parameters hold the grader's arguments only if nothing in the code calls it.
        self.graded_alone = not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                    for s in closure for n in ast.walk(s))

    def check(self, exercise: str) -> str | None:
        for statement in self.closure:
            unknown = sorted(_facts(statement).reads - self.bound - PLAIN_BUILTINS)
            dynamic = [n for n in unknown if n in DYNAMIC_CALLS]
            if dynamic:
                raise CannotVerify(f"{DYNAMIC_CALLS[dynamic[0]]} ({dynamic[0]})", statement)
            if unknown:
                raise CannotVerify(f"uses {', '.join(unknown)}, which is not defined in the exercise cells or the "
                                   "imports (a helper defined in a cell of your own is not loaded where your answer "
                                   "is graded: define it in an exercise cell)", statement)
            self._parents = _parents(statement)
            for node in ast.walk(statement):
                message = self._machinery_or_kin(node, exercise)
                if message:
                    return message
            self._visit(statement, frozenset(), in_class=False)
        for statement in self.statements:
            self._anywhere(statement)
        return None

    def _anywhere(self, statement: ast.stmt) -> None:
        """What anywhere in what is loaded could put another function under a name, or change a module."""
        parents = _parents(statement)
        for node in ast.walk(statement):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                raise CannotVerify(f"imports every name of {node.module} (`import *`), so the grader cannot tell "
                                   f"what a name stands for: import the names you use", node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]):
                    if module.split(".")[0] in ("__main__", "builtins", "importlib", "ctypes", "runpy", "unittest",
                                                "mock", "gc", "inspect", "IPython"):
                        raise CannotVerify(f"imports {module}, which can change which function a name stands for", node)
            if isinstance(node, ast.Name) and node.id in DYNAMIC_CALLS and not self._reads_namespace(node, parents):
                raise CannotVerify(DYNAMIC_CALLS[node.id], node)
            if isinstance(node, ast.Attribute) and (node.attr in ("__dict__", "__globals__", "__code__", "__builtins__")
                                                    or node.attr in DYNAMIC_ATTRIBUTES
                                                    or node.attr == "modules" and _chain_root(node) == "sys"):
                raise CannotVerify(f"reaches code through {node.attr}", node)
            problem = self._patches_a_module(node) or self._through_a_class(node) or self._module_as_value(node, parents)
            if problem:
                raise CannotVerify(problem, node)

    @staticmethod
    def _reads_namespace(node: ast.Name, parents: dict[int, ast.AST]) -> bool:
        """Whether ``globals()`` is only read where it is made (``globals()['x']``, ``.get``, ``in``)."""
        call = parents.get(id(node))
        if node.id not in ("globals", "locals", "vars") or not (isinstance(call, ast.Call) and call.func is node):
            return False
        parent = parents.get(id(call))
        if isinstance(parent, ast.Subscript):
            return isinstance(parent.ctx, ast.Load) and not isinstance(parents.get(id(parent)), (ast.Call,))
        if isinstance(parent, ast.Attribute):
            return parent.attr in ("get", "keys", "__contains__")
        return isinstance(parent, ast.Compare)

    def _patches_a_module(self, node: ast.AST) -> str | None:
        """How ``node`` changes what an imported module holds (``torch.softmax = f``, ``setattr(checks, ...)``)."""
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and (_chain_root(node.args[0]) in self.imported or _chain_root(node.args[0]) == "sys"):
                return f"changes what the module {_chain_root(node.args[0])} holds ({node.func.id})"
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)) and _chain_root(target) in self.imported:
                chain = target.value
                while isinstance(chain, (ast.Attribute, ast.Subscript)):  # ``x.grad[0] = 1`` on a tensor is fine
                    chain = chain.value
                root = target.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name):
                    return f"changes what the module {root.id} holds"
        return None

    @staticmethod
    def _through_a_class(node: ast.AST) -> str | None:
        """How ``node`` changes a class reached through one of its objects (``type(x).f = g``, ``x.__class__.f = g``,
        ``setattr(type(x), ...)``): a class of PyTorch's or of the grader's watches, which no name shows."""
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = [t for t in node.targets if isinstance(t, ast.Attribute)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Attribute):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = node.args[:1]
        for target in targets:
            base = target.value if isinstance(target, ast.Attribute) and not isinstance(node, ast.Call) else target
            for part in ast.walk(base):
                if (isinstance(part, ast.Attribute) and part.attr == "__class__") or (
                        isinstance(part, ast.Call) and isinstance(part.func, ast.Name) and part.func.id == "type"):
                    return "changes a class through one of its objects (type(x) or x.__class__)"
        return None

    def _visit(self, node: ast.AST, own: frozenset[str], in_class: bool) -> None:
        """Check ``node`` and what it holds; ``own`` are the names that hold the student's own objects there."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            own = self._own(node, own, in_class)
            in_class = False
        elif isinstance(node, ast.ClassDef):
            in_class = True
        else:
            self._check(node, own)
        for child in ast.iter_child_nodes(node):
            self._visit(child, own, in_class and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    def _own(self, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, outer: frozenset[str],
             method: bool) -> frozenset[str]:
        """The names that hold the student's own objects in ``function``: ``self`` in a method, the exercise's
        parameters (the grader's arguments), the enclosing function's such names, none of them rebound."""
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)]
        own = set(outer) - set(params)
        decorators = {d.id for d in getattr(function, "decorator_list", []) if isinstance(d, ast.Name)}
        if method and params and not decorators & {"staticmethod", "classmethod"}:
            own.add(params[0])
        if getattr(function, "name", None) == self.name and self.graded_alone and function in self.closure:
            own |= set(params)
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                own.discard(node.id)
            elif isinstance(node, (ast.Nonlocal, ast.Global)):
                own -= set(node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not function:
                own -= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}  # shadowed in a nested one
        factories = set(self.classes) | ({params[0]} if method and params and "classmethod" in decorators else set())
        return frozenset(own | self._instances(function, factories))

    def _instances(self, function: ast.AST, factories: set[str]) -> set[str]:
        """The names that ``function`` only ever binds to a new instance of a class of the student's:
        ``module = cls(d_model, h).to(dtype)``, ``block = Block()``."""
        if any(isinstance(s, ast.FunctionDef) and s.name == "__new__" or any(k.arg == "metaclass" for k in c.keywords)
               for c in self.classes.values() for s in [*c.body, c]):
            return set()  # a class whose instances are made another way: nothing is known of what it returns
        stored: dict[str, int] = {}
        made: dict[str, int] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stored[node.id] = stored.get(node.id, 0) + 1
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                  and self._makes_instance(node.value, factories)):
                made[node.targets[0].id] = made.get(node.targets[0].id, 0) + 1
        return {name for name, count in made.items() if stored.get(name) == count}

    def _makes_instance(self, value: ast.AST, factories: set[str]) -> bool:
        """Whether ``value`` is ``C(...)`` for a class ``C`` of the student's, maybe followed by ``.to(...)``-like
        calls of ``nn.Module`` that return the module itself (and that no class of the student's redefines)."""
        defined = {s.name for c in self.classes.values() for s in c.body if isinstance(s, ast.FunctionDef)}
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and value.func.attr in RETURN_THE_MODULE and value.func.attr not in defined):
            value = value.func.value
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in factories

    def _check(self, node: ast.AST, own: frozenset[str]) -> None:
        parents = self._parents
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise CannotVerify("imports from a package by a relative name", node)
            for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]):
                if module.split(".")[0] not in IMPORTABLE:
                    raise CannotVerify(f"imports {module} (an answer here may import only "
                                       f"{', '.join(sorted(IMPORTABLE - {'__future__'}))})", node)
            for path in _imported([node]).values():
                self._readable(path.split("."), node)
                if path.rsplit(".", 1)[-1] in DYNAMIC_ATTRIBUTES:
                    raise CannotVerify(f"imports {path}, which reaches attributes or code by computed names", node)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            parent = parents.get(id(node))
            if node.id in BY_NAME and not (isinstance(parent, ast.Call) and parent.func is node):
                raise CannotVerify(f"hands {node.id} on as a value, so the grader cannot tell which attribute it "
                                   "reaches", node)
        elif isinstance(node, ast.Attribute):
            self._attribute(node, parents)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME:
            attribute = _constant_text(node.args[1]) if len(node.args) >= 2 else None
            if attribute is not None:
                if _unplain(attribute):
                    raise CannotVerify(f"reaches the attribute {attribute}, which reaches code rather than values",
                                       node)
            elif not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in own):
                raise CannotVerify(f"reaches an attribute by a name computed at run time ({node.func.id} with a name "
                                   "that is not a constant, on an object that is not self or an argument of the "
                                   "exercise's function)", node)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.classes
                and node.attr in _plain_methods(self.classes[node.value.id])):
            call = parents.get(id(node))
            if not (isinstance(call, ast.Call) and call.func is node and call.args
                    and isinstance(call.args[0], ast.Name) and call.args[0].id in own):
                raise CannotVerify(f"takes the method {node.attr} from the class {node.value.id}, so it may run on "
                                   "any object: call it on an instance", node)

    def _attribute(self, node: ast.Attribute, parents: dict[int, ast.AST]) -> None:
        if _only_named(node, parents):
            return
        if _unplain(node.attr):
            raise CannotVerify(f"reaches code through {node.attr}", node)
        chain = _chain(node)
        if chain is None or chain[0] not in self.imported:
            return
        self._readable([*self.imported[chain[0]].split("."), *chain[1:]], node)

    @staticmethod
    def _readable(path: list[str], node: ast.AST) -> None:
        """Refuse a part of PyTorch or NumPy that compiles, loads or hides code (``torch.jit``, ``torch._C``)."""
        if path[0] in ("torch", "numpy") and any(p in UNREADABLE or (p.startswith("_") and not p.startswith("__"))
                                                 for p in path[1:]):
            raise CannotVerify(f"uses {'.'.join(path)}, which runs code the grader cannot read (compiled, loaded "
                               "or private to PyTorch): write the computation in Python", node)

    def _module_as_value(self, node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
        """How ``node`` uses a module as a value (stored, passed, listed: then ``getattr`` could reach it), or None."""
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
            return None
        chain = _chain(node)
        parent = parents.get(id(node))
        if (chain is None or chain[0] not in self.imported or isinstance(parent, ast.Attribute)
                or (isinstance(parent, ast.Call) and parent.func is node) or _only_named(node, parents)):
            return None
        if _is_namespace(_resolve(".".join([*self.imported[chain[0]].split("."), *chain[1:]]))):
            return (f"uses the module {'.'.join(chain)} as a value (stored, passed or listed), so the grader cannot "
                    f"tell which of its functions runs: call them by name ({'.'.join(chain)}.name(...))")
        return None

    def _machinery_or_kin(self, node: ast.AST, exercise: str) -> str | None:
        parents = self._parents
        if (isinstance(node, ast.Attribute) and _chain_root(node) in self.torch_names
                and not _only_named(node, parents) and re.search(GUARD_MACHINERY, node.attr)):
            return (f"{exercise}'s code uses {node.attr} (`{_shown(node)}`), PyTorch's machinery of modes "
                    "and dispatch, which can turn off or detect the guard and the watches. Compute the result "
                    "with the guard and the checks' watches on.")
        kin = _kin(node, self.rules, self.torch_names, parents)
        if kin is not None:
            rule, entry = kin
            return (f"{exercise}'s code uses {entry} (`{_shown(node)}`), a PyTorch built-in of the "
                    f"same kind as {rule.shown_as}, which this exercise asks you to write yourself. Build the "
                    "result from basic operations (matmul, exp, sum, max, ...).")
        return None


def _unplain(attribute: str) -> bool:
    """Whether reaching ``attribute`` may reach code or a namespace (a dunder other than a plain one, a frame)."""
    dunder = attribute.startswith("__") and attribute.endswith("__")
    return (dunder and attribute not in PLAIN_DUNDERS) or attribute in DYNAMIC_ATTRIBUTES


def _plain_methods(cls: ast.ClassDef) -> set[str]:
    """The methods of ``cls`` that take their object as first argument (neither static nor class methods)."""
    return {s.name for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not {d.id for d in s.decorator_list if isinstance(d, ast.Name)} & {"staticmethod", "classmethod"}}


def _cannot_verify(exercise: str, problem: str, where: str | None) -> str:
    """The message of code the grader cannot read for the built-ins it runs: what, where, and what to write."""
    shown = f" (`{where}`)" if where else ""
    return (f"Cannot verify {exercise}: the code loaded for grading {problem}{shown}. In an exercise that asks you "
            "to write a built-in yourself, or whose checks watch your code while it runs (the memory it allocates, "
            "the gradients it reaches), the grader reads the code your answer runs to see that no built-in does "
            "the work and nothing changes what the checks watch, and gives no points for code it cannot read: "
            "write plain Python in the exercise cells, call functions by their names, and import only what the "
            "exercise needs.")
