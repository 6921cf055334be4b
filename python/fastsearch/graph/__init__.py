"""Whole models: the inference pipeline, channel-blocked layout, partitioning into tasks, the
tasks of a Relax module and timing a compiled model."""
