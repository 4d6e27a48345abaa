"""The versions of PyTorch, NumPy and Matplotlib a student may work with, and the evidence for them.

The grader keeps exact pins (``pyproject.toml``): a grade must be the same everywhere. A student's
side (the released notebooks, the visible checks and the references they compare with) computes
in float64 with tolerances, so it runs on a range of releases: the oldest release that has every
API it calls (:data:`NEEDS`, each with where it is used), up to the newest on PyPI when the range
was last tested at both ends (:data:`NEWEST`; ``make test-versions`` runs every released notebook
with the reference answers on :data:`ENDS`). This module is the one source of truth: the bundle's
``requirements.txt`` and ``course.py``'s check of an environment are written from it.

What this does *not* do: prove that every release inside a range works (the two ends are run,
the releases between are not), nor cover Python 3.14 below PyTorch 2.9, the first with wheels
for it (pip picks such a release by itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PACKAGES = ("torch", "numpy", "matplotlib")


@dataclass(frozen=True)
class Need:
    """An API the student's side calls, the oldest release of ``package`` that has it, and where it is used."""

    package: str
    since: str
    api: str
    where: str


NEEDS = (
    Need("torch", "2.5", "F.scaled_dot_product_attention(..., enable_gqa=True) (missing from the 2.4 manual)",
         "references/multi_head.py, decoding_and_training.py, serving.py: the grouped-query referees of 05, 09, 11"),
    Need("torch", "2.4", "nn.RMSNorm and F.rms_norm", "references/tiny_decoder.py, notebooks 09 and 11's decoder"),
    Need("torch", "2.3", "torch.nn.attention.sdpa_kernel and torch.nn.attention.bias.causal_lower_right "
         "(the torch.nn.attention manual starts with 2.3)",
         "grader/inputs.py (every SDPA referee on the math backend), checks/masking.py, checks/decoding_and_training.py"),
    Need("torch", "2.2", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu (FlashAttention on CPU)",
         "notebooks 07 and 08 (the kernel's log-sum-exp)"),
    Need("torch", "2.0", "TorchFunctionMode and TorchDispatchMode as context managers, torch.func, "
         "torch.set_default_device", "kernel/guard.py, kernel/watches.py, references/flash_backward.py"),
    Need("numpy", "1.26", "wheels for Python 3.12 (the notebooks use NumPy only through Tensor.numpy() to plot)",
         "every notebook's figures"),
    Need("matplotlib", "3.9", "the backend that today's ipykernel draws through (matplotlib-inline 0.2): on 3.8 a "
         "notebook's first figure shows as the text '<Figure size ... with N Axes>', not drawn (pyplot's subplots, "
         "imshow, bar, hist and patches are far older)", "every notebook's figures"),
)

#: The newest release of each package on PyPI when the range was last tested at its newest end.
NEWEST = {"torch": "2.15.0", "numpy": "2.4.6", "matplotlib": "3.11.2"}

#: The environments ``make test-versions`` runs every released notebook in: the two ends of the ranges,
#: on two Pythons (PyTorch 2.5 has no wheel for Python 3.14, hence 3.12 at the oldest end).
ENDS = {
    "oldest": {"python": "3.12", "torch": "2.5.0", "numpy": "1.26.4", "matplotlib": "3.9.4"},
    "newest": {"python": "3.13", **NEWEST},
}


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.5.0+cpu"`` -> ``(2, 5, 0)``, ``"2.16.0rc1"`` -> ``(2, 16, 0)``: a release's leading numbers."""
    return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", version.strip()).group().split("."))


def oldest(package: str) -> str:
    """The oldest release of ``package`` that has every API of :data:`NEEDS`."""
    return max((n.since for n in NEEDS if n.package == package), key=version_tuple)


def below(package: str) -> str:
    """The first release past the tested range: the minor release after :data:`NEWEST`'s."""
    major, minor = version_tuple(NEWEST[package])[:2]
    return f"{major}.{minor + 1}"


def requirement(package: str) -> str:
    """``torch>=2.5,<2.16``: the range of ``package``, as pip reads it."""
    return f"{package}>={oldest(package)},<{below(package)}"


def inside(package: str, version: str) -> bool:
    """Whether ``version`` of ``package`` is in its range."""
    return version_tuple(oldest(package)) <= version_tuple(version) < version_tuple(below(package))
