//! Group 1: the arithmetic a store performs (op counts scaled by the loop nest's trip count),
//! and the vectorized / unrolled / parallel loops around it.

use super::{slog, LoopNest};
use crate::program::{BinOp, Expr, LoopKind};

/// Counts per op kind, each already multiplied by the trip count of the enclosing loops.
#[derive(Clone, Debug, Default)]
pub struct ArithOps {
    pub float_mad: f64,
    pub float_add_sub: f64,
    pub float_mul: f64,
    pub float_div_mod: f64,
    pub float_cmp: f64,
    pub float_math_func: f64,
    pub float_other_func: f64,
    pub int_mad: f64,
    pub int_add_sub: f64,
    pub int_mul: f64,
    pub int_div_mod: f64,
    pub int_cmp: f64,
    pub int_math_func: f64,
    pub int_other_func: f64,
    pub bool_op: f64,
    pub select_op: f64,
}

/// Result dtype of an expression, as far as float-or-not goes.
pub fn is_float(e: &Expr, buffer_dtype: &impl Fn(usize) -> bool) -> bool {
    match e {
        Expr::Float { dtype, .. } | Expr::Cast { dtype, .. } | Expr::Call { dtype, .. } => {
            dtype.starts_with("float") || dtype.starts_with("bfloat")
        }
        Expr::Load { buffer, .. } => buffer_dtype(*buffer),
        Expr::Int(_) | Expr::Var(_) | Expr::Bool(_) | Expr::Not(_) => false,
        Expr::Bin(op, a, b) => {
            if op.is_comparison() || matches!(op, BinOp::And | BinOp::Or) {
                false
            } else {
                is_float(a, buffer_dtype) || is_float(b, buffer_dtype)
            }
        }
        Expr::Select(_, a, b) => is_float(a, buffer_dtype) || is_float(b, buffer_dtype),
    }
}

impl ArithOps {
    /// Counts the ops of a stored value (load indices included), times `prod`.
    pub fn of_value(value: &Expr, prod: f64, buffer_float: &impl Fn(usize) -> bool) -> ArithOps {
        let mut ops = ArithOps::default();
        value.visit(&mut |e| match e {
            Expr::Bin(op, _, _) => {
                let f = is_float(e, buffer_float);
                let slot = match op {
                    BinOp::Add | BinOp::Sub if f => &mut ops.float_add_sub,
                    BinOp::Add | BinOp::Sub => &mut ops.int_add_sub,
                    BinOp::Mul if f => &mut ops.float_mul,
                    BinOp::Mul => &mut ops.int_mul,
                    BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod if f => {
                        &mut ops.float_div_mod
                    }
                    BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod => {
                        &mut ops.int_div_mod
                    }
                    BinOp::Min | BinOp::Max if f => &mut ops.float_cmp,
                    BinOp::Min | BinOp::Max => &mut ops.int_cmp,
                    // A comparison's result is a bool: TVM files it under integer compares.
                    BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                        &mut ops.int_cmp
                    }
                    BinOp::And | BinOp::Or => &mut ops.bool_op,
                };
                *slot += prod;
            }
            Expr::Not(_) => ops.bool_op += prod,
            Expr::Select(..) => ops.select_op += prod,
            // Math intrinsics (exp, sqrt, if_then_else, ...) are pure calls.
            Expr::Call { dtype, .. } => {
                if dtype.starts_with("float") || dtype.starts_with("bfloat") {
                    ops.float_math_func += prod
                } else {
                    ops.int_math_func += prod
                }
            }
            _ => {}
        });
        ops
    }

    pub fn float_total(&self) -> f64 {
        self.float_mad
            + self.float_add_sub
            + self.float_mul
            + self.float_div_mod
            + self.float_cmp
            + self.float_math_func
            + self.float_other_func
    }

    fn export(&self, v: &mut Vec<f64>) {
        for x in [
            self.float_mad,
            self.float_add_sub,
            self.float_mul,
            self.float_div_mod,
            self.float_cmp,
            self.float_math_func,
            self.float_other_func,
            self.int_mad,
            self.int_add_sub,
            self.int_mul,
            self.int_div_mod,
            self.int_cmp,
            self.int_math_func,
            self.int_other_func,
            self.bool_op,
            self.select_op,
        ] {
            v.push(slog(x));
        }
    }
}

/// Number, extent product and innermost extent of the loops of one kind, and their position
/// (TVM only ever reports "none" or "mixed").
fn export_kind(nest: &LoopNest, kind: LoopKind, v: &mut Vec<f64>) {
    let ext: Vec<i64> = nest
        .loops
        .iter()
        .filter(|l| l.kind == kind)
        .map(|l| l.extent)
        .collect();
    let (num, prod, len, pos) = match ext.last() {
        None => (0.0, 0.0, 0.0, 0),
        Some(&last) => (
            ext.len() as f64,
            ext.iter().map(|&e| e as f64).product::<f64>(),
            last as f64,
            7,
        ),
    };
    v.extend([slog(num), slog(prod), slog(len)]);
    v.extend((0..8).map(|i| if i == pos { 1.0 } else { 0.0 }));
}

/// The 57 values of group 1 (CPU: no GPU thread extents).
pub fn export(ops: &ArithOps, nest: &LoopNest, v: &mut Vec<f64>) {
    ops.export(v);
    export_kind(nest, LoopKind::Vectorized, v);
    export_kind(nest, LoopKind::Unrolled, v);
    export_kind(nest, LoopKind::Parallel, v);
    let thread_len = |tag: &str| -> f64 {
        nest.loops
            .iter()
            .find(|l| match &l.thread {
                Some(t) if tag == "vthread" => t.starts_with("vthread"),
                Some(t) => t == tag,
                None => false,
            })
            .map(|l| l.extent as f64)
            .unwrap_or(1.0)
    };
    let gpu = nest.is_gpu;
    v.push(if gpu { 1.0 } else { 0.0 });
    for tag in [
        "blockIdx.x",
        "blockIdx.y",
        "blockIdx.z",
        "threadIdx.x",
        "threadIdx.y",
        "threadIdx.z",
        "vthread",
    ] {
        v.push(slog(if gpu { thread_len(tag) } else { 1.0 }));
    }
}
