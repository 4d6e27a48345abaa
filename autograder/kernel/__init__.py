"""What runs in the student's kernel, beside the student's code: the guard against forbidden built-ins
(:mod:`~autograder.kernel.guard`) and the guarded call (:mod:`~autograder.kernel.call`), the watches the
probes run (:mod:`~autograder.kernel.watches`), the allocator setting of a kernel whose memory is measured
(:mod:`~autograder.kernel.allocator`), the kernel's side of grading, which answers the grader's
requests (:mod:`~autograder.kernel.serve`), and the stand-in for an object the grader keeps
(:mod:`~autograder.kernel.served`). Nothing here imports the grader's side (:mod:`autograder.grader`);
the checks call it directly where the student's code runs in their own process (the student's notebook)."""
