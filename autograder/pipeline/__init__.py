"""The instructor's pipeline around nbgrader: release, grade, feedback, grades, bundle."""
