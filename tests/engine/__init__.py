"""One notebook run and judged: execution, the kernel and its sandbox, staging, the source reading, hostile submissions."""
