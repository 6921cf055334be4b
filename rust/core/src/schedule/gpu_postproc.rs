//! The effect of MetaSchedule's CUDA postprocessors RewriteCooperativeFetch and
//! RewriteUnboundBlock, with the same rules (TVM's `rewrite_cooperative_fetch.cc`,
//! `rewrite_unbound_block.cc` and `schedule/cuda/thread_bind.cc`). The other CUDA
//! postprocessors are shared with the CPU ([`super::postproc`]).

use super::loops;
use super::state::{BlockId, Child, LoopId, State};
use super::trace::FetchEvent;
use crate::error::{Error, Result};
use crate::gpu_target::GpuTarget;
use crate::program::{IterKind, LoopKind};

const COOPERATIVE_FETCH: &str = "meta_schedule.cooperative_fetch";
const TILING_STRUCTURE: &str = "meta_schedule.tiling_structure";
/// RewriteUnboundBlock's cap on thread blocks, as MetaSchedule's default CUDA postprocessors set it.
const MAX_THREADBLOCKS: i64 = 256;

fn bind(st: &mut State, l: LoopId, thread: &str) -> Result<()> {
    loops::set_kind(
        st,
        "Bind",
        l,
        LoopKind::ThreadBinding,
        Some(thread.to_string()),
    )
}

/// The widest element, in bytes, that block `b` reads or writes.
fn max_dtype_bytes(st: &State, b: BlockId) -> i64 {
    let blk = &st.blocks[b].block;
    blk.reads
        .iter()
        .chain(&blk.writes)
        .map(|a| st.buffers[a.buffer].element_bytes())
        .max()
        .unwrap_or(1)
}

/// RewriteCooperativeFetch: each block annotated for cooperative fetch has its innermost
/// (fused) loop split across the threads the trace bound before the annotation, with its
/// innermost part vectorized when the lanes divide the extent and no value is wider than 4
/// bytes. Thread extents are read from the trace's bindings, in order, before any rewrite.
pub fn rewrite_cooperative_fetch(
    st: &mut State,
    events: &[FetchEvent],
    target: &GpuTarget,
) -> Result<()> {
    let (mut tx, mut ty) = (-1i64, -1i64);
    let mut tasks = Vec::new();
    for e in events {
        match *e {
            // TVM reads every bound loop's extent now, and fails on one that no longer exists.
            FetchEvent::Thread { l, .. } if !st.loops[l].alive => {
                return Err(Error::schedule(
                    "RewriteCooperativeFetch",
                    "a loop the trace bound to threadIdx no longer exists",
                ))
            }
            FetchEvent::Thread { x: true, l } => tx = st.loops[l].extent,
            FetchEvent::Thread { x: false, l } => ty = st.loops[l].extent,
            FetchEvent::Warp => tx = target.warp_size,
            FetchEvent::Fetch { b, lanes } => tasks.push((b, lanes, tx, ty)),
        }
    }
    for (b, mut lanes, tx, ty) in tasks {
        if !st.blocks[b].alive {
            return Err(Error::schedule(
                "RewriteCooperativeFetch",
                "the annotated block no longer exists",
            ));
        }
        st.blocks[b].block.annotations.remove(COOPERATIVE_FETCH);
        let Some(&fused) = st.loops_of(b).last() else {
            return Err(Error::schedule(
                "RewriteCooperativeFetch",
                "the annotated block has no loop",
            ));
        };
        if tx <= 0 {
            return Err(Error::schedule(
                "RewriteCooperativeFetch",
                "no threadIdx.x bound before the annotation",
            ));
        }
        if st.loops[fused].extent % lanes != 0 || max_dtype_bytes(st, b) > 4 {
            lanes = 1;
        }
        let mut factors = vec![None];
        if ty != -1 {
            factors.push(Some(ty));
        }
        factors.push(Some(tx));
        if lanes > 1 {
            factors.push(Some(lanes));
        }
        let parts = loops::split(st, fused, &factors, true, false)?;
        let n = parts.len();
        if lanes > 1 {
            loops::set_kind(st, "Vectorize", parts[n - 1], LoopKind::Vectorized, None)?;
        }
        let x_at = if lanes > 1 { n - 2 } else { n - 1 };
        bind(st, parts[x_at], "threadIdx.x")?;
        if ty != -1 {
            bind(st, parts[x_at - 1], "threadIdx.y")?;
        }
    }
    Ok(())
}

fn is_block_idx(thread: Option<&str>) -> bool {
    thread.is_some_and(|t| t.starts_with("blockIdx."))
}

fn is_thread_idx(thread: Option<&str>) -> bool {
    thread.is_some_and(|t| t.starts_with("threadIdx."))
}

/// The blocks RewriteUnboundBlock binds, in program order: those not under both a blockIdx
/// and a threadIdx loop.
fn unbound_blocks(st: &State) -> Vec<BlockId> {
    fn walk(st: &State, kids: &[Child], n_block: usize, n_thread: usize, out: &mut Vec<BlockId>) {
        for &c in kids {
            match c {
                Child::Block(b) => out.push(b),
                Child::Loop(l) => {
                    let t = st.loops[l].thread.as_deref();
                    let nb = n_block + is_block_idx(t) as usize;
                    let nt = n_thread + is_thread_idx(t) as usize;
                    if nb == 0 || nt == 0 {
                        walk(st, &st.loops[l].children, nb, nt, out);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(st, st.children(None), 0, 0, &mut out);
    out
}

/// Wraps `c` in a new loop of extent 1 at its place (TVM's `add_unit_loop`).
pub(super) fn add_unit_loop(st: &mut State, c: Child) -> Result<LoopId> {
    let parent = st.parent_of(c);
    let pos = st.position(c)?;
    let l = st.new_loop(1, parent);
    st.children_mut(parent)[pos] = Child::Loop(l);
    st.loops[l].children.push(c);
    st.set_parent(c, Some(l));
    Ok(l)
}

/// RewriteUnboundBlock: every block not under both a blockIdx and a threadIdx loop, and not
/// multi-level tiled, gets its outer spatial loops fused and bound (TVM's
/// `BindBlockThreadIdx` with a fixed factor: the thread count, capped by the extent).
pub fn rewrite_unbound_block(st: &mut State, target: &GpuTarget) -> Result<()> {
    for b in unbound_blocks(st) {
        if st.blocks[b].alive
            && !st.blocks[b]
                .block
                .annotations
                .contains_key(TILING_STRUCTURE)
        {
            bind_block(st, b, target.max_threads_per_block)?;
        }
    }
    Ok(())
}

fn bind_block(st: &mut State, b: BlockId, max_threads: i64) -> Result<()> {
    const K: &str = "RewriteUnboundBlock";
    let mut ls = st.loops_of(b);
    let n = ls.len();
    let (mut i_block, mut i_thread, mut i_multi, mut i_spatial) = (None, None, None, -1i64);
    for (i, &l) in ls.iter().enumerate() {
        let t = st.loops[l].thread.as_deref();
        if is_block_idx(t) && i_block.is_none() {
            i_block = Some(i);
        }
        if is_thread_idx(t) && i_thread.is_none() {
            i_thread = Some(i);
        }
        if st.loops[l].kind != LoopKind::Serial && i_multi.is_none() {
            i_multi = Some(i);
        }
        if st.loops[l].children.len() != 1 && i_multi.is_none() {
            i_multi = Some(i + 1);
        }
        if st.loop_iter_kind(l) == IterKind::Spatial && i_spatial == i as i64 - 1 {
            i_spatial += 1;
        }
    }
    let mut i_multi = i_multi.unwrap_or(n);
    match (i_block, i_thread) {
        (Some(_), Some(_)) => return Ok(()),
        (Some(_), None) => {
            return Err(Error::schedule(K, "blockIdx is bound but threadIdx is not"))
        }
        _ => {}
    }
    if i_spatial == -1 {
        let unit = add_unit_loop(st, ls.first().map_or(Child::Block(b), |&l| Child::Loop(l)))?;
        ls.insert(0, unit);
        i_spatial = 0;
        i_thread = i_thread.map(|i| i + 1);
        i_multi += 1;
    }
    let spatial = (i_spatial + 1) as usize;
    if let Some(it) = i_thread {
        let k = i_multi.min(it).min(spatial);
        if k == 0 {
            return Err(Error::schedule(
                K,
                "no loop to fuse above the thread binding",
            ));
        }
        let fused = loops::fuse(st, &ls[..k], true)?;
        return bind(st, fused, "blockIdx.x");
    }
    let k = i_multi.min(spatial);
    if k == 0 {
        return Err(Error::schedule(K, "no loop to fuse"));
    }
    let fused = loops::fuse(st, &ls[..k], true)?;
    let extent = st.loops[fused].extent;
    if extent <= MAX_THREADBLOCKS * max_threads {
        let parts = loops::split(
            st,
            fused,
            &[None, Some(extent.min(max_threads))],
            true,
            false,
        )?;
        bind(st, parts[0], "blockIdx.x")?;
        bind(st, parts[1], "threadIdx.x")
    } else {
        let parts = loops::split(
            st,
            fused,
            &[None, Some(MAX_THREADBLOCKS), Some(max_threads)],
            true,
            false,
        )?;
        loops::reorder(st, &[parts[1], parts[2], parts[0]])?;
        bind(st, parts[1], "blockIdx.x")?;
        bind(st, parts[2], "threadIdx.x")
    }
}
