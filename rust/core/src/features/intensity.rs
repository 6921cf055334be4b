//! Group 3: the arithmetic intensity curve. Float ops over bytes touched, for the loop nests
//! from the innermost loop outwards, sampled at `n` evenly spaced fractions of the total ops.

use super::{slog, LoopNest};

pub fn curve(n: usize, nest: &LoopNest, for_touched_bytes: &[i64], float_ops: f64) -> Vec<f64> {
    let loops = &nest.loops;
    let k = loops.len();
    let mut out = vec![0.0; n];
    // memory[j]: bytes touched by the j+1 innermost loops.
    let memory: Vec<f64> = (0..k)
        .map(|j| for_touched_bytes[k - 1 - j] as f64)
        .collect();
    let mut total = float_ops / nest.prod as f64;
    let mut compute = Vec::with_capacity(k);
    for l in loops.iter().rev() {
        total *= l.extent as f64;
        compute.push(total);
    }
    if total <= 0.0 || compute.is_empty() {
        return out;
    }
    let total = compute[k - 1];
    let mut p = 0;
    for (i, slot) in out.iter_mut().enumerate() {
        let cur = (i + 1) as f64 / n as f64 * total;
        while p < k && compute[p] < cur - 1e-4 {
            p += 1;
        }
        // Float rounding could leave `cur` just above the total; the last point is the total.
        let p = p.min(k - 1);
        *slot = if p == 0 {
            slog(compute[0] / memory[0])
        } else {
            let base = compute[p - 1] / memory[p - 1];
            let slope = (compute[p] / memory[p] - base) / (compute[p] - compute[p - 1]);
            slog(base + slope * (cur - compute[p - 1]))
        };
    }
    out
}
