//! How much code LLVM is handed for a candidate, counted on the schedule state: what drives its
//! build time.
//!
//! TVM's `VectorizeLoop` turns each vectorized loop into vector statements, then `UnrollLoop`
//! copies the serial loops under a `pragma_auto_unroll_max_step` while the copied body stays
//! within the step budget. A vector access whose index is not contiguous along the vector loop
//! becomes a strided `Ramp`, which LLVM expands lane by lane. On TBG:0, every candidate with
//! 4096 such lanes after unrolling took 7.3 to 8.1 s to build, against a median of 0.2 s
//! (BENCHMARKS.md, build cost).

use std::collections::HashMap;

use super::access::bounds;
use super::lower::{lower, Lowered};
use crate::error::Result;
use crate::program::{Expr, LoopKind};
use crate::schedule::State;

/// Names of [`CodeSize::row`]'s values, in order.
pub const CODE_SIZE_NAMES: [&str; 4] = [
    "log_statements",
    "log_strided_lanes",
    "log_vector_lanes",
    "log_max_copies",
];

/// The size of a candidate's code after TVM's vectorization and unrolling.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CodeSize {
    /// Stores after unrolling (a vectorized store counts once).
    pub statements: f64,
    /// Lanes of vector loads and stores that are not contiguous along their vector loop, after
    /// unrolling.
    pub strided_lanes: f64,
    /// Lanes of every vector load and store, after unrolling.
    pub vector_lanes: f64,
    /// The most copies unrolling makes of one store.
    pub max_copies: f64,
}

impl CodeSize {
    /// The values as the build-time model reads them: `log2(x + 1)`.
    pub fn row(&self) -> [f32; 4] {
        [
            self.statements,
            self.strided_lanes,
            self.vector_lanes,
            self.max_copies,
        ]
        .map(|x| (x + 1.0).log2() as f32)
    }
}

/// One node of the lowered loop tree: a loop (index into [`Lowered::loops`]) or a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Node {
    Loop(usize),
    Store(usize),
}

struct Tree<'a> {
    low: &'a Lowered,
    children: HashMap<Option<usize>, Vec<Node>>,
    /// Whether each loop is unrolled (auto or explicitly).
    unrolled: Vec<bool>,
}

/// `UnrollLoop`'s counters after visiting a subtree: statements, unrolled and normal depth.
#[derive(Clone, Copy, Default)]
struct Count {
    steps: i64,
    unroll_depth: i64,
    normal_depth: i64,
}

/// TVM's defaults for the counters `pragma_auto_unroll_max_step` leaves alone.
const AUTO_MAX_DEPTH: i64 = 8;

impl<'a> Tree<'a> {
    fn new(low: &'a Lowered) -> Self {
        let mut children: HashMap<Option<usize>, Vec<Node>> = HashMap::new();
        let mut seen = vec![false; low.loops.len()];
        for (s, store) in low.stores.iter().enumerate() {
            let mut parent = None;
            for &l in &store.loops {
                if !seen[l] {
                    seen[l] = true;
                    children.entry(parent).or_default().push(Node::Loop(l));
                }
                parent = Some(l);
            }
            children.entry(parent).or_default().push(Node::Store(s));
        }
        Tree {
            low,
            children,
            unrolled: vec![false; low.loops.len()],
        }
    }

    /// `UnrollLoop` on the subtree under `parent`, its children as a sequence: each child is
    /// counted from zero, statements add up, depths take the maximum.
    fn visit_children(&mut self, parent: Option<usize>, max_step: i64) -> Count {
        let kids = self.children.get(&parent).cloned().unwrap_or_default();
        let mut total = Count::default();
        for node in kids {
            let c = self.visit(node, max_step);
            total.steps += c.steps;
            total.unroll_depth = total.unroll_depth.max(c.unroll_depth);
            total.normal_depth = total.normal_depth.max(c.normal_depth);
        }
        total
    }

    fn visit(&mut self, node: Node, max_step: i64) -> Count {
        let l = match node {
            Node::Store(_) => {
                return Count {
                    steps: 1,
                    ..Count::default()
                }
            }
            Node::Loop(l) => l,
        };
        let lp = &self.low.loops[l];
        let (kind, extent) = (lp.kind, lp.extent);
        let max_step = lp.auto_unroll.unwrap_or(max_step);
        let mut c = self.visit_children(Some(l), max_step);
        if kind == LoopKind::Vectorized {
            return c; // one vector statement per store below
        }
        let auto = kind == LoopKind::Serial
            && c.normal_depth == 0
            && c.unroll_depth <= AUTO_MAX_DEPTH
            && extent.saturating_mul(c.steps) <= max_step;
        if auto || kind == LoopKind::Unrolled {
            self.unrolled[l] = true;
            c.steps = c.steps.saturating_mul(extent);
            c.unroll_depth += 1;
        } else {
            c.normal_depth += 1;
        }
        c
    }
}

/// The coefficient of `var` in the flattened index `indices` into a buffer of `shape`
/// (row-major), the other variables at 0; `None` where the index cannot be evaluated.
fn flat_step(indices: &[Expr], shape: &[i64], var: &str) -> Option<i64> {
    let at = |x: i64| {
        let mut flat = 0i64;
        for (i, e) in indices.iter().enumerate() {
            let (lo, _) = bounds(e, &|v: &str| if v == var { (x, x) } else { (0, 0) })?;
            let stride: i64 = shape.get(i + 1..).map_or(1, |s| s.iter().product());
            flat = flat.saturating_add(lo.saturating_mul(stride));
        }
        Some(flat)
    };
    Some(at(1)? - at(0)?)
}

/// The size of `st`'s code after TVM's vectorization and unrolling ([`CodeSize`]).
pub fn code_size(st: &State) -> Result<CodeSize> {
    let low = lower(st)?;
    let mut tree = Tree::new(&low);
    tree.visit_children(None, 0);
    let mut size = CodeSize::default();
    for store in &low.stores {
        let copies: f64 = store
            .loops
            .iter()
            .filter(|&&l| tree.unrolled[l])
            .map(|&l| low.loops[l].extent as f64)
            .product();
        size.statements += copies;
        size.max_copies = size.max_copies.max(copies);
        let vector = store
            .loops
            .iter()
            .rev()
            .find(|&&l| low.loops[l].kind == LoopKind::Vectorized);
        let Some(&v) = vector else { continue };
        let (var, lanes) = (low.loops[v].var.as_str(), low.loops[v].extent as f64);
        let mut accesses = vec![(store.buffer, store.indices.clone())];
        store.value.visit(&mut |e| {
            if let Expr::Load { buffer, indices } = e {
                accesses.push((*buffer, indices.clone()));
            }
        });
        for (buffer, indices) in accesses {
            let shape = low.shapes.get(buffer).map_or(&[][..], |s| s.as_slice());
            size.vector_lanes += copies * lanes;
            if !matches!(flat_step(&indices, shape, var), Some(0) | Some(1)) {
                size.strided_lanes += copies * lanes;
            }
        }
    }
    Ok(size)
}
