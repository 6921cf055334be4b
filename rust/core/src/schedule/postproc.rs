//! The effect of MetaSchedule's CPU postprocessors RewriteParallelVectorizeUnroll and
//! RewriteReductionBlock, with the same rules (see TVM's
//! `src/s_tir/meta_schedule/postproc/rewrite_parallel_vectorize_unroll.cc`).

use serde_json::json;

use super::arith;
use super::loops;
use super::reduction;
use super::state::{BlockId, LoopId, State};
use crate::error::Result;
use crate::program::{IterKind, LoopKind};

const PARALLEL: &str = "meta_schedule.parallel";
const VECTORIZE: &str = "meta_schedule.vectorize";
const UNROLL_EXPLICIT: &str = "meta_schedule.unroll_explicit";
const UNROLL_IMPLICIT: &str = "meta_schedule.unroll_implicit";

#[derive(Clone, Copy, Debug)]
struct Parsed {
    max_parallel: i64,
    max_vectorize: i64,
    unroll_explicit: i64,
    unroll_implicit: i64,
    num_parallel: i64,
    num_vectorize: i64,
}

fn has_ann_or_binding(st: &State, l: LoopId) -> bool {
    st.loops[l].kind == LoopKind::ThreadBinding || !st.loops[l].annotations.is_empty()
}

/// How many innermost loops can be fused into one contiguous (vectorizable) access.
fn max_fusible(st: &State, b: BlockId, ls: &[LoopId]) -> i64 {
    let sb = &st.blocks[b];
    let map = |v: &str| sb.binding_of(v);
    let ranges = st.ranges();
    let mut best = i64::MAX;
    for acc in sb.block.reads.iter().chain(&sb.block.writes) {
        let shape = &st.buffers[acc.buffer].shape;
        let idx: Vec<Option<arith::Lin>> = acc
            .region
            .iter()
            .map(|(m, _)| arith::linear(&m.substitute(&map), &ranges))
            .collect();
        let strides: Vec<i64> = ls
            .iter()
            .map(|&l| {
                let var = crate::program::Expr::Var(st.loops[l].var.clone());
                let key = arith::key(&var);
                let mut buffer_stride = 1i64;
                for d in (0..idx.len()).rev() {
                    let coef = idx[d]
                        .as_ref()
                        .and_then(|lin| lin.terms.get(&key))
                        .map(|(_, c)| *c)
                        .unwrap_or(0);
                    if coef != 0 {
                        return coef * buffer_stride;
                    }
                    buffer_stride *= shape.get(d).copied().unwrap_or(1);
                }
                0
            })
            .collect();
        let mut fusible = 0i64;
        let mut prev: Option<usize> = None;
        for i in (0..strides.len()).rev() {
            if strides[i] == 0 {
                fusible += 1;
            } else if let Some(p) = prev {
                if strides[i] == strides[p] * st.loops[ls[p]].extent {
                    fusible += 1;
                    prev = Some(i);
                } else {
                    break;
                }
            } else {
                if strides[i] != 1 && fusible != 0 {
                    break;
                }
                fusible += 1;
                prev = Some(i);
            }
        }
        best = best.min(fusible);
    }
    best
}

fn adjust(st: &State, b: BlockId, ls: &[LoopId], p: &mut Parsed) {
    if p.max_parallel == -1 && p.max_vectorize == -1 {
        return;
    }
    let n = ls.len() as i64;
    let types: Vec<IterKind> = ls.iter().map(|&l| st.loop_iter_kind(l)).collect();
    let fusible = max_fusible(st, b, ls);
    let single = |l: LoopId| st.loops[l].children.len() == 1;
    let rw = ls
        .iter()
        .zip(&types)
        .filter(|(&l, &t)| !has_ann_or_binding(st, l) && t == IterKind::Spatial && single(l))
        .count() as i64;
    if p.max_parallel != -1 {
        let mut num = 0;
        let mut prod = 1i64;
        for (i, &l) in ls.iter().enumerate() {
            if types[i] != IterKind::Spatial || has_ann_or_binding(st, l) {
                break;
            }
            num += 1;
            prod = prod.saturating_mul(st.loops[l].extent);
            if prod > p.max_parallel || !single(l) {
                break;
            }
        }
        p.num_parallel = if prod == 1 { -1 } else { num };
    }
    if p.max_vectorize != -1 {
        let mut num = 0;
        let mut prod = 1i64;
        for i in (0..ls.len()).rev() {
            let l = ls[i];
            if types[i] != IterKind::Spatial
                || num >= fusible
                || has_ann_or_binding(st, l)
                || !single(l)
            {
                break;
            }
            prod = prod.saturating_mul(st.loops[l].extent);
            if prod > p.max_vectorize {
                break;
            }
            num += 1;
        }
        p.num_vectorize = if prod == 1 { -1 } else { num };
    }
    if p.num_parallel != -1 && p.num_vectorize != -1 {
        if rw == n && fusible == n {
            p.num_parallel = n;
            p.num_vectorize = n;
        } else {
            p.num_parallel = p.num_parallel.min(n - p.num_vectorize);
        }
    }
}

pub fn rewrite_parallel_vectorize_unroll(st: &mut State) -> Result<()> {
    let root = st.root;
    let anns = &st.blocks[root].block.annotations;
    let get = |k: &str| anns.get(k).map(|v| v.as_i64().unwrap_or(-1));
    let (par, vec, ue, ui) = (
        get(PARALLEL),
        get(VECTORIZE),
        get(UNROLL_EXPLICIT),
        get(UNROLL_IMPLICIT),
    );
    if par.is_none() && vec.is_none() && ue.is_none() && ui.is_none() {
        return Ok(());
    }
    for k in [PARALLEL, VECTORIZE, UNROLL_EXPLICIT, UNROLL_IMPLICIT] {
        st.blocks[root].block.annotations.remove(k);
    }
    let base = Parsed {
        max_parallel: par.unwrap_or(-1),
        max_vectorize: vec.unwrap_or(-1),
        unroll_explicit: ue.unwrap_or(-1),
        unroll_implicit: ui.unwrap_or(-1),
        num_parallel: -1,
        num_vectorize: -1,
    };
    for b in st.all_blocks() {
        let mut ls = st.loops_of(b);
        if ls.is_empty() {
            continue;
        }
        let mut p = base;
        adjust(st, b, &ls, &mut p);
        let n = ls.len() as i64;
        if p.num_parallel == n && p.num_vectorize == n {
            let fused = loops::fuse(st, &ls, true)?;
            let parts = loops::split(st, fused, &[None, Some(p.max_vectorize)], true, false)?;
            loops::set_kind(st, "Parallel", parts[0], LoopKind::Parallel, None)?;
            loops::set_kind(st, "Vectorize", parts[1], LoopKind::Vectorized, None)?;
            ls = vec![parts[0]];
        } else {
            if p.num_parallel > 0 {
                let k = p.num_parallel as usize;
                let fused = loops::fuse(st, &ls[..k], true)?;
                loops::set_kind(st, "Parallel", fused, LoopKind::Parallel, None)?;
                ls.splice(..k, std::iter::repeat_n(fused, k));
            }
            if p.num_vectorize > 0 {
                let k = p.num_vectorize as usize;
                let at = ls.len() - k;
                let fused = loops::fuse(st, &ls[at..], true)?;
                loops::set_kind(st, "Vectorize", fused, LoopKind::Vectorized, None)?;
                ls.splice(at.., std::iter::repeat_n(fused, k));
            }
        }
        if p.unroll_explicit != -1 || p.unroll_implicit != -1 {
            let explicit = (p.unroll_explicit != -1) as i64;
            let max_step = p.unroll_explicit + p.unroll_implicit + 1;
            let spatial = st.blocks[b]
                .block
                .iter_vars
                .iter()
                .all(|v| v.kind == IterKind::Spatial);
            if max_step > 0 && !spatial {
                let l = ls[0];
                st.loops[l]
                    .annotations
                    .insert("pragma_auto_unroll_max_step".into(), json!(max_step));
                st.loops[l]
                    .annotations
                    .insert("pragma_unroll_explicit".into(), json!(explicit));
            }
        }
    }
    Ok(())
}

pub fn rewrite_reduction_block(st: &mut State) -> Result<()> {
    loop {
        let mut rewritten = 0;
        for b in st.all_blocks() {
            // A reduction bound to threads is lowered as a cross-thread reduction instead.
            if st.blocks[b].block.init.is_none() || reduces_over_threads(st, b) {
                continue;
            }
            let ls = st.loops_of(b);
            if let Some(&l) = ls
                .iter()
                .find(|&&l| st.loop_iter_kind(l) != IterKind::Spatial)
            {
                reduction::decompose_reduction(st, b, l)?;
                rewritten += 1;
            }
        }
        if rewritten == 0 {
            return Ok(());
        }
    }
}

/// Whether a reduction variable of block `b` is bound to a loop bound to `threadIdx` or
/// `blockIdx` (TVM's RewriteReductionBlock leaves such blocks alone).
fn reduces_over_threads(st: &State, b: BlockId) -> bool {
    let bound: Vec<&str> = st
        .loops_of(b)
        .into_iter()
        .filter(|&l| {
            st.loops[l]
                .thread
                .as_deref()
                .is_some_and(|t| t.starts_with("threadIdx.") || t.starts_with("blockIdx."))
        })
        .map(|l| st.loops[l].var.as_str())
        .collect();
    let sb = &st.blocks[b];
    sb.block
        .iter_vars
        .iter()
        .zip(&sb.bindings)
        .any(|(iv, e)| iv.kind == IterKind::Reduce && bound.iter().any(|v| arith::uses_var(e, v)))
}
