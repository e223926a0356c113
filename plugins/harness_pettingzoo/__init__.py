"""The PettingZoo env plugin for harness: mpe2 tasks and any installed PettingZoo env as
multi-agent vector envs (see docs/multiagent.md)."""
