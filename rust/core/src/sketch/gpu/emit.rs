//! A GPU genome written as a MetaSchedule trace, in MetaSchedule's order: tiled blocks with
//! their caches, then inlining (padding goes into the shared read caches, epilogues into the
//! local write caches), then cross-thread reductions and thread bindings, then unrolling.

use std::collections::BTreeMap;

use serde_json::Value;

use super::tiling::{min_threads, GPU_MAX_INNERMOST_FACTOR};
use super::{GpuGenome, GpuRule, GpuSketchSpace, GPU_UNROLL_CANDIDATES};
use crate::program::{IterKind, Program};
use crate::sketch::{spatial_reduce_counts, TraceBuilder};

/// Emits the trace of one GPU candidate.
pub fn emit_gpu(program: &Program, space: &GpuSketchSpace, genome: &GpuGenome) -> Value {
    let mut t = TraceBuilder::new();
    let func = program.name.as_str();
    let mut rv: BTreeMap<usize, String> = BTreeMap::new();
    for info in &space.base.infos {
        let name = &program.blocks[info.block].name;
        rv.insert(info.block, t.get_block(name, func));
    }
    let root = t.get_block(&program.blocks[program.root.block].name, func);
    let rule = |b: usize| genome.rules.get(&b);
    let order: Vec<usize> = space.base.infos.iter().rev().map(|i| i.block).collect();
    for &b in &order {
        if let (Some(GpuRule::Tile { .. }), Some(tiles)) = (rule(b), genome.tiles.get(&b)) {
            let lanes = genome.lanes.get(&b).map_or(&[][..], |l| &l[..]);
            tile(&mut t, program, space, b, &rv[&b], tiles, lanes);
        }
    }
    for &b in &order {
        if rule(b) == Some(&GpuRule::Inline) {
            t.compute_inline(&rv[&b]);
        }
    }
    for &b in &order {
        if rule(b) == Some(&GpuRule::IntoProducer) {
            t.reverse_compute_inline(&rv[&b]);
        }
    }
    for &b in &order {
        match rule(b) {
            Some(GpuRule::Bind) => bind(&mut t, program, space, genome, b, &rv),
            Some(GpuRule::CrossThread { host: None }) => {
                let threads = thread_var(&mut t, program, space, genome, b);
                let loops = t.get_loops(&rv[&b], space.base.info(b).loop_extents.len());
                let (n_s, _) = spatial_reduce_counts(program, b);
                reduce_across_threads(&mut t, &loops[n_s..], &threads);
                if n_s > 0 {
                    let outer = fuse(&mut t, &loops[..n_s]);
                    t.bind(&outer, "blockIdx.x");
                }
            }
            _ => {}
        }
    }
    t.annotate_categorical(
        &root,
        "meta_schedule.unroll_explicit",
        &GPU_UNROLL_CANDIDATES,
        genome.unroll,
    );
    t.finish()
}

/// Fuses `loops` (one loop stays as it is).
fn fuse(t: &mut TraceBuilder, loops: &[String]) -> String {
    if loops.len() == 1 {
        loops[0].clone()
    } else {
        t.fuse(loops)
    }
}

/// The sampled thread count of block `b`.
fn thread_var(
    t: &mut TraceBuilder,
    program: &Program,
    space: &GpuSketchSpace,
    genome: &GpuGenome,
    b: usize,
) -> String {
    let candidates = space.thread_candidates(program, b, &genome.rules);
    let chosen = genome.threads.get(&b).copied().unwrap_or(candidates[0]);
    let index = candidates.iter().position(|c| *c == chosen).unwrap_or(0);
    t.sample_categorical(&candidates, index)
}

/// Fuses the reduction loops, splits them by `threads` and binds the inner part to threads.
fn reduce_across_threads(t: &mut TraceBuilder, reduce_loops: &[String], threads: &str) {
    let fused = fuse(t, reduce_loops);
    let [_, inner] = t.split_inner(&fused, threads);
    t.bind(&inner, "threadIdx.x");
}

/// AutoBind of block `b`; when it hosts cross-thread reductions, they are computed under its
/// thread block first, sharing its thread count.
fn bind(
    t: &mut TraceBuilder,
    program: &Program,
    space: &GpuSketchSpace,
    genome: &GpuGenome,
    b: usize,
    rv: &BTreeMap<usize, String>,
) {
    let n_bind = space.bind_loops(program, b);
    if n_bind == 0 {
        return; // left to RewriteUnboundBlock
    }
    let threads = thread_var(t, program, space, genome, b);
    let n_loops = space.base.info(b).loop_extents.len();
    let loops = t.get_loops(&rv[&b], n_loops);
    let hosted: Vec<usize> = space
        .base
        .infos
        .iter()
        .rev()
        .map(|i| i.block)
        .filter(|r| genome.rules.get(r) == Some(&GpuRule::CrossThread { host: Some(b) }))
        .collect();
    if hosted.is_empty() {
        let fused = fuse(t, &loops[..n_bind]);
        let [outer, inner] = t.split_inner(&fused, &threads);
        t.bind(&outer, "blockIdx.x");
        t.bind(&inner, "threadIdx.x");
        return;
    }
    let [_, inner] = t.split_inner(&loops[n_loops - 1], &threads);
    t.bind(&inner, "threadIdx.x");
    let mut n_outer = n_bind;
    for r in hosted {
        let (n_s, n_r) = spatial_reduce_counts(program, r);
        n_outer = n_outer.min(n_s);
        t.compute_at(&rv[&r], &loops[n_s - 1]);
        t.set_scope(&rv[&r], 0, "shared");
        let r_loops = t.get_loops(&rv[&r], 2 * n_s + n_r);
        reduce_across_threads(t, &r_loops[2 * n_s..], &threads);
    }
    let outer = fuse(t, &loops[..n_outer]);
    t.bind(&outer, "blockIdx.x");
}

/// Multi-level tiling SSSRRSRS of block `b`, bound to blocks, virtual threads and threads, with
/// a local write cache under the thread tile and shared read caches under the outer reduction
/// tile.
fn tile(
    t: &mut TraceBuilder,
    program: &Program,
    space: &GpuSketchSpace,
    b: usize,
    block: &str,
    tiles: &[Vec<i64>],
    lanes: &[i64],
) {
    t.annotate_str(block, "meta_schedule.tiling_structure", "SSSRRSRS");
    let pb = &program.blocks[b];
    let loops = t.get_loops(block, pb.iter_vars.len());
    let mut s: Vec<Vec<String>> = vec![Vec::new(); 5];
    let mut r: Vec<Vec<String>> = vec![Vec::new(); 3];
    for ((lp, factors), v) in loops.iter().zip(tiles).zip(&pb.iter_vars) {
        let split = t.sample_and_split(lp, factors, GPU_MAX_INNERMOST_FACTOR);
        let levels = if v.kind == IterKind::Reduce {
            &mut r
        } else {
            &mut s
        };
        for (level, l) in split.into_iter().enumerate() {
            levels[level].push(l);
        }
    }
    let order: Vec<String> = [&s[0], &s[1], &s[2], &r[0], &r[1], &s[3], &r[2], &s[4]]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    t.reorder(&order);
    let mut bound = Vec::new();
    for (level, axis) in ["blockIdx.x", "vthread.x", "threadIdx.x"]
        .iter()
        .enumerate()
    {
        let fused = t.fuse(&s[level]);
        t.bind(&fused, axis);
        bound.push(fused);
    }
    let low = min_threads(space, program, b);
    t.annotate_int(block, "meta_schedule.thread_extent_low_inclusive", low);
    let high = space.target.max_threads_per_block;
    t.annotate_int(block, "meta_schedule.thread_extent_high_inclusive", high);
    let cw = t.cache_write(block, 0, "local");
    t.reverse_compute_at(&cw, &bound[2]);
    let at = r[0].last().expect("a reduction loop").clone();
    let outer = 3 + r[0].len();
    for (k, i) in space.cached_reads(program, b).into_iter().enumerate() {
        let buffer = pb.reads[i].buffer;
        let ndim = program.buffers[buffer].shape.len();
        let cr = t.cache_read(block, i, "shared");
        t.compute_at(&cr, &at);
        if ndim > 0 {
            let cr_loops = t.get_loops(&cr, outer + ndim);
            t.fuse(&cr_loops[outer..]);
        }
        let candidates = space.lane_candidates(program, buffer);
        let chosen = lanes.get(k).copied().unwrap_or(1);
        let index = candidates.iter().position(|c| *c == chosen).unwrap_or(0);
        let v = t.sample_categorical(&candidates, index);
        t.annotate_var(&cr, "meta_schedule.cooperative_fetch", &v);
    }
}
