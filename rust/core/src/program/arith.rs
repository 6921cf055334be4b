//! Arithmetic counted by kind: what a block computes per iteration.

use super::{BinOp, Block, Expr, Program};

/// Operation counts of one execution of a block body, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub float_add_sub: u32,
    pub float_mul: u32,
    pub float_div_mod: u32,
    pub float_cmp: u32,
    pub float_math: u32,
    pub float_other: u32,
    pub int_add_sub: u32,
    pub int_mul: u32,
    pub int_div_mod: u32,
    pub int_cmp: u32,
    pub int_math: u32,
    pub int_other: u32,
    pub bool_op: u32,
    pub select: u32,
    pub loads: u32,
}

impl OpCounts {
    pub fn of_block(program: &Program, block: &Block) -> OpCounts {
        let mut c = OpCounts::default();
        for s in &block.body {
            let dtype = &program.buffers[s.buffer].dtype;
            c.count(program, &s.value, dtype);
        }
        c
    }

    pub fn float_ops(&self) -> u32 {
        self.float_add_sub
            + self.float_mul
            + self.float_div_mod
            + self.float_cmp
            + self.float_math
            + self.float_other
    }

    fn count(&mut self, program: &Program, e: &Expr, dtype: &str) {
        match e {
            Expr::Bin(op, a, b) => {
                let sub_dtype = infer_dtype(program, a).unwrap_or_else(|| dtype.to_string());
                let f = sub_dtype.starts_with("float") || sub_dtype.starts_with("bfloat");
                let slot = match (op, f) {
                    (BinOp::Add | BinOp::Sub, true) => &mut self.float_add_sub,
                    (BinOp::Mul, true) => &mut self.float_mul,
                    (BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod, true) => {
                        &mut self.float_div_mod
                    }
                    (BinOp::Min | BinOp::Max, true) => &mut self.float_other,
                    (op, true) if op.is_comparison() => &mut self.float_cmp,
                    (BinOp::Add | BinOp::Sub, false) => &mut self.int_add_sub,
                    (BinOp::Mul, false) => &mut self.int_mul,
                    (BinOp::Div | BinOp::Mod | BinOp::FloorDiv | BinOp::FloorMod, false) => {
                        &mut self.int_div_mod
                    }
                    (op, false) if op.is_comparison() => &mut self.int_cmp,
                    (BinOp::And | BinOp::Or, _) => &mut self.bool_op,
                    _ => &mut self.int_other,
                };
                *slot += 1;
                self.count(program, a, &sub_dtype);
                self.count(program, b, &sub_dtype);
            }
            Expr::Not(a) => {
                self.bool_op += 1;
                self.count(program, a, "bool");
            }
            Expr::Select(c, a, b) => {
                self.select += 1;
                self.count(program, c, "bool");
                self.count(program, a, dtype);
                self.count(program, b, dtype);
            }
            Expr::Cast { value, .. } => self.count(program, value, dtype),
            Expr::Load { indices, .. } => {
                self.loads += 1;
                for i in indices {
                    self.count(program, i, "int32");
                }
            }
            Expr::Call {
                args,
                dtype: call_dtype,
                ..
            } => {
                if call_dtype.starts_with("float") {
                    self.float_math += 1;
                } else {
                    self.int_math += 1;
                }
                for a in args {
                    self.count(program, a, call_dtype);
                }
            }
            Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } | Expr::Var(_) => {}
        }
    }
}

/// The dtype of an expression where it can be read off a leaf.
fn infer_dtype(program: &Program, e: &Expr) -> Option<String> {
    match e {
        Expr::Float { dtype, .. } => Some(dtype.clone()),
        Expr::Cast { dtype, .. } => Some(dtype.clone()),
        Expr::Load { buffer, .. } => Some(program.buffers[*buffer].dtype.clone()),
        Expr::Call { dtype, .. } => Some(dtype.clone()),
        Expr::Int(_) | Expr::Var(_) => Some("int32".into()),
        Expr::Bool(_) => Some("bool".into()),
        Expr::Bin(op, a, b) => {
            if op.is_comparison() || matches!(op, BinOp::And | BinOp::Or) {
                Some("bool".into())
            } else {
                infer_dtype(program, a).or_else(|| infer_dtype(program, b))
            }
        }
        Expr::Not(_) => Some("bool".into()),
        Expr::Select(_, a, b) => infer_dtype(program, a).or_else(|| infer_dtype(program, b)),
    }
}
