//! Group 2: how a store touches each buffer it reads or writes (access type, bytes and cache
//! lines touched, reuse, stride), 18 values per buffer for the top 5 buffers.

use std::collections::{BTreeMap, HashMap};

use super::{slog, LoopNest};
use crate::program::{BinOp, Expr};

pub const PER_BUFFER: usize = 18;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AccessType {
    Read = 0,
    Write = 1,
    ReadWrite = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReuseType {
    LoopMultipleRead = 0,
    SerialMultipleReadWrite = 1,
    NoReuse = 2,
}

/// What TVM keeps across stores: per loop, per buffer, the element counts each store's
/// accesses touched under that loop (it is never reset within a function).
#[derive(Default)]
pub struct Touched {
    pub under_loop: HashMap<usize, BTreeMap<usize, Vec<i64>>>,
}

/// The buffers' static facts the features need.
pub struct BufferInfo<'a> {
    pub shape: &'a [i64],
    pub bytes: i64,
    pub name: &'a str,
}

struct Sub {
    buffer: usize,
    access: AccessType,
    indices: Vec<Vec<Expr>>,
    /// Elements accessed under each loop of the nest.
    numel: Vec<i64>,
    access_shape: Vec<i64>,
    num_continuous_bytes: i64,
    min_stride: i64,
    innermost_stride: i64,
    prod_non_strided: i64,
    reuse: ReuseType,
    reuse_dis_iter: f64,
    reuse_dis_bytes: f64,
    reuse_ct: i64,
    bytes: f64,
    unique_bytes: f64,
    lines: f64,
    unique_lines: f64,
}

/// Interval bounds of an integer expression with TVM's rules (`None`: not bounded).
pub fn bounds(e: &Expr, var: &impl Fn(&str) -> (i64, i64)) -> Option<(i64, i64)> {
    Some(match e {
        Expr::Int(i) => (*i, *i),
        Expr::Var(v) => var(v),
        Expr::Bin(op, a, b) => {
            let (a0, a1) = bounds(a, var)?;
            let (b0, b1) = bounds(b, var)?;
            match op {
                BinOp::Add => (a0.saturating_add(b0), a1.saturating_add(b1)),
                BinOp::Sub => (a0.saturating_sub(b1), a1.saturating_sub(b0)),
                BinOp::Mul => {
                    let c = [
                        a0.saturating_mul(b0),
                        a0.saturating_mul(b1),
                        a1.saturating_mul(b0),
                        a1.saturating_mul(b1),
                    ];
                    (*c.iter().min()?, *c.iter().max()?)
                }
                BinOp::FloorDiv if b0 == b1 && b0 > 0 => (a0.div_euclid(b0), a1.div_euclid(b0)),
                BinOp::FloorMod if b0 == b1 && b0 > 0 => {
                    // TVM's extractor first binds every loop variable to its minimum, then to
                    // its range; only the bound analysis sees the range, the modular-set
                    // analysis keeps the exact 0, and a modulo of an exact value is exact.
                    if let Some(x) = value_at_zero(a) {
                        let r = x.rem_euclid(b0);
                        return Some((r, r));
                    }
                    if a0 >= 0 {
                        if a1 < b0 {
                            (a0, a1)
                        } else {
                            (0, a1.min(b0 - 1))
                        }
                    } else {
                        (0, b0 - 1)
                    }
                }
                BinOp::Min => (a0.min(b0), a1.min(b1)),
                BinOp::Max => (a0.max(b0), a1.max(b1)),
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// The value of an integer expression with every variable at 0.
fn value_at_zero(e: &Expr) -> Option<i64> {
    Some(match e {
        Expr::Int(i) => *i,
        Expr::Var(_) => 0,
        Expr::Bin(op, a, b) => {
            let (x, y) = (value_at_zero(a)?, value_at_zero(b)?);
            match op {
                BinOp::Add => x.checked_add(y)?,
                BinOp::Sub => x.checked_sub(y)?,
                BinOp::Mul => x.checked_mul(y)?,
                BinOp::FloorDiv if y != 0 => x.div_euclid(y),
                BinOp::FloorMod if y != 0 => x.rem_euclid(y),
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// The stride TVM's coefficient visitor reads for `var` off an index expression. It is
/// syntactic (the last constant multiplier seen after the variable, or 1 after an add), and
/// we reproduce it as is since the feature is defined by it.
fn coefficient(e: &Expr, var: &str) -> i64 {
    #[derive(Default)]
    struct S {
        stride: i64,
        var: bool,
        add: bool,
        mul: bool,
    }
    fn visit(e: &Expr, var: &str, s: &mut S) {
        match e {
            Expr::Bin(BinOp::Mul, a, b) => {
                visit(a, var, s);
                visit(b, var, s);
                if s.var && !s.add {
                    if let Expr::Int(k) = **a {
                        s.mul = true;
                        s.stride = k;
                    } else if let Expr::Int(k) = **b {
                        s.mul = true;
                        s.stride = k;
                    }
                }
            }
            Expr::Bin(BinOp::Add, a, b) => {
                visit(a, var, s);
                visit(b, var, s);
                if s.var && !s.mul {
                    s.add = true;
                    s.stride = 1;
                }
            }
            Expr::Var(v) => {
                if v == var {
                    s.var = true;
                    s.stride = 2;
                }
            }
            Expr::Bin(_, a, b) => {
                visit(a, var, s);
                visit(b, var, s);
            }
            Expr::Not(a) | Expr::Cast { value: a, .. } => visit(a, var, s),
            Expr::Select(c, a, b) => {
                visit(c, var, s);
                visit(a, var, s);
                visit(b, var, s);
            }
            Expr::Load { indices, .. } => indices.iter().for_each(|i| visit(i, var, s)),
            Expr::Call { args, .. } => args.iter().for_each(|i| visit(i, var, s)),
            Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } => {}
        }
    }
    let mut s = S::default();
    visit(e, var, &mut s);
    if s.var && !s.mul && !s.add {
        1
    } else if s.var {
        s.stride
    } else {
        0
    }
}

fn var_stride(indices: &[Vec<Expr>], strides: &[i64], var: &str) -> i64 {
    let mut best = i64::MAX;
    for idx in indices {
        for d in (0..idx.len().min(strides.len())).rev() {
            let c = coefficient(&idx[d], var);
            if c != 0 {
                best = best.min(c.saturating_abs().saturating_mul(strides[d]));
                break;
            }
        }
    }
    if best == i64::MAX {
        0
    } else {
        best
    }
}

fn collect_vars(e: &Expr, out: &mut Vec<String>) {
    e.visit(&mut |x| {
        if let Expr::Var(v) = x {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
    });
}

/// The loads of `value` in post order (TVM's `PostOrderVisit`).
fn loads_post_order<'e>(e: &'e Expr, out: &mut Vec<(usize, &'e [Expr])>) {
    match e {
        Expr::Load { buffer, indices } => {
            indices.iter().for_each(|i| loads_post_order(i, out));
            out.push((*buffer, indices));
        }
        Expr::Bin(_, a, b) => {
            loads_post_order(a, out);
            loads_post_order(b, out);
        }
        Expr::Not(a) | Expr::Cast { value: a, .. } => loads_post_order(a, out),
        Expr::Select(c, a, b) => {
            loads_post_order(c, out);
            loads_post_order(a, out);
            loads_post_order(b, out);
        }
        Expr::Call { args, .. } => args.iter().for_each(|a| loads_post_order(a, out)),
        Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } | Expr::Var(_) => {}
    }
}

pub struct StoreAccess {
    subs: Vec<Sub>,
    /// Bytes touched by all of the store's buffers under each loop.
    pub for_touched_bytes: Vec<i64>,
}

/// Group 2 of one store; updates `touched` as TVM does.
pub fn analyze<'a>(
    store_buffer: usize,
    store_indices: &[Expr],
    value: &Expr,
    nest: &LoopNest,
    info: &impl Fn(usize) -> BufferInfo<'a>,
    cache_line: i64,
    touched: &mut Touched,
) -> StoreAccess {
    let mut subs = buffer_accesses(store_buffer, store_indices, value, nest);
    let for_touched_bytes = count_touched(&mut subs, nest, info, touched);
    set_strides(&mut subs, nest, info);
    set_reuse(&mut subs, nest, info, touched);
    set_bytes_and_lines(&mut subs, nest, info, cache_line);
    order_buffers(&mut subs, info);
    StoreAccess {
        subs,
        for_touched_bytes,
    }
}

/// Step 0: the store's buffers and their access patterns, the stored buffer first.
fn buffer_accesses(
    store_buffer: usize,
    store_indices: &[Expr],
    value: &Expr,
    nest: &LoopNest,
) -> Vec<Sub> {
    let mut subs: Vec<Sub> = Vec::new();
    let new_sub = |buffer, access, indices| Sub {
        buffer,
        access,
        indices,
        numel: vec![0; nest.loops.len()],
        access_shape: vec![],
        num_continuous_bytes: 1,
        min_stride: 0,
        innermost_stride: 0,
        prod_non_strided: 1,
        reuse: ReuseType::NoReuse,
        reuse_dis_iter: 0.0,
        reuse_dis_bytes: 0.0,
        reuse_ct: 0,
        bytes: 0.0,
        unique_bytes: 0.0,
        lines: 0.0,
        unique_lines: 0.0,
    };
    subs.push(new_sub(
        store_buffer,
        AccessType::Write,
        vec![store_indices.to_vec()],
    ));
    let mut loads = Vec::new();
    loads_post_order(value, &mut loads);
    for (buffer, idx) in loads {
        match subs.iter_mut().find(|s| s.buffer == buffer) {
            Some(s) => {
                if s.access == AccessType::Write {
                    s.access = AccessType::ReadWrite;
                }
                if s.access != AccessType::ReadWrite {
                    s.indices.push(idx.to_vec());
                }
            }
            None => subs.push(new_sub(buffer, AccessType::Read, vec![idx.to_vec()])),
        }
    }
    subs
}

/// Step 1: elements touched under each loop, binding loops from the inside out (outer loops
/// sit at their minimum, 0); the bytes all buffers touch under each loop.
fn count_touched<'a>(
    subs: &mut [Sub],
    nest: &LoopNest,
    info: &impl Fn(usize) -> BufferInfo<'a>,
    touched: &mut Touched,
) -> Vec<i64> {
    let n = nest.loops.len();
    let mut for_touched_bytes = vec![0i64; n];
    if n == 0 {
        for s in subs.iter_mut() {
            s.access_shape = vec![1; info(s.buffer).shape.len()];
        }
    }
    for i in (0..n).rev() {
        let ranges: HashMap<&str, i64> = nest.loops[i..]
            .iter()
            .map(|l| (l.var.as_str(), l.extent))
            .collect();
        let var = |v: &str| match ranges.get(v) {
            Some(&e) => (0, e - 1),
            None => (0, 0),
        };
        for s in subs.iter_mut() {
            let ndim = s.indices.first().map(|x| x.len()).unwrap_or(0);
            let mut numel = 1i64;
            let mut shape = Vec::with_capacity(ndim);
            for d in 0..ndim {
                let (mut lo, mut hi) = (i64::MAX, i64::MIN);
                for idx in &s.indices {
                    let (a, b) = idx
                        .get(d)
                        .and_then(|e| bounds(e, &var))
                        .unwrap_or((i64::MIN / 4, i64::MAX / 4));
                    lo = lo.min(a);
                    hi = hi.max(b);
                }
                let ext = hi.saturating_sub(lo).saturating_add(1);
                numel = numel.saturating_mul(ext);
                shape.push(ext);
            }
            s.access_shape = shape;
            let numel = numel.max(0);
            s.numel[i] = numel;
            let bytes = info(s.buffer).bytes;
            for_touched_bytes[i] = for_touched_bytes[i].saturating_add(numel.saturating_mul(bytes));
            touched
                .under_loop
                .entry(nest.ids[i])
                .or_default()
                .entry(s.buffer)
                .or_default()
                .push(numel);
        }
    }
    for_touched_bytes
}

/// Step 2: the strides of the innermost loop each buffer's indices move with.
fn set_strides<'a>(subs: &mut [Sub], nest: &LoopNest, info: &impl Fn(usize) -> BufferInfo<'a>) {
    let n = nest.loops.len();
    for s in subs.iter_mut() {
        let bi = info(s.buffer);
        let shape = bi.shape;
        let ndim = shape.len();
        let mut strides = vec![0i64; ndim];
        if ndim >= 1 {
            strides[ndim - 1] = 1;
            for d in (0..ndim - 1).rev() {
                strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
            }
        }
        s.num_continuous_bytes = 1;
        for d in (0..ndim.min(s.access_shape.len())).rev() {
            if s.access_shape[d] == shape[d] {
                s.num_continuous_bytes = shape[d].saturating_mul(bi.bytes);
                break;
            }
        }
        let mut i = n as i64 - 1;
        let mut stride = 0;
        while i >= 0 {
            stride = var_stride(&s.indices, &strides, &nest.loops[i as usize].var);
            if stride != 0 {
                break;
            }
            i -= 1;
        }
        s.min_stride = stride;
        s.innermost_stride = if i == n as i64 - 1 { stride } else { 0 };
        s.prod_non_strided = nest.loops[((i + 1) as usize)..]
            .iter()
            .fold(1i64, |p, l| p.saturating_mul(l.extent));
    }
}

/// Step 3: reuse: across a loop the indices do not use, or serial accesses under one loop.
fn set_reuse<'a>(
    subs: &mut [Sub],
    nest: &LoopNest,
    info: &impl Fn(usize) -> BufferInfo<'a>,
    touched: &Touched,
) {
    let n = nest.loops.len();
    let top_loop_touch_bytes: i64 = if n > 0 {
        subs.iter().map(|s| info(s.buffer).bytes).sum()
    } else {
        0
    };
    let bytes_under = |loop_id: usize| -> f64 {
        touched
            .under_loop
            .get(&loop_id)
            .map(|m| {
                m.iter()
                    .map(|(b, v)| {
                        v.iter()
                            .fold(0i64, |a, &x| a.saturating_add(x))
                            .saturating_mul(info(*b).bytes) as f64
                    })
                    .sum()
            })
            .unwrap_or(0.0)
    };
    for s in subs.iter_mut() {
        let mut region_vars = Vec::new();
        for idx in &s.indices {
            idx.iter().for_each(|e| collect_vars(e, &mut region_vars));
        }
        for i in (0..n).rev() {
            let lp = &nest.loops[i];
            if !region_vars.contains(&lp.var) {
                s.reuse = ReuseType::LoopMultipleRead;
                s.reuse_ct = lp.extent;
                s.reuse_dis_iter = nest.loops[i + 1..]
                    .iter()
                    .map(|l| l.extent as f64)
                    .product();
                s.reuse_dis_bytes = if i == n - 1 {
                    top_loop_touch_bytes as f64
                } else {
                    bytes_under(nest.ids[i + 1])
                };
                break;
            }
            let list = touched
                .under_loop
                .get(&nest.ids[i])
                .and_then(|m| m.get(&s.buffer));
            if let Some(list) = list.filter(|l| l.len() >= 2) {
                let extent = lp.extent as f64;
                s.reuse = ReuseType::SerialMultipleReadWrite;
                s.reuse_ct = list.len() as i64 - 1;
                s.reuse_dis_iter = *list.iter().min().unwrap_or(&0) as f64 / extent;
                s.reuse_dis_bytes = bytes_under(nest.ids[i]) / extent;
                break;
            }
        }
    }
}

/// Step 4: bytes and cache lines.
fn set_bytes_and_lines<'a>(
    subs: &mut [Sub],
    nest: &LoopNest,
    info: &impl Fn(usize) -> BufferInfo<'a>,
    cache_line: i64,
) {
    let n = nest.loops.len();
    for s in subs.iter_mut() {
        let dtype_bytes = info(s.buffer).bytes;
        s.bytes = (dtype_bytes as f64) * nest.prod as f64;
        if n == 0 {
            s.unique_bytes = 1.0;
            s.lines = 1.0;
            s.unique_lines = 1.0;
        } else {
            s.unique_bytes = s.numel[0] as f64 * dtype_bytes as f64;
            let frac = (s.min_stride as f64 * dtype_bytes as f64 / cache_line as f64).min(1.0);
            s.lines = (nest.prod as f64 / s.prod_non_strided as f64 * frac).max(1.0);
            s.unique_lines =
                (s.unique_bytes / cache_line.min(s.num_continuous_bytes) as f64).max(1.0);
        }
    }
}

/// Step 5: most lines first, then most bytes, then by name. TVM sorts the buffers in the
/// iteration order of its hash map, which for a handful of buffers is the reverse of
/// insertion, with a sort that is stable at that size: ties keep that order.
fn order_buffers<'a>(subs: &mut [Sub], info: &impl Fn(usize) -> BufferInfo<'a>) {
    subs.reverse();
    subs.sort_by(|a, b| {
        b.lines
            .partial_cmp(&a.lines)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(
                b.bytes
                    .partial_cmp(&a.bytes)
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
            .then_with(|| info(a.buffer).name.cmp(info(b.buffer).name))
    });
}

impl StoreAccess {
    pub fn export(&self, buffers_per_store: usize, v: &mut Vec<f64>) {
        for i in 0..buffers_per_store {
            let Some(s) = self.subs.get(i) else {
                v.extend(std::iter::repeat_n(0.0, PER_BUFFER));
                continue;
            };
            let proxy = if s.reuse_ct > 0 {
                s.reuse_ct as f64
            } else {
                0.5
            };
            let onehot = |x: bool| if x { 1.0 } else { 0.0 };
            v.extend([
                onehot(s.access == AccessType::Read),
                onehot(s.access == AccessType::Write),
                onehot(s.access == AccessType::ReadWrite),
                slog(s.bytes),
                slog(s.unique_bytes),
                slog(s.lines),
                slog(s.unique_lines),
                onehot(s.reuse == ReuseType::LoopMultipleRead),
                onehot(s.reuse == ReuseType::SerialMultipleReadWrite),
                onehot(s.reuse == ReuseType::NoReuse),
                slog(s.reuse_dis_iter),
                slog(s.reuse_dis_bytes),
                slog(s.reuse_ct as f64),
                slog(s.bytes / proxy),
                slog(s.unique_bytes / proxy),
                slog(s.lines / proxy),
                slog(s.unique_lines / proxy),
                slog(s.innermost_stride as f64),
            ]);
        }
    }
}
