"""Building and timing candidates, locally or on an RPC device (``measurer``); CUDA candidates
compiled to cubins and their resources read from ptxas (``cubin``, with the ``cuda`` extra)."""

from fastsearch.measure.measurer import MeasureConfig, Measurer, MeasureResult, RPCRunner

__all__ = ["MeasureConfig", "MeasureResult", "Measurer", "RPCRunner"]
