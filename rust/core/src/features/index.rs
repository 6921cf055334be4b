//! Integer index expressions in the normal form TVM's simplifier leaves them in.
//!
//! Several features are read off the syntax of the lowered indices (integer op counts, the
//! stride TVM's coefficient visitor finds), so we rebuild that syntax: a sum of split terms
//! `floordiv(floormod(x, upper), lower) * scale`, sorted by scale, then lower, then upper
//! factor (all descending), positive terms first, then the constant, then the negative terms
//! as subtractions.

use std::collections::HashMap;

use crate::program::{BinOp, Expr};

/// Ranges `[0, extent)` of the loop variables in scope.
pub type Extents = HashMap<String, i64>;

#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    Var(String),
    Sum(Box<Sum>),
}

/// `floordiv(floormod(index, upper), lower) * scale`; no `upper` means no modulo.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub index: Index,
    pub lower: i64,
    pub upper: Option<i64>,
    pub scale: i64,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Sum {
    pub terms: Vec<Split>,
    pub base: i64,
}

impl Split {
    fn same_form(&self, other: &Split) -> bool {
        self.index == other.index && self.lower == other.lower && self.upper == other.upper
    }

    /// What the term divides by `lower`: its index (a sum as it is), with the modulo kept.
    pub fn dividend(&self) -> Sum {
        match (&self.index, self.upper) {
            (Index::Sum(s), None) => (**s).clone(),
            _ => Sum::term(Split {
                lower: 1,
                scale: 1,
                ..self.clone()
            }),
        }
    }
}

impl Sum {
    pub fn constant(c: i64) -> Sum {
        Sum {
            terms: Vec::new(),
            base: c,
        }
    }

    /// The sum of one term.
    pub fn term(t: Split) -> Sum {
        Sum {
            terms: vec![t],
            base: 0,
        }
    }

    pub fn is_constant(&self) -> bool {
        self.terms.is_empty()
    }

    fn push(&mut self, t: Split) {
        if let Some(x) = self.terms.iter_mut().find(|x| x.same_form(&t)) {
            x.scale += t.scale;
        } else {
            self.terms.push(t);
        }
        self.terms.retain(|x| x.scale != 0);
    }

    pub fn add(&self, other: &Sum, sign: i64) -> Sum {
        let mut out = self.clone();
        for t in &other.terms {
            out.push(Split {
                scale: t.scale * sign,
                ..t.clone()
            });
        }
        out.base += sign * other.base;
        out.merge_splits();
        out
    }

    /// `(x % u) // l * s + (x % l) // m * t` with `s == t * (l / m)` is `(x % u) // m * t`:
    /// the simplifier folds a split loop's parts back together.
    fn merge_splits(&mut self) {
        'again: loop {
            for i in 0..self.terms.len() {
                for j in 0..self.terms.len() {
                    let (hi, lo) = (&self.terms[i], &self.terms[j]);
                    if i == j || hi.index != lo.index || lo.upper != Some(hi.lower) {
                        continue;
                    }
                    if hi.lower % lo.lower != 0 || hi.scale != lo.scale * (hi.lower / lo.lower) {
                        continue;
                    }
                    let merged = Split {
                        index: hi.index.clone(),
                        lower: lo.lower,
                        upper: hi.upper,
                        scale: lo.scale,
                    };
                    let (a, b) = (i.max(j), i.min(j));
                    self.terms.remove(a);
                    self.terms.remove(b);
                    self.push(merged);
                    continue 'again;
                }
            }
            return;
        }
    }

    pub fn scale(&self, k: i64) -> Sum {
        if k == 0 {
            return Sum::constant(0);
        }
        Sum {
            terms: self
                .terms
                .iter()
                .map(|t| Split {
                    scale: t.scale * k,
                    ..t.clone()
                })
                .collect(),
            base: self.base * k,
        }
    }

    /// Variables the sum reads.
    pub fn vars(&self, out: &mut Vec<String>) {
        for t in &self.terms {
            match &t.index {
                Index::Var(v) => {
                    if !out.contains(v) {
                        out.push(v.clone())
                    }
                }
                Index::Sum(s) => s.vars(out),
            }
        }
    }

    /// The expression tree TVM prints for this sum.
    pub fn to_expr(&self) -> Expr {
        let mut terms = self.terms.clone();
        // Stable, as TVM's: equal keys keep their order.
        terms.sort_by(|a, b| {
            b.scale.cmp(&a.scale).then(b.lower.cmp(&a.lower)).then(
                b.upper
                    .unwrap_or(i64::MAX)
                    .cmp(&a.upper.unwrap_or(i64::MAX)),
            )
        });
        let mut res: Option<Expr> = None;
        let add = |res: Option<Expr>, op: BinOp, e: Expr| -> Option<Expr> {
            Some(match res {
                None if op == BinOp::Add => e,
                None => bin(op, Expr::Int(0), e),
                Some(r) => bin(op, r, e),
            })
        };
        for t in terms.iter().filter(|t| t.scale > 0) {
            res = add(res, BinOp::Add, t.term_expr(1));
        }
        if self.base > 0 {
            res = add(res, BinOp::Add, Expr::Int(self.base));
        }
        for t in terms.iter().filter(|t| t.scale < 0) {
            res = add(res, BinOp::Sub, t.term_expr(-1));
        }
        if self.base < 0 {
            res = add(res, BinOp::Sub, Expr::Int(-self.base));
        }
        res.unwrap_or(Expr::Int(0))
    }
}

pub fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::Bin(op, Box::new(a), Box::new(b))
}

impl Split {
    fn term_expr(&self, sign: i64) -> Expr {
        let mut e = match &self.index {
            Index::Var(v) => Expr::Var(v.clone()),
            Index::Sum(s) => s.to_expr(),
        };
        if let Some(u) = self.upper {
            e = bin(BinOp::FloorMod, e, Expr::Int(u));
        }
        if self.lower != 1 {
            e = bin(BinOp::FloorDiv, e, Expr::Int(self.lower));
        }
        let s = self.scale * sign;
        if s != 1 {
            e = bin(BinOp::Mul, e, Expr::Int(s));
        }
        e
    }
}

/// Inclusive bounds, with each variable's bounds given by `var`.
pub fn sum_bounds(s: &Sum, var: &impl Fn(&str) -> (i64, i64)) -> (i64, i64) {
    sum_bounds_capped(s, var, &|_| None)
}

/// [`sum_bounds`] where `cap` may bound an index (a variable or a sum inside a term) from
/// above more tightly than its own bounds do (a predicate on a fused index).
pub fn sum_bounds_capped(
    s: &Sum,
    var: &impl Fn(&str) -> (i64, i64),
    cap: &impl Fn(&Index) -> Option<i64>,
) -> (i64, i64) {
    let (mut lo, mut hi) = (s.base, s.base);
    for t in &s.terms {
        let (a, b) = split_bounds(t, var, cap);
        let (x, y) = (a.saturating_mul(t.scale), b.saturating_mul(t.scale));
        lo = lo.saturating_add(x.min(y));
        hi = hi.saturating_add(x.max(y));
    }
    (lo, hi)
}

/// Bounds of `floordiv(floormod(index, upper), lower)` with TVM's interval rules.
fn split_bounds(
    t: &Split,
    var: &impl Fn(&str) -> (i64, i64),
    cap: &impl Fn(&Index) -> Option<i64>,
) -> (i64, i64) {
    let (mut lo, mut hi) = match &t.index {
        Index::Var(v) => var(v),
        Index::Sum(s) => sum_bounds_capped(s, var, cap),
    };
    if let Some(c) = cap(&t.index) {
        hi = hi.min(c).max(lo);
    }
    if let Some(u) = t.upper {
        if lo >= 0 {
            if hi >= u {
                (lo, hi) = (0, hi.min(u - 1));
            }
        } else {
            (lo, hi) = (0, u - 1);
        }
    }
    (lo.div_euclid(t.lower), hi.div_euclid(t.lower))
}

/// Canonical sums of integer expressions, with the loop extents to simplify by.
pub struct Canon<'a> {
    pub extents: &'a Extents,
}

impl Canon<'_> {
    pub fn var_bounds(&self, v: &str) -> (i64, i64) {
        match self.extents.get(v) {
            Some(&e) => (0, e - 1),
            None => (i64::MIN / 4, i64::MAX / 4),
        }
    }

    pub fn bounds(&self, s: &Sum) -> (i64, i64) {
        sum_bounds(s, &|v| self.var_bounds(v))
    }

    /// The canonical sum of `e`, or `None` when it is not integer arithmetic we model.
    pub fn sum(&self, e: &Expr) -> Option<Sum> {
        match e {
            Expr::Int(i) => Some(Sum::constant(*i)),
            Expr::Var(v) => {
                if self.extents.get(v) == Some(&1) {
                    // TVM binds a unit-extent loop variable to its minimum.
                    return Some(Sum::constant(0));
                }
                Some(Sum {
                    terms: vec![Split {
                        index: Index::Var(v.clone()),
                        lower: 1,
                        upper: None,
                        scale: 1,
                    }],
                    base: 0,
                })
            }
            Expr::Cast { value, dtype } if dtype.starts_with("int") => self.sum(value),
            Expr::Bin(BinOp::Add, a, b) => Some(self.sum(a)?.add(&self.sum(b)?, 1)),
            Expr::Bin(BinOp::Sub, a, b) => Some(self.sum(a)?.add(&self.sum(b)?, -1)),
            Expr::Bin(BinOp::Mul, a, b) => {
                let (x, y) = (self.sum(a)?, self.sum(b)?);
                if x.is_constant() {
                    Some(y.scale(x.base))
                } else if y.is_constant() {
                    Some(x.scale(y.base))
                } else {
                    None
                }
            }
            Expr::Bin(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
                let k = self.sum(b)?;
                if !k.is_constant() || k.base <= 0 {
                    return None;
                }
                if *op == BinOp::FloorMod {
                    // TVM reads `floormod(floordiv(x, c), k)` as `floordiv(floormod(x, c * k), c)`
                    // before its rewrite rules see it (`(f0 * 64 + tx * 2 + v) // 128 % 2` stays
                    // `(f0 * 64 + tx * 2 + v) % 256 // 128`, where two terms would fold).
                    if let Expr::Bin(BinOp::FloorDiv, x, c) = &**a {
                        let c = self.sum(c)?;
                        if c.is_constant() && c.base > 0 {
                            if let Some(ck) = c.base.checked_mul(k.base) {
                                return Some(self.div(&self.modulo(&self.sum(x)?, ck), c.base));
                            }
                        }
                    }
                }
                let a = self.sum(a)?;
                Some(if *op == BinOp::FloorDiv {
                    self.div(&a, k.base)
                } else {
                    self.modulo(&a, k.base)
                })
            }
            _ => None,
        }
    }

    fn tidy(&self, mut s: Sum) -> Sum {
        let mut out = Sum::constant(s.base);
        for mut t in s.terms.drain(..) {
            let (lo, hi) = match &t.index {
                Index::Var(v) => self.var_bounds(v),
                Index::Sum(x) => self.bounds(x),
            };
            if let Some(u) = t.upper {
                if lo >= 0 && hi < u {
                    t.upper = None;
                }
            }
            let cap = match t.upper {
                Some(u) => u - 1,
                None => hi,
            };
            if lo >= 0 && cap < t.lower {
                continue;
            }
            out.push(t);
        }
        out.merge_splits();
        out
    }

    /// Writes `a` as `g * q + r` with `g` dividing `k` and `r` provably in `[0, g)`, for the
    /// largest such `g > 1` (then `a // k == q // (k / g)` and `a % k == (q % (k / g)) * g + r`).
    fn factor_out(&self, a: &Sum, k: i64, max_rest: usize) -> Option<(i64, Sum, Sum)> {
        let mut gs: Vec<i64> = a.terms.iter().map(|t| gcd(k, t.scale.abs())).collect();
        gs.push(k);
        gs.sort_unstable_by(|x, y| y.cmp(x));
        gs.dedup();
        for g in gs.into_iter().filter(|&g| g > 1) {
            let mut q = Sum::constant(a.base.div_euclid(g));
            let mut r = Sum::constant(a.base.rem_euclid(g));
            for t in &a.terms {
                if t.scale % g == 0 {
                    q.push(Split {
                        scale: t.scale / g,
                        ..t.clone()
                    });
                } else {
                    r.push(t.clone());
                }
            }
            // Below `k`, TVM factors only through its rewrite rules for `floordiv(x * c1 + y, c2)`
            // and `floordiv(x * c1 + y + z, c2)` (`floormod(x * c1 + y, c2)`), after setting
            // aside the terms `k` divides: `x` is one term, `y` and `z` the operands after it
            // (`max_rest` of them at most), the constant below `c1`. Anything longer is left
            // whole.
            let factored = a
                .terms
                .iter()
                .filter(|t| t.scale % g == 0 && t.scale % k != 0)
                .count();
            let base = a.base.rem_euclid(k);
            let operands =
                a.terms.iter().filter(|t| t.scale % g != 0).count() + usize::from(base != 0);
            if g < k && (factored != 1 || operands > max_rest || base >= g) {
                continue;
            }
            let (lo, hi) = self.bounds(&r);
            if lo >= 0 && hi < g {
                return Some((g, q, r));
            }
        }
        None
    }

    pub fn div(&self, a: &Sum, k: i64) -> Sum {
        if k == 1 {
            return a.clone();
        }
        // floordiv(floormod(x, m * k), k) == floormod(floordiv(x, k), m), which TVM's
        // canonical simplifier applies when some part of `x` divides by `k` (a fused copy's
        // `((f0 * 128 + tx * 4 + v) % 1008) // 16` reads `(f0 * 8 + tx // 4) % 63`).
        if let [t] = a.terms.as_slice() {
            if let (Index::Sum(x), Some(m)) = (&t.index, t.upper) {
                let divisible =
                    x.terms.iter().any(|u| u.scale % k == 0) || (x.base != 0 && x.base % k == 0);
                if a.base == 0 && t.scale == 1 && t.lower == 1 && m % k == 0 && divisible {
                    return self.modulo(&self.div(x, k), m / k);
                }
            }
        }
        if let Some((g, q, _)) = self.factor_out(a, k, 2) {
            return if g == k {
                self.tidy(q)
            } else {
                self.div(&q, k / g)
            };
        }
        let mut divisible = Sum::constant(a.base.div_euclid(k));
        let mut rest = Sum::constant(a.base.rem_euclid(k));
        for t in &a.terms {
            if t.scale % k == 0 {
                divisible.push(Split {
                    scale: t.scale / k,
                    ..t.clone()
                });
            } else {
                rest.push(t.clone());
            }
        }
        if rest.is_constant() {
            return self.tidy(divisible);
        }
        let (lo, hi) = self.bounds(&rest);
        if lo >= 0 && hi < k {
            return self.tidy(divisible);
        }
        if rest.base == 0 && rest.terms.len() == 1 {
            let t = &rest.terms[0];
            if t.scale > 0 && k % t.scale == 0 {
                let lower = t.lower * (k / t.scale);
                if t.upper.is_none_or(|u| u % lower == 0) {
                    let mut out = divisible;
                    out.push(Split {
                        index: t.index.clone(),
                        lower,
                        upper: t.upper,
                        scale: 1,
                    });
                    return self.tidy(out);
                }
            }
        }
        let mut out = divisible;
        if let [t] = rest.terms.as_slice() {
            let unit = Sum::term(Split {
                scale: 1,
                ..t.clone()
            });
            let (lo, _) = self.bounds(&unit);
            if t.scale > 0 && lo >= 0 {
                // floordiv(x * c + b, k) == x * (c // k) + floordiv(x * (c % k) + b, k), and the
                // second part is a constant when its bounds agree (TVM's "eliminate residue").
                let residue = unit.scale(t.scale % k).add(&Sum::constant(rest.base), 1);
                let (rl, rh) = self.bounds(&residue);
                if rl.div_euclid(k) == rh.div_euclid(k) {
                    out = out
                        .add(&unit.scale(t.scale / k), 1)
                        .add(&Sum::constant(rl.div_euclid(k)), 1);
                    return self.tidy(out);
                }
            }
            if t.scale == 1 && t.lower > 1 {
                // floordiv(floordiv(x, l) + c, k) == floordiv(x + c * l, l * k), as TVM's
                // rewrite simplifier folds it (a padded input read at `(h // 8 + 1) // 2`).
                let x = t.dividend().add(&Sum::constant(rest.base * t.lower), 1);
                out.push(Split {
                    index: Index::Sum(Box::new(x)),
                    lower: t.lower * k,
                    upper: None,
                    scale: 1,
                });
                return self.tidy(out);
            }
        }
        out.push(Split {
            index: Index::Sum(Box::new(rest)),
            lower: k,
            upper: None,
            scale: 1,
        });
        self.tidy(out)
    }

    fn modulo(&self, a: &Sum, k: i64) -> Sum {
        if k == 1 {
            return Sum::constant(0);
        }
        if let Some((g, q, r)) = self.factor_out(a, k, 1) {
            return if g == k {
                self.tidy(r)
            } else {
                self.tidy(self.modulo(&q, k / g).scale(g).add(&r, 1))
            };
        }
        let mut rest = Sum::constant(a.base.rem_euclid(k));
        for t in &a.terms {
            if t.scale % k != 0 {
                rest.push(t.clone());
            }
        }
        let (lo, hi) = self.bounds(&rest);
        if lo >= 0 && hi < k {
            return self.tidy(rest);
        }
        if rest.base == 0 && rest.terms.len() == 1 {
            let t = &rest.terms[0];
            if t.scale > 0 && k % t.scale == 0 {
                let upper = t.lower * (k / t.scale);
                if t.upper.is_none_or(|u| u % upper == 0) {
                    return self.tidy(Sum {
                        terms: vec![Split {
                            index: t.index.clone(),
                            lower: t.lower,
                            upper: Some(upper),
                            scale: t.scale,
                        }],
                        base: 0,
                    });
                }
            }
        }
        self.tidy(Sum {
            terms: vec![Split {
                index: Index::Sum(Box::new(rest)),
                lower: 1,
                upper: Some(k),
                scale: 1,
            }],
            base: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: &str) -> Expr {
        Expr::Var(n.into())
    }

    #[test]
    fn nested_divisions_fold_into_one() {
        // (f // 8 + 1) // 2 is (f + 8) // 16, as TVM's rewrite simplifier leaves it.
        let mut ext = Extents::new();
        ext.insert("f".into(), 56);
        let c = Canon { extents: &ext };
        let e = bin(
            BinOp::FloorDiv,
            bin(
                BinOp::Add,
                bin(BinOp::FloorDiv, v("f"), Expr::Int(8)),
                Expr::Int(1),
            ),
            Expr::Int(2),
        );
        let want = bin(
            BinOp::FloorDiv,
            bin(BinOp::Add, v("f"), Expr::Int(8)),
            Expr::Int(16),
        );
        assert_eq!(c.sum(&e).unwrap().to_expr(), want);
    }

    #[test]
    fn a_modulo_of_a_division_is_a_division_of_a_modulo() {
        // TVM's simplifier (checked with tvm.sym.Analyzer): `(f0*64 + tx*2 + v) // 128 % 2`
        // becomes `(f0*64 + tx*2 + v) % 256 // 128`, while two terms fold:
        // `(f0*64 + tx*2) // 128 % 2` becomes `f0 % 4 // 2`.
        let mut ext = Extents::new();
        for (x, e) in [("f0", 12), ("tx", 32), ("v", 2)] {
            ext.insert(x.into(), e);
        }
        let c = Canon { extents: &ext };
        let mul = |x: &str, k: i64| bin(BinOp::Mul, v(x), Expr::Int(k));
        let add = |a: Expr, b: Expr| bin(BinOp::Add, a, b);
        let three = add(add(mul("f0", 64), mul("tx", 2)), v("v"));
        let e = bin(
            BinOp::FloorMod,
            bin(BinOp::FloorDiv, three.clone(), Expr::Int(128)),
            Expr::Int(2),
        );
        let want = bin(
            BinOp::FloorDiv,
            bin(BinOp::FloorMod, three, Expr::Int(256)),
            Expr::Int(128),
        );
        assert_eq!(c.sum(&e).unwrap().to_expr(), want);
        let two = add(mul("f0", 64), mul("tx", 2));
        let e = bin(
            BinOp::FloorMod,
            bin(BinOp::FloorDiv, two, Expr::Int(128)),
            Expr::Int(2),
        );
        let want = bin(
            BinOp::FloorDiv,
            bin(BinOp::FloorMod, v("f0"), Expr::Int(4)),
            Expr::Int(2),
        );
        assert_eq!(c.sum(&e).unwrap().to_expr(), want);
    }

    #[test]
    fn divisions_factor_only_where_tvm_rewrites() {
        let mut ext = Extents::new();
        for (v, e) in [("c", 2), ("a", 32), ("b", 2), ("d", 2), ("e", 2), ("f", 16)] {
            ext.insert(v.into(), e);
        }
        let c = Canon { extents: &ext };
        let mul = |x: &str, k: i64| bin(BinOp::Mul, v(x), Expr::Int(k));
        let add = |a: Expr, b: Expr| bin(BinOp::Add, a, b);
        let div = |a: Expr, k: i64| bin(BinOp::FloorDiv, a, Expr::Int(k));
        // floordiv(c * 64 + a * 2 + d, 32): 64 sets c aside, then a * 2 + d factors: a // 16.
        let e = div(add(add(mul("c", 64), mul("a", 2)), v("d")), 32);
        let want = add(mul("c", 2), div(v("a"), 16));
        assert_eq!(c.sum(&e).unwrap().to_expr(), want);
        // floordiv(f * 8 + b * 4 + d * 2 + e, 32), the rest below 8: three operands after
        // f * 8, left whole.
        let e = div(
            add(add(add(mul("f", 8), mul("b", 4)), mul("d", 2)), v("e")),
            32,
        );
        assert_eq!(c.sum(&e).unwrap().to_expr(), e);
        // floordiv(c * 3, 2) for c < 2 is c: the residue floordiv(c, 2) is 0.
        assert_eq!(c.sum(&div(mul("c", 3), 2)).unwrap().to_expr(), v("c"));
    }

    #[test]
    fn fused_split_prints_like_tvm() {
        let mut ext = Extents::new();
        ext.insert("f".into(), 128);
        ext.insert("i1".into(), 2);
        ext.insert("i3".into(), 8);
        ext.insert("u".into(), 1);
        let c = Canon { extents: &ext };
        // (floordiv(f, 16) * 2 + i1) * 8 + u * 8 + i3
        let e = bin(
            BinOp::Add,
            bin(
                BinOp::Add,
                bin(
                    BinOp::Mul,
                    bin(
                        BinOp::Add,
                        bin(
                            BinOp::Mul,
                            bin(BinOp::FloorDiv, v("f"), Expr::Int(16)),
                            Expr::Int(2),
                        ),
                        v("i1"),
                    ),
                    Expr::Int(8),
                ),
                bin(BinOp::Mul, v("u"), Expr::Int(8)),
            ),
            v("i3"),
        );
        let want = bin(
            BinOp::Add,
            bin(
                BinOp::Add,
                bin(
                    BinOp::Mul,
                    bin(BinOp::FloorDiv, v("f"), Expr::Int(16)),
                    Expr::Int(16),
                ),
                bin(BinOp::Mul, v("i1"), Expr::Int(8)),
            ),
            v("i3"),
        );
        assert_eq!(c.sum(&e).unwrap().to_expr(), want);
        // floormod(floordiv(f, 16), 8) with f < 128 is floordiv(f, 16)
        let m = bin(
            BinOp::FloorMod,
            bin(BinOp::FloorDiv, v("f"), Expr::Int(16)),
            Expr::Int(8),
        );
        assert_eq!(
            c.sum(&m).unwrap().to_expr(),
            bin(BinOp::FloorDiv, v("f"), Expr::Int(16))
        );
    }
}
