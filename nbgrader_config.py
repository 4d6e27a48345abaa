"""nbgrader configuration of the course (one config for every command)."""

import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

HERE = Path(__file__).resolve().parent

c.CourseDirectory.course_id = "attention"
c.CourseDirectory.root = str(HERE)
c.CourseDirectory.source_directory = "source"
# nbgrader writes student versions here; `make release` copies them to notebooks/.
c.CourseDirectory.release_directory = "build/release"
c.CourseDirectory.solution_directory = "solutions"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.db_url = os.environ.get("NBGRADER_DB_URL", f"sqlite:///{HERE / 'gradebook.db'}")
# The notebooks import the autograder package; nothing else in an assignment folder is needed.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]

# A writable exchange inside the course (the system default /srv/nbgrader/exchange is not).
# It is made when missing: nbgrader's Assignment List says "The exchange directory does not
# exist" otherwise (`make lab` makes it too).
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", str(HERE / "exchange"))
try:
    Path(c.Exchange.root).mkdir(parents=True, exist_ok=True)
except OSError:
    pass  # read-only course folder: nbgrader says so when the exchange is used

# Execution: a per-cell limit, and a kernel that never goes idle must not lose the whole
# submission (raise_on_iopub_timeout=False keeps the cells already executed).
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = False
c.Execute.execute_retries = 1
# Nothing a kernel does after the last cell is graded: it is stopped at once, without the second
# or so a graceful shutdown (the student's atexit hooks, ipykernel's own) takes.
c.Execute.shutdown_kernel = "immediate"

# Grading a class safely (README): nbgrader's Execute is replaced by one that runs the kernel
# in a sandbox, keeps grading after the student's code kills or hangs its kernel, limits the
# time of the whole notebook and caps output (autograder/engine/execute.py). The other
# steps are nbgrader's defaults.
c.Autograde.autograde_preprocessors = [
    "autograder.engine.execute.ResilientExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# A library warning printed to stderr must not zero a correct test cell: nbgrader gives
# zero to any cell with stderr output, so warnings are dropped before grading.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"Warning"

# A cap on output: a flood of prints must not make the feedback unreadable.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 30

# Feedback shows the hidden tests' messages, never their source: the hidden part of each
# test cell is removed before the feedback is rendered, and the checks print their
# messages without a traceback (autograder/shared/errors.py). Nothing a student wrote runs when the
# page is opened: outputs and raw cells go through nbconvert's SanitizeHTML, markdown cells are
# cleaned once rendered (FeedbackExporter), which also loads MathJax from feedback/_mathjax/
# instead of a CDN and wraps long lines (autograder/grading/feedback.py).
c.GenerateFeedback.exporter_class = "autograder.grading.feedback.FeedbackExporter"
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "autograder.grading.feedback.SanitizeOutputs",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# `nbgrader validate` prints each line of a failing cell's output cut to Validator.width - 3
# characters; a check's message is one line that names the mistake near its end, so the width
# is wider than any message (tests/course/test_validate.py checks every catalogued one). The same
# number is the width of the "=====" line between failed cells.
c.Validator.width = 640
# A kernel started by nbgrader (validate, the Validate button) talks to it over CurveZMQ
# instead of warning on every run that its TCP traffic is not encrypted.
c.KernelManager.transport_encryption = "auto"

# Resource limits of each sandboxed kernel (autograder/engine/kernel_manager.py); the
# environment variables AUTOGRADER_MEMORY_MB, AUTOGRADER_CPU_SECONDS, ... override them, and
# AUTOGRADER_SANDBOX=off turns bubblewrap off (grading then refuses unless Grading.sandbox is False).
c.SandboxedKernelManager.bubblewrap = True
c.SandboxedKernelManager.memory_mb = 4096
c.SandboxedKernelManager.cpu_seconds = 1200
c.SandboxedKernelManager.file_mb = 256
c.SandboxedKernelManager.tmp_mb = 256
c.SandboxedKernelManager.processes = 256
c.SandboxedKernelManager.threads = 1
# One core for all the processes of a sandbox together: a submission that starts busy processes
# slows only itself, never a classmate graded beside it (0: no cap).
c.SandboxedKernelManager.cpu_percent = 100

# The warm kernel pool (autograder/engine/kernel_pool.py): while a class is graded, the fork
# server keeps sandboxed kernels started ahead (PyTorch and matplotlib imported, nothing of a
# student), one fresh kernel per submission. AUTOGRADER_KERNEL_POOL=0
# turns it off.
c.KernelPool.enabled = True
c.KernelPool.max_idle = 300
c.KernelPool.size = 4
