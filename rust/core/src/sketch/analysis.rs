//! What the sketch rules need to know about each block of a program.

use std::collections::BTreeSet;

use crate::program::{Expr, IterKind, Loop, Node, Program};

/// A leaf block with its place in the initial loop tree.
#[derive(Clone, Debug)]
pub struct BlockInfo {
    pub block: usize,
    /// Extents of the enclosing loops, outermost first.
    pub loop_extents: Vec<i64>,
    /// Whether loop `i` binds iteration variable `i` directly (one loop per iteration variable,
    /// in order, no predicate): the shape multi-level tiling and rfactor expect.
    pub simple_loops: bool,
    pub spatial: bool,
    /// Spatial, one store, identity write indices, not a function output: ComputeInline applies.
    pub inlinable: bool,
    /// As `inlinable`, but also for blocks whose value is costly to recompute (`exp`): what
    /// MetaSchedule's CUDA AutoInline inlines, since it disallows no operator.
    pub inlinable_any_cost: bool,
    /// The stored value holds a conditional (padding's `if_then_else`): inlining it puts a
    /// select into the consumer's inner loops, so sketches may also compute it under the
    /// consumer's tiles, as MetaSchedule's CPU AutoInline leaves it to RandomComputeLocation.
    pub conditional: bool,
    /// Some read walks the block's iteration variables out of their order (a transpose):
    /// MetaSchedule's CPU AutoInline requires ordered reads and leaves such a block, too, to
    /// RandomComputeLocation.
    pub unordered: bool,
    pub output: bool,
    /// A reduction with data reuse: some read ignores some spatial iteration variable.
    pub reuse: bool,
    pub spatial_extent: i64,
    pub reduce_extent: i64,
    /// Buffers read and written.
    pub reads: BTreeSet<usize>,
    pub writes: BTreeSet<usize>,
    /// Per read of the block (in `Block::reads` order), the iteration variables its region
    /// walks ([`super::read_walks`]): what the analytical model's reuse counts depend on,
    /// worked out once per program rather than per scored candidate.
    pub read_walks: Vec<BTreeSet<usize>>,
}

/// Each leaf block with its enclosing loop extents and whether its bindings are exactly the
/// enclosing loop variables, in order, with no predicate.
fn placement(p: &Program) -> Vec<(usize, Vec<i64>, bool)> {
    struct Walk<'a> {
        p: &'a Program,
        extents: Vec<i64>,
        vars: Vec<String>,
        out: Vec<(usize, Vec<i64>, bool)>,
    }
    impl Walk<'_> {
        fn nodes(&mut self, nodes: &[Node]) {
            for n in nodes {
                match n {
                    Node::Loop(Loop {
                        extent, var, body, ..
                    }) => {
                        self.extents.push(*extent);
                        self.vars.push(var.clone());
                        self.nodes(body);
                        self.extents.pop();
                        self.vars.pop();
                    }
                    Node::Block(r) => match &self.p.blocks[r.block].children {
                        Some(children) => self.nodes(children),
                        None => {
                            let simple = r.bindings.len() == self.vars.len()
                                && r.bindings
                                    .iter()
                                    .zip(&self.vars)
                                    .all(|(e, v)| matches!(e, Expr::Var(n) if n == v))
                                && matches!(r.predicate, Expr::Bool(true) | Expr::Int(1));
                            self.out.push((r.block, self.extents.clone(), simple));
                        }
                    },
                }
            }
        }
    }
    let mut w = Walk {
        p,
        extents: Vec::new(),
        vars: Vec::new(),
        out: Vec::new(),
    };
    if let Some(children) = &p.blocks[p.root.block].children {
        w.nodes(children);
    }
    w.out
}

/// Calls too costly to duplicate into every consumer by inlining.
const EXPENSIVE_CALLS: &[&str] = &["tirx.exp", "tir.exp"];

pub fn analyze(p: &Program) -> Vec<BlockInfo> {
    placement(p)
        .into_iter()
        .map(|(b, loop_extents, simple_bindings)| {
            let block = &p.blocks[b];
            let simple_loops = simple_bindings
                && block.iter_vars.len() == loop_extents.len()
                && block
                    .iter_vars
                    .iter()
                    .zip(&loop_extents)
                    .all(|(iv, e)| iv.extent == *e && iv.min == 0);
            let spatial =
                block.init.is_none() && block.iter_vars.iter().all(|v| v.kind == IterKind::Spatial);
            let writes: BTreeSet<usize> = block.writes.iter().map(|w| w.buffer).collect();
            let reads: BTreeSet<usize> = block.reads.iter().map(|r| r.buffer).collect();
            let output = writes.iter().any(|w| p.is_param(*w));
            let identity_write = block.body.len() == 1
                && block.body[0].indices.len() == block.iter_vars.len()
                && block.body[0]
                    .indices
                    .iter()
                    .zip(&block.iter_vars)
                    .all(|(e, v)| matches!(e, Expr::Var(n) if *n == v.name));
            let spatial_vars: Vec<&str> = block
                .iter_vars
                .iter()
                .filter(|v| v.kind == IterKind::Spatial)
                .map(|v| v.name.as_str())
                .collect();
            let reuse = !spatial
                && block.reads.iter().any(|r| {
                    let mut used = BTreeSet::new();
                    for (min, _) in &r.region {
                        min.visit(&mut |e| {
                            if let Expr::Var(n) = e {
                                used.insert(n.clone());
                            }
                        });
                    }
                    spatial_vars.iter().any(|v| !used.contains(*v))
                });
            let extent_of = |kind: IterKind| -> i64 {
                block
                    .iter_vars
                    .iter()
                    .filter(|v| v.kind == kind)
                    .map(|v| v.extent)
                    .product()
            };
            // As MetaSchedule's CPU AutoInline: inlining `exp` would recompute it in every consumer.
            let mut expensive = false;
            let mut conditional = false;
            for store in &block.body {
                store.value.visit(&mut |e| match e {
                    Expr::Call { name, .. } => {
                        expensive |= EXPENSIVE_CALLS.contains(&name.as_str())
                    }
                    Expr::Select(..) => conditional = true,
                    _ => {}
                });
            }
            let position = |name: &str| block.iter_vars.iter().position(|v| v.name == name);
            let unordered = block.reads.iter().any(|r| {
                let mut order: Vec<usize> = Vec::new();
                for (min, _) in &r.region {
                    min.visit(&mut |e| {
                        if let Expr::Var(n) = e {
                            if let Some(i) = position(n) {
                                if !order.contains(&i) {
                                    order.push(i);
                                }
                            }
                        }
                    });
                }
                order.windows(2).any(|w| w[0] > w[1])
            });
            BlockInfo {
                block: b,
                simple_loops,
                spatial,
                inlinable: spatial
                    && identity_write
                    && !output
                    && block.body.len() == 1
                    && !expensive,
                inlinable_any_cost: spatial && identity_write && !output && block.body.len() == 1,
                conditional,
                unordered,
                output,
                reuse,
                spatial_extent: extent_of(IterKind::Spatial),
                reduce_extent: extent_of(IterKind::Reduce),
                reads,
                writes,
                read_walks: super::read_walks(block),
                loop_extents,
            }
        })
        .collect()
}
