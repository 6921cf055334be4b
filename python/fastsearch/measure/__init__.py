"""Building and timing candidates, locally or on an RPC device (``measurer``)."""

from fastsearch.measure.measurer import MeasureConfig, Measurer, MeasureResult, RPCRunner

__all__ = ["MeasureConfig", "MeasureResult", "Measurer", "RPCRunner"]
