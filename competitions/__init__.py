"""First-party competition packs. Each subdirectory holding a pack.toml is a pack; the
``competitions`` plugin registers them by directory name (``harness run cartpole``), and
``harness run competitions/NAME`` works by path from a checkout."""
