"""Running and judging one notebook: staging a submission, the sandbox and its kernel (cold, forked
from the zygote, or taken from the pool), nbgrader's execution with its limits, the checks' requests
to the kernel, the grader's reading of the source, and the notes grading leaves in a notebook."""
