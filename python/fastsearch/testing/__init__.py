"""Models built in code for tests, examples and benchmarks: Relax models (``relax_models``) and
ONNX files (``onnx_zoo``, needs the ``onnx`` package)."""
