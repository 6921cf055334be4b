//! Scalar expressions of the program model, and their affine forms.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    FloorDiv,
    FloorMod,
    Min,
    Max,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Mod => "mod",
            BinOp::FloorDiv => "floordiv",
            BinOp::FloorMod => "floormod",
            BinOp::Min => "min",
            BinOp::Max => "max",
            BinOp::Eq => "eq",
            BinOp::Ne => "ne",
            BinOp::Lt => "lt",
            BinOp::Le => "le",
            BinOp::Gt => "gt",
            BinOp::Ge => "ge",
            BinOp::And => "and",
            BinOp::Or => "or",
        }
    }

    fn from_name(name: &str) -> Option<BinOp> {
        Some(match name {
            "add" => BinOp::Add,
            "sub" => BinOp::Sub,
            "mul" => BinOp::Mul,
            "div" => BinOp::Div,
            "mod" => BinOp::Mod,
            "floordiv" => BinOp::FloorDiv,
            "floormod" => BinOp::FloorMod,
            "min" => BinOp::Min,
            "max" => BinOp::Max,
            "eq" => BinOp::Eq,
            "ne" => BinOp::Ne,
            "lt" => BinOp::Lt,
            "le" => BinOp::Le,
            "gt" => BinOp::Gt,
            "ge" => BinOp::Ge,
            "and" => BinOp::And,
            "or" => BinOp::Or,
            _ => return None,
        })
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Int(i64),
    Bool(bool),
    Float {
        value: f64,
        dtype: String,
    },
    Var(String),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    Cast {
        dtype: String,
        value: Box<Expr>,
    },
    /// A read of `buffer` (an index into the program's buffers).
    Load {
        buffer: usize,
        indices: Vec<Expr>,
    },
    /// An intrinsic or math call such as `tirx.exp`.
    Call {
        name: String,
        dtype: String,
        args: Vec<Expr>,
    },
}

fn malformed(what: &str, v: &Value) -> Error {
    let mut text = v.to_string();
    if text.len() > 120 {
        text.truncate(120);
        text.push_str("...");
    }
    Error::Malformed(format!("{what}: {text}"))
}

fn as_str<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| malformed(what, v))
}

pub(crate) fn as_i64(v: &Value, what: &str) -> Result<i64> {
    v.as_i64().ok_or_else(|| malformed(what, v))
}

impl Expr {
    /// Parses the array form the Python exporter writes (`["add", a, b]`, `["var", "i"]`, ...).
    pub fn from_json(v: &Value, n_buffers: usize) -> Result<Expr> {
        let arr = v
            .as_array()
            .ok_or_else(|| malformed("expression must be an array", v))?;
        let head = arr
            .first()
            .ok_or_else(|| malformed("empty expression", v))?;
        let tag = as_str(head, "expression tag")?;
        let arg = |i: usize| arr.get(i).ok_or_else(|| malformed("missing operand", v));
        let sub =
            |i: usize| -> Result<Box<Expr>> { Ok(Box::new(Expr::from_json(arg(i)?, n_buffers)?)) };
        Ok(match tag {
            "int" => Expr::Int(as_i64(arg(1)?, "int literal")?),
            "bool" => Expr::Bool(
                arg(1)?
                    .as_bool()
                    .ok_or_else(|| malformed("bool literal", v))?,
            ),
            "float" => Expr::Float {
                value: arg(1)?
                    .as_f64()
                    .ok_or_else(|| malformed("float literal", v))?,
                dtype: as_str(arg(2)?, "float dtype")?.to_string(),
            },
            "var" => Expr::Var(as_str(arg(1)?, "variable name")?.to_string()),
            "not" => Expr::Not(sub(1)?),
            "select" => Expr::Select(sub(1)?, sub(2)?, sub(3)?),
            "cast" => Expr::Cast {
                dtype: as_str(arg(1)?, "cast dtype")?.to_string(),
                value: sub(2)?,
            },
            "load" => {
                let buffer = as_i64(arg(1)?, "buffer index")?;
                if buffer < 0 || buffer as usize >= n_buffers {
                    return Err(malformed("load of an unknown buffer", v));
                }
                let idx = arg(2)?
                    .as_array()
                    .ok_or_else(|| malformed("load indices", v))?;
                let indices = idx
                    .iter()
                    .map(|e| Expr::from_json(e, n_buffers))
                    .collect::<Result<_>>()?;
                Expr::Load {
                    buffer: buffer as usize,
                    indices,
                }
            }
            "call" => {
                let list = arg(3)?
                    .as_array()
                    .ok_or_else(|| malformed("call arguments", v))?;
                Expr::Call {
                    name: as_str(arg(1)?, "call name")?.to_string(),
                    dtype: as_str(arg(2)?, "call dtype")?.to_string(),
                    args: list
                        .iter()
                        .map(|e| Expr::from_json(e, n_buffers))
                        .collect::<Result<_>>()?,
                }
            }
            other => match BinOp::from_name(other) {
                Some(op) => Expr::Bin(op, sub(1)?, sub(2)?),
                None => return Err(Error::Unsupported(format!("expression kind `{other}`"))),
            },
        })
    }

    pub fn to_json(&self) -> Value {
        match self {
            Expr::Int(i) => json!(["int", i]),
            Expr::Bool(b) => json!(["bool", b]),
            Expr::Float { value, dtype } => json!(["float", value, dtype]),
            Expr::Var(n) => json!(["var", n]),
            Expr::Bin(op, a, b) => json!([op.name(), a.to_json(), b.to_json()]),
            Expr::Not(a) => json!(["not", a.to_json()]),
            Expr::Select(c, a, b) => json!(["select", c.to_json(), a.to_json(), b.to_json()]),
            Expr::Cast { dtype, value } => json!(["cast", dtype, value.to_json()]),
            Expr::Load { buffer, indices } => {
                json!([
                    "load",
                    buffer,
                    indices.iter().map(Expr::to_json).collect::<Vec<_>>()
                ])
            }
            Expr::Call { name, dtype, args } => {
                json!([
                    "call",
                    name,
                    dtype,
                    args.iter().map(Expr::to_json).collect::<Vec<_>>()
                ])
            }
        }
    }

    /// The text of [`Expr::to_json`], written directly: the schedule engine's arithmetic keys
    /// every term by it, and building the JSON value first cost a tenth of feature extraction.
    pub fn json_text(&self) -> String {
        serde_json::to_string(self).expect("an expression always serializes")
    }

    /// Visits this expression and all its sub-expressions, parents first.
    pub fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Bin(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Not(a) => a.visit(f),
            Expr::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
            Expr::Cast { value, .. } => value.visit(f),
            Expr::Load { indices, .. } => indices.iter().for_each(|e| e.visit(f)),
            Expr::Call { args, .. } => args.iter().for_each(|e| e.visit(f)),
            Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } | Expr::Var(_) => {}
        }
    }

    /// The expression with every variable replaced by `map(name)` where it gives one.
    pub fn substitute(&self, map: &impl Fn(&str) -> Option<Expr>) -> Expr {
        let s = |e: &Expr| Box::new(e.substitute(map));
        match self {
            Expr::Var(n) => map(n).unwrap_or_else(|| self.clone()),
            Expr::Bin(op, a, b) => Expr::Bin(*op, s(a), s(b)),
            Expr::Not(a) => Expr::Not(s(a)),
            Expr::Select(c, a, b) => Expr::Select(s(c), s(a), s(b)),
            Expr::Cast { dtype, value } => Expr::Cast {
                dtype: dtype.clone(),
                value: s(value),
            },
            Expr::Load { buffer, indices } => Expr::Load {
                buffer: *buffer,
                indices: indices.iter().map(|e| e.substitute(map)).collect(),
            },
            Expr::Call { name, dtype, args } => Expr::Call {
                name: name.clone(),
                dtype: dtype.clone(),
                args: args.iter().map(|e| e.substitute(map)).collect(),
            },
            Expr::Int(_) | Expr::Bool(_) | Expr::Float { .. } => self.clone(),
        }
    }

    /// The affine form `sum(coef * var) + constant`, or `None` when the expression is not affine.
    pub fn affine(&self) -> Option<Affine> {
        match self {
            Expr::Int(i) => Some(Affine::constant(*i)),
            Expr::Var(n) => Some(Affine::var(n)),
            Expr::Bin(BinOp::Add, a, b) => Some(a.affine()?.add(&b.affine()?, 1)),
            Expr::Bin(BinOp::Sub, a, b) => Some(a.affine()?.add(&b.affine()?, -1)),
            Expr::Bin(BinOp::Mul, a, b) => {
                let (x, y) = (a.affine()?, b.affine()?);
                if x.is_constant() {
                    Some(y.scale(x.constant))
                } else if y.is_constant() {
                    Some(x.scale(y.constant))
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// Integer value when the expression is a constant.
    pub fn as_int(&self) -> Option<i64> {
        match self.affine() {
            Some(a) if a.is_constant() => Some(a.constant),
            _ => None,
        }
    }
}

/// `sum(coefs[v] * v) + constant` over named variables.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Affine {
    pub coefs: BTreeMap<String, i64>,
    pub constant: i64,
}

impl Affine {
    pub fn constant(c: i64) -> Self {
        Affine {
            coefs: BTreeMap::new(),
            constant: c,
        }
    }

    pub fn var(name: &str) -> Self {
        let mut coefs = BTreeMap::new();
        coefs.insert(name.to_string(), 1);
        Affine { coefs, constant: 0 }
    }

    pub fn is_constant(&self) -> bool {
        self.coefs.is_empty()
    }

    pub fn add(&self, other: &Affine, sign: i64) -> Affine {
        let mut out = self.clone();
        for (v, c) in &other.coefs {
            let e = out.coefs.entry(v.clone()).or_insert(0);
            *e += sign * c;
            if *e == 0 {
                out.coefs.remove(v);
            }
        }
        out.constant += sign * other.constant;
        out
    }

    pub fn scale(&self, k: i64) -> Affine {
        if k == 0 {
            return Affine::constant(0);
        }
        Affine {
            coefs: self.coefs.iter().map(|(v, c)| (v.clone(), c * k)).collect(),
            constant: self.constant * k,
        }
    }

    pub fn coef(&self, var: &str) -> i64 {
        self.coefs.get(var).copied().unwrap_or(0)
    }
}

/// The same JSON as [`Expr::to_json`], without building the value.
impl serde::Serialize for Expr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq;
        match self {
            Expr::Int(i) => {
                seq = s.serialize_seq(Some(2))?;
                seq.serialize_element("int")?;
                seq.serialize_element(i)?;
            }
            Expr::Bool(b) => {
                seq = s.serialize_seq(Some(2))?;
                seq.serialize_element("bool")?;
                seq.serialize_element(b)?;
            }
            Expr::Float { value, dtype } => {
                seq = s.serialize_seq(Some(3))?;
                seq.serialize_element("float")?;
                // json! turns a non-finite float into null; serialize_f64 writes null too.
                seq.serialize_element(value)?;
                seq.serialize_element(dtype)?;
            }
            Expr::Var(n) => {
                seq = s.serialize_seq(Some(2))?;
                seq.serialize_element("var")?;
                seq.serialize_element(n)?;
            }
            Expr::Bin(op, a, b) => {
                seq = s.serialize_seq(Some(3))?;
                seq.serialize_element(op.name())?;
                seq.serialize_element(a.as_ref())?;
                seq.serialize_element(b.as_ref())?;
            }
            Expr::Not(a) => {
                seq = s.serialize_seq(Some(2))?;
                seq.serialize_element("not")?;
                seq.serialize_element(a.as_ref())?;
            }
            Expr::Select(c, a, b) => {
                seq = s.serialize_seq(Some(4))?;
                seq.serialize_element("select")?;
                seq.serialize_element(c.as_ref())?;
                seq.serialize_element(a.as_ref())?;
                seq.serialize_element(b.as_ref())?;
            }
            Expr::Cast { dtype, value } => {
                seq = s.serialize_seq(Some(3))?;
                seq.serialize_element("cast")?;
                seq.serialize_element(dtype)?;
                seq.serialize_element(value.as_ref())?;
            }
            Expr::Load { buffer, indices } => {
                seq = s.serialize_seq(Some(3))?;
                seq.serialize_element("load")?;
                seq.serialize_element(buffer)?;
                seq.serialize_element(indices)?;
            }
            Expr::Call { name, dtype, args } => {
                seq = s.serialize_seq(Some(4))?;
                seq.serialize_element("call")?;
                seq.serialize_element(name)?;
                seq.serialize_element(dtype)?;
                seq.serialize_element(args)?;
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = Expr> {
        prop_oneof![
            any::<i64>().prop_map(Expr::Int),
            any::<bool>().prop_map(Expr::Bool),
            (any::<f64>(), "float(16|32|64)")
                .prop_map(|(value, dtype)| Expr::Float { value, dtype }),
            "[a-z_\"\\\\]{1,6}".prop_map(Expr::Var),
        ]
    }

    fn expr() -> impl Strategy<Value = Expr> {
        leaf().prop_recursive(4, 32, 3, |inner| {
            let op = prop_oneof![
                Just(BinOp::Add),
                Just(BinOp::FloorDiv),
                Just(BinOp::Ge),
                Just(BinOp::Or)
            ];
            prop_oneof![
                (op, inner.clone(), inner.clone()).prop_map(|(o, a, b)| Expr::Bin(
                    o,
                    Box::new(a),
                    Box::new(b)
                )),
                inner.clone().prop_map(|a| Expr::Not(Box::new(a))),
                (inner.clone(), inner.clone(), inner.clone()).prop_map(|(c, a, b)| Expr::Select(
                    Box::new(c),
                    Box::new(a),
                    Box::new(b)
                )),
                (inner.clone(), "int(32|64)").prop_map(|(v, dtype)| Expr::Cast {
                    dtype,
                    value: Box::new(v)
                }),
                (0usize..4, prop::collection::vec(inner.clone(), 0..3))
                    .prop_map(|(buffer, indices)| Expr::Load { buffer, indices }),
                ("tirx\\.[a-z]{1,4}", prop::collection::vec(inner, 0..3)).prop_map(
                    |(name, args)| Expr::Call {
                        name,
                        dtype: "float32".into(),
                        args
                    }
                ),
            ]
        })
    }

    proptest! {
        // The arithmetic orders terms by this text: it must stay exactly the JSON value's text.
        #[test]
        fn json_text_is_the_json_values_text(e in expr()) {
            prop_assert_eq!(e.json_text(), e.to_json().to_string());
        }
    }
}
