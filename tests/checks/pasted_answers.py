"""The reference answers and the catalogued mistakes as the checks receive them, in this process.

:func:`solution` is a notebook's reference namespace (built once), :func:`module` its hidden or visible
check module, :func:`partners` what a test cell hands its check after the exercise, and :func:`pasted` a
catalogued mistake pasted alone into an answer cell, as the end-to-end test submits it.
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograder.course.repository import module_name

from ..course_copy import mistake_source
from ..notebook_code import cell_arguments, solution_namespace

#: What a mistake's source may use without importing it: the notebook's own imports (as the answer cell has them).
PASTED_INTO = {"torch": torch, "math": math, "F": F, "nn": nn}


def module(assignment: str, kind: str = "hidden"):
    """``autograder.hidden.<notebook>`` or ``autograder.checks.<notebook>``."""
    return importlib.import_module(f"autograder.{kind}.{module_name(assignment)}")


_SOLUTIONS: dict = {}


def solution(assignment: str):
    """The reference answers with the notebook's own definitions (built once per notebook)."""
    if assignment not in _SOLUTIONS:
        _SOLUTIONS[assignment] = solution_namespace(assignment)
    return _SOLUTIONS[assignment]


def partners(assignment: str, exercise: str, hidden: bool) -> list:
    """The reference's objects that the test cell hands to the check after the exercise (``KVCache``...)."""
    names = cell_arguments(assignment, hidden).get(exercise, [exercise])[1:]
    return [getattr(solution(assignment), name) for name in names]


def pasted(mistake, exercise: str):
    """The mistake as the end-to-end test submits it: its source alone, renamed to the exercise."""
    namespace = dict(PASTED_INTO)
    exec(compile(mistake_source(mistake, exercise), f"<{exercise}: {mistake.fn.__name__}>", "exec"), namespace)
    return namespace[exercise]
