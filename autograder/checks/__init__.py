"""Visible checks, one module per notebook: ``check_<exercise>(fn)`` for each exercise.

These ship to students. They compare with PyTorch's built-ins and simple formulas on a
few inputs and explain what is wrong; the hidden checks (instructor-only) go further.
"""

from ..shared.errors import install_notebook_display

install_notebook_display()
