"""What both sides share: the failures a check raises and a notebook shows (:mod:`.errors`), and the
plain-data format of the messages between the grader and the student's kernel (:mod:`.wire`)."""
