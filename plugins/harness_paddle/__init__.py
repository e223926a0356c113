"""The PaddlePaddle backend plugin for harness (CPU and CUDA)."""
