"""``harness report``: a self-contained HTML page per run, or comparing several runs."""
