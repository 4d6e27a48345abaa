"""One settings system: nbgrader_config.py's traits, read the same way by every part of grading."""

from __future__ import annotations

import re
import shutil

import pytest
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute
from traitlets.utils.importstring import import_item

from autograder.course import settings
from autograder.engine import staging
from autograder.engine.execute import ResilientExecute
from autograder.grading import grade

from ..notebook_code import ROOT

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


def test_options_take_the_course_settings_and_override_them(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    with open(tmp_path / "nbgrader_config.py", "a") as config:
        config.write("c.Execute.timeout = 120\nc.ResilientExecute.notebook_timeout = 900\nc.Grading.sandbox = False\n")
    resolved = grade.Options().resolved(tmp_path)
    assert (resolved.cell_timeout, resolved.notebook_timeout, resolved.sandbox) == (120, 900, False)
    # a flag of one run wins over the file, and a resolved value is kept as it is
    flagged = grade.Options(cell_timeout=30, sandbox=True).resolved(tmp_path)
    assert (flagged.cell_timeout, flagged.notebook_timeout, flagged.sandbox) == (30, 900, True)
    assert flagged.resolved(tmp_path) == flagged
    # without a course config: the traits' defaults, stated once, in the classes
    bare = grade.Options().resolved(tmp_path / "nowhere")
    assert bare.notebook_timeout == ResilientExecute.class_traits()["notebook_timeout"].default_value
    assert bare.cell_timeout == Execute.class_traits()["timeout"].default_value


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
    for key, flag in {**settings.FLAGS, **settings.ENVIRONMENT}.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        assert flag in row, (key, row)
    assert re.search(r"\| `ResilientExecute.notebook_timeout` \| 600 \|", table)


@pytest.mark.parametrize("word", ["0", "off", "OFF", "no", "false", "None", " off "])
def test_every_switch_is_turned_off_by_the_same_words(word, monkeypatch):
    """AUTOGRADER_SANDBOX, AUTOGRADER_FORKSERVER and AUTOGRADER_KERNEL_POOL: one vocabulary for "off"."""
    from autograder.engine import kernel_pool, sandbox

    for variable in ("AUTOGRADER_SANDBOX", "AUTOGRADER_FORKSERVER", "AUTOGRADER_KERNEL_POOL"):
        monkeypatch.setenv(variable, word)
    assert sandbox.mode() == "limits only" and sandbox.why_not() == "AUTOGRADER_SANDBOX is off"
    assert grade.fork_server(True) is None
    assert not kernel_pool.wanted(kernel_pool.KernelPool(), {"AUTOGRADER_KERNEL_POOL": word})
    assert settings.switched_off("AUTOGRADER_FORKSERVER") and not settings.switched_off("AUTOGRADER_UNSET_SWITCH")
