//! The program model: a TIR PrimFunc of scheduled blocks, as the Rust core sees it.
//!
//! Blocks live in an arena ([`Program::blocks`]); the loop tree refers to them by index. Every
//! loop and block keeps the names TIR gave it, so traces can refer to blocks by name.

mod arith;
mod expr;
mod import;

use std::collections::BTreeMap;

use serde_json::Value;

pub use arith::OpCounts;
pub use expr::{BinOp, Expr};

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub shape: Vec<i64>,
    pub dtype: String,
    pub scope: String,
}

impl Buffer {
    pub fn elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Bytes per element, from the dtype's bit width (`float32` -> 4, `bool` -> 1).
    pub fn element_bytes(&self) -> i64 {
        ((dtype_bits(&self.dtype) + 7) / 8).max(1)
    }
}

pub fn dtype_bits(dtype: &str) -> i64 {
    if dtype == "bool" {
        return 8;
    }
    let digits: String = dtype
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap_or(32)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IterKind {
    /// Data-parallel (TIR's `S`).
    Spatial,
    /// Commutative reduction (TIR's `R`).
    Reduce,
    /// Ordered or opaque: nothing may reorder it.
    Opaque,
}

impl IterKind {
    pub fn letter(self) -> char {
        match self {
            IterKind::Spatial => 'S',
            IterKind::Reduce => 'R',
            IterKind::Opaque => 'O',
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct IterVar {
    pub name: String,
    pub min: i64,
    pub extent: i64,
    pub kind: IterKind,
}

/// A read or written region: per dimension, a minimum index expression and an extent.
#[derive(Clone, Debug, PartialEq)]
pub struct Access {
    pub buffer: usize,
    pub region: Vec<(Expr, Expr)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    pub buffer: usize,
    pub indices: Vec<Expr>,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub name: String,
    pub iter_vars: Vec<IterVar>,
    pub reads: Vec<Access>,
    pub writes: Vec<Access>,
    /// The reduction init (`T.init()`), if any.
    pub init: Option<Vec<Store>>,
    /// The stores of a leaf block; empty for a block with child statements.
    pub body: Vec<Store>,
    /// Child statements of a non-leaf block (the root block, for one).
    pub children: Option<Vec<Node>>,
    pub alloc_buffers: Vec<usize>,
    pub annotations: BTreeMap<String, Value>,
}

impl Block {
    pub fn is_reduction(&self) -> bool {
        self.init.is_some() || self.iter_vars.iter().any(|v| v.kind == IterKind::Reduce)
    }

    pub fn iter_kinds(&self) -> String {
        self.iter_vars.iter().map(|v| v.kind.letter()).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    Serial,
    Parallel,
    Vectorized,
    Unrolled,
    ThreadBinding,
}

impl LoopKind {
    pub fn name(self) -> &'static str {
        match self {
            LoopKind::Serial => "serial",
            LoopKind::Parallel => "parallel",
            LoopKind::Vectorized => "vectorized",
            LoopKind::Unrolled => "unrolled",
            LoopKind::ThreadBinding => "thread_binding",
        }
    }

    pub fn from_name(name: &str) -> Option<LoopKind> {
        Some(match name {
            "serial" => LoopKind::Serial,
            "parallel" => LoopKind::Parallel,
            "vectorized" => LoopKind::Vectorized,
            "unrolled" => LoopKind::Unrolled,
            "thread_binding" => LoopKind::ThreadBinding,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    pub var: String,
    pub min: i64,
    pub extent: i64,
    pub kind: LoopKind,
    pub thread: Option<String>,
    pub annotations: BTreeMap<String, Value>,
    pub body: Vec<Node>,
}

/// A block placed in the loop tree: which block, the values of its iteration variables in terms
/// of the enclosing loop variables, and its predicate.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRealize {
    pub block: usize,
    pub bindings: Vec<Expr>,
    pub predicate: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Loop(Loop),
    Block(BlockRealize),
}

/// A TIR function as the engine sees it: buffers, blocks and the loop tree under the root block.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The function's name.
    pub name: String,
    /// The buffers the function takes, in argument order (indices into `buffers`).
    pub params: Vec<usize>,
    /// Every buffer: parameters and intermediates.
    pub buffers: Vec<Buffer>,
    /// Every block, in program order.
    pub blocks: Vec<Block>,
    /// The root block, whose body is the loop tree.
    pub root: BlockRealize,
}

impl Program {
    /// Imports the JSON the Python bridge writes (see `fastsearch/tir_import.py`).
    pub fn from_json(text: &str) -> crate::Result<Program> {
        import::program_from_json(text)
    }

    /// Index of the block named `name`.
    pub fn block_by_name(&self, name: &str) -> Option<usize> {
        self.blocks.iter().position(|b| b.name == name)
    }

    /// Leaf blocks (those that compute) in program order.
    pub fn leaf_blocks(&self) -> Vec<usize> {
        let mut out = Vec::new();
        fn walk(p: &Program, nodes: &[Node], out: &mut Vec<usize>) {
            for n in nodes {
                match n {
                    Node::Loop(l) => walk(p, &l.body, out),
                    Node::Block(r) => match &p.blocks[r.block].children {
                        Some(children) => walk(p, children, out),
                        None => out.push(r.block),
                    },
                }
            }
        }
        if let Some(children) = &self.blocks[self.root.block].children {
            walk(self, children, &mut out);
        }
        out
    }

    /// The loops enclosing `block`, outermost first, as found in the initial loop tree.
    pub fn loops_of(&self, block: usize) -> Vec<&Loop> {
        fn walk<'a>(
            p: &'a Program,
            nodes: &'a [Node],
            target: usize,
            stack: &mut Vec<&'a Loop>,
        ) -> bool {
            for n in nodes {
                match n {
                    Node::Loop(l) => {
                        stack.push(l);
                        if walk(p, &l.body, target, stack) {
                            return true;
                        }
                        stack.pop();
                    }
                    Node::Block(r) => {
                        if r.block == target {
                            return true;
                        }
                        if let Some(children) = &p.blocks[r.block].children {
                            if walk(p, children, target, stack) {
                                return true;
                            }
                        }
                    }
                }
            }
            false
        }
        let mut stack = Vec::new();
        if let Some(children) = &self.blocks[self.root.block].children {
            walk(self, children, block, &mut stack);
        }
        stack
    }

    /// Blocks that read a buffer `block` writes (its consumers), in program order.
    pub fn consumers(&self, block: usize) -> Vec<usize> {
        let written: Vec<usize> = self.blocks[block].writes.iter().map(|w| w.buffer).collect();
        self.leaf_blocks()
            .into_iter()
            .filter(|&b| {
                b != block
                    && self.blocks[b]
                        .reads
                        .iter()
                        .any(|r| written.contains(&r.buffer))
            })
            .collect()
    }

    /// Blocks that write a buffer `block` reads (its producers), in program order.
    pub fn producers(&self, block: usize) -> Vec<usize> {
        let read: Vec<usize> = self.blocks[block].reads.iter().map(|r| r.buffer).collect();
        self.leaf_blocks()
            .into_iter()
            .filter(|&b| {
                b != block
                    && self.blocks[b]
                        .writes
                        .iter()
                        .any(|w| read.contains(&w.buffer))
            })
            .collect()
    }

    /// Whether `buffer` is a parameter of the function (an input or an output).
    pub fn is_param(&self, buffer: usize) -> bool {
        self.params.contains(&buffer)
    }
}

/// A JSON summary of the program: each leaf block with its iteration kinds and extents, its
/// enclosing loops and its arithmetic per iteration.
pub fn summary(p: &Program) -> Value {
    let blocks: Vec<Value> = p
        .leaf_blocks()
        .into_iter()
        .map(|b| {
            let block = &p.blocks[b];
            let ops = OpCounts::of_block(p, block);
            serde_json::json!({
                "name": block.name,
                "iter_kinds": block.iter_kinds(),
                "extents": block.iter_vars.iter().map(|v| v.extent).collect::<Vec<_>>(),
                "loops": p.loops_of(b).iter().map(|l| l.extent).collect::<Vec<_>>(),
                "reads": block.reads.len(),
                "writes": block.writes.len(),
                "float_ops": ops.float_ops(),
                "loads": ops.loads,
                "reduction": block.is_reduction(),
            })
        })
        .collect();
    serde_json::json!({ "name": p.name, "buffers": p.buffers.len(), "blocks": blocks })
}
