"""MetaSchedule's ``TuneContext`` without its import of every tensor intrinsic.

``TuneContext.__init__`` imports ``tvm.s_tir.tensor_intrin`` (35 s the first time in a process
on a 2-vCPU host). Postprocessors and ``PerStoreFeature`` need none of them: this builds the
same object through TVM's constructor and initializes it.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import meta_schedule as ms

__all__ = ["tune_context"]


def tune_context(
    mod: tvm.tirx.PrimFunc | tvm.IRModule,
    target: tvm.target.Target,
    space: ms.space_generator.SpaceGenerator | None = None,
    task_name: str = "main",
    num_threads: int = 1,
) -> ms.TuneContext:
    """An initialized ``TuneContext`` of ``mod`` (a PrimFunc is wrapped as ``main``) for
    ``target``, with ``space`` (a space generator object, not a name) if given."""
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    ctx = ms.TuneContext.__new__(ms.TuneContext)
    ctx.__init_handle_by_constructor__(
        _ffi_api.TuneContext,
        mod,
        target,
        space,
        None,
        task_name,
        num_threads,
        0,
        get_logging_func(get_logger(__name__)),
    )
    _ffi_api.TuneContextInitialize(ctx)
    return ctx
