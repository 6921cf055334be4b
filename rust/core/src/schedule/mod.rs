//! The schedule engine: MetaSchedule's scheduling instructions applied to the program model,
//! traces read and written in MetaSchedule's JSON, and the effect of the CPU postprocessors.
//!
//! * [`state`] — the mutable loop tree, addressed by stable loop and block ids.
//! * [`arith`] — linear forms, simplification and interval bounds of index expressions.
//! * [`iter_map`] — whether bindings are an affine iterator map (when TVM simplifies them).
//! * [`loops`] — split, fuse, reorder, loop kinds.
//! * [`compute`] — compute_at, reverse_compute_at, compute_inline, reverse_compute_inline.
//! * [`cache`] — cache_read, cache_write.
//! * [`reduction`] — decompose_reduction, rfactor.
//! * [`trace`] — trace JSON and replay.
//! * [`postproc`] — RewriteParallelVectorizeUnroll and RewriteReductionBlock.
//! * [`gpu_postproc`] — the CUDA postprocessors RewriteCooperativeFetch and RewriteUnboundBlock.
//! * [`nest`] — the loop-nest description compared against TVM.

pub mod arith;
pub mod cache;
pub mod compute;
pub mod gpu_postproc;
pub mod iter_map;
pub mod loops;
pub mod nest;
pub mod postproc;
pub mod reduction;
pub mod state;
pub mod trace;

#[cfg(test)]
mod tests;

pub use state::State;
pub use trace::Trace;

use crate::error::Result;
use crate::gpu_target::GpuTarget;
use crate::program::Program;

/// Replays `trace_json` on the program and returns the loop-nest JSON. With `postprocess`, the
/// trace's postprocessing instructions (after `EnterPostproc`) are replaced by our own
/// implementation of the CPU postprocessors.
pub fn apply_trace(program_json: &str, trace_json: &str, postprocess: bool) -> Result<String> {
    apply_trace_to(&Program::from_json(program_json)?, trace_json, postprocess)
}

/// [`apply_trace`] on a program already imported.
pub fn apply_trace_to(program: &Program, trace_json: &str, postprocess: bool) -> Result<String> {
    let trace = Trace::from_json(trace_json)?;
    let mut st = State::from_program(program)?;
    trace::apply_trace(&mut st, &trace, postprocess)?;
    Ok(nest::loop_nest(&st).to_string())
}

/// [`apply_trace_to`] for a CUDA target: with `postprocess`, MetaSchedule's CUDA
/// postprocessors replace the trace's postprocessing instructions.
pub fn apply_trace_to_gpu(
    program: &Program,
    trace_json: &str,
    target: &GpuTarget,
    postprocess: bool,
) -> Result<String> {
    let trace = Trace::from_json(trace_json)?;
    let mut st = State::from_program(program)?;
    trace::apply_trace_gpu(&mut st, &trace, target, postprocess)?;
    Ok(nest::loop_nest(&st).to_string())
}
