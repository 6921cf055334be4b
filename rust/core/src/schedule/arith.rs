//! Integer arithmetic on index expressions: a linear normal form over atoms (loop variables and
//! `floordiv`/`floormod` terms), simplification with known loop ranges, and interval bounds.
//!
//! TVM simplifies bindings after every loop transformation; whether a loop variable still
//! appears in a binding decides loop iteration types, so we simplify the same common cases.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use crate::program::{BinOp, Expr};

/// Ranges `[0, extent)` of the loop variables in scope.
pub type Ranges = BTreeMap<String, i64>;

/// `sum(coef * atom) + constant`; atoms are keyed by their printed form.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Lin {
    pub terms: BTreeMap<String, (Expr, i64)>,
    pub constant: i64,
}

pub fn key(e: &Expr) -> String {
    e.json_text()
}

impl Lin {
    pub fn constant(c: i64) -> Lin {
        Lin {
            terms: BTreeMap::new(),
            constant: c,
        }
    }

    pub fn atom(e: Expr) -> Lin {
        let mut terms = BTreeMap::new();
        terms.insert(key(&e), (e, 1));
        Lin { terms, constant: 0 }
    }

    pub fn is_constant(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn add(&self, other: &Lin, sign: i64) -> Lin {
        self.clone().plus(other.clone(), sign)
    }

    /// `self + sign * other`, moving terms instead of cloning either side: the normal form is
    /// rebuilt for every binding after every split and fuse. [`Lin::add`] is its borrowing form.
    pub fn plus(mut self, other: Lin, sign: i64) -> Lin {
        for (k, (e, c)) in other.terms {
            match self.terms.entry(k) {
                Entry::Vacant(slot) => {
                    if sign * c != 0 {
                        slot.insert((e, sign * c));
                    }
                }
                Entry::Occupied(mut slot) => {
                    slot.get_mut().1 += sign * c;
                    if slot.get().1 == 0 {
                        slot.remove();
                    }
                }
            }
        }
        self.constant += sign * other.constant;
        self
    }

    /// `self * k`, in place. [`Lin::scale`] is its borrowing form.
    pub fn scaled(mut self, k: i64) -> Lin {
        if k == 0 {
            return Lin::constant(0);
        }
        for (_, c) in self.terms.values_mut() {
            *c *= k;
        }
        self.constant *= k;
        self
    }

    pub fn scale(&self, k: i64) -> Lin {
        self.clone().scaled(k)
    }

    /// Back to an expression, terms in a stable order.
    pub fn to_expr(&self) -> Expr {
        let mut out: Option<Expr> = None;
        for (e, c) in self.terms.values() {
            let term = if *c == 1 {
                e.clone()
            } else {
                Expr::Bin(BinOp::Mul, Box::new(e.clone()), Box::new(Expr::Int(*c)))
            };
            out = Some(match out {
                None => term,
                Some(acc) => Expr::Bin(BinOp::Add, Box::new(acc), Box::new(term)),
            });
        }
        match out {
            None => Expr::Int(self.constant),
            Some(acc) if self.constant == 0 => acc,
            Some(acc) => Expr::Bin(
                BinOp::Add,
                Box::new(acc),
                Box::new(Expr::Int(self.constant)),
            ),
        }
    }

    /// Inclusive bounds given bounds of each atom.
    pub fn bounds(&self, atom_bounds: &impl Fn(&Expr) -> Option<(i64, i64)>) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.constant, self.constant);
        for (e, c) in self.terms.values() {
            let (a, b) = atom_bounds(e)?;
            let (x, y) = (a.checked_mul(*c)?, b.checked_mul(*c)?);
            lo = lo.checked_add(x.min(y))?;
            hi = hi.checked_add(x.max(y))?;
        }
        Some((lo, hi))
    }
}

/// Bounds of an atom under `ranges` (variables absent from `ranges` are unbounded).
pub fn atom_bounds(e: &Expr, ranges: &Ranges) -> Option<(i64, i64)> {
    match e {
        Expr::Var(v) => ranges.get(v).map(|ext| (0, ext - 1)),
        Expr::Bin(BinOp::FloorDiv, a, b) => {
            let k = b.as_int().filter(|k| *k > 0)?;
            let (lo, hi) = linear(a, ranges)?.bounds(&|x| atom_bounds(x, ranges))?;
            Some((lo.div_euclid(k), hi.div_euclid(k)))
        }
        Expr::Bin(BinOp::FloorMod, a, b) => {
            let k = b.as_int().filter(|k| *k > 0)?;
            match linear(a, ranges)?.bounds(&|x| atom_bounds(x, ranges)) {
                Some((lo, hi)) if lo.div_euclid(k) == hi.div_euclid(k) => {
                    Some((lo.rem_euclid(k), hi.rem_euclid(k)))
                }
                _ => Some((0, k - 1)),
            }
        }
        _ => None,
    }
}

/// Splits `l` into `k * q + r` as TVM's canonical simplifier separates a sum's divisible
/// parts: the terms whose coefficient `k` divides go to `q`, every other term stays whole in
/// `r` (`floordiv(x * 64 + y, 37)` keeps its 64, where `x + floordiv(x * 27 + y, 37)` would
/// read as two more additions in the lowered program's features); the constant splits.
fn div_split(l: &Lin, k: i64) -> (Lin, Lin) {
    let mut q = Lin::constant(l.constant.div_euclid(k));
    let mut r = Lin::constant(l.constant.rem_euclid(k));
    for (key, (e, c)) in &l.terms {
        if c % k == 0 {
            q.terms.insert(key.clone(), (e.clone(), c / k));
        } else {
            r.terms.insert(key.clone(), (e.clone(), *c));
        }
    }
    (q, r)
}

/// The linear normal form of `e`, or `None` when it is not linear over atoms.
pub fn linear(e: &Expr, ranges: &Ranges) -> Option<Lin> {
    match e {
        Expr::Int(i) => Some(Lin::constant(*i)),
        Expr::Var(_) => Some(Lin::atom(e.clone())),
        Expr::Cast { value, .. } => linear(value, ranges),
        Expr::Bin(BinOp::Add, a, b) => Some(linear(a, ranges)?.plus(linear(b, ranges)?, 1)),
        Expr::Bin(BinOp::Sub, a, b) => Some(linear(a, ranges)?.plus(linear(b, ranges)?, -1)),
        Expr::Bin(BinOp::Mul, a, b) => {
            let (x, y) = (linear(a, ranges)?, linear(b, ranges)?);
            if x.is_constant() {
                Some(y.scaled(x.constant))
            } else if y.is_constant() {
                Some(x.scaled(y.constant))
            } else {
                None
            }
        }
        Expr::Bin(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
            let k = linear(b, ranges)?;
            if !k.is_constant() || k.constant <= 0 {
                return None;
            }
            let k = k.constant;
            let la = linear(a, ranges)?;
            if k == 1 {
                return Some(if *op == BinOp::FloorDiv {
                    la
                } else {
                    Lin::constant(0)
                });
            }
            let (q, r) = div_split(&la, k);
            let rb = r.bounds(&|x| atom_bounds(x, ranges));
            if *op == BinOp::FloorDiv {
                if let Some((lo, hi)) = rb {
                    if lo.div_euclid(k) == hi.div_euclid(k) {
                        return Some(q.plus(Lin::constant(lo.div_euclid(k)), 1));
                    }
                }
                // floordiv(floordiv(x, a), b) == floordiv(x, a * b)
                if r.constant == 0 && r.terms.len() == 1 {
                    if let Some((Expr::Bin(BinOp::FloorDiv, x, a), 1)) = r.terms.values().next() {
                        if let Some(a) = a.as_int() {
                            let inner =
                                Expr::Bin(BinOp::FloorDiv, x.clone(), Box::new(Expr::Int(a * k)));
                            return Some(q.plus(linear(&inner, ranges)?, 1));
                        }
                    }
                }
                Some(q.plus(
                    Lin::atom(Expr::Bin(
                        BinOp::FloorDiv,
                        Box::new(r.to_expr()),
                        Box::new(Expr::Int(k)),
                    )),
                    1,
                ))
            } else {
                if let Some((lo, hi)) = rb {
                    if lo.div_euclid(k) == hi.div_euclid(k) {
                        return Some(r.plus(Lin::constant(lo.div_euclid(k) * k), -1));
                    }
                }
                Some(Lin::atom(Expr::Bin(
                    BinOp::FloorMod,
                    Box::new(r.to_expr()),
                    Box::new(Expr::Int(k)),
                )))
            }
        }
        _ => None,
    }
}

/// `e` simplified under `ranges` (unchanged where it is not linear).
pub fn simplify(e: &Expr, ranges: &Ranges) -> Expr {
    match linear(e, ranges) {
        Some(l) => l.to_expr(),
        None => e.clone(),
    }
}

pub fn uses_var(e: &Expr, var: &str) -> bool {
    let mut found = false;
    e.visit(&mut |x| {
        if let Expr::Var(v) = x {
            if v == var {
                found = true;
            }
        }
    });
    found
}

pub fn vars_of(e: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    e.visit(&mut |x| {
        if let Expr::Var(v) = x {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
    });
    out
}

/// An interval `[base + lo, base + hi]` where `base` is symbolic in fixed (outer) variables.
#[derive(Clone, Debug, PartialEq)]
pub struct SymInterval {
    pub base: Lin,
    pub lo: i64,
    pub hi: i64,
    /// False when an atom mixes outer and relaxed variables in a way TVM bounds symbolically
    /// (its extent then depends on outer loops); `lo..hi` is then only a constant cover.
    pub exact: bool,
}

/// Relaxes `e` over the variables in `relaxed` (ranges `[0, extent)`), keeping the others
/// symbolic. `all` holds the ranges of every loop variable in scope (for simplification).
pub fn relax(e: &Expr, relaxed: &Ranges, all: &Ranges) -> Option<SymInterval> {
    let l = linear(e, all)?;
    let mut base = Lin::constant(l.constant);
    let (mut lo, mut hi) = (0i64, 0i64);
    let mut exact = true;
    for (k, (atom, c)) in &l.terms {
        let vars = vars_of(atom);
        if vars.iter().all(|v| !relaxed.contains_key(v)) {
            base.terms.insert(k.clone(), (atom.clone(), *c));
            continue;
        }
        if let Some((part, a, b)) = relax_div(atom, relaxed, all) {
            base = base.add(&part.scale(*c), 1);
            let (x, y) = (a * c, b * c);
            lo += x.min(y);
            hi += x.max(y);
            continue;
        }
        // An atom over relaxed variables (or mixing both kinds: then over its whole range).
        if vars.iter().any(|v| !relaxed.contains_key(v)) {
            exact = false;
        }
        let (a, b) = atom_bounds(atom, all)?;
        let (x, y) = (a * c, b * c);
        lo += x.min(y);
        hi += x.max(y);
    }
    Some(SymInterval {
        base,
        lo,
        hi,
        exact,
    })
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// Relaxes `floordiv(A, k)` / `floormod(A, k)` where `A = g * S + R`, `S` symbolic, `g | k` and
/// `R` relaxed, using `floordiv(g * S + R, g * q) == floordiv(S + floordiv(R, g), q)`. Exact
/// (`Some`) when `floordiv(R, g)` is a single point, `q == 1`, or (for a division) its span is a
/// multiple of `q`: otherwise TVM's bound depends on the outer loops too (a dynamic extent).
fn relax_div(atom: &Expr, relaxed: &Ranges, all: &Ranges) -> Option<(Lin, i64, i64)> {
    let (op, a, k) = match atom {
        Expr::Bin(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => (*op, a, b.as_int()?),
        _ => return None,
    };
    let inner = relax(a, relaxed, all)?;
    if !inner.exact || inner.base.is_constant() || k <= 0 || inner.lo < 0 {
        return None;
    }
    let g = inner
        .base
        .terms
        .values()
        .fold(gcd(inner.base.constant, k), |acc, (_, c)| gcd(acc, *c));
    if g <= 0 {
        return None;
    }
    let scaled = Lin {
        terms: inner
            .base
            .terms
            .iter()
            .map(|(key, (e, c))| (key.clone(), (e.clone(), c / g)))
            .collect(),
        constant: inner.base.constant / g,
    };
    let q = k / g;
    let (a0, a1) = (inner.lo.div_euclid(g), inner.hi.div_euclid(g));
    match op {
        BinOp::FloorDiv if q == 1 => Some((scaled, a0, a1)),
        // `floordiv(S + a1, q) == floordiv(S + a0, q) + (a1 - a0) / q` when `q` divides
        // `a1 - a0`: a constant extent, which TVM's simplifier proves too (a padding read
        // through `(h + rh + 1) // 2` under a tile of `h`).
        BinOp::FloorDiv if (a1 - a0) % q == 0 => {
            let e = Expr::Bin(
                BinOp::FloorDiv,
                Box::new(scaled.add(&Lin::constant(a0), 1).to_expr()),
                Box::new(Expr::Int(q)),
            );
            Some((linear(&e, all)?, 0, (a1 - a0) / q))
        }
        BinOp::FloorMod if a0 == a1 => {
            let sym = if q == 1 {
                Lin::constant(0)
            } else {
                let e = Expr::Bin(
                    BinOp::FloorMod,
                    Box::new(scaled.add(&Lin::constant(a0), 1).to_expr()),
                    Box::new(Expr::Int(q)),
                );
                linear(&e, all)?.scale(g)
            };
            Some((sym, inner.lo - g * a0, inner.hi - g * a0))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: &str) -> Expr {
        Expr::Var(n.into())
    }
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }

    #[test]
    fn fuse_then_split_back_simplifies() {
        let mut r = Ranges::new();
        r.insert("f".into(), 12);
        r.insert("u".into(), 1);
        // floordiv(f, 4) with f < 12 stays, floordiv(u, 4) with u < 1 is 0
        assert_eq!(
            simplify(&bin(BinOp::FloorDiv, v("u"), Expr::Int(4)), &r),
            Expr::Int(0)
        );
        assert_eq!(
            simplify(&bin(BinOp::FloorMod, v("u"), Expr::Int(4)), &r),
            v("u")
        );
        let e = bin(
            BinOp::FloorDiv,
            bin(BinOp::Add, bin(BinOp::Mul, v("f"), Expr::Int(4)), v("u")),
            Expr::Int(4),
        );
        assert_eq!(simplify(&e, &r), v("f"));
    }

    #[test]
    fn a_division_over_a_span_the_divisor_divides_has_a_constant_extent() {
        // A transposed conv's padded input read at (h + rh + 1) // 2 under a tile of h: with
        // rh in [0, 5) the region is (h + 1) // 2 + [0, 2] for every h, as TVM proves.
        let mut all = Ranges::new();
        all.insert("h".into(), 7);
        all.insert("rh".into(), 5);
        let mut relaxed = Ranges::new();
        relaxed.insert("rh".into(), 5);
        let read = |r: Expr| {
            bin(
                BinOp::FloorDiv,
                bin(BinOp::Add, bin(BinOp::Add, v("h"), r), Expr::Int(1)),
                Expr::Int(2),
            )
        };
        let iv = relax(&read(v("rh")), &relaxed, &all).unwrap();
        let start = bin(
            BinOp::FloorDiv,
            bin(BinOp::Add, v("h"), Expr::Int(1)),
            Expr::Int(2),
        );
        assert!(iv.exact);
        assert_eq!((iv.lo, iv.hi), (0, 2));
        assert_eq!(iv.base.to_expr(), simplify(&start, &all));
        // rh in [0, 4): (h + 4) // 2 - (h + 1) // 2 is 1 or 2, an extent that depends on h.
        relaxed.insert("rh".into(), 4);
        all.insert("rh".into(), 4);
        assert!(!relax(&read(v("rh")), &relaxed, &all).unwrap().exact);
    }

    #[test]
    fn division_keeps_coefficients_the_divisor_does_not_divide() {
        // A fused (5, 37) loop split by 64: TVM leaves floordiv(f0 * 64 + f1, 37) as it is;
        // f0 + floordiv(f0 * 27 + f1, 37), equal in value, counts two more additions.
        let mut r = Ranges::new();
        r.insert("f0".into(), 3);
        r.insert("f1".into(), 64);
        let fused = bin(BinOp::Add, bin(BinOp::Mul, v("f0"), Expr::Int(64)), v("f1"));
        for op in [BinOp::FloorDiv, BinOp::FloorMod] {
            let e = bin(op, fused.clone(), Expr::Int(37));
            assert_eq!(simplify(&e, &r), e);
        }
        // Terms the divisor divides still leave the division: (f0 * 74 + f1) // 37.
        let e = bin(
            BinOp::FloorDiv,
            bin(BinOp::Add, bin(BinOp::Mul, v("f0"), Expr::Int(74)), v("f1")),
            Expr::Int(37),
        );
        let want = bin(
            BinOp::Add,
            bin(BinOp::FloorDiv, v("f1"), Expr::Int(37)),
            bin(BinOp::Mul, v("f0"), Expr::Int(2)),
        );
        assert_eq!(simplify(&e, &r), want);
    }

    #[test]
    fn relax_inner_vars() {
        let mut all = Ranges::new();
        all.insert("o".into(), 4);
        all.insert("i".into(), 8);
        let mut relaxed = Ranges::new();
        relaxed.insert("i".into(), 8);
        let e = bin(BinOp::Add, bin(BinOp::Mul, v("o"), Expr::Int(8)), v("i"));
        let s = relax(&e, &relaxed, &all).unwrap();
        assert_eq!((s.lo, s.hi), (0, 7));
        assert_eq!(s.base.to_expr(), bin(BinOp::Mul, v("o"), Expr::Int(8)));
    }
}
