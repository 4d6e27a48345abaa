"""Run a graded notebook again where the student's code cannot fake its test results.

In nbgrader's kernel the student's cells run first, in the same interpreter as the test
cells, with every IPython hook at hand: an answer cell can replace ``torch.allclose`` or a
hidden check, swallow every error (``set_custom_exc``), or rewrite every later cell (input
transformers), and nbgrader then sees test cells without errors and gives full marks.

This module is the other run (``python -m autograder.pipeline.recheck``, in the sandbox,
notebook on stdin). It

1. imports PyTorch and the checks *before* any student code, and takes a
   :class:`Snapshot` of the functions the checks rely on: every function, class and
   module in the namespaces of ``torch``, ``numpy``, ``autograder`` and the standard
   modules they use, the attributes of their classes, the code, defaults and closures of
   their Python functions, and ``sys.modules``;
2. runs the student's cells in an IPython shell (magics work as in Jupyter);
3. runs each test cell itself, with ``exec`` captured at start-up (no IPython hook, input
   transformer or custom exception handler sees it), and compares the snapshot before and
   after it, with checks for trace and profile functions, torch function and dispatch
   modes, subclasses of ``torch.Tensor`` from the student's code, and extra threads;
4. writes one verdict per test cell: passed, or failed with the reason. After the first
   change to what the checks rely on, every later test cell fails with that reason.

What it cannot see: changes made through ``ctypes`` to memory, or code written to find
and rewrite this module's own state while it runs. The static scan of
:mod:`autograder.pipeline.integrity` sends such submissions here, and the sandbox keeps
any damage inside the submission's own grading.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import types

#: Modules whose namespaces (callables, classes, modules) the checks rely on.
WATCHED = ("numpy", "autograder", "builtins", "math", "operator", "functools", "itertools", "collections",
           "types", "inspect", "traceback", "re", "dataclasses", "typing", "contextlib", "copy", "abc", "sys",
           "importlib", "IPython")
#: The parts of PyTorch the checks use (the rest of it changes itself as it loads lazily).
TORCH = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.modules", "torch.nn.init", "torch.nn.attention",
         "torch.nn.parameter", "torch.testing", "torch.linalg", "torch.special", "torch.fft", "torch.overrides",
         "torch.functional", "torch._tensor", "torch.random", "torch.autograd", "torch.utils._python_dispatch",
         "torch.utils._pytree")
#: Names that change while an IPython shell works normally.
VOLATILE = {"_", "__", "___", "displayhook", "excepthook", "last_type", "last_value", "last_traceback", "last_exc",
            "ps1", "ps2", "ps3"}


class CellTimeout(BaseException):
    """A cell of the re-check ran past its time."""


def _watched(name: str) -> bool:
    if name == "torch" or name.startswith("torch."):
        return name == "torch" or any(name == t or name.startswith(t + ".") for t in TORCH[1:])
    return any(name == w or name.startswith(w + ".") for w in WATCHED)


def _torch_wrapper(new: object, old: object) -> bool:
    """Whether ``new`` is PyTorch's own wrapper of ``old`` (it wraps functions as it loads, e.g. for dynamo)."""
    import torch

    code = getattr(new, "__code__", None)
    if code is None or not code.co_filename.startswith(os.path.dirname(torch.__file__) + os.sep):
        return False
    target = new
    for _ in range(5):
        target = getattr(target, "__wrapped__", None)
        if target is old:
            return True
        if target is None:
            return False
    return False


def _functions_of(value: object) -> list[types.FunctionType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType)]
    return [value] if isinstance(value, types.FunctionType) else []


def _important(value: object) -> bool:
    return callable(value) or isinstance(value, (type, types.ModuleType, staticmethod, classmethod, property))


class Snapshot:
    """Identities of everything the checks rely on, to compare after student code ran."""

    def __init__(self) -> None:
        self.modules: dict[str, tuple[types.ModuleType, dict[str, object]]] = {}
        self.classes: dict[int, tuple[type, dict[str, int]]] = {}
        self.functions: dict[int, tuple[types.FunctionType, tuple]] = {}
        self.keep: list[object] = []  # keeps every recorded object alive, so ids stay unique
        for name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType) or not _watched(name):
                continue
            everything = name == "autograder" or name.startswith("autograder.")
            names = {}
            for key, value in list(vars(module).items()):
                if key in VOLATILE:
                    continue
                if everything or _important(value):
                    names[key] = value
                    self._visit(value)
            self.modules[name] = (module, names)

    def _visit(self, value: object) -> None:
        if isinstance(value, type) and id(value) not in self.classes and _watched(getattr(value, "__module__", "") or ""):
            attrs = {}
            for key, attr in list(vars(value).items()):
                attrs[key] = id(attr)
                self.keep.append(attr)
                for fn in _functions_of(attr):
                    self._function(fn)
            self.classes[id(value)] = (value, attrs)
        for fn in _functions_of(value):
            self._function(fn)

    def _function(self, fn: types.FunctionType) -> None:
        if id(fn) in self.functions:
            return
        self.functions[id(fn)] = (fn, self._state(fn))

    @staticmethod
    def _state(fn: types.FunctionType) -> tuple:
        cells = []
        for cell in fn.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:
                content = None
            cells.append(id(content) if _important(content) else None)
        return id(fn.__code__), id(fn.__defaults__), id(fn.__kwdefaults__), tuple(cells)

    def changes(self) -> list[str]:
        """What differs from the snapshot, in words (empty: nothing)."""
        found = []
        for name, (module, names) in self.modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}] was replaced")
                continue
            now = vars(module)
            for key, old in names.items():
                if key not in now:
                    found.append(f"{name}.{key} was deleted")
                elif now[key] is not old and not _torch_wrapper(now[key], old):
                    found.append(f"{name}.{key} was replaced")
            if len(found) > 20:
                return found
        for cls, attrs in self.classes.values():
            now = vars(cls)
            for key in now.keys() - attrs.keys():
                found.append(f"{cls.__module__}.{cls.__qualname__}.{key} was added")
            for key, ident in attrs.items():
                if key not in now:
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{key} was deleted")
                elif id(now[key]) != ident:
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{key} was replaced")
        for fn, state in self.functions.values():
            if self._state(fn) != state:
                found.append(f"the code of {fn.__module__}.{fn.__qualname__} was changed")
        return found


def state_changes(threads: int) -> list[str]:
    """Interpreter state that would let student code interfere with a check."""
    import torch

    found = []
    if sys.gettrace() is not None:
        found.append("a trace function was installed (sys.settrace)")
    if sys.getprofile() is not None:
        found.append("a profile function was installed (sys.setprofile)")
    if threading.gettrace() is not None or threading.getprofile() is not None:
        found.append("a trace or profile function was installed for threads")
    if torch._C._len_torch_function_stack():
        found.append("a torch function mode was left active")
    if torch._C._len_torch_dispatch_stack():
        found.append("a torch dispatch mode was left active")
    if not torch._C._is_torch_function_enabled():
        found.append("torch function overrides were disabled")
    if threading.active_count() > threads:
        found.append("a thread was started")
    todo, seen = list(torch.Tensor.__subclasses__()), set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        module = getattr(cls, "__module__", "") or ""
        if not (module == "torch" or module.startswith(("torch.", "autograder"))):
            found.append(f"a subclass of torch.Tensor was defined ({cls.__qualname__})")
    return found


def _on_alarm(signum, frame):
    raise CellTimeout()


def main() -> None:
    spec = json.loads(sys.stdin.buffer.read())
    nonce = spec["nonce"]
    verdicts = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    os.environ["MPLBACKEND"] = "agg"

    def emit(**record):
        verdicts.write(f"{nonce} {json.dumps(record)}\n")

    import importlib

    import torch  # noqa: F401 - loaded before any student code

    for name in spec["preload"]:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - reported, the test cells will fail on it
            emit(warning=f"could not import {name}: {type(error).__name__}: {error}")
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.enable_gui = lambda gui=None: None  # `%matplotlib inline` works without a front end
    run_cell, run_code, compile_code = shell.run_cell, exec, compile
    namespace = shell.user_ns
    signal.signal(signal.SIGALRM, _on_alarm)
    alarm = signal.alarm
    default_dtype = torch.get_default_dtype()

    def no_new_hooks(event, args):
        if event == "sys.addaudithook":
            raise RuntimeError("audit hooks are not allowed while grading")

    sys.addaudithook(no_new_hooks)
    snapshot = Snapshot()
    threads = threading.active_count()
    tampered: str | None = None
    timeout = int(spec["cell_timeout"])

    for cell in spec["cells"]:
        if cell["kind"] == "code":
            try:
                alarm(timeout)
                result = run_cell(cell["source"], store_history=False)
                error = result.error_before_exec or result.error_in_exec
                if error is not None:
                    emit(cell_error=f"{type(error).__name__}: {error}"[:300])
            except BaseException as error:  # noqa: BLE001 - a student cell may raise anything, even SystemExit
                emit(cell_error=f"{type(error).__name__}: {error}"[:300])
            finally:
                alarm(0)
            continue
        if tampered is None:
            problems = snapshot.changes() + state_changes(threads)
            tampered = "; ".join(problems[:3]) if problems else None
        if tampered is not None:
            emit(grade_id=cell["grade_id"], ok=False, reason=tampered)
            continue
        torch.set_default_dtype(default_dtype)
        ok, reason = True, ""
        try:
            alarm(timeout)
            run_code(compile_code(cell["source"], f"<test cell {cell['grade_id']}>", "exec"), namespace)
        except CellTimeout:
            ok, reason = False, f"it ran longer than {timeout} s"
        except BaseException as error:  # noqa: BLE001 - any error fails the test cell
            ok, reason = False, f"{type(error).__name__}: {error}"[:500]
        finally:
            alarm(0)
        problems = snapshot.changes() + state_changes(threads)
        if problems:
            tampered = "; ".join(problems[:3])
            ok, reason = False, tampered
        emit(grade_id=cell["grade_id"], ok=ok, reason=reason)
    emit(done=True)


if __name__ == "__main__":
    main()
