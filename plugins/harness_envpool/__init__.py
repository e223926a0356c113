"""EnvPool's C++ thread-pool envs (Atari, MuJoCo, ...) for harness as ``envpool/TASK`` ids,
through harness's env contract (``pip install 'harness[envpool]'``; docs/envpool.md)."""
