//! Whether a block's bindings are an affine iterator map, as TVM's `DetectIterMap` decides it.
//!
//! After a split or fuse, TVM rewrites a block's bindings with `IterMapSimplify`, which only
//! simplifies when the bindings form an iterator map: every binding a sum of loop-variable
//! pieces (`floormod(floordiv(v, lower), extent) * scale`) whose scales chain as a mixed radix,
//! `scale[i + 1] == scale[i] * extent[i]`. Where detection fails (a convolution window
//! `h * 2 + rh + ax`, or a tile of 63 rows under a stride of 64), TVM keeps the substituted
//! bindings as they are, `floordiv(floormod(fused, 252), 4)` included, and later passes see
//! that form. The engine must not simplify them either: the modulo its ranges would drop at the
//! fuse no longer drops once a split widens the loop past 252.

use super::arith::{atom_bounds, linear, Ranges};
use crate::program::{BinOp, Expr};

/// Whether every binding is a mixed-radix sum of pieces (a binding this cannot read, such as
/// a negative scale, is taken as detected: the engine then simplifies as before).
pub fn is_iter_map(bindings: &[Expr], ranges: &Ranges) -> bool {
    bindings
        .iter()
        .all(|e| chains(e, ranges) != Piece::NotAffine)
}

/// What a term's atom is to `DetectIterMap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    /// A piece of a loop variable (or of a mixed-radix sum) taking this many values.
    Extent(i64),
    /// Something detection refuses: a window of overlapping terms, a split off a mark whose
    /// extent it does not divide.
    NotAffine,
    /// Something this reading does not model.
    Unread,
}

/// One binding: `Extent(n)` where its terms fuse into one iterator as `DetectIterMap`'s
/// `TryFuseIters` fuses them (the sum then takes `n` values from 0 on), `NotAffine` where they
/// do not.
fn chains(e: &Expr, ranges: &Ranges) -> Piece {
    let Some(lin) = linear(e, ranges) else {
        return Piece::Unread;
    };
    let mut terms: Vec<(i64, i64)> = Vec::new();
    for (atom, coef) in lin.terms.values() {
        match piece(atom, ranges) {
            Piece::Extent(n) if *coef > 0 => {
                if n > 1 {
                    terms.push((*coef, n));
                }
            }
            Piece::NotAffine => return Piece::NotAffine,
            _ => return Piece::Unread,
        }
    }
    if fuses(&mut terms) {
        let extent = terms.iter().map(|&(c, n)| c * (n - 1)).sum::<i64>() + 1;
        match terms.iter().map(|t| t.0).min() {
            Some(1) | None => Piece::Extent(extent),
            Some(_) => Piece::Unread,
        }
    } else {
        Piece::NotAffine
    }
}

/// `TryFuseIters` on `(scale, extent)` terms: from the smallest scale, each next term has the
/// scale the ones before span; with a base scale of 1 (surjective maps), a smaller scale also
/// does, the terms then overlapping (a window `rh + ax`).
fn fuses(terms: &mut [(i64, i64)]) -> bool {
    terms.sort_unstable();
    let Some(&(base, _)) = terms.first() else {
        return true;
    };
    let mut used = vec![false; terms.len()];
    let mut expected = base;
    for step in 0..terms.len() {
        let exact = if step == 0 {
            Some(0)
        } else {
            (0..terms.len()).find(|&j| !used[j] && terms[j].0 == expected)
        };
        let pos = exact.or_else(|| {
            (base == 1)
                .then(|| {
                    (0..terms.len())
                        .filter(|&j| !used[j] && terms[j].0 <= expected)
                        .max_by_key(|&j| terms[j].0)
                })
                .flatten()
        });
        let Some(pos) = pos else {
            return false;
        };
        used[pos] = true;
        let scale = if exact.is_some() {
            expected
        } else {
            terms[pos].0
        };
        let Some(next) = terms[pos].1.checked_mul(scale) else {
            return false;
        };
        expected = next;
    }
    true
}

/// What `atom` (a term of a binding's linear form) is to `DetectIterMap`.
fn piece(atom: &Expr, ranges: &Ranges) -> Piece {
    match atom {
        Expr::Var(v) => ranges.get(v).map_or(Piece::Unread, |&n| Piece::Extent(n)),
        Expr::Bin(BinOp::FloorDiv | BinOp::FloorMod, a, b) => {
            let Some(k) = b.as_int().filter(|k| *k > 0) else {
                return Piece::Unread;
            };
            // A piece of a piece, or of a sum that is itself a mixed radix.
            let inner = match a.as_ref() {
                Expr::Var(_) | Expr::Bin(BinOp::FloorDiv | BinOp::FloorMod, _, _) => {
                    piece(a, ranges)
                }
                sum => chains(sum, ranges),
            };
            let Piece::Extent(n) = inner else {
                return inner;
            };
            // TVM splits a mark only by a divisor of its extent.
            if n % k != 0 {
                return Piece::NotAffine;
            }
            match atom_bounds(atom, ranges) {
                Some((0, hi)) => Piece::Extent(hi + 1),
                _ => Piece::Unread,
            }
        }
        _ => Piece::Unread,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str) -> Expr {
        Expr::Var(name.into())
    }
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }
    fn ranges(vars: &[(&str, i64)]) -> Ranges {
        vars.iter().map(|&(n, e)| (n.to_string(), e)).collect()
    }

    #[test]
    fn a_tile_is_an_iter_map() {
        // bx * 32 + ax with ax < 32, and a fused loop's pieces.
        let r = ranges(&[("bx", 4), ("ax", 32), ("f", 252)]);
        let tile = bin(BinOp::Add, bin(BinOp::Mul, v("bx"), Expr::Int(32)), v("ax"));
        let hi = bin(BinOp::FloorDiv, v("f"), Expr::Int(4));
        let lo = bin(BinOp::FloorMod, v("f"), Expr::Int(4));
        assert!(is_iter_map(&[tile, hi, lo], &r));
    }

    #[test]
    fn a_window_with_a_unit_base_scale_is_surjective() {
        // rh + ax (both scale 1): TryFuseIters takes the smaller scale, the terms overlap.
        let r = ranges(&[("rh", 2), ("ax", 5)]);
        assert!(is_iter_map(&[bin(BinOp::Add, v("rh"), v("ax"))], &r));
    }

    #[test]
    fn a_window_under_a_wider_stride_is_not() {
        // b * 64 + rl + ax with rl < 3, ax < 63: after rl and ax (extent 65 at most) no term
        // has a scale within 63, so detection fails and TVM keeps the substituted bindings.
        let r = ranges(&[("b", 4), ("rl", 3), ("ax", 63)]);
        let window = bin(
            BinOp::Add,
            bin(BinOp::Add, bin(BinOp::Mul, v("b"), Expr::Int(64)), v("rl")),
            v("ax"),
        );
        assert!(!is_iter_map(&[window], &r));
        // The same with a tile of 63 rows under a stride of 64 and no window.
        let tile = bin(BinOp::Add, bin(BinOp::Mul, v("b"), Expr::Int(64)), v("ax"));
        assert!(!is_iter_map(&[tile], &r));
    }

    #[test]
    fn a_split_that_does_not_divide_its_mark_is_not() {
        // floormod(f, 63) with f < 64.
        let r = ranges(&[("f", 64)]);
        assert!(!is_iter_map(
            &[bin(BinOp::FloorMod, v("f"), Expr::Int(63))],
            &r
        ));
        let r = ranges(&[("f", 126)]);
        assert!(is_iter_map(
            &[bin(BinOp::FloorMod, v("f"), Expr::Int(63))],
            &r
        ));
    }
}
