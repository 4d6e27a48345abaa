"""What runs where the checks run (the grader's process when a notebook is graded, the student's own
kernel otherwise): the cases of a check, the comparisons and what they say, the mistake catalogue's
machinery, the calls of the student's code (:mod:`.student`, in the kernel through :mod:`.remote`), and
the measure of its memory. It calls the kernel's side (:mod:`autograder.kernel`) only in one process."""
