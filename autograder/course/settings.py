"""Every setting of grading, in one place: traitlets read from the course's ``nbgrader_config.py``.

The course is configured the way nbgrader is: ``c.Class.trait = value`` in ``nbgrader_config.py``.
The course's own settings are traits of :class:`Grading` (how ``make autograde`` runs a class),
of :class:`~autograder.engine.execute.ResilientExecute` (how one notebook runs) and of
:class:`~autograder.engine.kernel_manager.SandboxedKernelManager` (the sandbox's limits) and of
:class:`~autograder.engine.kernel_pool.KernelPool` (kernels started ahead); nbgrader's
own (``Execute.timeout``, ...) are set in the same file. A command-line flag overrides a trait
for one run (:data:`FLAGS`); a few environment variables override one for a whole machine
(:data:`ENVIRONMENT`). All three are read once, where a run starts, into one frozen
:class:`Settings` that is passed down to every part and process of the run.
:func:`table` lists them all, with their values in this course: the manual's settings page
(``docs/settings.md``) prints that table as it is built.

What this does *not* do: check that a value makes sense beyond its type (a timeout of 1 s is
accepted, and grades every cell as timed out).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from traitlets import Bool, Enum, Float, Integer, Unicode
from traitlets.config import Config, Configurable
from traitlets.config.loader import PyFileConfigLoader

from .repository import ROOT

CONFIG_FILE = "nbgrader_config.py"
#: Settings whose value is a path inside the course (shown as such, not as this machine's path).
FOLDERS = ("CourseDirectory.root", "CourseDirectory.db_url", "Exchange.root")


class Grading(Configurable):
    """How ``make autograde`` grades a class (``c.Grading.<trait>`` in ``nbgrader_config.py``)."""

    workers = Integer(0, help="Submissions graded at once; 0: the number of cores (on a cluster: all, queued by its "
                      "scheduler).").tag(config=True)
    cluster = Unicode("", help="The address of a Dask scheduler (tcp://host:8786) whose workers grade, the grades "
                      "being written here (autograder.grading.cluster); empty: grade on this machine.").tag(config=True)
    sandbox = Bool(True, help="Refuse to grade where no sandbox can be made. False grades anyway, the students' "
                   "code running with the resource limits only, with the grader's rights.").tag(config=True)
    forkserver = Bool(True, help="Fork each nbgrader process from a server that imported nbgrader, PyTorch and "
                      "the checks once, instead of starting each afresh.").tag(config=True)
    nbgrader_margin = Integer(120, help="Seconds added to a submission's notebook time limits before its whole "
                              "nbgrader process is stopped.").tag(config=True)
    sqlite_busy_timeout = Integer(300, help="Seconds a writer of the SQLite gradebook waits for another "
                                  "before giving up.").tag(config=True)
    max_file_mb = Integer(50, help="Largest file of a submission that is used; a larger one is left out, "
                          "with a note.").tag(config=True)
    max_submission_mb = Integer(200, help="Largest total size of a submission's files that are used.").tag(config=True)


class GradingService(Configurable):
    """How ``python -m autograder serve`` grades submissions as they arrive (``c.GradingService.<trait>``)."""

    daily_quota = Integer(3, help="Official gradings per student per assignment per day (UTC) before the due date; "
                          "later submissions wait for the next day or the final grading.").tag(config=True)
    hidden_before_due = Enum(("messages", "pass_fail", "nothing"), default_value="messages",
                             help="What a student's feedback shows of the hidden checks before the due date: "
                             "their messages, only passed or failed, or nothing; after it, everything."
                             ).tag(config=True)
    poll_seconds = Float(2.0, help="Seconds between two looks at the exchange for new submissions.").tag(config=True)
    workers = Integer(0, help="Submissions the service grades at once; 0: the number of cores.").tag(config=True)
    retries = Integer(2, help="Times a submission that could not be graded (not the student's doing) is graded "
                      "again before it is left to the instructor.").tag(config=True)


#: The words that turn an on/off environment switch off, and on, in any case: one vocabulary for all of them.
OFF = frozenset({"0", "off", "no", "false", "none"})
ON = frozenset({"1", "on", "yes", "true"})


def switch(variable: str, raw: str) -> bool:
    """The value of the on/off environment switch ``variable`` set to ``raw`` (:data:`OFF`, :data:`ON`)."""
    word = raw.strip().lower()
    if word in OFF | ON:
        return word in ON
    raise ValueError(f"{variable} is a switch: set it to one of {', '.join(sorted(OFF | ON))}, not {raw!r}")


#: Command-line flags that override a trait for one run.
FLAGS = {
    "Grading.workers": "`--workers N` (`make autograde WORKERS=N`)",
    "Grading.cluster": "`--cluster ADDRESS` (`make autograde CLUSTER=ADDRESS`)",
    "Grading.sandbox": "`--no-sandbox` (`make autograde NO_SANDBOX=1`)",
    "GradingService.workers": "`python -m autograder serve --workers N`",
    "Execute.timeout": "`--cell-timeout S`",
    "ResilientExecute.notebook_timeout": "`--notebook-timeout S`",
}
#: Environment variables that override a trait on a machine, and the kind of value each holds. They are
#: read once, by :meth:`Settings.load` where a run starts; ``NBGRADER_DB_URL`` and ``NBGRADER_EXCHANGE``
#: are read by the course's ``nbgrader_config.py`` itself, as nbgrader's own commands read that file.
ENVIRONMENT: dict[str, tuple[str, type]] = {
    "Grading.forkserver": ("AUTOGRADER_FORKSERVER", bool),
    "KernelPool.enabled": ("AUTOGRADER_KERNEL_POOL", bool),
    "SandboxedKernelManager.bubblewrap": ("AUTOGRADER_SANDBOX", bool),
    **{f"SandboxedKernelManager.{name}": (f"AUTOGRADER_{name.upper()}", int)
       for name in ("memory_mb", "cpu_seconds", "file_mb", "tmp_mb", "processes", "threads", "cpu_percent")},
}
#: Environment variables read by ``nbgrader_config.py`` (the course's file, for every nbgrader command).
READ_BY_THE_CONFIG_FILE = {"CourseDirectory.db_url": "NBGRADER_DB_URL", "Exchange.root": "NBGRADER_EXCHANGE"}
#: Environment variables that are settings of their own (no trait), and what they do.
ENVIRONMENT_ONLY = {
    "AUTOGRADER_GRADESCOPE_ROOT": "the root a Gradescope autograder grades in (default `/autograder`; for tests)",
    "AUTOGRADER_PYTHON": "the Python a Gradescope autograder runs (default the one `setup.sh` installed)",
}
#: What a setting of nbgrader's that has no help text of its own does in this course.
HELP = {
    "Autograde.autograde_preprocessors": "The steps of autograding: nbgrader's, with its Execute replaced by "
                                         "ResilientExecute (a test keeps the rest equal to nbgrader's default).",
    "GenerateFeedback.exporter_class": "Writes the feedback page: markdown cleaned, MathJax from feedback/_mathjax/.",
    "GenerateFeedback.preprocessors": "The steps of the feedback: hidden tests removed, outputs sanitised.",
}
#: The course's own configurable classes, then nbgrader's and Jupyter's that it sets, by section name.
COURSE_CLASSES = ("autograder.course.settings.Grading", "autograder.course.settings.GradingService",
                  "autograder.course.notebook_setup.StudentBundle",
                  "autograder.engine.execute.ResilientExecute",
                  "autograder.engine.kernel_manager.SandboxedKernelManager",
                  "autograder.engine.kernel_pool.KernelPool")
OTHER_CLASSES = ("nbgrader.coursedir.CourseDirectory", "nbgrader.exchange.default.exchange.Exchange",
                 "nbgrader.preprocessors.Execute", "nbgrader.converters.Autograde",
                 "nbgrader.preprocessors.IgnorePattern", "nbgrader.preprocessors.LimitOutput",
                 "nbgrader.converters.GenerateFeedback", "nbgrader.validator.Validator",
                 "jupyter_client.manager.KernelManager")


def course_config(root: Path = ROOT) -> Config:
    """The configuration of ``root/nbgrader_config.py`` (empty where the course has none), rooted at ``root``."""
    config = PyFileConfigLoader(CONFIG_FILE, path=str(root)).load_config() if (root / CONFIG_FILE).is_file() else Config()
    config.CourseDirectory.root = str(root)
    return config


@dataclass(frozen=True)
class Settings:
    """Every setting of one run, read once where the run starts and passed down as it is.

    :meth:`load` reads the course's ``nbgrader_config.py``, then the environment's overrides
    (:data:`ENVIRONMENT`), then the run's flags (:data:`FLAGS`); nothing below the entry point
    (``python -m autograder``, Gradescope's ``run_autograder``, the grading service) reads a
    setting of its own. The processes a run starts get it whole: the fork server and its
    waiting kernels as :meth:`to_json` on their first line, a Dask task as a pickled argument,
    and each ``nbgrader autograde`` process as :meth:`argv` (nbgrader reads the same file,
    and the overrides as traitlets' ``--Class.trait=value``).
    """

    root: Path
    #: The course file's values, as JSON (a frozen copy: each :meth:`config` is a new Config).
    file: str
    #: ("Class.trait", value) that the environment, then the flags, set over the file, in order.
    overrides: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def load(cls, root: Path = ROOT, flags: Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None) -> Settings:
        """The settings of the course at ``root`` for a run with ``flags`` ("Class.trait": value, None: unset)
        in the environment ``env`` (default: this process's)."""
        env = os.environ if env is None else env
        overrides: list[tuple[str, Any]] = []
        for key, (variable, kind) in ENVIRONMENT.items():
            raw = env.get(variable, "").strip()
            if raw:
                overrides.append((key, _parsed(variable, raw, kind)))
        overrides += [(key, value) for key, value in (flags or {}).items() if value is not None]
        made = cls(Path(root), _frozen(course_config(Path(root))), tuple(overrides))
        if not made.value(Grading, "sandbox"):  # grading without a sandbox: none for the kernels either
            made = cls(made.root, made.file, made.overrides + (("SandboxedKernelManager.bubblewrap", False),))
        return made

    def config(self) -> Config:
        """The settings as a new traitlets Config (the file's, the overrides applied)."""
        config = Config(json.loads(self.file))
        for key, value in self.overrides:
            section, name = key.split(".")
            config[section][name] = value
        return config

    def value(self, cls: type[Configurable], name: str) -> Any:
        """The value of ``cls``'s trait ``name`` in these settings (:func:`configured`)."""
        return configured(self.config(), cls, name)

    def make(self, cls: type[ConfigurableT], **kwargs: Any) -> ConfigurableT:
        """An instance of the configurable ``cls`` with these settings."""
        return cls(config=self.config(), **kwargs)

    def argv(self) -> list[str]:
        """The overrides as traitlets command-line arguments, for a process that reads the course file itself."""
        return [f"--{key}={value}" for key, value in self.overrides]

    def at(self, root: Path) -> Settings:
        """The same overrides over the copy of the course at ``root`` (a cluster worker's private course)."""
        return Settings(Path(root), _frozen(course_config(Path(root))), self.overrides)

    def to_json(self) -> str:
        return json.dumps({"root": str(self.root), "file": self.file, "overrides": self.overrides})

    @classmethod
    def from_json(cls, text: str) -> Settings:
        data = json.loads(text)
        return cls(Path(data["root"]), data["file"], tuple((key, value) for key, value in data["overrides"]))


ConfigurableT = TypeVar("ConfigurableT", bound=Configurable)


def _parsed(variable: str, raw: str, kind: type) -> Any:
    if kind is bool:
        return switch(variable, raw)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{variable} must be a whole number, not {raw!r}") from None


def _frozen(config: Config) -> str:
    try:
        return json.dumps(config, sort_keys=True)
    except TypeError as error:
        raise ValueError(f"{CONFIG_FILE} sets a value that is not text, a number, a list or a switch: {error}") from None


def configured(config: Config, cls: type[Configurable], name: str) -> Any:
    """The value ``cls``'s trait ``name`` takes under ``config``, without making an instance.

    As traitlets does: a section of ``cls`` or of a parent class sets it, the nearest winning.
    """
    for klass in cls.mro():
        section = klass.__name__
        if section in config and name in config[section]:
            return config[section][name]
    return cls.class_traits()[name].default_value


def _load(path: str) -> type[Configurable]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _shown(value: Any) -> str:
    """A value as the table shows it: a class by its name, a list item by item."""
    if isinstance(value, list | tuple):
        return ", ".join(_shown(v) for v in value) or "(none)"
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):
        return value.rsplit(".", 1)[-1]
    return str(value)


def _first_sentence(text: str) -> str:
    text = " ".join(str(text).split())
    return re.split(r"\.\s+(?=[A-Z`])", text)[0].rstrip(".") + "." if text else ""


def table(root: Path = ROOT) -> str:
    """Every setting as a Markdown table: name, value in this course, where to set it, what it does.

    The course's classes are listed with every trait they add; nbgrader's and Jupyter's with the
    traits the course's ``nbgrader_config.py`` sets.
    """
    config = course_config(root)
    rows = ["| setting | value here | set it with | what it does |", "|---|---|---|---|"]
    for path in COURSE_CLASSES + OTHER_CLASSES:
        cls = _load(path)
        own = path in COURSE_CLASSES
        names = cls.class_own_traits(config=True) if own else {n: None for n in config.get(cls.__name__, {})}
        for name in sorted(names):
            trait = cls.class_traits()[name]
            key = f"{cls.__name__}.{name}"
            variable = ENVIRONMENT.get(key, (READ_BY_THE_CONFIG_FILE.get(key),))[0]
            where = ["`nbgrader_config.py`"] + [w for w in (FLAGS.get(key), variable and f"`{variable}`") if w]
            value = configured(config, cls, name)
            shown = "(in the course folder)" if key in FOLDERS else _shown(value)
            if trait.metadata.get("set_by"):  # a live object the grader hands down, never a person's setting
                where, shown = [trait.metadata["set_by"]], "(while grading)"
            what = HELP.get(key) or _first_sentence(trait.help)
            if not what:
                raise ValueError(f"{key} has no help text: give the trait one, or add it to settings.HELP")
            rows.append(f"| `{key}` | {_cell(shown)} | {', '.join(where)} | {_cell(what)} |")
    for variable, what in ENVIRONMENT_ONLY.items():
        rows.append(f"| `{variable}` | (unset) | environment | {_cell(what)} |")
    return "\n".join(rows) + "\n"
