//! Reduction primitives: decompose_reduction and rfactor.

use super::arith;
use super::state::{BlockId, Child, LoopId, State};
use crate::error::{Error, Result};
use crate::program::{Access, BinOp, Block, Buffer, Expr, IterKind, IterVar, Store};

/// Moves the init of reduction block `b` into a new block `<name>_init` placed before loop `l`,
/// under copies of the loops between `l` and the block that the init's bindings use.
pub fn decompose_reduction(st: &mut State, b: BlockId, l: LoopId) -> Result<BlockId> {
    const I: &str = "DecomposeReduction";
    if b == st.root || !st.blocks[b].alive || !st.loops[l].alive {
        return Err(Error::schedule(I, "the block or loop no longer exists"));
    }
    let loops = st.loops_of(b);
    let Some(li) = loops.iter().position(|&x| x == l) else {
        return Err(Error::schedule(
            I,
            format!(
                "loop {} is not an ancestor of block {}",
                st.loops[l].var, st.blocks[b].block.name
            ),
        ));
    };
    let blk = st.blocks[b].block.clone();
    let Some(init) = blk.init.clone() else {
        return Err(Error::schedule(
            I,
            format!("block {} is not a reduction block", blk.name),
        ));
    };
    let bindings = st.blocks[b].bindings.clone();
    for (iv, e) in blk.iter_vars.iter().zip(&bindings) {
        if iv.kind == IterKind::Reduce
            && loops[..li]
                .iter()
                .any(|&o| arith::uses_var(e, &st.loops[o].var))
        {
            return Err(Error::schedule(
                I,
                format!(
                    "loop {} is lower than a loop of reduction variable {}",
                    st.loops[l].var, iv.name
                ),
            ));
        }
    }
    let mut init_vars = Vec::new();
    let mut init_bindings = Vec::new();
    for (iv, e) in blk.iter_vars.iter().zip(&bindings) {
        if iv.kind == IterKind::Spatial {
            init_vars.push(iv.clone());
            init_bindings.push(e.clone());
        }
    }
    // Loops from the innermost up to `l` that the init bindings use, outermost first.
    let chosen: Vec<LoopId> = loops[li..]
        .iter()
        .copied()
        .filter(|&x| {
            init_bindings
                .iter()
                .any(|e| arith::uses_var(e, &st.loops[x].var))
        })
        .collect();
    let parent = st.loops[l].parent;
    let pos = st.position(Child::Loop(l))?;
    let init_block = Block {
        name: format!("{}_init", blk.name),
        iter_vars: init_vars,
        reads: vec![],
        writes: blk.writes.clone(),
        init: None,
        body: init,
        children: None,
        alloc_buffers: vec![],
        annotations: blk.annotations.clone(),
    };
    let mut renames = Vec::new();
    let mut up: Option<LoopId> = None;
    let mut outer: Option<Child> = None;
    for &old in &chosen {
        let n = st.new_loop(st.loops[old].extent, up);
        st.loops[n].kind = st.loops[old].kind;
        st.loops[n].thread = st.loops[old].thread.clone();
        st.loops[n].annotations = st.loops[old].annotations.clone();
        if let Some(p) = up {
            st.loops[p].children.push(Child::Loop(n));
        }
        outer.get_or_insert(Child::Loop(n));
        renames.push((
            st.loops[old].var.clone(),
            Expr::Var(st.loops[n].var.clone()),
        ));
        up = Some(n);
    }
    let sub = |v: &str| renames.iter().find(|(n, _)| n == v).map(|(_, e)| e.clone());
    let init_bindings = init_bindings.iter().map(|e| e.substitute(&sub)).collect();
    let ib = st.new_block(init_block, init_bindings, up);
    if let Some(p) = up {
        st.loops[p].children.push(Child::Block(ib));
    }
    st.insert(parent, pos, outer.unwrap_or(Child::Block(ib)));
    let ub = &mut st.blocks[b].block;
    ub.name = format!("{}_update", blk.name);
    ub.init = None;
    let mut reads: Vec<Access> = blk
        .writes
        .iter()
        .filter(|w| !blk.reads.iter().any(|r| r.buffer == w.buffer))
        .cloned()
        .collect();
    reads.extend(blk.reads.iter().cloned());
    ub.reads = reads;
    Ok(ib)
}

/// `(op, self-load indices, other operand)` of a reduction update `W[i] = op(W[i], x)`.
fn reducer(blk: &Block) -> Option<(BinOp, usize, Vec<Expr>, Expr)> {
    let [store] = blk.body.as_slice() else {
        return None;
    };
    let Expr::Bin(op, a, c) = &store.value else {
        return None;
    };
    if !matches!(op, BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max) {
        return None;
    }
    let is_self = |e: &Expr| matches!(e, Expr::Load { buffer, indices } if *buffer == store.buffer && *indices == store.indices);
    let other = if is_self(a) {
        (**c).clone()
    } else if is_self(c) {
        (**a).clone()
    } else {
        return None;
    };
    Some((*op, store.buffer, store.indices.clone(), other))
}

fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::Bin(op, Box::new(a), Box::new(b))
}

/// The reduction block `rfactor` factorizes under loop `rf`, checked as TVM checks it.
struct Factorized {
    b: BlockId,
    blk: Block,
    init: Vec<Store>,
    op: BinOp,
    wbuf: usize,
    widx: Vec<Expr>,
    /// The reduction's update operand (the value combined into the accumulator).
    other: Expr,
    bindings: Vec<Expr>,
    loops: Vec<LoopId>,
    reduce_loops: Vec<LoopId>,
}

const RFACTOR: &str = "RFactor";

fn factorized(st: &State, rf: LoopId) -> Result<Factorized> {
    const I: &str = RFACTOR;
    if !st.loops[rf].alive {
        return Err(Error::schedule(I, "the loop no longer exists"));
    }
    let under = st.blocks_under(Some(rf));
    let [b] = under.as_slice() else {
        return Err(Error::schedule(
            I,
            "the loop does not have exactly one block under it",
        ));
    };
    let b = *b;
    let blk = st.blocks[b].block.clone();
    let init = blk.init.clone().ok_or_else(|| {
        Error::schedule(I, format!("block {} is not a reduction block", blk.name))
    })?;
    if st.loops[rf].kind != crate::program::LoopKind::Serial {
        return Err(Error::schedule(I, "the loop is not serial"));
    }
    let (op, wbuf, widx, other) = reducer(&blk).ok_or_else(|| {
        Error::schedule(
            I,
            format!("block {} is not a recognized reduction", blk.name),
        )
    })?;
    let bindings = st.blocks[b].bindings.clone();
    let loops = st.loops_of(b);
    let touched = |l: LoopId, kind: IterKind| {
        blk.iter_vars
            .iter()
            .zip(&bindings)
            .any(|(iv, e)| iv.kind == kind && arith::uses_var(e, &st.loops[l].var))
    };
    let mut reduce_loops = Vec::new();
    for &l in &loops {
        let (s, r) = (touched(l, IterKind::Spatial), touched(l, IterKind::Reduce));
        if s && r {
            return Err(Error::schedule(
                I,
                format!(
                    "loop {} is used by both spatial and reduction variables",
                    st.loops[l].var
                ),
            ));
        }
        if r {
            reduce_loops.push(l);
        }
    }
    if !reduce_loops.contains(&rf) {
        return Err(Error::schedule(
            I,
            "the loop is not a reduction loop of the block",
        ));
    }
    Ok(Factorized {
        b,
        blk,
        init,
        op,
        wbuf,
        widx,
        other,
        bindings,
        loops,
        reduce_loops,
    })
}

/// Factorizes the reduction of the single block under loop `rf` over that loop into a new block
/// `<name>_rf` writing `<buffer>_rf` (the loop's extent inserted at `factor_axis`); the original
/// block becomes the write-back block.
pub fn rfactor(st: &mut State, rf: LoopId, factor_axis: i64) -> Result<BlockId> {
    let Factorized {
        b,
        blk,
        init,
        op,
        wbuf,
        widx,
        other,
        bindings,
        loops,
        reduce_loops,
    } = factorized(st, rf)?;
    let (rf_buf, axis) = rf_buffer(st, wbuf, rf, factor_axis)?;

    // The rf block's variables: the rf loop (spatial), the spatial ones, one per other reduction loop.
    let name_of = |l: LoopId| format!("vr{}", st.loops[l].var.trim_start_matches('%'));
    let rf_var = format!("v_rf{}", st.loops[rf].var.trim_start_matches('%'));
    let mut ivs = vec![IterVar {
        name: rf_var.clone(),
        min: 0,
        extent: st.loops[rf].extent,
        kind: IterKind::Spatial,
    }];
    let mut loop_to_iv: Vec<(String, Expr)> =
        vec![(st.loops[rf].var.clone(), Expr::Var(rf_var.clone()))];
    let mut rf_bind_loops: Vec<LoopId> = vec![rf];
    let mut rf_bindings_spatial = Vec::new();
    for (iv, e) in blk.iter_vars.iter().zip(&bindings) {
        if iv.kind == IterKind::Spatial {
            ivs.push(iv.clone());
            rf_bindings_spatial.push(e.clone());
        }
    }
    // One reduction variable per other reduction loop, in the order the original reduction
    // variables' bindings mention them (TVM's order, not the loop nesting order).
    let order = other_reduce_loops(st, &blk, &bindings, rf, &reduce_loops);
    for &l in &order {
        ivs.push(IterVar {
            name: name_of(l),
            min: 0,
            extent: st.loops[l].extent,
            kind: IterKind::Reduce,
        });
        loop_to_iv.push((st.loops[l].var.clone(), Expr::Var(name_of(l))));
        rf_bind_loops.push(l);
    }
    let l2iv = |v: &str| {
        loop_to_iv
            .iter()
            .find(|(n, _)| n == v)
            .map(|(_, e)| e.clone())
    };
    let red_subst: Vec<(String, Expr)> = blk
        .iter_vars
        .iter()
        .zip(&bindings)
        .filter(|(iv, _)| iv.kind == IterKind::Reduce)
        .map(|(iv, e)| (iv.name.clone(), e.substitute(&l2iv)))
        .collect();
    let rsub = |v: &str| {
        red_subst
            .iter()
            .find(|(n, _)| n == v)
            .map(|(_, e)| e.clone())
    };
    let mut rf_idx = widx.clone();
    rf_idx.insert(axis, Expr::Var(rf_var.clone()));
    let rf_point = Access {
        buffer: rf_buf,
        region: rf_idx.iter().map(|e| (e.clone(), Expr::Int(1))).collect(),
    };
    let rf_load = Expr::Load {
        buffer: rf_buf,
        indices: rf_idx.clone(),
    };
    let init_value = init
        .first()
        .map(|s| s.value.clone())
        .unwrap_or(Expr::Int(0));
    let has_reduce = reduce_loops.len() > 1;
    let rf_block = Block {
        name: format!("{}_rf", blk.name),
        iter_vars: ivs,
        reads: blk
            .reads
            .iter()
            .filter(|a| a.buffer != wbuf)
            .map(|a| Access {
                buffer: a.buffer,
                region: a
                    .region
                    .iter()
                    .map(|(m, e)| (m.substitute(&rsub), e.substitute(&rsub)))
                    .collect(),
            })
            .collect(),
        writes: vec![rf_point.clone()],
        // With no reduction left (the rf loop was the only one), TVM makes a plain spatial
        // block: no init, no accumulation.
        init: has_reduce.then(|| {
            vec![Store {
                buffer: rf_buf,
                indices: rf_idx.clone(),
                value: init_value,
            }]
        }),
        body: vec![Store {
            buffer: rf_buf,
            indices: rf_idx.clone(),
            value: if has_reduce {
                bin(op, rf_load.clone(), other.substitute(&rsub))
            } else {
                other.substitute(&rsub)
            },
        }],
        children: None,
        alloc_buffers: vec![],
        annotations: blk.annotations.clone(),
    };
    let rfb = place_rf_block(
        st,
        b,
        rf,
        &loops,
        rf_block,
        &rf_bindings_spatial,
        &rf_bind_loops,
    )?;
    write_back(
        st, b, rf, &rf_var, &blk, &bindings, op, wbuf, &widx, rf_point, rf_load,
    );
    for &l in reduce_loops.iter().filter(|&&l| l != rf) {
        unlink_loop(st, l)?;
    }
    Ok(rfb)
}

/// The rf block under a copy of the whole loop nest of block `b`, placed before that nest.
fn place_rf_block(
    st: &mut State,
    b: BlockId,
    rf: LoopId,
    loops: &[LoopId],
    rf_block: Block,
    rf_bindings_spatial: &[Expr],
    rf_bind_loops: &[LoopId],
) -> Result<BlockId> {
    let mut copies = Vec::new();
    let mut up: Option<LoopId> = None;
    for &old in loops {
        let n = st.new_loop(st.loops[old].extent, up);
        st.loops[n].kind = st.loops[old].kind;
        st.loops[n].thread = st.loops[old].thread.clone();
        st.loops[n].annotations = st.loops[old].annotations.clone();
        if let Some(p) = up {
            st.loops[p].children.push(Child::Loop(n));
        }
        copies.push((
            st.loops[old].var.clone(),
            Expr::Var(st.loops[n].var.clone()),
        ));
        up = Some(n);
    }
    let csub = |v: &str| copies.iter().find(|(n, _)| n == v).map(|(_, e)| e.clone());
    let mut rf_bindings = vec![Expr::Var(st.loops[rf].var.clone()).substitute(&csub)];
    rf_bindings.extend(rf_bindings_spatial.iter().map(|e| e.substitute(&csub)));
    rf_bindings.extend(
        rf_bind_loops[1..]
            .iter()
            .map(|&l| Expr::Var(st.loops[l].var.clone()).substitute(&csub)),
    );
    let rfb = st.new_block(rf_block, rf_bindings, up);
    // The rf block keeps the predicate; TVM's write-back block has none.
    st.blocks[rfb].predicate = st.blocks[b].predicate.substitute(&csub);
    if let Some(p) = up {
        st.loops[p].children.push(Child::Block(rfb));
    }
    let top = loops.first().copied();
    match top {
        Some(t) => {
            let parent = st.loops[t].parent;
            let pos = st.position(Child::Loop(t))?;
            st.insert(parent, pos, Child::Loop(copies_root(st, &copies)?));
        }
        None => return Err(Error::schedule(RFACTOR, "the block has no loops")),
    }
    Ok(rfb)
}

/// Block `b` becomes the write-back block: it reduces over the rf loop only.
#[allow(clippy::too_many_arguments)]
fn write_back(
    st: &mut State,
    b: BlockId,
    rf: LoopId,
    rf_var: &str,
    blk: &Block,
    bindings: &[Expr],
    op: BinOp,
    wbuf: usize,
    widx: &[Expr],
    rf_point: Access,
    rf_load: Expr,
) {
    let mut wb_ivs = vec![IterVar {
        name: rf_var.to_string(),
        min: 0,
        extent: st.loops[rf].extent,
        kind: IterKind::Reduce,
    }];
    let mut wb_bindings = vec![Expr::Var(st.loops[rf].var.clone())];
    for (iv, e) in blk.iter_vars.iter().zip(bindings) {
        if iv.kind == IterKind::Spatial {
            wb_ivs.push(iv.clone());
            wb_bindings.push(e.clone());
        }
    }
    let w_load = Expr::Load {
        buffer: wbuf,
        indices: widx.to_vec(),
    };
    let sb = &mut st.blocks[b];
    sb.block.iter_vars = wb_ivs;
    sb.block.reads = vec![rf_point];
    sb.block.body = vec![Store {
        buffer: wbuf,
        indices: widx.to_vec(),
        value: bin(op, w_load, rf_load),
    }];
    sb.bindings = wb_bindings;
    sb.predicate = Expr::Bool(true);
}

/// The rf block's buffer: the written buffer with the rf loop's extent inserted at
/// `factor_axis` (negative from the end), allocated at the root. Returns it and the axis.
fn rf_buffer(st: &mut State, wbuf: usize, rf: LoopId, factor_axis: i64) -> Result<(usize, usize)> {
    const I: &str = RFACTOR;
    let ndim = st.buffers[wbuf].shape.len() as i64;
    let axis = if factor_axis < 0 {
        factor_axis + ndim + 1
    } else {
        factor_axis
    };
    if !(0..=ndim).contains(&axis) {
        return Err(Error::schedule(
            I,
            format!("factor axis {factor_axis} out of range for {ndim} dimensions"),
        ));
    }
    let axis = axis as usize;
    let mut shape = st.buffers[wbuf].shape.clone();
    shape.insert(axis, st.loops[rf].extent);
    let wb = st.buffers[wbuf].clone();
    let rf_buf = st.add_buffer(Buffer {
        name: format!("{}.rf", wb.name),
        shape,
        dtype: wb.dtype,
        scope: wb.scope,
    });
    let root = st.root;
    st.blocks[root].block.alloc_buffers.push(rf_buf);
    Ok((rf_buf, axis))
}

/// The reduction loops other than `rf`, in the order the block's reduction variables' bindings
/// mention them (TVM's order, not the loop nesting order).
fn other_reduce_loops(
    st: &State,
    blk: &Block,
    bindings: &[Expr],
    rf: LoopId,
    reduce_loops: &[LoopId],
) -> Vec<LoopId> {
    let mut order: Vec<LoopId> = Vec::new();
    for (iv, e) in blk.iter_vars.iter().zip(bindings) {
        if iv.kind != IterKind::Reduce {
            continue;
        }
        for v in arith::vars_of(e) {
            if let Some(l) = st.loop_by_var(&v) {
                if l != rf && reduce_loops.contains(&l) && !order.contains(&l) {
                    order.push(l);
                }
            }
        }
    }
    order
}

fn copies_root(st: &State, copies: &[(String, Expr)]) -> Result<LoopId> {
    match copies.first() {
        Some((_, Expr::Var(v))) => st
            .loop_by_var(v)
            .ok_or_else(|| Error::Internal("rfactor: lost loop copy".into())),
        _ => Err(Error::Internal("rfactor: no loop copies".into())),
    }
}

/// Removes loop `l`, splicing its children into its parent.
fn unlink_loop(st: &mut State, l: LoopId) -> Result<()> {
    let parent = st.loops[l].parent;
    let pos = st.position(Child::Loop(l))?;
    let kids = std::mem::take(&mut st.loops[l].children);
    for c in &kids {
        st.set_parent(*c, parent);
    }
    let list = st.children_mut(parent);
    list.splice(pos..pos + 1, kids);
    st.loops[l].alive = false;
    Ok(())
}
