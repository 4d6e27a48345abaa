"""The course's autograder.

Public part (shipped to students, and the only part a student's kernel sees when a notebook
is graded): the checking core, in three folders by the side that runs it (``grader``: where the
checks run and judge; ``kernel``: what runs beside the student's code in the student's kernel;
``shared``: the failures and the messages both sides use), ``checks`` and ``references``. Instructor-only part
(:data:`INSTRUCTOR_ONLY`): ``hidden`` (hidden checks and the mistake catalogue), and the three
layers of the instructor's tools: ``course`` (the repository, its settings, release, scaffold,
bundle), ``engine`` (running and judging one notebook: staging, the sandbox, the kernel, the
source reading) and ``grading`` (a class's run and its platforms, feedback, export, report);
``service`` (the hub's grading service) and the command line.
"""

__version__ = "1.0.0"

#: The parts of the package that never leave the instructor's side: not in the student bundle,
#: not in the grading sandbox, never run as a probe.
INSTRUCTOR_ONLY = ("hidden", "course", "engine", "grading", "service", "__main__.py")
