"""What a right answer is, one module per notebook, shared by its visible and its hidden checks.

Each module holds what both kinds of checks of its notebook use: the references (PyTorch's
built-ins as referees, or formulas), the forbidden built-ins, the inputs, the tolerances, and the
steps of checking both run. The visible checks (:mod:`autograder.checks`) and the hidden ones
(instructor-only) import it; neither writes a reference of its own, and the hidden checks
never import the visible ones.

This part ships to students: nothing here is secret. The hidden checks keep what is: their
inputs, the mistake catalogue, and the references that are an exercise's solution (an exercise
with no PyTorch built-in to compare with, such as the sinusoidal encoding or a FLOP count, is
checked against a solution, which stays with the hidden checks).
"""
