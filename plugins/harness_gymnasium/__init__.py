"""The gymnasium env plugin for harness: any registered id, sync or async vector envs."""
