//! Groups 4 and 5: the allocation of the stored buffer (its size and the loops it sits in)
//! and the loop nest around the store (trip count, depth, auto-unroll pragma).

use super::{slog, LoopNest};

/// Where and how big the stored buffer is allocated; `None` when the function does not
/// allocate it (TVM then reports zeros and an outer product of 1).
#[derive(Clone, Copy, Debug)]
pub struct Allocation {
    pub bytes: i64,
    pub numel: i64,
    /// Trip count of the loops around the allocation.
    pub outer_prod: i64,
}

pub fn export_alloc(a: Option<Allocation>, store_outer_prod: i64, v: &mut Vec<f64>) {
    let (size, prod, outer) = match a {
        Some(a) => (
            a.bytes as f64,
            (a.numel as f64) * a.outer_prod as f64,
            a.outer_prod,
        ),
        None => (0.0, 0.0, 1),
    };
    v.extend([
        slog(size),
        slog(prod),
        slog(outer as f64),
        slog(store_outer_prod as f64 / outer as f64),
    ]);
}

pub fn export_outer(nest: &LoopNest, v: &mut Vec<f64>) {
    let unroll = nest
        .loops
        .iter()
        .rev()
        .find_map(|l| l.auto_unroll.filter(|&x| x > 0))
        .unwrap_or(0);
    v.extend([
        slog(nest.prod as f64),
        slog(nest.loops.len() as f64),
        slog(unroll as f64),
    ]);
}
