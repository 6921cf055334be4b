"""Reading Relax expressions (which arguments are constant tensors, static shapes) and running
an expression mutator over a module's Relax functions.

In TVM 0.27 a ``PrimValue`` (an ``IntImm`` such as ``HardSigmoid``'s or ``Clip``'s bounds) is a
``tvm.ir.expr.Constant`` too, so an ``isinstance`` check on that class alone takes a scalar
attribute for a weight."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm

__all__ = ["constant_array", "is_tensor_constant", "mutate_relax_functions", "static_shape"]


def is_tensor_constant(expr: Any) -> bool:
    """Whether ``expr`` is a constant tensor (``relax.const``), not a ``PrimValue``."""
    return isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "numpy")


def constant_array(expr: Any) -> np.ndarray | None:
    """The value of a constant tensor as a numpy array; ``None`` for anything else."""
    return expr.value.numpy() if is_tensor_constant(expr) else None


def static_shape(expr: Any) -> tuple[int, ...] | None:
    """The static shape of a Relax expression's tensor type; ``None`` when it has none (a
    tuple, an unknown or symbolic shape)."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        return None


def mutate_relax_functions(mutator: Any, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every Relax function visited by ``mutator`` (a ``relax.PyExprMutator``
    built over ``mod``): the module its block builder holds afterwards."""
    for gvar, func in mod.functions_items():
        if isinstance(func, tvm.relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
