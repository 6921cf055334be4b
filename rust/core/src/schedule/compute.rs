//! Moving and inlining blocks: compute_at, reverse_compute_at, compute_inline,
//! reverse_compute_inline.

use std::collections::BTreeMap;

use super::arith::{self, Lin, Ranges, SymInterval};
use super::state::{BlockId, Child, LoopId, State};
use crate::error::{Error, Result};
use crate::program::{Access, Expr, IterKind, Store};

/// For a block `b`, the ranges of the loops strictly inside `target`, and, for a buffer in
/// `scope` below global memory, of the thread-bound loops above `target` that the buffer is
/// shared across (TVM's `LoopDomainOfSRefTreePath` with an extra relax scope): a shared cache
/// computed under `threadIdx` holds what every thread of the block reads.
fn inner_ranges(st: &State, b: BlockId, target: LoopId, scope: Option<&str>) -> Ranges {
    let loops = st.loops_of(b);
    let start = loops
        .iter()
        .position(|&l| l == target)
        .map(|i| i + 1)
        .unwrap_or(0);
    let shared_across = |l: LoopId| match (scope, &st.loops[l].thread) {
        (Some(scope), Some(thread)) => can_relax_under_thread(scope, thread),
        _ => false,
    };
    loops[..start]
        .iter()
        .copied()
        .filter(|&l| shared_across(l))
        .chain(loops[start..].iter().copied())
        .map(|l| (st.loops[l].var.clone(), st.loops[l].extent))
        .collect()
}

/// Whether a buffer in storage `scope` is shared by the threads of loops bound to `thread`, so
/// that a region computed for one of them must cover them all (TVM's
/// `CanRelaxStorageUnderThread`: storage rank at most the thread's rank; warp memory only
/// across `threadIdx.x`). Global memory is never relaxed this way.
pub fn can_relax_under_thread(scope: &str, thread: &str) -> bool {
    let storage_rank = match scope.split('.').next().unwrap_or("") {
        "" | "global" => return false,
        "shared" => 1,
        "warp" => return thread == "threadIdx.x",
        "local" => 3,
        _ => 4,
    };
    let thread_rank = if thread.starts_with("vthread") || thread == "cthread" {
        1
    } else if thread.starts_with("blockIdx.") {
        0
    } else if thread.starts_with("threadIdx.") {
        1
    } else if thread.starts_with("clusterCtaIdx.") {
        2
    } else if thread.starts_with("preferredClusterCtaIdx.") {
        3
    } else {
        return false;
    };
    storage_rank <= thread_rank
}

/// Per buffer and dimension, the union of intervals `accesses` cover, relaxed over the loops
/// inside `target`.
fn required_regions(
    st: &State,
    inst: &str,
    blocks: &[BlockId],
    target: LoopId,
    writes: bool,
    buffers: &[usize],
) -> Result<BTreeMap<usize, Vec<Option<SymInterval>>>> {
    let all = st.ranges();
    let mut out: BTreeMap<usize, Vec<Option<SymInterval>>> = BTreeMap::new();
    for &rb in blocks {
        let sb = &st.blocks[rb];
        let map = |v: &str| sb.binding_of(v);
        let accesses = if writes {
            &sb.block.writes
        } else {
            &sb.block.reads
        };
        for acc in accesses.iter().filter(|a| buffers.contains(&a.buffer)) {
            // Only compute_at relaxes by storage scope; reverse_compute_at relaxes the path alone.
            let scope = (!writes).then(|| st.buffers[acc.buffer].scope.as_str());
            let relaxed = inner_ranges(st, rb, target, scope);
            let dims = out
                .entry(acc.buffer)
                .or_insert_with(|| vec![None; acc.region.len()]);
            for (d, (min, ext)) in acc.region.iter().enumerate() {
                let ext = ext.substitute(&map).as_int().ok_or_else(|| {
                    Error::schedule(
                        inst,
                        format!("non-constant region extent in block {}", sb.block.name),
                    )
                })?;
                let mut iv =
                    arith::relax(&min.substitute(&map), &relaxed, &all).ok_or_else(|| {
                        Error::schedule(
                            inst,
                            format!(
                                "cannot bound the region of block {} (non-affine index)",
                                sb.block.name
                            ),
                        )
                    })?;
                if !iv.exact {
                    return Err(Error::schedule(
                        inst,
                        format!("the region block {} needs has an extent that depends on outer loops (TVM makes a dynamic loop, which DisallowDynamicLoop rejects)", sb.block.name),
                    ));
                }
                iv.hi += ext - 1;
                dims[d] = Some(match dims[d].take() {
                    None => iv,
                    Some(prev) => union(inst, prev, iv, &all)?,
                });
            }
        }
    }
    Ok(out)
}

fn union(inst: &str, a: SymInterval, b: SymInterval, all: &Ranges) -> Result<SymInterval> {
    let diff = b.base.add(&a.base, -1);
    if !diff.is_constant() {
        // Different symbolic starts: fine when one constant interval covers the other for
        // every value of the outer loops (TVM's simplifier proves the same).
        let span = |x: &SymInterval| {
            x.base
                .bounds(&|e| arith::atom_bounds(e, all))
                .map(|(l, h)| (l + x.lo, h + x.hi))
        };
        let covers = |x: &SymInterval, y: &SymInterval| {
            x.base.is_constant()
                && matches!((span(x), span(y)), (Some((xl, xh)), Some((yl, yh))) if xl <= yl && yh <= xh)
        };
        if covers(&a, &b) {
            return Ok(SymInterval {
                exact: a.exact && b.exact,
                ..a
            });
        }
        if covers(&b, &a) {
            return Ok(SymInterval {
                exact: a.exact && b.exact,
                ..b
            });
        }
        return Err(Error::schedule(
            inst,
            "regions with different symbolic bases cannot be united",
        ));
    }
    let d = diff.constant;
    Ok(SymInterval {
        base: a.base,
        lo: a.lo.min(b.lo + d),
        hi: a.hi.max(b.hi + d),
        exact: a.exact && b.exact,
    })
}

/// Solves the iteration domain of `b`'s variables from the regions it provides (`provided`,
/// in its own variables) and the regions required of them.
fn solve_domains(
    st: &State,
    inst: &str,
    b: BlockId,
    provided: &[Access],
    required: &BTreeMap<usize, Vec<Option<SymInterval>>>,
) -> Result<Vec<Option<(SymInterval, i64)>>> {
    let block = &st.blocks[b].block;
    let empty = Ranges::new();
    let all = st.ranges();
    let mut doms: Vec<Option<(SymInterval, i64)>> = vec![None; block.iter_vars.len()];
    for acc in provided {
        let Some(req) = required.get(&acc.buffer) else {
            continue;
        };
        let shape = &st.buffers[acc.buffer].shape;
        for (d, (min, _)) in acc.region.iter().enumerate() {
            let Some(Some(r)) = req.get(d) else { continue };
            let l = arith::linear(min, &empty).ok_or_else(|| {
                Error::schedule(
                    inst,
                    format!("block {}: index of dimension {d} is not affine", block.name),
                )
            })?;
            if l.is_constant() {
                continue;
            }
            let (var, coef) = match l.terms.values().collect::<Vec<_>>().as_slice() {
                [(Expr::Var(v), c)] => (v.clone(), *c),
                _ => {
                    return Err(Error::schedule(
                        inst,
                        format!(
                            "block {}: cannot solve the domain from index {}",
                            block.name,
                            arith::key(min)
                        ),
                    ))
                }
            };
            let Some(i) = block.iter_vars.iter().position(|iv| iv.name == var) else {
                return Err(Error::schedule(
                    inst,
                    format!("block {}: index uses unknown variable {var}", block.name),
                ));
            };
            let dim_max = shape.get(d).copied().unwrap_or(1).max(1) - 1;
            let (dom, bound_max) = if coef == 1 {
                let shift = Lin::constant(l.constant);
                (
                    SymInterval {
                        base: r.base.add(&shift, -1),
                        lo: r.lo,
                        hi: r.hi,
                        exact: r.exact,
                    },
                    dim_max - l.constant,
                )
            } else if coef > 1 && l.constant == 0 && r.base.is_constant() {
                let lo = (r.base.constant + r.lo).div_euclid(coef);
                let hi = (r.base.constant + r.hi).div_euclid(coef);
                (
                    SymInterval {
                        base: Lin::constant(0),
                        lo,
                        hi,
                        exact: r.exact,
                    },
                    dim_max.div_euclid(coef),
                )
            } else {
                return Err(Error::schedule(
                    inst,
                    format!(
                        "block {}: cannot solve the domain from index {}",
                        block.name,
                        arith::key(min)
                    ),
                ));
            };
            doms[i] = Some(match doms[i].take() {
                None => (dom, bound_max),
                Some((prev, pb)) => (union(inst, prev, dom, &all)?, pb.min(bound_max)),
            });
        }
    }
    Ok(doms)
}

/// Clamps a domain to the iteration variable's range the way TVM does: keep it when provably
/// inside, take the bound when provably covering it, intersect when constant.
/// A domain that straddles the range's edge depending on outer loops is kept whole (TVM adds a
/// predicate). `None` is reserved for domains that cannot be placed at all.
fn clamp(dom: SymInterval, bound_max: i64, all: &Ranges) -> Option<(Lin, i64, i64)> {
    let (bmin, bmax) = dom
        .base
        .bounds(&|x| arith::atom_bounds(x, all))
        .unwrap_or((i64::MIN / 4, i64::MAX / 4));
    if dom.base.is_constant() {
        let lo = (dom.base.constant + dom.lo).max(0);
        let hi = (dom.base.constant + dom.hi).min(bound_max);
        return Some((Lin::constant(0), lo, hi.max(lo)));
    }
    if bmin + dom.lo >= 0 && bmax + dom.hi <= bound_max {
        Some((dom.base, dom.lo, dom.hi))
    } else if bmax + dom.lo <= 0 && bmin + dom.hi >= bound_max {
        Some((Lin::constant(0), 0, bound_max))
    } else {
        Some((dom.base, dom.lo, dom.hi))
    }
}

/// compute_at (`reverse == false`) and reverse_compute_at (`reverse == true`).
pub fn compute_at(
    st: &mut State,
    b: BlockId,
    target: LoopId,
    preserve_unit_loops: bool,
    index: i64,
    reverse: bool,
) -> Result<()> {
    let inst = if reverse {
        "ReverseComputeAt"
    } else {
        "ComputeAt"
    };
    check_movable(st, inst, b, target, reverse)?;
    let producers = st.producers(b);
    let consumers = st.consumers(b);
    let pos = insertion_position(st, inst, b, target, index, reverse, &producers, &consumers)?;
    let block = st.blocks[b].block.clone();
    let (provided, req_blocks, req_writes) = if reverse {
        (&block.reads, &producers, true)
    } else {
        (&block.writes, &consumers, false)
    };
    let bufs: Vec<usize> = provided.iter().map(|a| a.buffer).collect();
    let required = required_regions(st, inst, req_blocks, target, req_writes, &bufs)?;
    let doms = solve_domains(st, inst, b, provided, &required)?;
    let all = st.ranges();
    // Every domain is checked before the tree changes.
    let mut spans = Vec::new();
    for (iv, dom) in block.iter_vars.iter().zip(doms) {
        spans.push(match dom {
            Some((d, bound_max)) => clamp(d, bound_max.min(iv.extent - 1), &all).ok_or_else(|| {
                Error::schedule(
                    inst,
                    format!(
                        "the domain of {} of block {} crosses its range depending on outer loops (TVM makes a dynamic loop, which DisallowDynamicLoop rejects)",
                        iv.name, block.name
                    ),
                )
            })?,
            None => (Lin::constant(0), 0, iv.extent - 1),
        });
    }
    st.detach(Child::Block(b))?;
    let (parent, insert_at, bindings) =
        new_loop_nest(st, target, pos, spans, preserve_unit_loops, &all);
    st.blocks[b].bindings = bindings;
    st.blocks[b].predicate = Expr::Bool(true);
    st.insert(parent, insert_at, Child::Block(b));
    // Only `b` moved: the bindings of the other blocks under `target` are as they were.
    st.simplify_block_bindings(b);
    Ok(())
}

/// TVM's preconditions of (reverse_)compute_at that do not depend on the insertion point.
fn check_movable(st: &State, inst: &str, b: BlockId, target: LoopId, reverse: bool) -> Result<()> {
    if b == st.root || !st.blocks[b].alive {
        return Err(Error::schedule(
            inst,
            "the block is the root or no longer exists",
        ));
    }
    if !st.loops[target].alive {
        return Err(Error::schedule(inst, "the loop no longer exists"));
    }
    let name = &st.blocks[b].block.name;
    if st.is_ancestor(target, Child::Block(b)) {
        return Err(Error::schedule(
            inst,
            format!(
                "loop {} is an ancestor of block {name}",
                st.loops[target].var
            ),
        ));
    }
    if !reverse
        && st.blocks[b]
            .block
            .writes
            .iter()
            .any(|w| st.is_param(w.buffer))
    {
        return Err(Error::schedule(
            inst,
            format!("block {name} is an output block"),
        ));
    }
    Ok(())
}

/// Where under `target` the moved block goes: after its last producer and before its first
/// consumer (`index` -1 and -2 are TVM's "just before the first consumer" and "just after the
/// last producer"); every consumer (producer, when `reverse`) must be under the loop.
#[allow(clippy::too_many_arguments)]
fn insertion_position(
    st: &State,
    inst: &str,
    b: BlockId,
    target: LoopId,
    index: i64,
    reverse: bool,
    producers: &[BlockId],
    consumers: &[BlockId],
) -> Result<usize> {
    let name = &st.blocks[b].block.name;
    let kids = &st.loops[target].children;
    let mut last_producer: i64 = -1;
    let mut first_consumer: i64 = kids.len() as i64;
    let (mut n_prod, mut n_cons) = (0, 0);
    for (i, &c) in kids.iter().enumerate() {
        let mut under = Vec::new();
        st.blocks_in(c, &mut under);
        let p = under.iter().filter(|x| producers.contains(x)).count();
        let q = under.iter().filter(|x| consumers.contains(x)).count();
        n_prod += p;
        n_cons += q;
        if p > 0 {
            last_producer = i as i64;
        }
        if q > 0 && first_consumer == kids.len() as i64 {
            first_consumer = i as i64;
        }
    }
    if !reverse && n_cons < consumers.len() {
        return Err(Error::schedule(
            inst,
            format!("not all consumers of block {name} are under the target loop"),
        ));
    }
    if reverse && n_prod < producers.len() {
        return Err(Error::schedule(
            inst,
            format!("not all producers of block {name} are under the target loop"),
        ));
    }
    if last_producer >= first_consumer {
        return Err(Error::schedule(
            inst,
            "a consumer comes before a producer under the target loop",
        ));
    }
    Ok(match index {
        -1 => first_consumer,
        -2 => last_producer + 1,
        i if i > last_producer && i <= first_consumer => i,
        i => {
            return Err(Error::schedule(
                inst,
                format!("insertion index {i} is not valid"),
            ))
        }
    } as usize)
}

/// The loops of a moved block, one per iteration variable over its span (unit loops kept on
/// request), inserted at `pos` under `target`: the innermost parent, the position there, and
/// the block's new bindings.
fn new_loop_nest(
    st: &mut State,
    target: LoopId,
    pos: usize,
    spans: Vec<(Lin, i64, i64)>,
    preserve_unit_loops: bool,
    all: &Ranges,
) -> (Option<LoopId>, usize, Vec<Expr>) {
    let mut parent = Some(target);
    let mut insert_at = pos;
    let mut bindings = Vec::new();
    for (base, lo, hi) in spans {
        let extent = hi - lo + 1;
        // TVM's analyzer knows the outer loop ranges: a unit loop's variable is 0 there.
        let unit = |v: &str| (all.get(v) == Some(&1)).then_some(Expr::Int(0));
        let start = arith::linear(&base.to_expr().substitute(&unit), all)
            .unwrap_or(base)
            .add(&Lin::constant(lo), 1);
        if preserve_unit_loops || extent != 1 {
            let l = st.new_loop(extent, parent);
            st.insert(parent, insert_at, Child::Loop(l));
            bindings.push(
                start
                    .add(&Lin::atom(Expr::Var(st.loops[l].var.clone())), 1)
                    .to_expr(),
            );
            parent = Some(l);
            insert_at = 0;
        } else {
            bindings.push(start.to_expr());
        }
    }
    (parent, insert_at, bindings)
}

/// The iteration variable stored at each index of a block's single store: TVM inlines only
/// blocks of the form `B[v0, v1, ...] = f(...)` with distinct variables.
fn store_vars(st: &State, inst: &str, b: BlockId) -> Result<(Store, Vec<String>)> {
    let blk = &st.blocks[b].block;
    let [store] = blk.body.as_slice() else {
        return Err(Error::schedule(
            inst,
            format!("block {} does not have a single store", blk.name),
        ));
    };
    let mut vars = Vec::new();
    for e in &store.indices {
        match e {
            Expr::Var(v) if !vars.contains(v) && blk.iter_vars.iter().any(|iv| &iv.name == v) => {
                vars.push(v.clone())
            }
            _ => {
                return Err(Error::schedule(
                    inst,
                    format!(
                        "block {} does not store at distinct iteration variables",
                        blk.name
                    ),
                ))
            }
        }
    }
    Ok((store.clone(), vars))
}

pub(super) fn replace_loads(e: &Expr, buffer: usize, f: &impl Fn(&[Expr]) -> Expr) -> Expr {
    match e {
        Expr::Load { buffer: b, indices } if *b == buffer => {
            let idx: Vec<Expr> = indices
                .iter()
                .map(|i| replace_loads(i, buffer, f))
                .collect();
            f(&idx)
        }
        Expr::Load { buffer: b, indices } => Expr::Load {
            buffer: *b,
            indices: indices
                .iter()
                .map(|i| replace_loads(i, buffer, f))
                .collect(),
        },
        Expr::Bin(op, a, c) => Expr::Bin(
            *op,
            Box::new(replace_loads(a, buffer, f)),
            Box::new(replace_loads(c, buffer, f)),
        ),
        Expr::Not(a) => Expr::Not(Box::new(replace_loads(a, buffer, f))),
        Expr::Select(c, a, d) => Expr::Select(
            Box::new(replace_loads(c, buffer, f)),
            Box::new(replace_loads(a, buffer, f)),
            Box::new(replace_loads(d, buffer, f)),
        ),
        Expr::Cast { dtype, value } => Expr::Cast {
            dtype: dtype.clone(),
            value: Box::new(replace_loads(value, buffer, f)),
        },
        Expr::Call { name, dtype, args } => Expr::Call {
            name: name.clone(),
            dtype: dtype.clone(),
            args: args.iter().map(|a| replace_loads(a, buffer, f)).collect(),
        },
        Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } | Expr::Var(_) => e.clone(),
    }
}

fn collect_loads(e: &Expr, buffer: usize, out: &mut Vec<Vec<Expr>>) {
    e.visit(&mut |x| {
        if let Expr::Load { buffer: b, indices } = x {
            if *b == buffer {
                out.push(indices.clone());
            }
        }
    });
}

fn subst_access(a: &Access, map: &impl Fn(&str) -> Option<Expr>) -> Access {
    Access {
        buffer: a.buffer,
        region: a
            .region
            .iter()
            .map(|(m, e)| (m.substitute(map), e.substitute(map)))
            .collect(),
    }
}

fn remove_alloc(st: &mut State, buffer: usize) {
    let root = st.root;
    st.blocks[root].block.alloc_buffers.retain(|&x| x != buffer);
}

/// Inlines a spatial producer into its consumers.
pub fn compute_inline(st: &mut State, b: BlockId) -> Result<()> {
    const I: &str = "ComputeInline";
    if b == st.root || !st.blocks[b].alive {
        return Err(Error::schedule(
            I,
            "the block is the root or no longer exists",
        ));
    }
    let blk = st.blocks[b].block.clone();
    if blk.init.is_some() || blk.iter_vars.iter().any(|v| v.kind != IterKind::Spatial) {
        return Err(Error::schedule(
            I,
            format!("block {} is not a spatial block", blk.name),
        ));
    }
    let (store, vars) = store_vars(st, I, b)?;
    if st.is_param(store.buffer) {
        return Err(Error::schedule(
            I,
            format!("block {} writes an output buffer", blk.name),
        ));
    }
    let buf = store.buffer;
    let subst_for = |idx: &[Expr]| {
        let vars = vars.clone();
        let idx = idx.to_vec();
        move |v: &str| vars.iter().position(|n| n == v).map(|i| idx[i].clone())
    };
    for c in st.consumers(b) {
        let cb = &mut st.blocks[c].block;
        let mut loads = Vec::new();
        for s in cb.body.iter().chain(cb.init.iter().flatten()) {
            collect_loads(&s.value, buf, &mut loads);
            for i in &s.indices {
                collect_loads(i, buf, &mut loads);
            }
        }
        let f = |idx: &[Expr]| store.value.substitute(&subst_for(idx));
        for s in cb.body.iter_mut().chain(cb.init.iter_mut().flatten()) {
            s.value = replace_loads(&s.value, buf, &f);
        }
        // The producer's reads take the place of the inlined buffer's (read indices stay
        // meaningful for later cache_read).
        let mut inlined: Vec<Access> = Vec::new();
        for idx in &loads {
            for a in &blk.reads {
                let acc = subst_access(a, &subst_for(idx));
                if !inlined.contains(&acc) {
                    inlined.push(acc);
                }
            }
        }
        let mut reads: Vec<Access> = Vec::new();
        for a in &cb.reads {
            if a.buffer == buf {
                for x in inlined.drain(..) {
                    if !reads.contains(&x) {
                        reads.push(x);
                    }
                }
            } else if !reads.contains(a) {
                reads.push(a.clone());
            }
        }
        reads.extend(inlined);
        cb.reads = reads;
    }
    st.detach(Child::Block(b))?;
    st.blocks[b].alive = false;
    remove_alloc(st, buf);
    Ok(())
}

/// Inlines a spatial consumer into its single producer.
pub fn reverse_compute_inline(st: &mut State, b: BlockId) -> Result<()> {
    const I: &str = "ReverseComputeInline";
    if b == st.root || !st.blocks[b].alive {
        return Err(Error::schedule(
            I,
            "the block is the root or no longer exists",
        ));
    }
    let blk = st.blocks[b].block.clone();
    if blk.init.is_some() || blk.iter_vars.iter().any(|v| v.kind != IterKind::Spatial) {
        return Err(Error::schedule(
            I,
            format!("block {} is not a spatial block", blk.name),
        ));
    }
    let [store] = blk.body.as_slice() else {
        return Err(Error::schedule(
            I,
            format!("block {} does not have a single store", blk.name),
        ));
    };
    let producers = st.producers(b);
    let [p] = producers.as_slice() else {
        return Err(Error::schedule(
            I,
            format!("block {} does not have exactly one producer", blk.name),
        ));
    };
    let p = *p;
    if st.blocks[p].block.init.is_some() {
        return Err(Error::schedule(
            I,
            format!("producer {} is a reduction block", st.blocks[p].block.name),
        ));
    }
    let (pstore, _) = store_vars(st, I, p)?;
    let buf = pstore.buffer;
    let mut loads = Vec::new();
    collect_loads(&store.value, buf, &mut loads);
    let Some(first) = loads.first() else {
        return Err(Error::schedule(
            I,
            format!("block {} does not load its producer's buffer", blk.name),
        ));
    };
    if loads.iter().any(|l| l != first) {
        return Err(Error::schedule(
            I,
            "the producer's buffer is loaded at different indices",
        ));
    }
    // Consumer variable -> producer index expression at the dimension it loads.
    let mut map = Vec::new();
    for (d, e) in first.iter().enumerate() {
        match e {
            Expr::Var(v) if !map.iter().any(|(n, _): &(String, Expr)| n == v) => {
                map.push((v.clone(), pstore.indices[d].clone()))
            }
            _ => {
                return Err(Error::schedule(
                    I,
                    "the consumer's load indices are not distinct iteration variables",
                ))
            }
        }
    }
    if map.len() != blk.iter_vars.len() {
        return Err(Error::schedule(
            I,
            "the consumer's load does not use all its iteration variables",
        ));
    }
    let sub = |v: &str| map.iter().find(|(n, _)| n == v).map(|(_, e)| e.clone());
    let value = replace_loads(&store.value.substitute(&sub), buf, &|_: &[Expr]| {
        pstore.value.clone()
    });
    let new_store = Store {
        buffer: store.buffer,
        indices: store.indices.iter().map(|e| e.substitute(&sub)).collect(),
        value,
    };
    let pb = &mut st.blocks[p].block;
    pb.body = vec![new_store];
    pb.writes = blk.writes.iter().map(|a| subst_access(a, &sub)).collect();
    for a in blk.reads.iter().filter(|a| a.buffer != buf) {
        let acc = subst_access(a, &sub);
        if !pb.reads.contains(&acc) {
            pb.reads.push(acc);
        }
    }
    st.detach(Child::Block(b))?;
    st.blocks[b].alive = false;
    remove_alloc(st, buf);
    Ok(())
}
