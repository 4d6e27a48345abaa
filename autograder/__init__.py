"""The course's autograder.

Public part (shipped to students): ``errors``, ``compare``, ``guard``, ``diagnosis``,
``student`` and ``checks``. Instructor-only part: ``hidden`` (hidden checks and the
mistake catalogue) and ``pipeline`` (release, grading, feedback, bundle).
"""

__version__ = "1.0.0"
