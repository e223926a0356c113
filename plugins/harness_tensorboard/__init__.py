"""The TensorBoard tracker plugin for harness."""
