"""One settings system: nbgrader_config.py's traits, read the same way by every part of grading."""

from __future__ import annotations

import re
import shutil

import pytest
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute
from traitlets.utils.importstring import import_item

from autograder.course import settings
from autograder.engine import kernel_pool, sandbox, staging
from autograder.engine.execute import ResilientExecute
from autograder.engine.kernel_manager import SandboxedKernelManager
from autograder.grading import grade

from ..notebook_code import ROOT

A = "01_soft_lookup"


def limits_of(config) -> sandbox.Limits:
    """The limits of a kernel manager made with ``config``, as grading makes it (its private folder removed)."""
    manager = SandboxedKernelManager(config=config)
    try:
        return manager.limits
    finally:
        shutil.rmtree(manager.private, ignore_errors=True)

# The manual's settings page is settings.table, printed as the page is built (tests/course/test_docs.py reads the page).

def test_autograde_steps_are_nbgraders_with_execute_swapped():
    """An nbgrader upgrade that adds or reorders a step of autograding must not be dropped silently here."""
    ours = [import_item(p) if isinstance(p, str) else p
            for p in settings.course_config(ROOT).Autograde.autograde_preprocessors]
    default = Autograde().autograde_preprocessors  # nbgrader's own default, in a process without our config
    assert Execute in default and ResilientExecute not in default
    assert ours == [ResilientExecute if step is Execute else step for step in default]


def test_every_trait_of_the_course_has_help():
    for path in settings.COURSE_CLASSES:
        cls = settings._load(path)
        for name, trait in cls.class_own_traits(config=True).items():
            assert trait.help.strip(), f"{cls.__name__}.{name} has no help text"


def test_settings_are_the_file_then_the_environment_then_the_flags(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    with open(tmp_path / "nbgrader_config.py", "a") as config:
        config.write("c.Execute.timeout = 120\nc.ResilientExecute.notebook_timeout = 900\nc.Grading.sandbox = False\n"
                     "c.SandboxedKernelManager.memory_mb = 2048\n")
    course = settings.Settings.load(tmp_path, env={})
    assert course.value(ResilientExecute, "timeout") == 120 and course.value(ResilientExecute, "notebook_timeout") == 900
    assert course.value(settings.Grading, "sandbox") is False
    # grading without a sandbox runs no kernel in bubblewrap either, and the kernel manager is told so
    assert limits_of(course.config()) == sandbox.Limits(memory_mb=2048, bubblewrap=False)
    # the environment wins over the file, a flag over both
    env = {"AUTOGRADER_MEMORY_MB": "1024", "AUTOGRADER_FORKSERVER": "off"}
    flagged = settings.Settings.load(tmp_path, {"Execute.timeout": 30, "Grading.sandbox": True, "Grading.workers": None,
                                                "SandboxedKernelManager.memory_mb": 512}, env=env)
    assert flagged.value(ResilientExecute, "timeout") == 30 and flagged.value(settings.Grading, "sandbox") is True
    assert flagged.value(settings.Grading, "forkserver") is False
    assert limits_of(flagged.config()) == sandbox.Limits(memory_mb=512)
    assert flagged.value(settings.Grading, "workers") == settings.Grading().workers  # None: not set
    # without a course config: the traits' defaults, stated once, in the classes
    bare = settings.Settings.load(tmp_path / "nowhere", env={})
    assert bare.value(ResilientExecute, "notebook_timeout") == ResilientExecute.class_traits()["notebook_timeout"].default_value
    assert bare.value(ResilientExecute, "timeout") == Execute.class_traits()["timeout"].default_value


def test_settings_are_frozen_and_cross_processes_whole(tmp_path):
    """The fork server gets them as JSON, a Dask task pickled, an nbgrader process as its arguments: the same values."""
    import dataclasses
    import pickle

    from nbgrader.apps.autogradeapp import AutogradeApp

    course = settings.Settings.load(ROOT, {"Execute.timeout": 30, "Grading.cluster": "tcp://host:8786"},
                                    env={"AUTOGRADER_MEMORY_MB": "1024", "AUTOGRADER_SANDBOX": "off"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        course.overrides = ()  # type: ignore[misc]
    course.config().SandboxedKernelManager.memory_mb = 1  # a copy: the settings keep their value
    assert limits_of(course.config()).memory_mb == 1024
    assert settings.Settings.from_json(course.to_json()) == course == pickle.loads(pickle.dumps(course))
    app = AutogradeApp()
    app.parse_command_line([A, *course.argv()])  # what an nbgrader process is started with
    assert limits_of(app.config) == sandbox.Limits(memory_mb=1024, bubblewrap=False)
    assert Execute(config=app.config).timeout == 30
    assert settings.Grading(config=app.config).cluster == "tcp://host:8786"
    # a cluster worker's copy of the course keeps the run's overrides
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", copy / "nbgrader_config.py")
    there = course.at(copy)
    assert there.root == copy and there.overrides == course.overrides
    assert there.value(ResilientExecute, "timeout") == 30


def test_nothing_below_the_entry_point_reads_the_environment(monkeypatch):
    """The environment is read once, into the run's settings: a variable set afterwards changes nothing."""
    loaded_on = settings.Settings.load(ROOT, env={})
    loaded_off = settings.Settings.load(ROOT, env={"AUTOGRADER_FORKSERVER": "0"})
    monkeypatch.setenv("AUTOGRADER_FORKSERVER", "0")
    monkeypatch.setenv("AUTOGRADER_MEMORY_MB", "64")
    assert loaded_on.value(settings.Grading, "forkserver") and not loaded_off.value(settings.Grading, "forkserver")
    assert grade.fork_server(loaded_off) is None
    assert limits_of(loaded_on.config()).memory_mb == 4096


@pytest.mark.parametrize("variable,raw,message", [
    ("AUTOGRADER_MEMORY_MB", "4G", "AUTOGRADER_MEMORY_MB must be a whole number, not '4G'"),
    ("AUTOGRADER_FORKSERVER", "maybe", "AUTOGRADER_FORKSERVER is a switch: set it to one of"),
])
def test_a_bad_environment_value_is_named(variable, raw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        settings.Settings.load(ROOT, env={variable: raw})


def test_staging_limits_are_settings(tmp_path):
    """A file over Grading.max_file_mb is left out with a note; under it, it is copied."""
    source = tmp_path / "course" / "submitted" / "ada" / "01_soft_lookup"
    source.mkdir(parents=True)
    (source / "data.bin").write_bytes(b"x" * (2 * 2**20))
    (tmp_path / "course" / "release").mkdir()
    strict, roomy = settings.Grading(max_file_mb=1), settings.Grading(max_file_mb=3)
    left_out = staging.stage(tmp_path / "course", "01_soft_lookup", "ada", tmp_path / "a", strict)
    assert [n.kind for n in left_out.notes if n.kind == "size"] == ["size"]
    assert not (tmp_path / "a" / "ada" / "01_soft_lookup" / "data.bin").exists()
    kept = staging.stage(tmp_path / "course", "01_soft_lookup", "ada", tmp_path / "b", roomy)
    assert not [n for n in kept.notes if n.kind == "size"]
    assert (tmp_path / "b" / "ada" / "01_soft_lookup" / "data.bin").stat().st_size == 2 * 2**20


def test_the_table_names_where_each_setting_is_set():
    table = settings.table(ROOT)
    variables = {key: f"`{variable}`" for key, (variable, _) in settings.ENVIRONMENT.items()}
    variables.update({key: f"`{variable}`" for key, variable in settings.READ_BY_THE_CONFIG_FILE.items()})
    for key, where in [*settings.FLAGS.items(), *variables.items()]:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        assert where in row, (key, row)
    assert re.search(r"\| `ResilientExecute.notebook_timeout` \| 600 \|", table)


@pytest.mark.parametrize("word", ["0", "off", "OFF", "no", "false", "None", " off "])
def test_every_switch_is_turned_off_by_the_same_words(word):
    """AUTOGRADER_SANDBOX, AUTOGRADER_FORKSERVER and AUTOGRADER_KERNEL_POOL: one vocabulary for "off"."""
    switches = {key: variable for key, (variable, kind) in settings.ENVIRONMENT.items() if kind is bool}
    assert sorted(switches.values()) == ["AUTOGRADER_FORKSERVER", "AUTOGRADER_KERNEL_POOL", "AUTOGRADER_SANDBOX"]
    course = settings.Settings.load(ROOT, env=dict.fromkeys(switches.values(), word))
    for key in switches:
        section, name = key.split(".")
        assert course.config()[section][name] is False, key
    bubblewrap = grade.bubblewrap(course)
    assert sandbox.mode(bubblewrap) == "limits only" and "turned off" in sandbox.why_not(bubblewrap)
    assert grade.fork_server(course) is None
    assert not kernel_pool.wanted(course.make(kernel_pool.KernelPool), bubblewrap)


@pytest.mark.parametrize("word", ["1", "on", "Yes", "TRUE"])
def test_every_switch_is_turned_on_by_the_same_words(word, tmp_path):
    """A switch set on in the environment wins over a course file that turns it off."""
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.KernelPool.enabled = False\n")
    assert settings.Settings.load(tmp_path, env={}).config().KernelPool.enabled is False
    assert settings.Settings.load(tmp_path, env={"AUTOGRADER_KERNEL_POOL": word}).config().KernelPool.enabled is True
