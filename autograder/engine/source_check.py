"""Read a student's source for the built-ins an exercise forbids: what the kernel cannot fake.

In the student's kernel the guard (:mod:`autograder.guard`) stops a forbidden built-in when
it is called, which is what an honest student needs. Code in that kernel can also switch the
guard off (``torch._C.DisableTorchFunction``), call the built-in from another thread, or
replace the guard. So, before the grader asks the kernel to run an exercise that forbids
built-ins, it reads the student's own source, in the grader's process:

- the definition of the exercise and, transitively, every top-level function, class,
  assignment or import of the notebook that it reads as a global (Python's own symbol
  tables say which names those are);
- in that code, a forbidden built-in *called* or *passed on* (``F.scaled_dot_product_attention(...)``,
  ``torch.ops.aten._softmax``, ``f = torch.softmax``, ``from torch import softmax``, a
  string naming it for ``getattr``, even one glued together from constants), and the ways
  round the guard (``DisableTorchFunction``, threads, processes). Mentioning a forbidden
  class in ``isinstance`` or an annotation is fine.

It reads conservatively, because only the code it reads is judged: in an exercise that forbids
built-ins, that code may not run code that is not in the notebook's cells (``exec``, ``eval``,
``compile``, ``__import__``, ``importlib``, a module this environment does not have, such as one
the code writes at run time), reach a function by a name computed at run time (``getattr`` with a
name that is not a constant, ``globals()``, ``vars``, ``__dict__``, ``sys.modules``, frames), or
name a PyTorch entry of the forbidden built-in's *family* (:attr:`autograder.guard.Forbidden.family`:
``torch._native_multi_head_attention`` and ``torch.ops.aten.scaled_dot_product_attention.default``
are attention whatever list they are missing from). Nothing in the notebook may change what an
imported module holds (``torch.softmax = f``, a probe of the public checks replaced): the checks' own
code runs in the kernel beside the student's. A function that behaves differently when it is graded
gains nothing: its source is what is read.

What it does not see: code that is not Python source in the notebook (a compiled extension that
this environment already has), a family that no pattern describes, and exercises that forbid no
built-in (their source is not read: a probe of theirs replaced in the kernel can only misreport how
the student's own code worked, never supply its results). Those are left to the guard,
and to the instructor reading the code.
"""

from __future__ import annotations

import ast
import functools
import re
import symtable
from collections.abc import Iterable, Sequence

from ..guard import Forbidden

#: Names whose use in an exercise's code gets round the guard: turning torch function
#: modes off, or running the work in another thread or process, where the guard is not.
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
}
#: What an exercise that forbids built-ins may import: PyTorch and what honest answers use beside it. Any
#: other module may run code the grader does not read (``importlib``, one the code writes at run time),
#: or tell grading from a run in the notebook (``os.environ``, ``sys._getframe``, ``inspect``).
IMPORTABLE = frozenset({
    "torch", "math", "cmath", "numpy", "einops", "functools", "itertools", "operator", "collections", "typing",
    "dataclasses", "abc", "enum", "numbers", "fractions", "decimal", "random", "statistics", "string", "re", "copy",
    "contextlib", "heapq", "bisect", "warnings", "time", "weakref", "matplotlib", "__future__",
})
#: Calls through which code runs that is not in the notebook's cells, or a name is computed at run time.
DYNAMIC_CALLS = {
    "exec": "runs code from a string", "eval": "runs code from a string", "compile": "makes code from a string",
    "__import__": "imports a module by a computed name", "globals": "reaches functions through the notebook's namespace",
    "locals": "reaches functions through a namespace", "vars": "reaches functions through a namespace",
    "breakpoint": "stops in a debugger", "get_ipython": "reaches the notebook's kernel",
}
#: Attributes that reach code or namespaces rather than values.
DYNAMIC_ATTRIBUTES = frozenset({
    "__dict__", "__globals__", "__code__", "__builtins__", "__closure__", "__subclasses__", "__getattribute__",
    "__import__", "__loader__", "__spec__", "f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "tb_frame",
    "co_code", "_getframe", "modules",
})
#: PyTorch's machinery of modes and dispatch (switching the guard or a watch off, or looking for them), by its
#: names' shape rather than a list: ``torch._C._disable_current_modes``, ``torch.overrides._pop_mode``, ...
GUARD_MACHINERY = (r"(?i)dispatch|torch_function|function_mode|current_modes?|mode_stack|_len_torch|disable"
                   r"|^_pop|^_push|_unset|overrides")
#: Calls that reach an attribute by name: fine with a constant name, not with one computed at run time.
BY_NAME = {"getattr", "setattr", "delattr"}
#: Calls whose arguments only name a class (never call it).
NAMING_ONLY = {"isinstance", "issubclass", "type"}


def _statements(sources: Iterable[str]) -> list[ast.stmt]:
    return [statement for source in sources for statement in _cell_statements(source)]


# Every check of a notebook reads the cells before it again: each cell is parsed once per process
# (a grading process serves one submission), and the parsed statements are only read, never changed.
@functools.lru_cache(maxsize=4096)
def _cell_statements(source: str) -> tuple[ast.stmt, ...]:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        statements = ast.parse(TransformerManager().transform_cell(source)).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()  # a cell that does not parse defines nothing the kernel could run either
    # A cell magic that runs its body as Python (%%time, %%timeit, %%capture): the body is what is read.
    if len(statements) == 1 and _magic(statements[0]) in PYTHON_CELL_MAGICS:
        body = statements[0].value.args[2]  # type: ignore[attr-defined]
        if isinstance(body, ast.Constant) and isinstance(body.value, str):
            return _cell_statements(body.value)
    return tuple(statements)


#: IPython's magics that run nothing but Python the reader sees, or a shell: kept in a read notebook.
SAFE_MAGICS = frozenset({"matplotlib", "time", "timeit", "config", "precision", "pprint", "who", "whos", "pwd", "ls",
                         "capture"})
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture"})


def _magic(node: ast.AST) -> str | None:
    """The magic a transformed magic line calls (``get_ipython().run_line_magic('time', ...)``), or None."""
    call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else node
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("run_line_magic", "run_cell_magic") and call.args
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return call.args[0].value
    return None


def _harmless_ipython(node: ast.Call, parents: dict[int, ast.AST]) -> bool:
    """Whether a ``get_ipython()`` call only runs a shell command or a magic of :data:`SAFE_MAGICS`."""
    attribute = parents.get(id(node))
    if not isinstance(attribute, ast.Attribute):
        return False
    if attribute.attr in ("system", "getoutput"):
        return True
    return _magic(parents.get(id(attribute))) in SAFE_MAGICS


def _bound_names(statement: ast.stmt) -> set[str]:
    """The global names a top-level statement defines."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names}
    names = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


@functools.lru_cache(maxsize=4096)
def _globals_read(statement: ast.stmt) -> frozenset[str]:
    """The global names a top-level statement reads (in its own body and in nested functions and classes)."""
    try:
        table = symtable.symtable(ast.unparse(statement), "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    todo = list(table.get_children())
    while todo:
        child = todo.pop()
        todo += child.get_children()
        names |= {s.get_name() for s in child.get_symbols() if s.is_global() or (
            child.get_type() == "class" and s.is_referenced() and not s.is_assigned())}
    return frozenset(names)


def definition_closure(sources: Sequence[str], name: str) -> list[ast.stmt]:
    """Every top-level statement that defines ``name`` or a global it reads, transitively."""
    statements = _statements(sources)
    defining: dict[str, list[ast.stmt]] = {}
    for statement in statements:
        for bound in _bound_names(statement):
            defining.setdefault(bound, []).append(statement)
    chosen: dict[int, ast.stmt] = {}
    todo = [name]
    seen = set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for statement in defining.get(current, []):
            if id(statement) not in chosen:
                chosen[id(statement)] = statement
                todo += _globals_read(statement)
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


def _dynamic(node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
    """How ``node`` runs code that is not in the cells or reaches a function by a computed name (None: it does not)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        if isinstance(node, ast.ImportFrom) and node.level:
            return "imports from a package by a relative name"
        for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]):
            if module.split(".")[0] not in IMPORTABLE:
                return (f"imports {module} (an answer here may import only "
                        f"{', '.join(sorted(IMPORTABLE - {'__future__'}))})")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "get_ipython" and _harmless_ipython(node, parents):
            return None
        if node.func.id in DYNAMIC_CALLS:
            return DYNAMIC_CALLS[node.func.id]
        if node.func.id in BY_NAME and (len(node.args) < 2 or _constant_text(node.args[1]) is None):
            return f"reaches an attribute by a name computed at run time ({node.func.id} with a name that is not a constant)"
    elif isinstance(node, ast.Attribute) and node.attr in DYNAMIC_ATTRIBUTES and not _only_named(node, parents):
        return f"reaches code through {node.attr}"
    return None


def _module_names(statements: Sequence[ast.stmt]) -> set[str]:
    """The names that stand for an imported module (or what it holds) anywhere in the notebook, aliases included."""
    names: set[str] = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import):
                names |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names |= {a.asname or a.name for a in node.names}
    for _ in range(3):  # ``fb = checks.flash_backward``: a name for a module, not a value a module computed
        for statement in statements:
            for node in ast.walk(statement):
                if isinstance(node, (ast.Assign, ast.NamedExpr)) and _names_a_module_part(node.value, names):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _names_a_module_part(node: ast.AST, modules: set[str]) -> bool:
    """Whether ``node`` is a module's name or an attribute chain from one (no call, no subscript)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in modules


def _patches_a_module(node: ast.AST, modules: set[str]) -> str | None:
    """How ``node`` changes what an imported module holds (``torch.softmax = f``, ``setattr(checks, ...)``), or None."""
    targets: list[ast.AST] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
        if node.args and (_names_a_module_part(node.args[0], modules) or _chain_root(node.args[0]) == "sys"):
            return f"changes what the module {_chain_root(node.args[0])} holds ({node.func.id})"
    for target in targets:
        if isinstance(target, (ast.Attribute, ast.Subscript)) and _names_a_module_part(target.value, modules):
            return f"changes what the module {_chain_root(target)} holds"
    return None


def _only_reads(namespace: ast.Call, parents: dict[int, ast.AST]) -> bool:
    """Whether a namespace (``globals()``) is only read where it is made: ``globals()['x']``, ``.get``, ``in``."""
    parent = parents.get(id(namespace))
    if isinstance(parent, ast.Subscript):
        return isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.Attribute):
        return parent.attr in ("get", "keys", "items", "values", "copy", "__contains__")
    return isinstance(parent, ast.Compare)


def _rewrites_namespace(node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
    """How a statement anywhere in the notebook could put another function under an exercise's name (None: it cannot)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "get_ipython"):
        if node.func.id == "get_ipython" and _harmless_ipython(node, parents):
            return None
        if node.func.id in ("globals", "locals", "vars") and _only_reads(node, parents):
            return None
        return DYNAMIC_CALLS[node.func.id]
    if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "__globals__", "__code__", "modules", "f_globals"):
        return f"reaches code through {node.attr}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]):
            if module.split(".")[0] in ("__main__", "builtins", "importlib", "ctypes", "runpy", "unittest", "mock"):
                return f"imports {module}, which can change which function a name stands for"
    return None


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


def forbidden_use(sources: Sequence[str], name: str, rules: Sequence[Forbidden], exercise: str) -> str | None:
    """What in the code behind ``name`` uses a forbidden built-in or gets round the guard, as a message."""
    closure = definition_closure(sources, name)
    torch_names = _torch_names(closure)
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
            elif not isinstance(parents.get(id(node)), ast.Expr):  # a docstring or bare string does nothing
                text = _constant_text(node)
                if text is not None and text.rsplit(".", 1)[-1] in words:
                    found = text.rsplit(".", 1)[-1]
            if found is None:
                continue
            where = ast.unparse(node)[:80]
            if found in EVASIONS:
                return (f"{exercise}'s code uses {found} (`{where}`), which {EVASIONS[found]}. In an exercise that "
                        "asks you to write a built-in yourself, compute the result in your function's own thread, "
                        "with the guard on.")
            rule = words[found]
            return (f"{exercise}'s code uses {rule.shown_as} (`{where}`), which this exercise asks you to write "
                    "yourself. Outside your function PyTorch's built-in is the referee your answer is compared "
                    "with; inside it, build the result from basic operations (matmul, exp, sum, max, ...).")
    # Then what the grader cannot read for the built-ins it runs, and the forbidden built-ins' kin.
    for statement in closure:
        parents = _parents(statement)
        for node in ast.walk(statement):
            problem = _dynamic(node, parents)
            if problem is not None:
                return _read_only_message(exercise, problem, node)
            if (isinstance(node, ast.Attribute) and _chain_root(node) in torch_names and not _only_named(node, parents)
                    and re.search(GUARD_MACHINERY, node.attr)):
                return (f"{exercise}'s code uses {node.attr} (`{ast.unparse(node)[:80]}`), PyTorch's machinery of modes "
                        "and dispatch, which can turn off or detect the guard and the watches. In an exercise that "
                        "asks you to write a built-in yourself, compute the result with the guard on.")
            kin = _kin(node, rules, torch_names, parents)
            if kin is not None:
                rule, entry = kin
                return (f"{exercise}'s code uses {entry} (`{ast.unparse(node)[:80]}`), a PyTorch built-in of the "
                        f"same kind as {rule.shown_as}, which this exercise asks you to write yourself. Build the "
                        "result from basic operations (matmul, exp, sum, max, ...).")
    # Anywhere in the notebook: what could put another function under the exercise's name, or change the
    # modules the checks' own code runs on in the kernel (a probe replaced, torch.softmax rebound).
    everything = _statements(sources)
    modules = _module_names(everything)
    chosen = {id(statement) for statement in closure}
    for statement in everything:
        parents = _parents(statement)
        for node in ast.walk(statement):
            problem = _patches_a_module(node, modules)
            if problem is None and id(statement) not in chosen:
                problem = _rewrites_namespace(node, parents)
            if problem is not None:
                return _read_only_message("the notebook", problem, node)
    return None


def _read_only_message(who: str, problem: str, node: ast.AST) -> str:
    """The message of code the grader cannot read for the built-ins it runs."""
    whose = "'s code" if who != "the notebook" else ""
    return (f"{who}{whose} {problem} (`{ast.unparse(node)[:80]}`). In an exercise that asks you to write a built-in "
            "yourself, the grader reads the code your answer runs to see that no built-in does the work: write it "
            "in the notebook's cells and call it by its name, importing only what the exercise needs.")
