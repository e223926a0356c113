"""The torch backend plugin for harness (CPU and CUDA)."""
