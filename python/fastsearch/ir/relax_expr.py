"""Reading Relax expressions: which arguments are constant tensors.

In TVM 0.27 a ``PrimValue`` (an ``IntImm`` such as ``HardSigmoid``'s or ``Clip``'s bounds) is a
``tvm.ir.expr.Constant`` too, so an ``isinstance`` check on that class alone takes a scalar
attribute for a weight."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm

__all__ = ["constant_array", "is_tensor_constant"]


def is_tensor_constant(expr: Any) -> bool:
    """Whether ``expr`` is a constant tensor (``relax.const``), not a ``PrimValue``."""
    return isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "numpy")


def constant_array(expr: Any) -> np.ndarray | None:
    """The value of a constant tensor as a numpy array; ``None`` for anything else."""
    return expr.value.numpy() if is_tensor_constant(expr) else None
