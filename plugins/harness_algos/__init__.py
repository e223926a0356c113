"""First-party algorithms for harness, each written once against the backend interface."""
