"""nbgrader's ``Execute``, made to survive what a submission can do to its kernel.

nbgrader executes a notebook in one kernel and gives up on the whole submission when that
kernel dies; a cell that ignores the interrupt after its timeout blocks it for ever; a flood
of output fills the grader's memory. :class:`ResilientExecute` replaces nbgrader's
``Execute`` in ``Autograde.autograde_preprocessors`` (``nbgrader_config.py``) and grades what
can be graded:

- **the kernel dies** in a cell (``os._exit``, a segmentation fault, the memory limit,
  ``exit()``): the cell gets an error output saying so, a new kernel is started, the cells
  that had run before are run again (outputs discarded) to rebuild the state, and grading
  goes on with the next cell;
- **a cell runs past its timeout** (``Execute.timeout``): it is interrupted and gets an error
  output; if the kernel does not come back (the code swallows ``KeyboardInterrupt``), it is
  restarted as above;
- **the whole notebook** may take at most ``ResilientExecute.notebook_timeout`` seconds,
  restarts included; the cells left get an error output "not run";
- **output** beyond ``ResilientExecute.max_output_bytes`` per cell, or beyond
  ``ResilientExecute.max_notebook_output_bytes`` for the whole notebook (so that many cells each
  writing just under a cell's share cannot grow the graded notebook, nor the grader's memory), is
  dropped (a note says so; a dropped stderr stream still leaves a stderr note, so nbgrader's rule
  "a test cell that writes to stderr scores zero" is unchanged).

- **test cells** run in this process, not in the kernel (:mod:`autograder.engine.judge`):
  the checks call the student's functions through proxies and judge what comes back here,
  so the student's code never shares a process with a reference, an expected value or a
  comparison. The calls go to a second kernel, the graded kernel
  (:mod:`autograder.engine.graded_kernel`), started while the notebook runs, into which only
  the release's code, the imports and the answer cells before the test cell are loaded
  (:mod:`autograder.engine.graded_cells`): no other cell can change a verdict or cost one.
  Before an exercise that forbids built-ins is run, those same sources are read for them
  (:mod:`autograder.engine.source_check`);
- **a cell kills its kernel** without an error of its own (``exit()``, a thread that calls
  ``os._exit`` later): after each cell the kernel must answer a request before the cell
  counts as done; if it does not, that cell is blamed and never run again.

Each of these is an error output of the cell, so nbgrader scores that cell as failed and
the student reads why in the feedback. The kernel runs in the sandbox of
:mod:`autograder.engine.sandbox` (``ResilientExecute.sandbox``, default on).
"""

from __future__ import annotations

import asyncio
import copy
import json
import resource
from pathlib import Path
from time import monotonic

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from nbgrader.utils import is_grade, is_solution
from traitlets import Bool, Integer, List, Unicode

from ..grader import remote
from . import graded_cells, graded_kernel, judge, source_check, staging
from .graded_kernel import GradedKernel
from .judge import error_output
from .kernel_requests import KernelRequests
from .notes import KERNEL_DIED, NOT_RUN, TIMEOUT, describe_exit, output_cut, safe_tree
from .staging import MAX_DEPTH

#: The marker of hidden tests in a test cell's source (nbgrader's ClearHiddenTests delimiter).
HIDDEN_TESTS = "BEGIN HIDDEN TESTS"


def is_test_cell(cell) -> bool:
    """A locked cell that nbgrader scores: the instructor's checks."""
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value`` (lists and dicts) nests more than ``limit`` levels deep; without recursion."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            todo += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return False


def limit_own_memory(mb: int) -> None:
    """Cap this process's private writable memory at ``mb`` MB (0: leave it), as its soft limit only.

    ``RLIMIT_DATA``, not the address space: the CUDA build of PyTorch maps gigabytes of library code.

    The soft limit: the kernels this process starts inherit it and may raise it to the hard one, so the
    sandbox still sets their own limits (:mod:`autograder.engine.sandbox`).
    """
    if mb <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = mb * 2**20 if hard == resource.RLIM_INFINITY else min(mb * 2**20, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


class ResilientExecute(KernelRequests, Execute):
    """``Execute`` that survives dead kernels, runaway cells and output floods (see the module doc)."""

    notebook_timeout = Integer(600, help="Seconds the whole notebook may take, restarts included.").tag(config=True)
    max_restarts = Integer(8, help="Kernel restarts allowed per notebook.").tag(config=True)
    max_output_bytes = Integer(2**20, help="Output bytes kept per cell.").tag(config=True)
    max_notebook_output_bytes = Integer(16 * 2**20, help="Output bytes kept for the whole notebook, every cell "
                                        "together: past it, a cell keeps a note and its error (cut short) only."
                                        ).tag(config=True)
    sandbox = Bool(True, help="Run the kernel in the sandbox of autograder.engine.sandbox.").tag(config=True)
    grader_memory_mb = Integer(4096, help="Private writable memory of the grading process itself in MB (RLIMIT_DATA, its soft "
                               "limit; 0: none): whatever a kernel answers, one submission's grading fails alone "
                               "instead of starving the machine.").tag(config=True)
    checks_in_grader = Bool(True, help="Run test cells in the grader's process, the student's functions in the "
                            "kernel (autograder.engine.judge); False runs them in the kernel, as nbgrader does."
                            ).tag(config=True)
    all_or_nothing = List(Unicode(), help="Test cells scored all or nothing instead of by their cases' shares "
                          "(autograder.grader.cases): '*' every cell of the course, a notebook's name ('08_flash_backward') "
                          "every cell of it, 'notebook/grade_id' one cell.").tag(config=True)
    # A kernel that never goes idle must not lose the cells already executed.
    raise_on_iopub_timeout = Bool(False, help="Raise when a cell's output stops before the kernel is idle; False "
                                  "keeps the cells already executed.").tag(config=True)

    def __init__(self, *args, **kwargs):
        from .kernel_manager import SandboxedKernelManager

        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)
        if not self.sandbox:
            from .kernel_manager import PlainKernelManager

            self.kernel_manager_class = PlainKernelManager
        # nbclient's public hooks for a cell's time limit: the limit of each cell (what the notebook has
        # left), and the error a stopped cell gets (set before each cell, with that limit in its words)
        self.timeout_func = self._timeout_of
        # and once the kernel is ready: nbclient calls this hook from the sync and async paths alike (an override
        # of async_start_new_kernel_client is not reached from the sync one, which nbconvert's preprocess takes)
        self.on_notebook_start = self._notebook_started
        if self.checks_in_grader:
            import torch

            torch.set_num_threads(1)  # as in the kernel: the same sums, whatever the number of workers

    # -- the notebook -----------------------------------------------------------------------

    def preprocess(self, nb, resources=None, km=None):
        limit_own_memory(self.grader_memory_mb)
        self._started = monotonic()
        self._replay: list[int] = []
        self._restarts = 0
        self._given_up: str | None = None
        self._timed_out = False
        self._cell_limit: int | None = None
        self._output_bytes: dict[int, int] = {}
        self._notebook_output_bytes = 0
        self._noted: dict[int, set[str]] = {}
        self._started_cells: set[int] = set()
        self._deadline = 0.0
        self._index = 0
        self._streams: list[tuple[str, str]] = []
        self._streams_size = 0
        self._forbidden: dict[tuple, str | None] = {}
        self._notebook_name = ""
        self._asked_exit = False
        self.graded = None
        self._graded_broken: str | None = None
        self._notebook_name = str((resources or {}).get("nbgrader", {}).get("notebook") or "")
        self._graded_sources = graded_cells.graded_sources(nb, self._release(resources)) if self.checks_in_grader else []
        self._check_modules = graded_cells.check_modules(nb) if self.checks_in_grader else []
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self.graded is not None:
                run_sync(self.graded.shutdown)()

    def _release(self, resources) -> NotebookNode | None:
        """The released notebook this submission's notebook was made from (None: it is not graded in a course)."""
        info = (resources or {}).get("nbgrader", {})
        if not info.get("assignment"):
            return None
        from nbgrader.coursedir import CourseDirectory

        root = Path(CourseDirectory(config=self.config).root)
        return staging.release_notebooks(root, info["assignment"]).get(info.get("notebook"))

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, self.resources
        if self._given_up is None and self._remaining() < 1:
            self._given_up = (
                f"This cell was not run: grading this notebook took longer than {self.notebook_timeout} s "
                "(the limit for the whole notebook), so the cells left were skipped."
            )
        if self._given_up is not None:
            cell.outputs = [error_output(NOT_RUN, self._given_up)]
            return cell, self.resources
        for attempt in range(2):
            self._timed_out = False
            self._asked_exit = False
            self._started_cells.discard(index)
            try:
                cell = self._run(cell, index)
            except CellTimeoutError:
                self._timed_out = True
                cell.outputs = list(cell.get("outputs", [])) + [error_output(TIMEOUT, self._timeout_message(
                    self._cell_limit or 0))]
            except DeadKernelError:
                code = self._exit_code()
                started = index in self._started_cells or bool(cell.get("outputs"))
                self._recover()
                if attempt == 0 and not started and self._given_up is None:
                    continue  # the kernel may have died of an earlier cell (exit()): try this one again
                message = self._death_message(code, asked_exit=self._asked_exit)
                cell.outputs = list(cell.get("outputs", [])) + [error_output(KERNEL_DIED, message)]
                return cell, self.resources
            if self._timed_out:
                # the interrupt's KeyboardInterrupt says less than the timeout's own message
                cell.outputs = [o for o in cell.outputs if o.get("ename") != "KeyboardInterrupt"]
                if not run_sync(self._async_responsive)(5):
                    self._recover()
            elif self._asked_exit or not run_sync(self._async_responsive)(5):
                # the cell returned, but its kernel is gone, going (exit() stops it a moment later) or gone
                # silent (a thread that ends it): this cell is to blame, and it is never run again
                code = self._exit_code()
                message = self._death_message(code, asked_exit=self._asked_exit)
                cell.outputs = list(cell.get("outputs", [])) + [error_output(KERNEL_DIED, message)]
                self._recover()
            elif not is_test_cell(cell):
                self._replay.append(index)
            return self._without_hidden_source(cell), self.resources
        return self._without_hidden_source(cell), self.resources

    @staticmethod
    def _without_hidden_source(cell):
        """Tracebacks of a cell with hidden tests keep their last line only: they would show its source.

        Every string of the outputs is made valid UTF-8 too, so that writing the notebook cannot fail.
        """
        cell.outputs = safe_tree(cell.get("outputs", []))
        if HIDDEN_TESTS in cell.source:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out.traceback = [f"\x1b[0;31m{out.ename}\x1b[0m: {out.evalue}"]
        return cell

    def _run(self, cell, index, store_history=True):
        self._cell_limit = max(1, int(min(self.timeout or 10**9, self._remaining())))
        if self.checks_in_grader and is_test_cell(cell):
            return self._judge(cell, index)
        stopped = error_output(TIMEOUT, self._timeout_message(self._cell_limit))
        self.error_on_timeout = {"ename": stopped.ename, "evalue": stopped.evalue, "traceback": stopped.traceback}
        return self.execute_cell(cell, index, store_history=store_history)

    def _timeout_of(self, cell) -> int | None:
        """nbclient's ``timeout_func``: the time limit of ``cell`` (this cell's share of the notebook's)."""
        return self._cell_limit if self._cell_limit is not None else self.timeout

    # -- test cells, run here ---------------------------------------------------------------

    def _judge(self, cell, index):
        """Run a test cell in this process (:mod:`autograder.engine.judge`); its outputs replace the kernel's."""
        self._started_cells.add(index)
        self._deadline = monotonic() + self._cell_limit
        self._index = index
        self._streams, self._streams_size = [], 0
        cell.outputs = []
        if self.checks_in_grader and self._graded_broken is None:
            self._load_graded(index)
        if self._graded_broken is not None:
            cell.outputs = [error_output(KERNEL_DIED, self._graded_broken)]
            return cell
        try:
            failure, records = judge.run_test_cell(cell.source, self, self._streams)
        except remote.CallTimedOut:
            if self.graded is not None:
                cell.outputs = self._capped(index, judge.stream_outputs(self._streams)) + [
                    error_output(TIMEOUT, self._timeout_message(self._cell_limit))]
                if not run_sync(self.graded.idle)(5):
                    self._restart_graded()
                return cell
            cell.outputs = self._capped(index, judge.stream_outputs(self._streams))
            raise CellTimeoutError.error_from_timeout_and_cell("", self._cell_limit, cell) from None
        except remote.KernelDied:
            cell.outputs = self._capped(index, judge.stream_outputs(self._streams))
            if self.graded is not None:
                message = self._death_message(self._exit_code(self.graded.km), asked_exit=self._asked_exit,
                                              graded=True)
                self._asked_exit = False
                cell.outputs.append(error_output(KERNEL_DIED, message))
                self._restart_graded()
                return cell
            raise DeadKernelError("the kernel died while a check ran the student's code") from None
        if any(record.timed_out for record in records) and self.graded is not None and \
                not run_sync(self.graded.idle)(5):
            self._restart_graded()  # a case ran out of time (recorded as failed): the kernel is brought back
        problems = self.graded.load_problems() if self.graded is not None and failure is not None else ""
        if problems:
            failure = error_output(failure.ename, failure.evalue + problems)
        scored = judge.scored_outputs(records, failure, float(cell.metadata.nbgrader.get("points", 0) or 0),
                                      self._all_or_nothing(cell))
        streams = self._capped(index, judge.stream_outputs(self._streams))
        cell.outputs = streams + [out for scoring in scored for out in self._kept(index, scoring)]
        return cell

    def _kept(self, index: int, out) -> list:
        """A scoring output of a judged cell, kept whatever the student's code printed before it: without its
        record and its score, nbgrader would give the cell full points. An error is cut to fit, as any."""
        if out.get("output_type") == "error":
            return self._capped(index, [out])
        self._count(index, out)
        return [out]

    def _all_or_nothing(self, cell) -> bool:
        """Whether the test ``cell`` is scored all or nothing (:attr:`all_or_nothing`)."""
        grade_id = cell.metadata.nbgrader.get("grade_id", "")
        chosen = set(self.all_or_nothing)
        return bool(chosen & {"*", self._notebook_name, f"{self._notebook_name}/{grade_id}"})

    # -- the graded kernel ------------------------------------------------------------------

    def _load_graded(self, index: int) -> None:
        """Load into the graded kernel what the test cell at ``index`` sees (:mod:`autograder.engine.graded_cells`)."""
        try:
            if self.graded is None:
                raise RuntimeError("it was not started")
            run_sync(self.graded.load_until)(graded_cells.before(self._graded_sources, index), self._deadline,
                                             self._may_restart)
        except Exception as error:  # noqa: BLE001 - whatever went wrong, the test cells say so
            self._graded_broken = (f"This check could not be run: the grader could not start the kernel that runs "
                                   f"the checks ({type(error).__name__}: {error}).")

    def _may_restart(self) -> bool:
        """Whether the graded kernel may be restarted once more (it counts as a restart of the notebook's)."""
        if self._restarts >= self.max_restarts or self._remaining() < 5:
            return False
        self._restarts += 1
        return True

    def _restart_graded(self) -> None:
        """A new graded kernel, loaded again at the next test cell; the test cells say so when none can be made."""
        if not self._may_restart():
            self._graded_broken = ("This check was not run: the kernel that runs the checks had to be restarted "
                                   "too often, or too late, while grading this notebook.")
            return
        try:
            run_sync(self.graded.restart)()
        except Exception as error:  # noqa: BLE001 - as for a kernel that cannot start
            self._graded_broken = (f"This check could not be run: the grader could not restart the kernel that runs "
                                   f"the checks ({type(error).__name__}: {error}).")

    def _capped(self, index: int, outputs: list) -> list:
        """``outputs`` within the cell's output budget (the same one ``output`` applies to the kernel's)."""
        kept, cut = [], []
        for out in outputs:
            if self._count(index, out):
                kept.append(out)
            elif out.get("output_type") == "error":  # a failure always shows, cut to fit
                kept.append(error_output(out.ename, out.evalue[: self._error_room(index)] + " [cut]"))
            elif out.get("name", "stdout") not in cut:
                cut.append(out.get("name", "stdout"))
        return kept + [new_output("stream", name=n, text=self._cut_note(n, index)) for n in cut]

    def _count(self, index: int, out) -> bool:
        """Add ``out`` to the cell's and the notebook's output bytes; False when either goes over its budget."""
        size = len(json.dumps(out, default=str))
        used = self._output_bytes.get(index, 0) + size
        self._output_bytes[index] = used
        if used > self.max_output_bytes or self._notebook_output_bytes + size > self.max_notebook_output_bytes:
            return False
        self._notebook_output_bytes += size
        return True

    def _over_notebook_budget(self, index: int) -> bool:
        """Whether cell ``index`` lost output to the notebook's budget rather than to its own."""
        return self._output_bytes.get(index, 0) <= self.max_output_bytes

    def _error_room(self, index: int) -> int:
        """Characters kept of an error's message past the budget: a quarter of a cell's, or a line once the
        notebook's is spent (an error still shows: nbgrader scores the cell from it)."""
        return 1000 if self._over_notebook_budget(index) else self.max_output_bytes // 4

    def _cut_note(self, stream: str, index: int) -> str:
        if self._over_notebook_budget(index):
            return output_cut(self.max_notebook_output_bytes, stream, whole_notebook=True)
        return output_cut(self.max_output_bytes, stream)

    def forbidden_use(self, name: str, rules, exercise: str) -> str | None:
        """The forbidden built-ins the student's source of ``name`` uses (:mod:`autograder.engine.source_check`)."""
        key = (name, tuple(rules), exercise, self._index)
        if key not in self._forbidden:
            sources = [s.source for s in graded_cells.before(self._graded_sources, self._index)]
            self._forbidden[key] = source_check.forbidden_use(sources, name, rules, exercise)
        return self._forbidden[key]

    def _timeout_message(self, timeout: int) -> str:
        if timeout < (self.timeout or 10**9):
            return (f"This cell was stopped after {timeout} s: the notebook reached its time limit "
                    f"of {self.notebook_timeout} s.")
        return (f"This cell was stopped after running for {timeout} s (the limit per cell). "
                "Look for a loop that never ends, or work that is far too large.")

    def _remaining(self) -> float:
        return self.notebook_timeout - (monotonic() - self._started)

    def _death_message(self, code: int | None, asked_exit: bool = False, graded: bool = False) -> str:
        how = "it called exit() or quit(), which ends the kernel" if asked_exit else describe_exit(code)
        if graded:
            return (f"The kernel that runs the checks (the notebook's imports and your answer cells) stopped while "
                    f"this check ran your code: {how}. The grader started a new one and went on with the next cell.")
        return (
            f"The kernel (the Python process running this notebook) stopped while this cell ran: {how}. "
            "Everything the notebook had defined was lost, so the grader started a new kernel, ran the cells "
            "before this one again, and went on with the next cell."
        )

    # -- kernels ----------------------------------------------------------------------------

    def on_cell_executed(self, **kwargs) -> None:
        """nbclient's hook after each cell: nbgrader's (it records an error the outputs do not show, such
        as a timeout's), then note a cell that asked its kernel to end."""
        super().on_cell_executed(**kwargs)
        reply = kwargs.get("execute_reply") or {}
        self._asked_exit = self._asks_exit(reply)
        if reply.get("content", {}).get("ename") == TIMEOUT and reply["content"].get("evalue") == \
                self.error_on_timeout.get("evalue"):
            self._timed_out = True  # nbclient interrupted the cell and answered with error_on_timeout

    def _seal(self, **_) -> None:
        """Once the kernel is up, its private folder is closed to it (the provisioner's ``seal``)."""
        seal = getattr(getattr(self.km, "provisioner", None), "seal", None)
        if seal is not None:
            seal()

    async def _notebook_started(self, **_) -> None:
        """nbclient's hook once the kernel is ready: seal it, and start the graded kernel beside it."""
        self._seal()
        if not self.checks_in_grader or self.graded is not None:
            return
        try:
            self.graded = await self.start_kernel_for_checks()
        except Exception as error:  # noqa: BLE001 - the test cells say so
            self._graded_broken = (f"This check could not be run: the grader could not start the kernel that runs "
                                   f"the checks ({type(error).__name__}: {error}).")

    async def start_kernel_for_checks(self, measured: bool = False) -> GradedKernel:
        """A kernel made as the notebook's was (forked from its zygote where it was), launched: the graded kernel,
        or one for a measured call (``measured``)."""
        manager = self.kernel_manager_class(kernel_name=self.kernel_name, config=self.config)
        manager.zygote_address = (getattr(getattr(self.km, "provisioner", None), "zygote_address", None)
                                  or getattr(manager, "zygote_address", None))
        kernel = GradedKernel(manager, self.startup_timeout, self._check_modules, measured=measured)
        try:
            path = self.resources.get("metadata", {}).get("path") or None
            await kernel.launch(extra_arguments=self.extra_arguments, **({"cwd": path} if path else {}))
        except BaseException:
            await kernel.shutdown()
            raise
        return kernel

    def graded_sources_now(self) -> list[graded_cells.GradedSource]:
        """What the graded kernel holds for the test cell being run, without what was left out of it."""
        left_out = self.graded.left_out if self.graded is not None else set()
        return [s for s in graded_cells.before(self._graded_sources, self._index) if s.name not in left_out]

    # -- recovery ---------------------------------------------------------------------------

    def _exit_code(self, km=None) -> int | None:
        process = getattr(getattr(km or self.km, "provisioner", None), "process", None)
        if process is None:
            return None
        try:
            process.wait(timeout=2)
        except Exception:  # noqa: BLE001 - still running or already reaped
            pass
        return process.returncode

    def _recover(self) -> None:
        """Start a new kernel and rebuild the notebook's state by running the cells that ran before."""
        while self._given_up is None:
            if self._restarts >= self.max_restarts or self._remaining() < 5:
                self._given_up = (
                    "This cell was not run: the kernel had to be restarted too often, or too late, "
                    "while grading this notebook."
                )
                return
            self._restarts += 1
            run_sync(self._async_restart)()
            failed = self._replay_cells()
            if failed is None:
                return
            self._replay.remove(failed)
            if not is_grade(self.nb.cells[failed]):
                self.nb.cells[failed].outputs.append(error_output(
                    KERNEL_DIED,
                    "When this cell was run again (to rebuild the notebook after a crash in a later cell), "
                    "the kernel stopped or hung in it, so it was left out.",
                ))

    def _replay_cells(self) -> int | None:
        """Run the cells that ran before again (outputs dropped); the index of one that fails, else None."""
        for index in list(self._replay):
            cell = self.nb.cells[index]
            if is_grade(cell):
                continue
            self._timed_out = False
            try:
                self._run(copy.deepcopy(cell), index, store_history=False)
            except DeadKernelError:
                return index
            finally:
                self.nb.cells[index] = cell  # nbclient keeps the copy it ran: the first run's outputs stay
            if self._timed_out and not run_sync(self._async_responsive)(5):
                return index
        return None

    async def _async_restart(self) -> None:
        self.kc = await graded_kernel.restart(self.km, self.kc, self.startup_timeout)

    async def _async_responsive(self, wait: float) -> bool:
        """Whether the kernel answers an empty request within ``wait`` seconds (it is idle again)."""
        return await graded_kernel.responsive(self.km, self.kc, wait)

    # -- nbclient hooks ---------------------------------------------------------------------

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        before = set(asyncio.all_tasks())
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            # nbclient leaves its output poller running after a timeout: it would eat the next cell's output
            for task in asyncio.all_tasks() - before:
                if task is not asyncio.current_task() and not task.done():
                    task.cancel()

    execute_cell = run_sync(async_execute_cell)

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") == "execute_input":
            self._started_cells.add(cell_index)  # the kernel began this cell: if it dies now, this cell did it
        return super().process_message(msg, cell, cell_index)

    def output(self, outs, msg, display_id, cell_index):
        msg_type = msg["msg_type"]
        if msg_type in ("stream", "display_data", "execute_result", "update_display_data", "error"):
            # every kind of output counts, its metadata too: nothing a cell prints can grow the notebook unbounded
            content = msg.get("content", {})
            for key in ("metadata", "data", "transient"):
                # nbformat builds an output recursively: a value nested deeper than a notebook needs is dropped
                # (a display() with metadata 700 deep made its submission ungradeable)
                if _deeper_than(content.get(key), MAX_DEPTH):
                    content[key] = {"text/plain": "(an output nested too deeply to keep)"} if key == "data" else {}
            if not self._count(cell_index, content):
                if msg_type == "error":  # the error still shows (nbgrader scores the cell from it), cut to fit
                    ename = str(content.get("ename", "Error"))[:100]
                    outs.append(error_output(ename, str(content.get("evalue", ""))[: self._error_room(cell_index)]))
                stream = content.get("name", "stdout") if msg_type == "stream" else "stdout"
                if stream not in self._noted.setdefault(cell_index, set()):
                    self._noted[cell_index].add(stream)
                    outs.append(new_output("stream", name=stream, text=self._cut_note(stream, cell_index)))
                return None
        count = len(outs)
        made = super().output(outs, msg, display_id, cell_index)
        if msg_type == "stream" and count and len(outs) == count + 1 and outs[-2].get("output_type") == "stream" \
                and outs[-2].get("name") == outs[-1].get("name"):
            # one output per run of text, as JupyterLab shows it: the kernel flushes what a cell prints on a timer,
            # so the same prints came as one output or two depending on the machine's speed (a graded notebook
            # differed between two gradings of the same submission)
            outs[-2]["text"] += outs.pop()["text"]
        return made
