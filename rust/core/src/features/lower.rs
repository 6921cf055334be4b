//! The effect of the lowering passes TVM runs before extracting per-store features
//! (`PassListForPerStoreFeature`), modelled on the schedule state:
//!
//! * unit loops (serial, extent 1, no annotation) disappear, their variable becomes 0, and a
//!   `Select` without buffer loads becomes the constant 1 (SimplifyForFeatureExtraction);
//! * block variables are replaced by their bindings and reduction inits run inline before
//!   the update (ConvertBlocksToOpaque, LowerInitBlock);
//! * each allocated buffer moves to the lowest common loop of its accesses and shrinks to the
//!   region accessed under that loop, with indices shifted accordingly
//!   (PlanAndUpdateBufferAllocationLocation, CompactBufferAllocation);
//! * integer indices take the simplifier's normal form (StmtSimplify).
//!
//! On a GPU ([`lower_for`] with `gpu`), three passes of the list matter too:
//!
//! * LowerCrossThreadReduction: a reduction with a reduction loop bound to a thread becomes an
//!   in-thread reduction into a one-element local buffer (`in_thread_<name>`, when a reduction
//!   loop is not bound or the block has a predicate), an all-reduce across the threads (no
//!   store) into `cross_thread_<name>`, and a write-back of that into the buffer, under the
//!   bound reduction loops only;
//! * PlanAndUpdateBufferAllocationLocation keeps a global buffer's allocation above every
//!   `blockIdx` loop;
//! * UnifyThreadBinding: in each kernel (the subtree of an outermost thread-bound loop), the
//!   loops bound to one thread tag become one loop (the first), and all of the kernel's thread
//!   loops move to its top, in the order they first occur; every store and allocation inside
//!   the kernel is then under all of them.

use std::collections::HashMap;

use super::index::{gcd, sum_bounds_capped, Canon, Extents, Index, Split, Sum};
use crate::error::{Error, Result};
use crate::program::{BinOp, Buffer, Expr, IterKind, LoopKind};
use crate::schedule::arith::uses_var;
use crate::schedule::compute::can_relax_under_thread;
use crate::schedule::state::{Child, State};

#[derive(Clone, Debug)]
pub struct LLoop {
    pub var: String,
    pub extent: i64,
    pub kind: LoopKind,
    pub thread: Option<String>,
    /// `pragma_auto_unroll_max_step`, where annotated.
    pub auto_unroll: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct LStore {
    pub buffer: usize,
    pub indices: Vec<Expr>,
    pub value: Expr,
    /// Enclosing loops, outermost first (indices into [`Lowered::loops`]).
    pub loops: Vec<usize>,
    /// TVM skips stores of a literal (reduction inits).
    pub constant: bool,
}

/// An allocated buffer: where it is allocated (enclosing loops) after lowering.
#[derive(Clone, Debug)]
pub struct LAlloc {
    pub buffer: usize,
    pub loops: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct Lowered {
    pub loops: Vec<LLoop>,
    pub stores: Vec<LStore>,
    /// Shape of every buffer after compaction.
    pub shapes: Vec<Vec<i64>>,
    pub allocs: Vec<LAlloc>,
    /// Buffers the lowering adds (the cross-thread reductions' local buffers), numbered after
    /// the state's: buffer `st.buffers.len() + i` is `extra_buffers[i]`.
    pub extra_buffers: Vec<Buffer>,
}

impl Lowered {
    /// A buffer of the state or one the lowering added.
    pub fn buffer<'a>(&'a self, st: &'a State, b: usize) -> &'a Buffer {
        st.buffers
            .get(b)
            .unwrap_or_else(|| &self.extra_buffers[b - st.buffers.len()])
    }
}

/// A store before index normalization: indices still as expressions in loop variables.
struct RawStore {
    block: usize,
    buffer: usize,
    indices: Vec<Expr>,
    value: Expr,
    loops: Vec<usize>,
    constant: bool,
    /// The block's predicate (in loop variables).
    predicate: Expr,
}

struct Walker<'a> {
    st: &'a State,
    gpu: bool,
    loops: Vec<LLoop>,
    /// Each loop's enclosing loops, itself last.
    paths: Vec<Vec<usize>>,
    extents: Extents,
    stores: Vec<RawStore>,
    /// Buffers the cross-thread reductions add, and where each is allocated.
    extra: Vec<Buffer>,
    extra_allocs: Vec<LAlloc>,
}

fn is_literal(e: &Expr) -> bool {
    matches!(e, Expr::Int(_) | Expr::Float { .. } | Expr::Bool(_))
}

fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= matches!(x, Expr::Load { .. }));
    found
}

/// SimplifyForFeatureExtraction's rewrite: a select reading no buffer becomes 1.
fn drop_pure_selects(e: &Expr, dtype: &str) -> Expr {
    match e {
        Expr::Select(c, a, b) => {
            if has_load(c) || has_load(a) || has_load(b) {
                // The program model imports TIR's `if_then_else` (padding) as a select; TVM
                // counts it as a pure call, and a genuine select reading buffers is rare.
                Expr::Call {
                    name: "tirx.if_then_else".into(),
                    dtype: dtype.to_string(),
                    args: vec![
                        drop_pure_selects(c, "bool"),
                        drop_pure_selects(a, dtype),
                        drop_pure_selects(b, dtype),
                    ],
                }
            } else if dtype.starts_with("float") {
                Expr::Float {
                    value: 1.0,
                    dtype: dtype.to_string(),
                }
            } else {
                Expr::Int(1)
            }
        }
        Expr::Bin(op, a, b) => Expr::Bin(
            *op,
            Box::new(drop_pure_selects(a, dtype)),
            Box::new(drop_pure_selects(b, dtype)),
        ),
        Expr::Not(a) => Expr::Not(Box::new(drop_pure_selects(a, dtype))),
        Expr::Cast { dtype: d, value } => Expr::Cast {
            dtype: d.clone(),
            value: Box::new(drop_pure_selects(value, d)),
        },
        Expr::Load { buffer, indices } => Expr::Load {
            buffer: *buffer,
            indices: indices.clone(),
        },
        Expr::Call {
            name,
            dtype: d,
            args,
        } => Expr::Call {
            name: name.clone(),
            dtype: d.clone(),
            args: args.iter().map(|a| drop_pure_selects(a, d)).collect(),
        },
        _ => e.clone(),
    }
}

impl<'a> Walker<'a> {
    fn walk(&mut self, children: &[Child], path: &mut Vec<usize>) -> Result<()> {
        for &c in children {
            match c {
                Child::Loop(l) => {
                    let lp = &self.st.loops[l];
                    self.extents.insert(lp.var.clone(), lp.extent);
                    if lp.extent <= 0 {
                        continue;
                    }
                    let unit = lp.extent == 1
                        && lp.kind == LoopKind::Serial
                        && lp.thread.is_none()
                        && lp.annotations.is_empty();
                    if unit {
                        self.walk(&lp.children, path)?;
                        continue;
                    }
                    let auto_unroll = lp
                        .annotations
                        .get("pragma_auto_unroll_max_step")
                        .and_then(|v| v.as_i64());
                    self.loops.push(LLoop {
                        var: lp.var.clone(),
                        extent: lp.extent,
                        kind: lp.kind,
                        thread: lp.thread.clone(),
                        auto_unroll,
                    });
                    path.push(self.loops.len() - 1);
                    self.paths.push(path.clone());
                    self.walk(&lp.children, path)?;
                    path.pop();
                }
                Child::Block(b) => self.block(b, path)?,
            }
        }
        Ok(())
    }

    fn block(&mut self, b: usize, path: &[usize]) -> Result<()> {
        let st: &'a State = self.st;
        let sb = &st.blocks[b];
        let blk = &sb.block;
        if blk.children.is_some() {
            return Err(Error::Unsupported(format!(
                "block {} has child statements",
                blk.name
            )));
        }
        let map: HashMap<&str, &Expr> = blk
            .iter_vars
            .iter()
            .map(|v| v.name.as_str())
            .zip(sb.bindings.iter())
            .collect();
        let sub = |e: &Expr| e.substitute(&|v: &str| map.get(v).map(|x| (*x).clone()));
        if self.gpu && blk.init.is_some() {
            let reduction: Vec<usize> = path
                .iter()
                .copied()
                .filter(|&l| {
                    let var = &self.loops[l].var;
                    blk.iter_vars
                        .iter()
                        .zip(&sb.bindings)
                        .any(|(iv, e)| iv.kind == IterKind::Reduce && uses_var(e, var))
                })
                .collect();
            if reduction.iter().any(|&l| self.loops[l].thread.is_some()) {
                let has_predicate = !matches!(sb.predicate, Expr::Bool(true));
                return self.cross_thread_reduction(b, path, &reduction, has_predicate, &sub);
            }
        }
        for s in blk.init.iter().flatten().chain(blk.body.iter()) {
            let dtype = &self.st.buffers[s.buffer].dtype;
            let value = drop_pure_selects(&sub(&s.value), dtype);
            self.stores.push(RawStore {
                block: b,
                buffer: s.buffer,
                indices: s.indices.iter().map(sub).collect(),
                constant: is_literal(&value),
                value,
                loops: path.to_vec(),
                predicate: sb.predicate.clone(),
            });
        }
        Ok(())
    }

    /// LowerCrossThreadReduction of block `b` (its reduction loops `reduction`, in `path`
    /// order): the init goes (the in-thread init stores a literal); with `in_thread` (a
    /// reduction loop not bound to a thread, or a predicate), each update stores into a new
    /// one-element local buffer under the loops outside the reduction, the bound reduction
    /// loops, then the others; the result is written back from the all-reduce's local buffer
    /// under the loops outside and the bound reduction loops.
    fn cross_thread_reduction(
        &mut self,
        b: usize,
        path: &[usize],
        reduction: &[usize],
        has_predicate: bool,
        sub: &impl Fn(&Expr) -> Expr,
    ) -> Result<()> {
        let st: &'a State = self.st;
        let blk = &st.blocks[b].block;
        let first = path.iter().position(|&l| l == reduction[0]).unwrap_or(0);
        let (bound, unbound): (Vec<usize>, Vec<usize>) = reduction
            .iter()
            .partition(|&&l| self.loops[l].thread.is_some());
        let mut outer_bound: Vec<usize> = path[..first].to_vec();
        outer_bound.extend(&bound);
        let in_thread = !unbound.is_empty() || has_predicate;
        let n_state = st.buffers.len();
        for s in &blk.body {
            let buffer = &st.buffers[s.buffer];
            let local = |prefix: &str| Buffer {
                name: format!("{prefix}_thread_{}", buffer.name),
                shape: vec![1],
                dtype: buffer.dtype.clone(),
                scope: "local".into(),
            };
            let cross = n_state + self.extra.len();
            self.extra.push(local("cross"));
            if in_thread {
                let it = n_state + self.extra.len();
                self.extra.push(local("in"));
                self.extra_allocs.push(LAlloc {
                    buffer: it,
                    loops: outer_bound.clone(),
                });
                let value = drop_pure_selects(&sub(&s.value), &buffer.dtype);
                let value = replace_loads(&value, s.buffer, it);
                let mut loops = outer_bound.clone();
                loops.extend(&unbound);
                self.stores.push(RawStore {
                    block: b,
                    buffer: it,
                    indices: vec![Expr::Int(0)],
                    constant: is_literal(&value),
                    value,
                    loops,
                    predicate: st.blocks[b].predicate.clone(),
                });
            }
            self.stores.push(RawStore {
                block: b,
                buffer: s.buffer,
                indices: s.indices.iter().map(sub).collect(),
                value: Expr::Load {
                    buffer: cross,
                    indices: vec![Expr::Int(0)],
                },
                loops: outer_bound.clone(),
                constant: false,
                predicate: Expr::Bool(true),
            });
        }
        Ok(())
    }
}

/// `e` with every load of `from` (at any index) a load of `to[0]`.
fn replace_loads(e: &Expr, from: usize, to: usize) -> Expr {
    match e {
        Expr::Load { buffer, .. } if *buffer == from => Expr::Load {
            buffer: to,
            indices: vec![Expr::Int(0)],
        },
        Expr::Load { buffer, indices } => Expr::Load {
            buffer: *buffer,
            indices: indices.iter().map(|i| replace_loads(i, from, to)).collect(),
        },
        Expr::Bin(op, a, b) => Expr::Bin(
            *op,
            Box::new(replace_loads(a, from, to)),
            Box::new(replace_loads(b, from, to)),
        ),
        Expr::Not(a) => Expr::Not(Box::new(replace_loads(a, from, to))),
        Expr::Select(c, a, b) => Expr::Select(
            Box::new(replace_loads(c, from, to)),
            Box::new(replace_loads(a, from, to)),
            Box::new(replace_loads(b, from, to)),
        ),
        Expr::Cast { dtype, value } => Expr::Cast {
            dtype: dtype.clone(),
            value: Box::new(replace_loads(value, from, to)),
        },
        Expr::Call { name, dtype, args } => Expr::Call {
            name: name.clone(),
            dtype: dtype.clone(),
            args: args.iter().map(|a| replace_loads(a, from, to)).collect(),
        },
        _ => e.clone(),
    }
}

fn unsupported_index(e: &Expr) -> Error {
    Error::Unsupported(format!(
        "index expression outside the affine and floordiv/floormod forms: {}",
        e.to_json()
    ))
}

/// Region of one access dimension relative to an allocation point: the part in outer
/// (fixed) variables, and the inclusive range of the rest.
struct DimRegion {
    outer: Sum,
    lo: i64,
    hi: i64,
}

fn index_vars(i: &Index, out: &mut Vec<String>) {
    match i {
        Index::Var(v) => {
            if !out.contains(v) {
                out.push(v.clone())
            }
        }
        Index::Sum(s) => s.vars(out),
    }
}

/// Which variables a term reads, relative to an allocation point.
#[derive(PartialEq)]
enum Side {
    Outer,
    Inner,
    Both,
}

fn side(t: &Split, outer_vars: &[String]) -> Side {
    let mut vs = Vec::new();
    index_vars(&t.index, &mut vs);
    let outer = vs.iter().filter(|v| outer_vars.contains(v)).count();
    if outer == vs.len() {
        Side::Outer
    } else if outer == 0 {
        Side::Inner
    } else {
        Side::Both
    }
}

fn dim_region(canon: &Canon, s: &Sum, outer_vars: &[String], preds: &[(Sum, i64)]) -> DimRegion {
    let mut outer = Sum::constant(0);
    let mut inner = Sum::constant(s.base);
    let mut inner_span = 0;
    for t in &s.terms {
        if side(t, outer_vars) == Side::Outer {
            outer = outer.add(&Sum::term(t.clone()), 1);
        } else if let Some((start, span)) = split_over_inner(canon, t, outer_vars) {
            // `floordiv(O + I, k) * c` with `I` spanning a multiple of `k`: an outer start
            // and a constant span, as TVM's simplifier proves.
            outer = outer.add(&start, 1);
            inner = inner.add(&Sum::constant(span.min(0)), 1);
            inner_span += span.abs();
        } else {
            inner = inner.add(&Sum::term(t.clone()), 1);
        }
    }
    let (lo, mut hi) = sum_bounds_capped(&inner, &|v| canon.var_bounds(v), &|i| {
        predicate_cap(canon, i, preds)
    });
    // A fused copy's whole index under its predicate (`fused * 16 + tx // 2` with
    // `fused * 32 + tx < 514`), not only a split of it.
    if inner_span == 0 && inner.terms.len() > 1 {
        let rest = Sum {
            terms: inner.terms.clone(),
            base: 0,
        };
        if let Some(c) = predicate_cap(canon, &Index::Sum(Box::new(rest)), preds) {
            hi = hi.min(c.saturating_add(inner.base)).max(lo);
        }
    }
    DimRegion {
        outer,
        lo,
        hi: hi + inner_span,
    }
}

/// A block predicate's conjuncts `S < c` (`S` a sum of terms with positive scales, no
/// constant): what CompactBufferAllocation's region estimate (an iterator map under the
/// predicate) may use to bound the indices of the block's accesses. `true` where `None`.
fn predicate_sums(canon: &Canon, e: &Expr, out: &mut Vec<(Sum, i64)>) {
    match e {
        Expr::Bin(BinOp::And, a, b) => {
            predicate_sums(canon, a, out);
            predicate_sums(canon, b, out);
        }
        Expr::Bin(op @ (BinOp::Lt | BinOp::Le), a, b) => {
            let (Some(x), Some(y)) = (canon.sum(a), canon.sum(b)) else {
                return;
            };
            let mut d = x.add(&y, -1);
            // d.terms + d.base < 0 (or <= 0): terms < -base (or < 1 - base).
            let c = -d.base + i64::from(*op == BinOp::Le);
            d.base = 0;
            if !d.terms.is_empty() && d.terms.iter().all(|t| t.scale > 0) {
                out.push((d, c));
            }
        }
        _ => {}
    }
}

/// The upper bound a predicate `S < c` gives an index `T` where `S = d * T + R` with `R`
/// (the rest of `S`'s terms) within `[0, d)`: `T <= (c - 1) / d`.
fn predicate_cap(canon: &Canon, index: &Index, preds: &[(Sum, i64)]) -> Option<i64> {
    let t = match index {
        Index::Var(v) => Sum::term(Split {
            index: Index::Var(v.clone()),
            lower: 1,
            upper: None,
            scale: 1,
        }),
        Index::Sum(s) => (**s).clone(),
    };
    if t.base != 0 || t.terms.is_empty() {
        return None;
    }
    preds
        .iter()
        .filter_map(|(s, c)| {
            // d from a term of `T` and the term of `S` over the same index:
            // `scale_s * (x // lower_s) == d * scale_t * (x // lower_t)`.
            let u = &t.terms[0];
            let w = s
                .terms
                .iter()
                .find(|w| w.index == u.index && w.upper == u.upper)?;
            let num = w.scale.checked_mul(u.lower)?;
            let den = u.scale.checked_mul(w.lower)?;
            if den <= 0 || num % den != 0 {
                return None;
            }
            let d = num / den;
            (d > 0 && same_sum(&canon.div(s, d), &t)).then(|| (c - 1).div_euclid(d))
        })
        .min()
}

/// Whether two canonical sums have the same terms (in any order) and constant.
fn same_sum(a: &Sum, b: &Sum) -> bool {
    a.base == b.base
        && a.terms.len() == b.terms.len()
        && a.terms.iter().all(|x| {
            b.terms
                .iter()
                .any(|y| same_split(x, y) && x.scale == y.scale)
        })
}

fn same_split(a: &Split, b: &Split) -> bool {
    a.index == b.index && a.lower == b.lower && a.upper == b.upper
}

/// `floordiv(O + I, k) * c`, `O` in outer and `I` in inner variables only, where the range of
/// `I`, `[a, b]`, has `k | b - a`: `floordiv(O + b, k) == floordiv(O + a, k) + (b - a) / k`, so
/// the term is `floordiv(O + a, k) * c` plus a constant span `c * (b - a) / k` (after dividing
/// `O`, `I` and `k` by a common factor of `O` and `k`).
fn split_over_inner(canon: &Canon, t: &Split, outer_vars: &[String]) -> Option<(Sum, i64)> {
    let Index::Sum(s) = &t.index else { return None };
    if t.upper.is_some() || t.lower <= 1 {
        return None;
    }
    let (mut o, mut i) = (Sum::constant(s.base), Sum::constant(0));
    for u in &s.terms {
        match side(u, outer_vars) {
            Side::Outer => o = o.add(&Sum::term(u.clone()), 1),
            Side::Inner => i = i.add(&Sum::term(u.clone()), 1),
            Side::Both => return None,
        }
    }
    let (a, b) = canon.bounds(&i);
    if o.is_constant() || i.is_constant() || a < 0 {
        return None;
    }
    // floordiv(g * O' + I, g * q) == floordiv(O' + floordiv(I, g), q) for `g` dividing `k`
    // and every coefficient of `O` (TVM's rewrite rule for `floordiv(x * c1 + y, c2)`).
    let g = o
        .terms
        .iter()
        .fold(gcd(o.base, t.lower), |acc, u| gcd(acc, u.scale));
    let (a, b, q) = (a.div_euclid(g), b.div_euclid(g), t.lower / g);
    if (b - a) % q != 0 {
        return None;
    }
    let o = Sum {
        terms: o
            .terms
            .iter()
            .map(|u| Split {
                scale: u.scale / g,
                ..u.clone()
            })
            .collect(),
        base: o.base / g,
    };
    let start = canon.div(&o.add(&Sum::constant(a), 1), q).scale(t.scale);
    Some((start, t.scale * ((b - a) / q)))
}

/// An access to compact a buffer by: its indices, and the block predicate's `S < c` bounds.
type Site<'a> = (&'a Vec<Sum>, Vec<(Sum, i64)>);

/// Each store's indices and loads as sums, per store: (indices, [(buffer, indices)]).
type AccessSums = (Vec<Vec<Sum>>, Vec<Vec<(usize, Vec<Sum>)>>);

/// Lowers the scheduled state to what TVM's feature extractor visits on a CPU.
pub fn lower(st: &State) -> Result<Lowered> {
    lower_for(st, false)
}

/// Lowers the scheduled state to what TVM's feature extractor visits, on a GPU with `gpu`
/// (cross-thread reductions, global allocations above `blockIdx`, unified thread loops).
pub fn lower_for(st: &State, gpu: bool) -> Result<Lowered> {
    lower_with(st, gpu, gpu)
}

/// [`lower_for`] with the compaction bounded by block predicates (TVM does it on any target;
/// the features model it on GPUs only) chosen apart: VerifyGPUCode's shared-memory sizes need
/// the bounds, without the other GPU passes, which rename the thread loops.
pub fn lower_with(st: &State, gpu: bool, predicates: bool) -> Result<Lowered> {
    let mut w = Walker {
        st,
        gpu,
        loops: Vec::new(),
        paths: Vec::new(),
        extents: Extents::new(),
        stores: Vec::new(),
        extra: Vec::new(),
        extra_allocs: Vec::new(),
    };
    let mut path = Vec::new();
    w.walk(&st.top, &mut path)?;
    let Walker {
        loops,
        paths,
        extents,
        stores: raw,
        extra,
        extra_allocs,
        ..
    } = w;
    let canon = Canon { extents: &extents };
    let (sums, loads) = access_sums(&canon, &raw)?;

    let mut shapes: Vec<Vec<i64>> = st.buffers.iter().map(|b| b.shape.clone()).collect();
    shapes.extend(extra.iter().map(|b| b.shape.clone()));
    // The loops bound to blockIdx, each with its enclosing loops (itself last).
    let block_idx: Vec<&Vec<usize>> = if gpu {
        paths
            .iter()
            .filter(|p| {
                p.last().is_some_and(|&l| {
                    loops[l]
                        .thread
                        .as_deref()
                        .is_some_and(|t| t.starts_with("blockIdx."))
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    // Per buffer: the offset subtracted from each dimension after compaction.
    let mut offsets: HashMap<usize, Vec<Sum>> = HashMap::new();
    let mut allocs = Vec::new();
    let root = &st.blocks[st.root].block;
    for &buf in &root.alloc_buffers {
        if st.is_param(buf) {
            continue;
        }
        let sites: Vec<(usize, &Vec<Sum>)> = raw
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                let own = (s.buffer == buf).then_some((i, &sums[i]));
                own.into_iter().chain(
                    loads[i]
                        .iter()
                        .filter(|(b, _)| *b == buf)
                        .map(move |(_, v)| (i, v)),
                )
            })
            .collect();
        if sites.is_empty() {
            allocs.push(LAlloc {
                buffer: buf,
                loops: vec![],
            });
            continue;
        }
        // Lowest common loop of the accesses.
        let first = &raw[sites[0].0].loops;
        let mut depth = first.len();
        for (i, _) in &sites {
            let p = &raw[*i].loops;
            depth = depth.min(p.iter().zip(first).take_while(|(a, b)| a == b).count());
        }
        let scope = st.buffers[buf].scope.as_str();
        // A global buffer stays above every blockIdx loop (the LCA detector's
        // UpdateWithBlockidx).
        if matches!(scope, "" | "global") {
            for p in &block_idx {
                depth = depth.min(p.iter().zip(first).take_while(|(a, b)| a == b).count());
            }
        }
        let lca: Vec<usize> = first[..depth].to_vec();
        // A buffer shared by the threads of a loop (shared memory across threadIdx) holds what
        // all of them access: CompactBufferAllocation relaxes those thread loops too.
        let outer_vars: Vec<String> = lca
            .iter()
            .filter(|&&l| {
                !loops[l]
                    .thread
                    .as_deref()
                    .is_some_and(|t| can_relax_under_thread(scope, t))
            })
            .map(|&l| loops[l].var.clone())
            .collect();
        allocs.push(LAlloc {
            buffer: buf,
            loops: lca,
        });
        // On a GPU, the predicates of the blocks, where they read only the relaxed loops
        // (ConditionalBoundsContext and EstimateRegionUpperBound).
        let idx: Vec<Site> = sites
            .iter()
            .map(|(i, v)| {
                let mut preds = Vec::new();
                if predicates {
                    predicate_sums(&canon, &raw[*i].predicate, &mut preds);
                    preds.retain(|(p, _)| {
                        let mut vs = Vec::new();
                        p.vars(&mut vs);
                        vs.iter().all(|v| !outer_vars.contains(v))
                    });
                }
                (*v, preds)
            })
            .collect();
        let off = compact(st, &canon, buf, &mut shapes[buf], &idx, &outer_vars)?;
        offsets.insert(buf, off);
    }
    allocs.extend(extra_allocs);
    let mut stores = lowered_stores(&canon, raw, &sums, &loads, &offsets);
    if gpu {
        unify_thread_binding(&canon, &loops, &paths, &mut stores, &mut allocs);
    }
    Ok(Lowered {
        loops,
        stores,
        shapes,
        allocs,
        extra_buffers: extra,
    })
}

/// UnifyThreadBinding: in each kernel, the first loop of each thread tag stands for all the
/// loops of that tag (their variables renamed to its), and all of them enclose everything in
/// the kernel, outermost the first to occur. Rewrites the stores' and allocations' loops and
/// the stores' indices (simplified again, as the second StmtSimplify does).
fn unify_thread_binding(
    canon: &Canon,
    loops: &[LLoop],
    paths: &[Vec<usize>],
    stores: &mut [LStore],
    allocs: &mut [LAlloc],
) {
    // Per kernel root: its thread loops, one per tag, in pre-order (loop ids are pre-order).
    let mut launch: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut rename: HashMap<String, String> = HashMap::new();
    for (l, p) in paths.iter().enumerate() {
        let Some(tag) = loops[l].thread.as_deref() else {
            continue;
        };
        let Some(&root) = p.iter().find(|&&x| loops[x].thread.is_some()) else {
            continue;
        };
        let threads = launch.entry(root).or_default();
        match threads
            .iter()
            .find(|&&t| loops[t].thread.as_deref() == Some(tag))
        {
            Some(&rep) => {
                rename.insert(loops[l].var.clone(), loops[rep].var.clone());
            }
            None => threads.push(l),
        }
    }
    if launch.is_empty() {
        return;
    }
    let unify = |path: &[usize]| -> Vec<usize> {
        let mut out = Vec::with_capacity(path.len());
        let mut inside = false;
        for &l in path {
            if loops[l].thread.is_none() {
                out.push(l);
            } else if !inside {
                inside = true;
                out.extend(launch.get(&l).into_iter().flatten());
            }
        }
        out
    };
    for a in allocs.iter_mut() {
        a.loops = unify(&a.loops);
    }
    let renamed = |e: &Expr| e.substitute(&|v: &str| rename.get(v).map(|r| Expr::Var(r.clone())));
    for s in stores.iter_mut() {
        s.loops = unify(&s.loops);
        if rename.is_empty() {
            continue;
        }
        let touches = |e: &Expr| {
            let mut found = false;
            e.visit(&mut |x| found |= matches!(x, Expr::Var(v) if rename.contains_key(v)));
            found
        };
        if s.indices.iter().any(touches) {
            s.indices = s
                .indices
                .iter()
                .map(|i| {
                    let i = renamed(i);
                    canon.sum(&i).map_or(i, |x| x.to_expr())
                })
                .collect();
        }
        if touches(&s.value) {
            let value = renamed(&s.value);
            s.value = normalize_int_operands(canon, &canon_load_indices(canon, &value));
        }
    }
}

/// `e` with each load's indices in the simplifier's normal form.
fn canon_load_indices(canon: &Canon, e: &Expr) -> Expr {
    match e {
        Expr::Load { buffer, indices } => Expr::Load {
            buffer: *buffer,
            indices: indices
                .iter()
                .map(|i| canon.sum(i).map_or_else(|| i.clone(), |x| x.to_expr()))
                .collect(),
        },
        Expr::Bin(op, a, b) => Expr::Bin(
            *op,
            Box::new(canon_load_indices(canon, a)),
            Box::new(canon_load_indices(canon, b)),
        ),
        Expr::Not(a) => Expr::Not(Box::new(canon_load_indices(canon, a))),
        Expr::Select(c, a, b) => Expr::Select(
            Box::new(canon_load_indices(canon, c)),
            Box::new(canon_load_indices(canon, a)),
            Box::new(canon_load_indices(canon, b)),
        ),
        Expr::Cast { dtype, value } => Expr::Cast {
            dtype: dtype.clone(),
            value: Box::new(canon_load_indices(canon, value)),
        },
        Expr::Call { name, dtype, args } => Expr::Call {
            name: name.clone(),
            dtype: dtype.clone(),
            args: args.iter().map(|a| canon_load_indices(canon, a)).collect(),
        },
        _ => e.clone(),
    }
}

/// The indices of every store and load, as canonical sums.
fn access_sums(canon: &Canon, raw: &[RawStore]) -> Result<AccessSums> {
    let norm = |e: &Expr| canon.sum(e).ok_or_else(|| unsupported_index(e));
    let mut sums: Vec<Vec<Sum>> = Vec::with_capacity(raw.len());
    let mut loads: Vec<Vec<(usize, Vec<Sum>)>> = Vec::with_capacity(raw.len());
    for s in raw {
        sums.push(s.indices.iter().map(norm).collect::<Result<_>>()?);
        let mut ls = Vec::new();
        let mut err = None;
        s.value.visit(&mut |x| {
            if let Expr::Load { buffer, indices } = x {
                match indices.iter().map(norm).collect::<Result<Vec<_>>>() {
                    Ok(v) => ls.push((*buffer, v)),
                    Err(e) => err = Some(e),
                }
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        loads.push(ls);
    }
    Ok((sums, loads))
}

/// Compacts an allocated buffer as TVM's CompactBufferAllocation does: each dimension shrinks
/// to the region its accesses (`sites`) touch below their lowest common loop, when the regions
/// share their outer part up to a constant. Updates `shape`; returns each dimension's offset.
fn compact(
    st: &State,
    canon: &Canon,
    buf: usize,
    shape: &mut [i64],
    sites: &[Site],
    outer_vars: &[String],
) -> Result<Vec<Sum>> {
    let ndim = shape.len();
    let mut region: Vec<Option<DimRegion>> = (0..ndim).map(|_| None).collect();
    let mut compactable = vec![true; ndim];
    for (idx, preds) in sites {
        if idx.len() != ndim {
            return Err(Error::Internal(format!(
                "buffer {} accessed with {} indices, has {} dimensions",
                st.buffers[buf].name,
                idx.len(),
                ndim
            )));
        }
        for d in 0..ndim {
            let r = dim_region(canon, &idx[d], outer_vars, preds);
            region[d] = Some(match region[d].take() {
                None => r,
                Some(prev) => {
                    // Regions over the same outer part (up to a constant) unite.
                    let diff = r.outer.add(&prev.outer, -1);
                    let shift = if diff.is_constant() {
                        diff.base
                    } else {
                        compactable[d] = false;
                        0
                    };
                    DimRegion {
                        outer: prev.outer,
                        lo: prev.lo.min(r.lo + shift),
                        hi: prev.hi.max(r.hi + shift),
                    }
                }
            });
        }
    }
    let mut off = Vec::with_capacity(ndim);
    for d in 0..ndim {
        match &region[d] {
            Some(r) if compactable[d] => {
                // TVM narrows the region to the buffer: its start to at least 0 and its extent
                // to at most the dimension (a fused loop whose last step is cut off by a
                // predicate reaches past the end; the predicate is not consulted).
                shape[d] = (r.hi - r.lo + 1).min(shape[d]);
                let lo = if r.outer.is_constant() {
                    r.lo.max(-r.outer.base)
                } else {
                    r.lo
                };
                off.push(r.outer.add(&Sum::constant(lo), 1));
            }
            _ => off.push(Sum::constant(0)),
        }
    }
    Ok(off)
}

/// The stores with their indices and loads shifted into the compacted buffers.
fn lowered_stores(
    canon: &Canon,
    raw: Vec<RawStore>,
    sums: &[Vec<Sum>],
    loads: &[Vec<(usize, Vec<Sum>)>],
    offsets: &HashMap<usize, Vec<Sum>>,
) -> Vec<LStore> {
    let shift = |buf: usize, idx: &[Sum]| -> Vec<Expr> {
        match offsets.get(&buf) {
            Some(off) => idx
                .iter()
                .zip(off)
                .map(|(i, o)| i.add(o, -1).to_expr())
                .collect(),
            None => idx.iter().map(Sum::to_expr).collect(),
        }
    };
    let mut stores = Vec::with_capacity(raw.len());
    for (i, s) in raw.into_iter().enumerate() {
        let mut k = 0;
        let value = rewrite_loads(&s.value, &mut |buf| {
            let out = match loads[i].get(k) {
                Some((b, idx)) if *b == buf => Some(shift(*b, idx)),
                _ => None,
            };
            k += 1;
            out
        });
        let value = normalize_int_operands(canon, &value);
        stores.push(LStore {
            buffer: s.buffer,
            indices: shift(s.buffer, &sums[i]),
            value,
            loops: s.loops,
            constant: s.constant,
        });
        let _ = s.block;
    }
    stores
}

/// Rebuilds `e` with each load's indices (in visit order) replaced by `f(buffer)` where it
/// gives them.
fn rewrite_loads(e: &Expr, f: &mut impl FnMut(usize) -> Option<Vec<Expr>>) -> Expr {
    match e {
        Expr::Load { buffer, indices } => {
            // Visit order: the load itself first (parents first), matching `Expr::visit`.
            let new = f(*buffer).unwrap_or_else(|| indices.clone());
            // Loads nested inside indices were visited after their parent.
            for i in indices {
                rewrite_loads(i, f);
            }
            Expr::Load {
                buffer: *buffer,
                indices: new,
            }
        }
        Expr::Bin(op, a, b) => {
            let a = rewrite_loads(a, f);
            Expr::Bin(*op, Box::new(a), Box::new(rewrite_loads(b, f)))
        }
        Expr::Not(a) => Expr::Not(Box::new(rewrite_loads(a, f))),
        Expr::Select(c, a, b) => {
            let c = rewrite_loads(c, f);
            let a = rewrite_loads(a, f);
            Expr::Select(Box::new(c), Box::new(a), Box::new(rewrite_loads(b, f)))
        }
        Expr::Cast { dtype, value } => Expr::Cast {
            dtype: dtype.clone(),
            value: Box::new(rewrite_loads(value, f)),
        },
        Expr::Call { name, dtype, args } => Expr::Call {
            name: name.clone(),
            dtype: dtype.clone(),
            args: args.iter().map(|a| rewrite_loads(a, f)).collect(),
        },
        _ => e.clone(),
    }
}

fn is_int_arith(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Int(_)
            | Expr::Var(_)
            | Expr::Bin(
                BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::FloorDiv | BinOp::FloorMod,
                _,
                _
            )
    ) && !has_load(e)
        && !has_float(e)
}

fn has_float(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| {
        found |= matches!(
            x,
            Expr::Float { .. } | Expr::Cast { .. } | Expr::Call { .. }
        )
    });
    found
}

/// Integer arithmetic outside indices (conditions of padding, for one) in normal form too.
fn normalize_int_operands(canon: &Canon, e: &Expr) -> Expr {
    if is_int_arith(e) {
        if let Some(s) = canon.sum(e) {
            return s.to_expr();
        }
    }
    match e {
        Expr::Bin(op, a, b) if op.is_comparison() && is_int_arith(a) && is_int_arith(b) => {
            if let Some((x, y)) = compared_before_division(canon, op, a, b) {
                return normalize_comparison(canon, op, x, y);
            }
            if let (Some(x), Some(y)) = (canon.sum(a), canon.sum(b)) {
                return normalize_comparison(canon, op, x, y);
            }
            e.clone()
        }
        Expr::Bin(op @ (BinOp::And | BinOp::Or), a, b) => {
            let (a, b) = (
                normalize_int_operands(canon, a),
                normalize_int_operands(canon, b),
            );
            and_or(*op, a, b)
        }
        Expr::Bin(op, a, b) => Expr::Bin(
            *op,
            Box::new(normalize_int_operands(canon, a)),
            Box::new(normalize_int_operands(canon, b)),
        ),
        Expr::Not(a) => Expr::Not(Box::new(normalize_int_operands(canon, a))),
        Expr::Select(c, a, b) => Expr::Select(
            Box::new(normalize_int_operands(canon, c)),
            Box::new(normalize_int_operands(canon, a)),
            Box::new(normalize_int_operands(canon, b)),
        ),
        Expr::Cast { dtype, value } => Expr::Cast {
            dtype: dtype.clone(),
            value: Box::new(normalize_int_operands(canon, value)),
        },
        Expr::Call { name, dtype, args } => {
            let args: Vec<Expr> = args
                .iter()
                .map(|a| normalize_int_operands(canon, a))
                .collect();
            if name == "tirx.if_then_else" && args.len() == 3 {
                if let Some(folded) = fold_if_then_else(name, dtype, &args) {
                    return folded;
                }
            }
            Expr::Call {
                name: name.clone(),
                dtype: dtype.clone(),
                args,
            }
        }
        _ => e.clone(),
    }
}

/// `c <= floordiv(x, k)` and `floordiv(x, k) < c` with `x` a sum, as TVM's rewrite rules read
/// them before the division is simplified: `c * k <= x` and `x < c * k` (a fused copy's
/// `1 <= (f0 * 32 + tx) // 576` is `576 <= f0 * 32 + tx`, not `18 <= f0`).
fn compared_before_division(canon: &Canon, op: &BinOp, a: &Expr, b: &Expr) -> Option<(Sum, Sum)> {
    fn division(e: &Expr) -> Option<(&Expr, i64)> {
        match e {
            Expr::Bin(BinOp::FloorDiv, x, k) if matches!(**x, Expr::Bin(BinOp::Add, _, _)) => {
                k.as_int().filter(|k| *k > 0).map(|k| (x.as_ref(), k))
            }
            _ => None,
        }
    }
    // Only where no term of `x` divides by `k`: the rewrite rules split that part off first
    // (`1 <= (h * 4 + rh) // 2` reads `1 <= h * 2 + rh // 2`).
    let whole = |x: &Expr, k: i64| {
        canon
            .sum(x)
            .filter(|s| s.terms.iter().all(|t| t.scale % k != 0))
    };
    match (op, a, b) {
        (BinOp::Le, Expr::Int(c), _) => {
            let (x, k) = division(b)?;
            Some((Sum::constant(c.checked_mul(k)?), whole(x, k)?))
        }
        (BinOp::Lt, _, Expr::Int(c)) => {
            let (x, k) = division(a)?;
            Some((whole(x, k)?, Sum::constant(c.checked_mul(k)?)))
        }
        _ => None,
    }
}

/// TVM's canonical simplifier on `d < 0`: with `g` the gcd of the constant and the scales other
/// than 1, where the terms `g` does not divide lie in `[0, g)`, `d / g < 0` without them, as
/// `q < c` (`f0 * 224 + tx * 4 + v < 5424` reads `f0 * 56 + tx < 1356`).
fn lt_divided_by_gcd(canon: &Canon, d: &Sum) -> Option<(Sum, i64)> {
    let g = d
        .terms
        .iter()
        .filter(|t| t.scale.abs() > 1)
        .fold(d.base, |g, t| gcd(g, t.scale.abs()))
        .abs();
    if g <= 1 || d.terms.iter().all(|t| t.scale.abs() <= 1) {
        return None;
    }
    let mut q = Sum::constant(0);
    // `g` divides the constant: it is in the gcd.
    let mut extra = Sum::constant(0);
    for t in &d.terms {
        if t.scale % g == 0 {
            q = q.add(
                &Sum::term(Split {
                    scale: t.scale / g,
                    ..t.clone()
                }),
                1,
            );
        } else {
            extra = extra.add(&Sum::term(t.clone()), 1);
        }
    }
    let (lo, hi) = canon.bounds(&extra);
    if lo < 0 || hi >= g || q.terms.is_empty() {
        return None;
    }
    Some((q, -d.base / g))
}

/// An integer comparison with both sides as canonical sums, as TVM's simplifier leaves it: decided
/// by the loop ranges where they decide it, scaled and divided sides rewritten.
fn normalize_comparison(canon: &Canon, op: &BinOp, x: Sum, y: Sum) -> Expr {
    // The simplifier drops conditions the loop ranges decide.
    let (lo, hi) = canon.bounds(&x.add(&y, -1));
    let decided = match op {
        BinOp::Lt => (hi < 0).then_some(true).or((lo >= 0).then_some(false)),
        BinOp::Le => (hi <= 0).then_some(true).or((lo > 0).then_some(false)),
        BinOp::Gt => (lo > 0).then_some(true).or((hi <= 0).then_some(false)),
        BinOp::Ge => (lo >= 0).then_some(true).or((hi < 0).then_some(false)),
        BinOp::Eq => (lo == 0 && hi == 0)
            .then_some(true)
            .or((lo > 0 || hi < 0).then_some(false)),
        BinOp::Ne => (lo > 0 || hi < 0)
            .then_some(true)
            .or((lo == 0 && hi == 0).then_some(false)),
        _ => None,
    };
    if let Some(d) = decided {
        return Expr::Bool(d);
    }
    if *op == BinOp::Lt {
        if let Some((q, c)) = lt_divided_by_gcd(canon, &x.add(&y, -1)) {
            return normalize_comparison(canon, op, q, Sum::constant(c));
        }
    }
    // `c <= g * x` and `g * x < c` (g the gcd of the scales) read
    // `(c - 1) // g < x` and `x < (c - 1) // g + 1`.
    let factor = |s: &Sum| -> Option<(i64, Sum)> {
        let g = s
            .terms
            .iter()
            .fold(0, |g, t| super::index::gcd(g, t.scale.abs()));
        (g > 1 && s.base == 0 && !s.terms.is_empty()).then(|| {
            let mut q = s.clone();
            q.terms.iter_mut().for_each(|t| t.scale /= g);
            (g, q)
        })
    };
    match op {
        BinOp::Le if x.is_constant() => {
            if let Some((g, q)) = factor(&y) {
                return Expr::Bin(
                    BinOp::Lt,
                    Box::new(Expr::Int((x.base - 1).div_euclid(g))),
                    Box::new(q.to_expr()),
                );
            }
        }
        BinOp::Lt if y.is_constant() => {
            if let Some((g, q)) = factor(&x) {
                return Expr::Bin(
                    BinOp::Lt,
                    Box::new(q.to_expr()),
                    Box::new(Expr::Int((y.base - 1).div_euclid(g) + 1)),
                );
            }
        }
        _ => {}
    }
    // `c <= x // k` and `x // k < c` read `c * k <= x` and `x < c * k` (for any `x`, a
    // modulo too: `x % 171 // 19 < 8` is `x % 171 < 152`), and are simplified again: the loop
    // ranges may decide the new form, or its constant move across.
    let div_of = |s: &Sum| match s.terms.as_slice() {
        [t] if s.base == 0 && t.scale == 1 && t.lower > 1 => Some((t.dividend(), t.lower)),
        _ => None,
    };
    match op {
        BinOp::Le if x.is_constant() => {
            if let Some((inner, k)) = div_of(&y) {
                return normalize_comparison(canon, op, Sum::constant(x.base * k), inner);
            }
        }
        BinOp::Lt if y.is_constant() => {
            if let Some((inner, k)) = div_of(&x) {
                return normalize_comparison(canon, op, inner, Sum::constant(y.base * k));
            }
        }
        _ => {}
    }
    // `c1 <= x + c2` and `x + c2 < c1` read `c1 - c2 <= x` and `x < c1 - c2`.
    match op {
        BinOp::Le | BinOp::Lt if x.is_constant() && y.base != 0 && !y.is_constant() => {
            let c = y.base;
            let mut y = y;
            y.base = 0;
            return normalize_comparison(canon, op, Sum::constant(x.base - c), y);
        }
        BinOp::Le | BinOp::Lt if y.is_constant() && x.base != 0 && !x.is_constant() => {
            let c = x.base;
            let mut x = x;
            x.base = 0;
            return normalize_comparison(canon, op, x, Sum::constant(y.base - c));
        }
        _ => {}
    }
    Expr::Bin(*op, Box::new(x.to_expr()), Box::new(y.to_expr()))
}

/// `a op b` for `And` or `Or`, literal operands folded.
fn and_or(op: BinOp, a: Expr, b: Expr) -> Expr {
    match (op, &a, &b) {
        (BinOp::And, Expr::Bool(true), _) | (BinOp::Or, Expr::Bool(false), _) => b,
        (BinOp::And, _, Expr::Bool(true)) | (BinOp::Or, _, Expr::Bool(false)) => a,
        (BinOp::And, Expr::Bool(false), _) | (BinOp::And, _, Expr::Bool(false)) => {
            Expr::Bool(false)
        }
        (BinOp::Or, Expr::Bool(true), _) | (BinOp::Or, _, Expr::Bool(true)) => Expr::Bool(true),
        _ => Expr::Bin(op, Box::new(a), Box::new(b)),
    }
}

/// `if_then_else` with a literal condition, or nested on the same else value, simplified.
fn fold_if_then_else(name: &str, dtype: &str, args: &[Expr]) -> Option<Expr> {
    match args[0] {
        Expr::Bool(true) => return Some(args[1].clone()),
        Expr::Bool(false) => return Some(args[2].clone()),
        _ => {}
    }
    // if_then_else(a, if_then_else(b, x, y), y) is if_then_else(a and b, x, y).
    if let Expr::Call {
        name: inner,
        args: inner_args,
        ..
    } = &args[1]
    {
        if inner == name && inner_args.len() == 3 && inner_args[2] == args[2] {
            return Some(Expr::Call {
                name: name.to_string(),
                dtype: dtype.to_owned(),
                args: vec![
                    Expr::Bin(
                        BinOp::And,
                        Box::new(args[0].clone()),
                        Box::new(inner_args[0].clone()),
                    ),
                    inner_args[1].clone(),
                    args[2].clone(),
                ],
            });
        }
    }
    None
}

/// Infix text of an expression, loads as `buffer[i, j]` (for inspecting the lowered form).
pub fn show(e: &Expr, names: &impl Fn(usize) -> String) -> String {
    match e {
        Expr::Int(i) => i.to_string(),
        Expr::Bool(b) => b.to_string(),
        Expr::Float { value, .. } => format!("{value:?}"),
        Expr::Var(v) => v.clone(),
        Expr::Bin(op, a, b) => {
            let sym = match op {
                BinOp::Add => "+",
                BinOp::Sub => "-",
                BinOp::Mul => "*",
                BinOp::Div => "/",
                BinOp::Mod => "%%",
                BinOp::FloorDiv => "//",
                BinOp::FloorMod => "%",
                BinOp::Eq => "==",
                BinOp::Ne => "!=",
                BinOp::Lt => "<",
                BinOp::Le => "<=",
                BinOp::Gt => ">",
                BinOp::Ge => ">=",
                BinOp::And => "and",
                BinOp::Or => "or",
                BinOp::Min => return format!("min({}, {})", show(a, names), show(b, names)),
                BinOp::Max => return format!("max({}, {})", show(a, names), show(b, names)),
            };
            format!("({} {sym} {})", show(a, names), show(b, names))
        }
        Expr::Not(a) => format!("not {}", show(a, names)),
        Expr::Select(c, a, b) => format!(
            "select({}, {}, {})",
            show(c, names),
            show(a, names),
            show(b, names)
        ),
        Expr::Cast { dtype, value } => format!("{dtype}({})", show(value, names)),
        Expr::Load { buffer, indices } => format!(
            "{}[{}]",
            names(*buffer),
            indices
                .iter()
                .map(|i| show(i, names))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Expr::Call { name, args, .. } => format!(
            "{name}({})",
            args.iter()
                .map(|i| show(i, names))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl Lowered {
    /// The lowered program as text: each store under its loops (allocations listed first).
    pub fn text(&self, st: &State) -> String {
        let names = |b: usize| self.buffer(st, b).name.clone();
        let mut out = String::new();
        for a in &self.allocs {
            out.push_str(&format!(
                "alloc {} {:?} under {:?}\n",
                names(a.buffer),
                self.shapes[a.buffer],
                a.loops
            ));
        }
        for s in &self.stores {
            let loops: Vec<String> = s
                .loops
                .iter()
                .map(|&l| {
                    let lp = &self.loops[l];
                    format!("{}:{}:{}", lp.var, lp.extent, lp.kind.name())
                })
                .collect();
            out.push_str(&format!(
                "[{}]\n  {}[{}] = {}\n",
                loops.join(" "),
                names(s.buffer),
                s.indices
                    .iter()
                    .map(|i| show(i, &names))
                    .collect::<Vec<_>>()
                    .join(", "),
                show(&s.value, &names)
            ));
        }
        out
    }
}
