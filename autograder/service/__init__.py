"""The grading service: official feedback on submit, from nbgrader's exchange (``python -m autograder serve``).

A daemon the instructor starts (on JupyterHub, a hub-managed service: ``hub/jupyterhub_config.py``)
that notices each new submission in the exchange's ``inbound/`` (:mod:`.inbox`), keeps what it knows
in a file that survives its restart (:mod:`.state`), chooses what to grade next fairly and within
each student's daily quota (:mod:`.queue`), grades it with the pipeline of ``make autograde``
(:func:`autograder.grading.grade.grade_one`), and releases the feedback page to that student only
(:mod:`.release`, what a student sees of the hidden checks: :mod:`.visibility`); :mod:`.serve`
ties them together.
"""
