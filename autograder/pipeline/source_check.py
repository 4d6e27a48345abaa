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

What it does not see: a name computed at run time from data (``getattr(F, name)`` where
``name`` is not made of constants), or code that is not in the notebook's cells (a file the
student's code writes and imports). Those are left to the guard, and to the instructor
reading the code.
"""

from __future__ import annotations

import ast
import functools
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
        return tuple(ast.parse(TransformerManager().transform_cell(source)).body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()  # a cell that does not parse defines nothing the kernel could run either


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


def forbidden_use(sources: Sequence[str], name: str, rules: Sequence[Forbidden], exercise: str) -> str | None:
    """What in the code behind ``name`` uses a forbidden built-in or gets round the guard, as a message."""
    closure = definition_closure(sources, name)
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
    return None
