"""harness_onnx: ``harness export RUN``, a run's greedy policy as a self-contained ONNX file
(``pip install 'harness[onnx]'``).

Modules: ``plugin`` (the command), ``export`` (load the run, describe its policy, verify
the graph in onnxruntime, write), ``graph`` (a ``harness.numpy_nets.PolicyProgram`` as
ONNX nodes), ``bench`` (onnxruntime vs numpy per-step latency). The interface of the graph
is docs/export.md.
"""
