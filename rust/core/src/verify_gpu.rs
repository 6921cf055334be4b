//! MetaSchedule's VerifyGPUCode postprocessor on the schedule state: the verdict TVM gives a
//! CUDA candidate after its lowering passes, without lowering it through TVM.
//!
//! What TVM checks, and where it shows on the state:
//! * the thread-extent bounds MultiLevelTiling annotates on a block
//!   (`meta_schedule.thread_extent_low_inclusive` / `high_inclusive`): the product of the
//!   innermost threadIdx.x/y/z extents around the block (ThreadExtentChecker);
//! * a kernel (the subtree under an outermost thread-bound loop) binds each thread tag with one
//!   extent: UnifyThreadBinding fails the lowering otherwise;
//! * threads per block: the product of a kernel's threadIdx.x/y/z extents (vthreads do not
//!   count: after InjectVirtualThread no `vthread` attribute is left);
//! * shared memory per block: the compacted size of every shared allocation placed inside the
//!   kernel (CompactBufferAllocation relaxes the threads sharing it);
//! * vector width: a vectorized loop moves at most `max_vector_bytes` per access;
//! * cross-thread reductions: LowerCrossThreadReduction's conditions on their loops;
//! * software pipelines: a stage for each statement of the pipelined body, and the copies
//!   InjectSoftwarePipeline keeps of the buffers passed between stages (shared memory).

use crate::error::Result;
use crate::features::lower::lower_with;
use crate::gpu_target::GpuTarget;
use crate::program::{IterKind, LoopKind, Program};
use crate::schedule::arith::uses_var;
use crate::schedule::state::{Child, LoopId, State};
use crate::schedule::trace::apply_trace_gpu;
use crate::schedule::Trace;

const LOW: &str = "meta_schedule.thread_extent_low_inclusive";
const HIGH: &str = "meta_schedule.thread_extent_high_inclusive";
const WARP_EXECUTION: &str = "warp_execution";

/// Why VerifyGPUCode rejects the candidate, or `None` when it passes.
pub(crate) fn verify_gpu(st: &State, target: &GpuTarget) -> Result<Option<String>> {
    if let Some(why) = thread_extent_bounds(st, st.children(None), [1, 1, 1], target.warp_size) {
        return Ok(Some(why));
    }
    let kernels = kernel_roots(st);
    for &k in &kernels {
        if let Some(why) = kernel_threads(st, k, target) {
            return Ok(Some(why));
        }
    }
    let lowering = vector_width(st, target)
        .or_else(|| pipeline_shapes(st))
        .or_else(|| cross_thread_reductions(st));
    if let Some(why) = lowering {
        return Ok(Some(why));
    }
    shared_memory(st, &kernels, target)
}

/// LowerCrossThreadReduction's conditions on a reduction whose reduction loops include one
/// bound to a thread: those loops are the innermost around the block, only threadIdx binds
/// them, and no block follows it under the outermost of them. The lowering fails otherwise.
fn cross_thread_reductions(st: &State) -> Option<String> {
    for b in st.all_blocks() {
        let sb = &st.blocks[b];
        if sb.block.init.is_none() {
            continue;
        }
        let loops = st.loops_of(b);
        let reduction: Vec<LoopId> = loops
            .iter()
            .copied()
            .filter(|&l| {
                let var = &st.loops[l].var;
                sb.block
                    .iter_vars
                    .iter()
                    .zip(&sb.bindings)
                    .any(|(iv, e)| iv.kind == IterKind::Reduce && uses_var(e, var))
            })
            .collect();
        if !reduction.iter().any(|&l| st.loops[l].thread.is_some()) {
            continue;
        }
        let name = &sb.block.name;
        let innermost = loops.iter().rev().take(reduction.len());
        if innermost.clone().any(|l| !reduction.contains(l)) {
            return Some(format!(
                "the cross-thread reduction of block {name} has other loops inside its reduction loops"
            ));
        }
        if reduction.iter().any(|&l| {
            st.loops[l]
                .thread
                .as_deref()
                .is_some_and(|t| thread_dim(t).is_none())
        }) {
            return Some(format!(
                "the cross-thread reduction of block {name} binds a reduction loop to a non-threadIdx axis"
            ));
        }
        let mut under = Vec::new();
        st.blocks_in(Child::Loop(reduction[0]), &mut under);
        if under.last() != Some(&b) {
            return Some(format!(
                "the cross-thread reduction of block {name} is followed by another block under its reduction loops"
            ));
        }
    }
    None
}

/// InjectSoftwarePipeline needs a stage for each statement of a pipelined loop's body; the
/// lowering fails otherwise (for instance when a reduction's init lands in the body).
fn pipeline_shapes(st: &State) -> Option<String> {
    st.loops.iter().filter(|lp| lp.alive).find_map(|lp| {
        let stages = lp.annotations.get("software_pipeline_stage")?.as_array()?;
        (stages.len() != lp.children.len()).then(|| {
            format!(
                "a software-pipelined loop has {} statements for {} stages",
                lp.children.len(),
                stages.len()
            )
        })
    })
}

fn thread_dim(thread: &str) -> Option<usize> {
    match thread {
        "threadIdx.x" => Some(0),
        "threadIdx.y" => Some(1),
        "threadIdx.z" => Some(2),
        _ => None,
    }
}

/// ThreadExtentChecker: each block's annotated bounds on the threads around it.
fn thread_extent_bounds(st: &State, kids: &[Child], xyz: [i64; 3], warp: i64) -> Option<String> {
    for &c in kids {
        match c {
            Child::Loop(l) => {
                let mut inner = xyz;
                if let Some(d) = st.loops[l].thread.as_deref().and_then(thread_dim) {
                    inner[d] = st.loops[l].extent;
                }
                if let Some(why) = thread_extent_bounds(st, &st.loops[l].children, inner, warp) {
                    return Some(why);
                }
            }
            Child::Block(b) => {
                let blk = &st.blocks[b].block;
                let x = if blk.annotations.contains_key(WARP_EXECUTION) {
                    warp
                } else {
                    xyz[0]
                };
                let threads = x * xyz[1] * xyz[2];
                let bound = |k: &str| blk.annotations.get(k).and_then(|v| v.as_i64());
                if let (Some(low), Some(high)) = (bound(LOW), bound(HIGH)) {
                    if !(low..=high).contains(&threads) {
                        return Some(format!(
                            "block {} runs on {threads} threads, outside its bounds [{low}, {high}]",
                            blk.name
                        ));
                    }
                }
            }
        }
    }
    None
}

/// The outermost thread-bound loops: where kernels launch.
fn kernel_roots(st: &State) -> Vec<LoopId> {
    fn walk(st: &State, kids: &[Child], out: &mut Vec<LoopId>) {
        for &c in kids {
            if let Child::Loop(l) = c {
                if st.loops[l].thread.is_some() {
                    out.push(l);
                } else {
                    walk(st, &st.loops[l].children, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(st, st.children(None), &mut out);
    out
}

/// The thread-bound loops of kernel `k` (its root included), in tree order.
fn bound_loops(st: &State, k: LoopId) -> Vec<LoopId> {
    fn walk(st: &State, l: LoopId, out: &mut Vec<LoopId>) {
        if st.loops[l].thread.is_some() {
            out.push(l);
        }
        for &c in &st.loops[l].children {
            if let Child::Loop(i) = c {
                walk(st, i, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(st, k, &mut out);
    out
}

/// One extent per thread tag in a kernel, and the threads of a block within the target's limit.
fn kernel_threads(st: &State, k: LoopId, target: &GpuTarget) -> Option<String> {
    let mut seen: Vec<(&str, i64)> = Vec::new();
    for l in bound_loops(st, k) {
        let tag = st.loops[l].thread.as_deref().unwrap_or_default();
        let extent = st.loops[l].extent;
        match seen.iter().find(|(t, _)| *t == tag) {
            Some(&(_, e)) if e != extent => {
                return Some(format!(
                    "two loops of one kernel are bound to {tag} with extents {e} and {extent}"
                ))
            }
            Some(_) => {}
            None => seen.push((tag, extent)),
        }
    }
    let threads: i64 = seen
        .iter()
        .filter(|(t, _)| thread_dim(t).is_some())
        .map(|&(_, e)| e)
        .product();
    (threads > target.max_threads_per_block).then(|| {
        format!(
            "a kernel runs {threads} threads per block, more than {}",
            target.max_threads_per_block
        )
    })
}

/// Vectorized loops whose accesses would move more than `max_vector_bytes` at once.
fn vector_width(st: &State, target: &GpuTarget) -> Option<String> {
    for (l, lp) in st.loops.iter().enumerate() {
        if !lp.alive || lp.kind != LoopKind::Vectorized {
            continue;
        }
        for b in st.blocks_under(Some(l)) {
            let blk = &st.blocks[b].block;
            let widest = blk
                .reads
                .iter()
                .chain(&blk.writes)
                .map(|a| st.buffers[a.buffer].element_bytes())
                .max()
                .unwrap_or(1);
            if lp.extent * widest > target.max_vector_bytes {
                return Some(format!(
                    "block {} is vectorized {} wide over {widest}-byte values, more than {} bytes",
                    blk.name, lp.extent, target.max_vector_bytes
                ));
            }
        }
    }
    None
}

/// The kernel root above loop `l`, if `l` is inside a kernel.
fn kernel_of(st: &State, l: LoopId, kernels: &[LoopId]) -> Option<LoopId> {
    let mut cur = Some(l);
    while let Some(c) = cur {
        if kernels.contains(&c) {
            return Some(c);
        }
        cur = st.loops[c].parent;
    }
    None
}

/// How many copies of `buffer`, allocated in the body of loop `l`, InjectSoftwarePipeline keeps
/// when `l` is software-pipelined (`software_pipeline_stage`: a stage per statement of the
/// body): one more than the stages between its first writer and its last reader, where a
/// second copy is only needed when a writer comes before a reader of a later stage.
fn pipeline_versions(st: &State, l: LoopId, buffer: usize) -> i64 {
    let Some(stages) = st.loops[l]
        .annotations
        .get("software_pipeline_stage")
        .and_then(|v| v.as_array())
    else {
        return 1;
    };
    let touches = |c: Child, write: bool| {
        let mut blocks = Vec::new();
        st.blocks_in(c, &mut blocks);
        blocks.iter().any(|&b| {
            let blk = &st.blocks[b].block;
            let accesses = if write { &blk.writes } else { &blk.reads };
            accesses.iter().any(|a| a.buffer == buffer)
        })
    };
    let kids = &st.loops[l].children;
    let stage = |i: usize| stages.get(i).and_then(|v| v.as_i64()).unwrap_or(0);
    let writers: Vec<usize> = (0..kids.len())
        .filter(|&i| touches(kids[i], true))
        .collect();
    let readers: Vec<usize> = (0..kids.len())
        .filter(|&i| touches(kids[i], false))
        .collect();
    let (Some(def), Some(usage)) = (
        writers.iter().map(|&i| stage(i)).min(),
        readers.iter().map(|&i| stage(i)).max(),
    ) else {
        return 1;
    };
    let versions = (usage - def + 1).max(1);
    let staggered = writers
        .iter()
        .any(|&w| readers.iter().any(|&r| w < r && stage(w) < stage(r)));
    if versions == 2 && !staggered {
        1
    } else {
        versions
    }
}

/// Shared memory per kernel, after compaction, within the target's limit.
fn shared_memory(st: &State, kernels: &[LoopId], target: &GpuTarget) -> Result<Option<String>> {
    let lowered = lower_with(st, false, true)?;
    let mut per_kernel: Vec<i64> = vec![0; kernels.len()];
    for a in &lowered.allocs {
        let buffer = &st.buffers[a.buffer];
        if !buffer.scope.starts_with("shared") {
            continue;
        }
        let Some(&site) = a.loops.last() else {
            continue;
        };
        let Some(l) = st.loop_by_var(&lowered.loops[site].var) else {
            continue;
        };
        if let Some(k) = kernel_of(st, l, kernels) {
            let elements: i64 = lowered.shapes[a.buffer].iter().product::<i64>()
                * pipeline_versions(st, l, a.buffer);
            let i = kernels.iter().position(|&x| x == k).unwrap_or(0);
            per_kernel[i] += elements * buffer.element_bytes();
        }
    }
    Ok(per_kernel
        .iter()
        .find(|&&bytes| bytes > target.max_shared_memory_per_block)
        .map(|bytes| {
            format!(
                "a kernel uses {bytes} bytes of shared memory per block, more than {}",
                target.max_shared_memory_per_block
            )
        }))
}

/// Replays `trace_json` on the program with MetaSchedule's CUDA postprocessors and gives
/// VerifyGPUCode's verdict: why it rejects the candidate, or `None` when it passes. A trace the
/// postprocessors refuse (a dynamic loop, a binding they cannot complete) is an error.
pub fn verify_trace_gpu(
    program: &Program,
    trace_json: &str,
    target: &GpuTarget,
) -> Result<Option<String>> {
    let trace = Trace::from_json(trace_json)?;
    let mut st = State::from_program(program)?;
    apply_trace_gpu(&mut st, &trace, target, true)?;
    verify_gpu(&st, target)
}

/// [`verify_trace_gpu`] on each trace, in parallel, results in index order.
pub fn verify_traces_gpu(
    program: &Program,
    trace_jsons: &[String],
    target: &GpuTarget,
) -> Vec<Result<Option<String>>> {
    use rayon::prelude::*;
    trace_jsons
        .par_iter()
        .map(|t| verify_trace_gpu(program, t, target))
        .collect()
}
