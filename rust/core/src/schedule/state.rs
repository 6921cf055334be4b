//! The schedule state: a mutable loop tree over the program model, with stable ids for loops
//! and blocks so that a trace's random variables keep pointing at the same things.

use std::collections::BTreeMap;

use serde_json::Value;

use super::arith::{self, Ranges};
use super::iter_map;
use crate::error::{Error, Result};
use crate::program::{Block, Buffer, Expr, IterKind, LoopKind, Node, Program};

pub type LoopId = usize;
pub type BlockId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    Loop(LoopId),
    Block(BlockId),
}

#[derive(Clone, Debug)]
pub struct SLoop {
    /// Unique in the state (`%<id>`); loop names are naming noise for comparisons.
    pub var: String,
    pub extent: i64,
    pub kind: LoopKind,
    pub thread: Option<String>,
    pub annotations: BTreeMap<String, Value>,
    pub children: Vec<Child>,
    /// `None`: directly under the root block.
    pub parent: Option<LoopId>,
    pub alive: bool,
}

#[derive(Clone, Debug)]
pub struct SBlock {
    pub block: Block,
    /// Iteration variable values in terms of loop variables.
    pub bindings: Vec<Expr>,
    pub predicate: Expr,
    pub parent: Option<LoopId>,
    pub alive: bool,
}

impl SBlock {
    /// The value bound to iteration variable `var`, in terms of loop variables.
    pub fn binding_of(&self, var: &str) -> Option<Expr> {
        self.block
            .iter_vars
            .iter()
            .position(|v| v.name == var)
            .map(|i| self.bindings[i].clone())
    }
}

#[derive(Clone, Debug)]
pub struct State {
    pub params: Vec<usize>,
    pub buffers: Vec<Buffer>,
    pub loops: Vec<SLoop>,
    pub blocks: Vec<SBlock>,
    /// The root block: its annotations and allocated buffers (it is not in the tree).
    pub root: BlockId,
    /// Children of the root block.
    pub top: Vec<Child>,
}

impl State {
    pub fn from_program(p: &Program) -> Result<State> {
        let root_block = &p.blocks[p.root.block];
        let mut st = State {
            params: p.params.clone(),
            buffers: p.buffers.clone(),
            loops: Vec::new(),
            blocks: Vec::new(),
            root: 0,
            top: Vec::new(),
        };
        let mut root = root_block.clone();
        root.children = None;
        st.blocks.push(SBlock {
            block: root,
            bindings: vec![],
            predicate: Expr::Bool(true),
            parent: None,
            alive: true,
        });
        let children = root_block.children.clone().unwrap_or_default();
        let mut renames = BTreeMap::new();
        st.top = st.import_nodes(p, &children, None, &mut renames)?;
        Ok(st)
    }

    fn import_nodes(
        &mut self,
        p: &Program,
        nodes: &[Node],
        parent: Option<LoopId>,
        renames: &mut BTreeMap<String, String>,
    ) -> Result<Vec<Child>> {
        let mut out = Vec::new();
        for n in nodes {
            match n {
                Node::Loop(l) => {
                    if l.min != 0 {
                        return Err(Error::Unsupported(format!(
                            "loop {} starts at {}, not 0",
                            l.var, l.min
                        )));
                    }
                    let id = self.new_loop(l.extent, parent);
                    self.loops[id].kind = l.kind;
                    self.loops[id].thread = l.thread.clone();
                    self.loops[id].annotations = l.annotations.clone();
                    let old = renames.insert(l.var.clone(), self.loops[id].var.clone());
                    let kids = self.import_nodes(p, &l.body, Some(id), renames)?;
                    match old {
                        Some(o) => renames.insert(l.var.clone(), o),
                        None => renames.remove(&l.var),
                    };
                    self.loops[id].children = kids;
                    out.push(Child::Loop(id));
                }
                Node::Block(r) => {
                    let block = p.blocks[r.block].clone();
                    if block.children.is_some() {
                        return Err(Error::Unsupported(format!(
                            "nested block `{}` with child statements",
                            block.name
                        )));
                    }
                    if let Some(iv) = block.iter_vars.iter().find(|iv| iv.min != 0) {
                        return Err(Error::Unsupported(format!(
                            "block {}: iteration var {} starts at {}",
                            block.name, iv.name, iv.min
                        )));
                    }
                    if r.bindings.len() != block.iter_vars.len() {
                        return Err(Error::Malformed(format!(
                            "block {}: {} bindings for {} iteration variables",
                            block.name,
                            r.bindings.len(),
                            block.iter_vars.len()
                        )));
                    }
                    let map = |v: &str| renames.get(v).map(|n| Expr::Var(n.clone()));
                    let bindings = r.bindings.iter().map(|e| e.substitute(&map)).collect();
                    let predicate = r.predicate.substitute(&map);
                    self.blocks.push(SBlock {
                        block,
                        bindings,
                        predicate,
                        parent,
                        alive: true,
                    });
                    out.push(Child::Block(self.blocks.len() - 1));
                }
            }
        }
        Ok(out)
    }

    pub fn new_loop(&mut self, extent: i64, parent: Option<LoopId>) -> LoopId {
        let id = self.loops.len();
        self.loops.push(SLoop {
            var: format!("%{id}"),
            extent,
            kind: LoopKind::Serial,
            thread: None,
            annotations: BTreeMap::new(),
            children: Vec::new(),
            parent,
            alive: true,
        });
        id
    }

    pub fn new_block(
        &mut self,
        block: Block,
        bindings: Vec<Expr>,
        parent: Option<LoopId>,
    ) -> BlockId {
        self.blocks.push(SBlock {
            block,
            bindings,
            predicate: Expr::Bool(true),
            parent,
            alive: true,
        });
        self.blocks.len() - 1
    }

    pub fn children(&self, parent: Option<LoopId>) -> &Vec<Child> {
        match parent {
            None => &self.top,
            Some(l) => &self.loops[l].children,
        }
    }

    pub fn children_mut(&mut self, parent: Option<LoopId>) -> &mut Vec<Child> {
        match parent {
            None => &mut self.top,
            Some(l) => &mut self.loops[l].children,
        }
    }

    pub fn parent_of(&self, c: Child) -> Option<LoopId> {
        match c {
            Child::Loop(l) => self.loops[l].parent,
            Child::Block(b) => self.blocks[b].parent,
        }
    }

    pub fn set_parent(&mut self, c: Child, parent: Option<LoopId>) {
        match c {
            Child::Loop(l) => self.loops[l].parent = parent,
            Child::Block(b) => self.blocks[b].parent = parent,
        }
    }

    /// Position of `c` in its parent's children.
    pub fn position(&self, c: Child) -> Result<usize> {
        self.children(self.parent_of(c))
            .iter()
            .position(|x| *x == c)
            .ok_or_else(|| Error::Internal(format!("{c:?} is not among its parent's children")))
    }

    /// Loops enclosing block `b`, outermost first.
    pub fn loops_of(&self, b: BlockId) -> Vec<LoopId> {
        let mut out = Vec::new();
        let mut p = self.blocks[b].parent;
        while let Some(l) = p {
            out.push(l);
            p = self.loops[l].parent;
        }
        out.reverse();
        out
    }

    /// Ancestors of loop `l` (outermost first), `l` included.
    pub fn loop_path(&self, l: LoopId) -> Vec<LoopId> {
        let mut out = vec![l];
        let mut p = self.loops[l].parent;
        while let Some(x) = p {
            out.push(x);
            p = self.loops[x].parent;
        }
        out.reverse();
        out
    }

    pub fn is_ancestor(&self, l: LoopId, c: Child) -> bool {
        let mut p = self.parent_of(c);
        while let Some(x) = p {
            if x == l {
                return true;
            }
            p = self.loops[x].parent;
        }
        false
    }

    /// Blocks in a subtree, in program order.
    pub fn blocks_in(&self, c: Child, out: &mut Vec<BlockId>) {
        match c {
            Child::Block(b) => out.push(b),
            Child::Loop(l) => {
                for &k in &self.loops[l].children {
                    self.blocks_in(k, out);
                }
            }
        }
    }

    /// Every placed block in program order (the root excluded).
    pub fn all_blocks(&self) -> Vec<BlockId> {
        let mut out = Vec::new();
        for &c in &self.top {
            self.blocks_in(c, &mut out);
        }
        out
    }

    pub fn blocks_under(&self, parent: Option<LoopId>) -> Vec<BlockId> {
        let mut out = Vec::new();
        for &c in self.children(parent) {
            self.blocks_in(c, &mut out);
        }
        out
    }

    /// Ranges of every live loop variable.
    pub fn ranges(&self) -> Ranges {
        self.loops
            .iter()
            .filter(|l| l.alive)
            .map(|l| (l.var.clone(), l.extent))
            .collect()
    }

    pub fn loop_by_var(&self, var: &str) -> Option<LoopId> {
        var.strip_prefix('%')
            .and_then(|s| s.parse().ok())
            .filter(|&i: &usize| i < self.loops.len())
    }

    /// TVM's loop iteration type: reduction if only reduction block vars use it, spatial if only
    /// spatial ones (or none), opaque otherwise.
    pub fn loop_iter_kind(&self, l: LoopId) -> IterKind {
        let var = &self.loops[l].var;
        let (mut s, mut r, mut o) = (false, false, false);
        for b in self.blocks_under(Some(l)) {
            let sb = &self.blocks[b];
            for (iv, e) in sb.block.iter_vars.iter().zip(&sb.bindings) {
                if arith::uses_var(e, var) {
                    match iv.kind {
                        IterKind::Spatial => s = true,
                        IterKind::Reduce => r = true,
                        IterKind::Opaque => o = true,
                    }
                }
            }
        }
        if o || (s && r) {
            IterKind::Opaque
        } else if r {
            IterKind::Reduce
        } else {
            IterKind::Spatial
        }
    }

    /// Removes child `c` from its parent, then every loop that became empty (TVM's leaf block
    /// removal plan).
    pub fn detach(&mut self, c: Child) -> Result<()> {
        let pos = self.position(c)?;
        let parent = self.parent_of(c);
        self.children_mut(parent).remove(pos);
        if let Some(l) = parent {
            if self.loops[l].children.is_empty() {
                self.loops[l].alive = false;
                self.detach(Child::Loop(l))?;
            }
        }
        Ok(())
    }

    pub fn insert(&mut self, parent: Option<LoopId>, pos: usize, c: Child) {
        self.set_parent(c, parent);
        let kids = self.children_mut(parent);
        let pos = pos.min(kids.len());
        kids.insert(pos, c);
    }

    /// Read-after-write and write-after-write dependencies `(src, dst)` in the order TVM's block
    /// scope records them: blocks in program order; for each, its reads then its writes, each
    /// against the earlier writers of the buffer in order.
    pub fn deps(&self) -> Vec<(BlockId, BlockId)> {
        let mut writers: BTreeMap<usize, Vec<BlockId>> = BTreeMap::new();
        let mut out = Vec::new();
        for b in self.all_blocks() {
            let blk = &self.blocks[b].block;
            for w in &blk.writes {
                writers.entry(w.buffer).or_default().push(b);
            }
            for acc in blk.reads.iter().chain(&blk.writes) {
                for &src in writers.get(&acc.buffer).into_iter().flatten() {
                    if src != b {
                        out.push((src, b));
                    }
                }
            }
        }
        out
    }

    /// TVM's consumers: blocks depending on `b` (read or write after its writes), deduplicated.
    pub fn consumers(&self, b: BlockId) -> Vec<BlockId> {
        let mut out = Vec::new();
        for (s, d) in self.deps() {
            if s == b && !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// TVM's producers: blocks `b` depends on, in the scope's order, deduplicated.
    pub fn producers(&self, b: BlockId) -> Vec<BlockId> {
        let mut out = Vec::new();
        for (s, d) in self.deps() {
            if d == b && !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    pub fn block_by_name(&self, name: &str) -> Option<BlockId> {
        if self.blocks[self.root].block.name == name {
            return Some(self.root);
        }
        self.all_blocks()
            .into_iter()
            .find(|&b| self.blocks[b].block.name == name)
    }

    /// Simplifies, with the current loop ranges, the bindings of blocks under `parent` that use
    /// one of the loop variables `vars`: those a split or fuse just substituted. The others were
    /// simplified when they last changed and no range they read has changed since; skipping
    /// them took a fifth off replaying a conv trace.
    /// Blocks in `unsimplified` keep their bindings as substituted: TVM's `IterMapSimplify`
    /// leaves bindings that are not an iterator map as they are.
    pub fn simplify_bindings_using(
        &mut self,
        parent: Option<LoopId>,
        vars: &[String],
        unsimplified: &[BlockId],
    ) {
        let ranges = self.ranges();
        for b in self.blocks_under(parent) {
            if unsimplified.contains(&b) {
                continue;
            }
            for e in self.blocks[b].bindings.iter_mut() {
                if vars.iter().any(|v| arith::uses_var(e, v)) {
                    *e = arith::simplify(e, &ranges);
                }
            }
        }
    }

    /// The blocks under `parent` whose bindings are not an affine iterator map under the
    /// current loop ranges: a split or fuse of a loop above them leaves them unsimplified.
    pub fn blocks_without_iter_maps(&self, parent: Option<LoopId>) -> Vec<BlockId> {
        let ranges = self.ranges();
        self.blocks_under(parent)
            .into_iter()
            .filter(|&b| !iter_map::is_iter_map(&self.blocks[b].bindings, &ranges))
            .collect()
    }

    /// Simplifies the bindings of block `b` with the current loop ranges.
    pub fn simplify_block_bindings(&mut self, b: BlockId) {
        let ranges = self.ranges();
        for e in self.blocks[b].bindings.iter_mut() {
            *e = arith::simplify(e, &ranges);
        }
    }

    /// Substitutes loop variables in the bindings and predicates of blocks under `parent`.
    pub fn substitute_under(
        &mut self,
        parent: Option<LoopId>,
        map: &impl Fn(&str) -> Option<Expr>,
    ) {
        let blocks = self.blocks_under(parent);
        self.substitute_in(&blocks, map);
    }

    /// Substitutes loop variables in the bindings and predicates of `blocks`.
    pub fn substitute_in(&mut self, blocks: &[BlockId], map: &impl Fn(&str) -> Option<Expr>) {
        for &b in blocks {
            let sb = &mut self.blocks[b];
            for e in sb.bindings.iter_mut() {
                *e = e.substitute(map);
            }
            sb.predicate = sb.predicate.substitute(map);
        }
    }

    pub fn is_param(&self, buffer: usize) -> bool {
        self.params.contains(&buffer)
    }

    pub fn add_buffer(&mut self, buffer: Buffer) -> usize {
        self.buffers.push(buffer);
        self.buffers.len() - 1
    }
}
