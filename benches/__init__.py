"""Benchmarks that run fastsearch side by side with MetaSchedule, TVM's pipeline and
onnxruntime. Run each from the repository root as a module (``python -m benches.suite ...``);
shared helpers live in ``benches.runs`` (a suite's runs), ``benches.kernel_retime`` (kernels
re-timed in fresh processes) and ``benches.run_meta`` (what each result records of its run).
Raw data goes to the ``--out-dir`` given, outside the repository (benches/results/README.md)."""
