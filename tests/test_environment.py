"""environment.yml pins exactly what pyproject.toml pins."""

from __future__ import annotations

import re
import tomllib

from .notebook_code import ROOT


def test_conda_pins_agree_with_pip_pins():
    pip = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    conda = re.findall(r"^\s+- ([A-Za-z0-9_.-]+==\S+)\s*$", (ROOT / "environment.yml").read_text(), re.M)
    assert sorted(pip) == sorted(conda)
    assert "torch==2.13.0" in pip


def test_every_dependency_is_pinned_exactly():
    pip = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", d) for d in pip), pip


def test_nbformat_does_not_build_the_iri_parsers():
    """make setup removes rfc3987-syntax: with it, importing nbformat costs every nbgrader process 2 s of CPU."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", "import sys, nbformat; print('rfc3987_syntax' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", "rfc3987-syntax is installed: run `make setup` (it uninstalls it)"
