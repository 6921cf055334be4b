//! Loop primitives: split, fuse, reorder, and the loop kinds (parallel, vectorize, unroll, bind).

use std::collections::BTreeSet;

use super::state::{BlockId, Child, LoopId, State};
use crate::error::{Error, Result};
use crate::program::{BinOp, Expr, IterKind, LoopKind};

fn mul(a: Expr, b: Expr) -> Expr {
    Expr::Bin(BinOp::Mul, Box::new(a), Box::new(b))
}

fn add(a: Expr, b: Expr) -> Expr {
    Expr::Bin(BinOp::Add, Box::new(a), Box::new(b))
}

fn check_plain(st: &State, inst: &str, l: LoopId) -> Result<()> {
    let lp = &st.loops[l];
    if !lp.alive {
        return Err(Error::schedule(inst, "the loop no longer exists"));
    }
    if !lp.annotations.is_empty() || lp.thread.is_some() {
        return Err(Error::schedule(
            inst,
            format!("loop {} has annotations or a thread binding", lp.var),
        ));
    }
    Ok(())
}

/// Splits loop `l` by `factors` (at most one `None`, inferred). Returns the new loops, outermost
/// first.
pub fn split(
    st: &mut State,
    l: LoopId,
    factors: &[Option<i64>],
    preserve_unit_iters: bool,
    disable_predication: bool,
) -> Result<Vec<LoopId>> {
    const I: &str = "Split";
    check_plain(st, I, l)?;
    if factors.is_empty() {
        return Err(Error::schedule(I, "no factors"));
    }
    let extent = st.loops[l].extent;
    let mut infer = None;
    let mut known: i64 = 1;
    for (i, f) in factors.iter().enumerate() {
        match f {
            None if infer.is_some() => {
                return Err(Error::schedule(I, "more than one factor to infer"))
            }
            None => infer = Some(i),
            Some(v) if *v <= 0 => {
                return Err(Error::schedule(
                    I,
                    format!("factor {v} at {i} is not positive"),
                ))
            }
            Some(v) => {
                known = known
                    .checked_mul(*v)
                    .ok_or_else(|| Error::schedule(I, "factor product overflows"))?
            }
        }
    }
    let mut fs: Vec<i64> = factors.iter().map(|f| f.unwrap_or(1)).collect();
    match infer {
        // Ceiling division that cannot overflow on factors near i64::MAX.
        Some(i) => {
            fs[i] = if extent <= 0 {
                0
            } else {
                (extent - 1) / known + 1
            }
        }
        None if known < extent => {
            return Err(Error::schedule(
                I,
                format!("factors {fs:?} multiply to {known}, less than the extent {extent}"),
            ));
        }
        None => {}
    }
    let product: i64 = fs.iter().product();
    let unsimplified = st.blocks_without_iter_maps(Some(l));
    let parent = st.loops[l].parent;
    let pos = st.position(Child::Loop(l))?;
    let children = std::mem::take(&mut st.loops[l].children);
    st.loops[l].alive = false;
    let ids: Vec<LoopId> = fs.iter().map(|&f| st.new_loop(f, None)).collect();
    for w in ids.windows(2) {
        st.loops[w[0]].children = vec![Child::Loop(w[1])];
        st.loops[w[1]].parent = Some(w[0]);
    }
    let last = *ids.last().unwrap_or(&l);
    for c in &children {
        st.set_parent(*c, Some(last));
    }
    st.loops[last].children = children;
    st.children_mut(parent)[pos] = Child::Loop(ids[0]);
    st.loops[ids[0]].parent = parent;
    // old = ((l0 * f1 + l1) * f2 + l2) ...
    let mut value = Expr::Int(0);
    for (i, &id) in ids.iter().enumerate() {
        let var = if !preserve_unit_iters && fs[i] == 1 {
            Expr::Int(0)
        } else {
            Expr::Var(st.loops[id].var.clone())
        };
        value = add(mul(value, Expr::Int(fs[i])), var);
    }
    let old = st.loops[l].var.clone();
    let predicate_needed = product != extent && !disable_predication;
    let guard = Expr::Bin(
        BinOp::Lt,
        Box::new(value.clone()),
        Box::new(Expr::Int(extent)),
    );
    st.substitute_under(Some(ids[0]), &|v: &str| (v == old).then(|| value.clone()));
    if predicate_needed {
        for b in st.blocks_under(Some(ids[0])) {
            let p = std::mem::replace(&mut st.blocks[b].predicate, Expr::Bool(true));
            st.blocks[b].predicate = match p {
                Expr::Bool(true) => guard.clone(),
                p => Expr::Bin(BinOp::And, Box::new(p), Box::new(guard.clone())),
            };
        }
    }
    let new_vars: Vec<String> = ids.iter().map(|&id| st.loops[id].var.clone()).collect();
    st.simplify_bindings_using(Some(ids[0]), &new_vars, &unsimplified);
    Ok(ids)
}

/// Fuses a chain of directly nested loops, outermost first.
/// `_preserve_unit_iters` is accepted for the trace format: TVM binds unit components to 0 anyway.
pub fn fuse(st: &mut State, loops: &[LoopId], _preserve_unit_iters: bool) -> Result<LoopId> {
    const I: &str = "Fuse";
    if loops.is_empty() {
        return Err(Error::schedule(I, "no loops to fuse"));
    }
    for (i, &l) in loops.iter().enumerate() {
        check_plain(st, I, l)?;
        if i > 0 {
            let outer = loops[i - 1];
            if st.loops[l].parent != Some(outer) {
                return Err(Error::schedule(
                    I,
                    format!(
                        "loop {} is not directly inside {}",
                        st.loops[l].var, st.loops[outer].var
                    ),
                ));
            }
            if st.loops[outer].children.len() != 1 {
                return Err(Error::schedule(
                    I,
                    format!("loop {} has more than one child", st.loops[outer].var),
                ));
            }
        }
    }
    let outer = loops[0];
    let inner = *loops.last().unwrap_or(&outer);
    let extents: Vec<i64> = loops.iter().map(|&l| st.loops[l].extent).collect();
    let total = extents
        .iter()
        .try_fold(1i64, |a, &e| a.checked_mul(e))
        .filter(|&t| t <= i64::from(i32::MAX))
        .ok_or_else(|| {
            // TVM's loop variables are 32-bit: its fused loop would silently wrap around.
            Error::schedule(I, "the fused extent overflows a 32-bit loop variable")
        })?;
    let unsimplified = st.blocks_without_iter_maps(Some(outer));
    let parent = st.loops[outer].parent;
    let pos = st.position(Child::Loop(outer))?;
    let children = std::mem::take(&mut st.loops[inner].children);
    let f = st.new_loop(total, parent);
    for c in &children {
        st.set_parent(*c, Some(f));
    }
    st.loops[f].children = children;
    st.children_mut(parent)[pos] = Child::Loop(f);
    let fv = Expr::Var(st.loops[f].var.clone());
    // Blocks whose bindings are an iterator map get `floormod(floordiv(f, lower), extent)`,
    // the form TVM's IterMapSimplify normalises to, and are simplified; the others keep TVM's
    // substitution as it is, `floordiv(floormod(f, lower * extent), lower)`.
    let div = |e: Expr, k: i64| match k {
        1 => e,
        _ => Expr::Bin(BinOp::FloorDiv, Box::new(e), Box::new(Expr::Int(k))),
    };
    let modulo = |e: Expr, k: i64| Expr::Bin(BinOp::FloorMod, Box::new(e), Box::new(Expr::Int(k)));
    let mut subst = Vec::new();
    let mut lower = 1i64;
    for (i, &l) in loops.iter().enumerate().rev() {
        // TVM binds a unit-extent component to 0 whatever preserve_unit_iters says.
        let (simplified, raw) = if extents[i] == 1 {
            (Expr::Int(0), Expr::Int(0))
        } else if i == 0 {
            (div(fv.clone(), lower), div(fv.clone(), lower))
        } else {
            (
                modulo(div(fv.clone(), lower), extents[i]),
                div(modulo(fv.clone(), lower * extents[i]), lower),
            )
        };
        subst.push((st.loops[l].var.clone(), simplified, raw));
        lower *= extents[i];
        st.loops[l].alive = false;
    }
    let (raw_blocks, blocks): (Vec<BlockId>, Vec<BlockId>) = st
        .blocks_under(Some(f))
        .into_iter()
        .partition(|b| unsimplified.contains(b));
    st.substitute_in(&blocks, &|v: &str| {
        subst.iter().find(|s| s.0 == v).map(|s| s.1.clone())
    });
    st.substitute_in(&raw_blocks, &|v: &str| {
        subst.iter().find(|s| s.0 == v).map(|s| s.2.clone())
    });
    let fused = [st.loops[f].var.clone()];
    st.simplify_bindings_using(Some(f), &fused, &unsimplified);
    Ok(f)
}

/// Reorders loops of one chain: the positions the given loops hold in the chain are filled with
/// them in the given order.
pub fn reorder(st: &mut State, ordered: &[LoopId]) -> Result<()> {
    const I: &str = "Reorder";
    if ordered.len() <= 1 {
        return Ok(());
    }
    let set: BTreeSet<LoopId> = ordered.iter().copied().collect();
    if set.len() != ordered.len() {
        return Err(Error::schedule(I, "a loop appears more than once"));
    }
    for &l in ordered {
        if !st.loops[l].alive {
            return Err(Error::schedule(I, "a loop no longer exists"));
        }
    }
    // The deepest loop's path must contain all others.
    let bottom = *ordered
        .iter()
        .max_by_key(|&&l| st.loop_path(l).len())
        .unwrap_or(&ordered[0]);
    let path = st.loop_path(bottom);
    let top_idx = path
        .iter()
        .position(|l| set.contains(l))
        .ok_or_else(|| Error::Internal("reorder: empty path".into()))?;
    if ordered.iter().any(|l| !path.contains(l)) {
        return Err(Error::schedule(I, "the loops are not in a single chain"));
    }
    let chain: Vec<LoopId> = path[top_idx..].to_vec();
    for &l in &chain[..chain.len() - 1] {
        if st.loops[l].children.len() != 1 {
            return Err(Error::schedule(
                I,
                format!(
                    "loop {} has more than one child: the loops are not a chain",
                    st.loops[l].var
                ),
            ));
        }
    }
    for b in st.blocks_under(Some(chain[0])) {
        if let Some(iv) = st.blocks[b]
            .block
            .iter_vars
            .iter()
            .find(|iv| iv.kind == IterKind::Opaque)
        {
            return Err(Error::schedule(
                I,
                format!(
                    "block {} has opaque iteration variable {}",
                    st.blocks[b].block.name, iv.name
                ),
            ));
        }
    }
    let mut it = ordered.iter();
    let new_chain: Vec<LoopId> = chain
        .iter()
        .map(|l| {
            if set.contains(l) {
                *it.next().unwrap_or(l)
            } else {
                *l
            }
        })
        .collect();
    let parent = st.loops[chain[0]].parent;
    let pos = st.position(Child::Loop(chain[0]))?;
    let leaf_children = std::mem::take(&mut st.loops[*chain.last().unwrap_or(&chain[0])].children);
    for &l in &chain {
        st.loops[l].children.clear();
    }
    st.children_mut(parent)[pos] = Child::Loop(new_chain[0]);
    st.loops[new_chain[0]].parent = parent;
    for w in new_chain.windows(2) {
        st.loops[w[0]].children = vec![Child::Loop(w[1])];
        st.loops[w[1]].parent = Some(w[0]);
    }
    let last = *new_chain.last().unwrap_or(&new_chain[0]);
    for c in &leaf_children {
        st.set_parent(*c, Some(last));
    }
    st.loops[last].children = leaf_children;
    Ok(())
}

/// Why TVM's compact-dataflow check refuses to parallelize a loop over `block`: every block under
/// the loop must be complete (spatial variables only, reading no buffer it writes) or a
/// reduction (an init, spatial and reduction variables, outputs indexed without reduction
/// variables). A reduction's update block after `decompose_reduction` is neither. (TVM also
/// checks that the block dominates its outputs; that is not modelled.)
fn not_compact_dataflow(block: &crate::program::Block) -> Option<&'static str> {
    let kinds = || block.iter_vars.iter().map(|v| v.kind);
    if kinds().all(|k| k == IterKind::Spatial) {
        let overlap = block
            .writes
            .iter()
            .any(|w| block.reads.iter().any(|r| r.buffer == w.buffer));
        return overlap.then_some("reads a buffer it writes without being a reduction");
    }
    if block.init.is_none() {
        return Some("has reduction variables but no init");
    }
    if kinds().any(|k| k == IterKind::Opaque) {
        return Some("has opaque iteration variables");
    }
    let reduce_in_output = block.iter_vars.iter().any(|v| {
        v.kind == IterKind::Reduce
            && block.writes.iter().any(|w| {
                w.region
                    .iter()
                    .any(|(min, _)| super::arith::uses_var(min, &v.name))
            })
    });
    reduce_in_output.then_some("indexes its output with a reduction variable")
}

/// Marks a loop parallel, vectorized, unrolled or thread-bound, with TVM's checks: every block
/// under the loop has compact dataflow, and none uses the loop in a reduction iteration
/// variable (unless it is bound to a thread).
pub fn set_kind(
    st: &mut State,
    inst: &str,
    l: LoopId,
    kind: LoopKind,
    thread: Option<String>,
) -> Result<()> {
    if !st.loops[l].alive {
        return Err(Error::schedule(inst, "the loop no longer exists"));
    }
    if matches!(
        kind,
        LoopKind::Parallel | LoopKind::Vectorized | LoopKind::ThreadBinding
    ) {
        let var = st.loops[l].var.clone();
        let reduce_ok = thread
            .as_deref()
            .is_some_and(|t| t.starts_with("threadIdx"));
        for b in st.blocks_under(Some(l)) {
            let sb = &st.blocks[b];
            if let Some(why) = not_compact_dataflow(&sb.block) {
                return Err(Error::schedule(
                    inst,
                    format!("block {} under the loop {why}", sb.block.name),
                ));
            }
            for (iv, e) in sb.block.iter_vars.iter().zip(&sb.bindings) {
                if super::arith::uses_var(e, &var)
                    && !(iv.kind == IterKind::Spatial || (iv.kind == IterKind::Reduce && reduce_ok))
                {
                    return Err(Error::schedule(
                        inst,
                        format!(
                            "loop is used by {} iteration variable {} of block {}",
                            if iv.kind == IterKind::Reduce {
                                "reduction"
                            } else {
                                "opaque"
                            },
                            iv.name,
                            sb.block.name
                        ),
                    ));
                }
            }
        }
    }
    st.loops[l].kind = kind;
    st.loops[l].thread = thread;
    Ok(())
}
