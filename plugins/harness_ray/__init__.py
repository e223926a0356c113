"""The Ray transport plugin for harness: @harness.remote classes as Ray actors."""
