//! TVM's fusion rules (Relax `FuseOps`, i.e. `GraphPartitioner`): every node tries to join its
//! immediate post-dominator when every path between them satisfies the rule of its kind.
//!
//! * phase 0: an out-elementwise-fusable anchor (conv, matmul) joins an elementwise
//!   post-dominator over broadcast-or-simpler paths; elementwise/broadcast nodes join an
//!   injective or reduction post-dominator over injective paths;
//! * phase 1: the same, plus injective nodes (and tuples) over injective paths — deferred so the
//!   anchors finish first;
//! * phase 2: injective nodes join a tuple that was itself fused into injective consumers.
//!
//! Groups are a union-find whose roots carry the group's kind and anchor. As in TVM, each
//! node's own group record keeps the kind and size it had when it was merged, and some rules
//! read those records rather than the root's.

use super::graph::{Graph, OpPattern};
use super::postdom::PostDomTree;
use OpPattern::*;

/// TVM's `kMaxFusedOps`, the default of `relax.FuseOps.max_depth`.
pub const DEFAULT_MAX_FUSE_DEPTH: usize = 256;

pub(crate) struct Partitioner<'g> {
    graph: &'g Graph,
    tree: PostDomTree,
    max_fuse_depth: usize,
    /// Union-find parent of each node's group record.
    parent: Vec<Option<usize>>,
    pattern: Vec<OpPattern>,
    num_nodes: Vec<usize>,
    anchor: Vec<Option<usize>>,
    /// Visit marks of the current traversal: `mark[i] == stamp` means visited.
    mark: Vec<u32>,
    stamp: u32,
    stack: Vec<usize>,
}

impl<'g> Partitioner<'g> {
    pub(crate) fn new(graph: &'g Graph, max_fuse_depth: usize) -> Self {
        let n = graph.len();
        let pattern: Vec<OpPattern> = graph.nodes().iter().map(|node| node.pattern).collect();
        let anchor = pattern
            .iter()
            .enumerate()
            .map(|(i, &p)| (p == OutEWiseFusable).then_some(i))
            .collect();
        Partitioner {
            graph,
            tree: PostDomTree::new(graph),
            max_fuse_depth,
            parent: vec![None; n],
            pattern,
            num_nodes: vec![1; n],
            anchor,
            mark: vec![0; n],
            stamp: 0,
            stack: Vec::new(),
        }
    }

    /// Runs the three phases and returns each node's group root.
    pub(crate) fn run(mut self) -> Vec<usize> {
        for phase in 0..3 {
            for index in 0..self.graph.len() {
                self.try_fuse(index, phase);
            }
        }
        (0..self.graph.len()).map(|i| self.find_root(i)).collect()
    }

    fn find_root(&mut self, index: usize) -> usize {
        let mut root = index;
        while let Some(p) = self.parent[root] {
            root = p;
        }
        // Path compression.
        let mut node = index;
        while let Some(p) = self.parent[node] {
            self.parent[node] = Some(root);
            node = p;
        }
        root
    }

    fn new_traversal(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.mark.fill(0);
            self.stamp = 1;
        }
    }

    /// Whether every node on the paths from `src` (exclusive) to `sink` (inclusive) has a group
    /// kind accepted by `cond(kind, is_sink)`.
    fn check_path(
        &mut self,
        src: usize,
        sink: usize,
        cond: impl Fn(OpPattern, bool) -> bool,
    ) -> bool {
        self.new_traversal();
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.extend_from_slice(self.graph.consumers(src));
        let mut ok = true;
        while let Some(node) = stack.pop() {
            if self.mark[node] == self.stamp {
                continue;
            }
            self.mark[node] = self.stamp;
            let root = self.find_root(node);
            if !cond(self.pattern[root], node == sink) {
                ok = false;
                break;
            }
            if node != sink {
                stack.extend_from_slice(self.graph.consumers(node));
            }
        }
        self.stack = stack;
        ok
    }

    /// Merges `child`'s group into `parent`'s; an anchor moves to the new root with its kind.
    fn merge(&mut self, child: usize, parent: usize) {
        let child = self.find_root(child);
        let parent = self.find_root(parent);
        if child == parent {
            return;
        }
        self.num_nodes[parent] += self.num_nodes[child];
        self.parent[child] = Some(parent);
        if let Some(anchor) = self.anchor[child] {
            // A group has at most one anchor: the path rules never join two.
            self.anchor[parent] = Some(anchor);
            self.pattern[parent] = self.pattern[child].combine(self.pattern[parent]);
        }
    }

    /// Calls `visit` once on every node from `src` along consumer edges up to (excluding)
    /// `sink`.
    fn for_each_up_to(&mut self, src: usize, sink: usize, mut visit: impl FnMut(&mut Self, usize)) {
        self.new_traversal();
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.push(src);
        while let Some(node) = stack.pop() {
            if node == sink || self.mark[node] == self.stamp {
                continue;
            }
            self.mark[node] = self.stamp;
            visit(self, node);
            stack.extend_from_slice(self.graph.consumers(node));
        }
        self.stack = stack;
    }

    /// Puts every node from `src` up to (excluding) `sink` into `sink`'s group.
    fn commit_fuse(&mut self, src: usize, sink: usize) {
        self.for_each_up_to(src, sink, |this, node| this.merge(node, sink));
    }

    /// Size of `sink`'s group after `src` and everything up to `sink` joins it, counted as TVM
    /// does (the size each node's own group record holds).
    fn fused_size(&mut self, src: usize, sink: usize) -> usize {
        let sink_root = self.find_root(sink);
        let mut total = self.num_nodes[sink_root];
        self.for_each_up_to(src, sink, |this, node| total += this.num_nodes[node]);
        total
    }

    fn try_fuse(&mut self, index: usize, phase: u8) {
        let kind = self.pattern[index];
        if kind == Opaque {
            return;
        }
        let Some(dom) = self.tree.parent(index) else {
            return;
        };
        if self.fused_size(index, dom) > self.max_fuse_depth {
            return;
        }
        if phase == 2 {
            // Injective nodes join a tuple already fused into injective consumers.
            if kind > Injective {
                return;
            }
            let dom_root = self.find_root(dom);
            if self.pattern[dom_root] == Tuple {
                return;
            }
            if self.pattern[dom] == Tuple
                && self.pattern[dom_root] <= Injective
                && self.check_path(index, dom, |k, _| k <= Injective)
            {
                self.commit_fuse(index, dom);
            }
            return;
        }
        if self.find_root(index) == self.find_root(dom) {
            return;
        }
        // Tuples are only joined in phase 2.
        if self.pattern[dom] == Tuple {
            return;
        }
        let dom_kind = self.tree.pattern(index);
        match kind {
            OutEWiseFusable => {
                if phase == 0
                    && dom_kind == ElemWise
                    && self.check_path(index, dom, |k, _| k <= Broadcast)
                {
                    self.commit_fuse(index, dom);
                }
            }
            ElemWise | Broadcast => {
                let cond = |k: OpPattern, is_sink: bool| {
                    if is_sink {
                        // The sink may already hold an anchor or a reduction.
                        k <= Injective || k == CommReduce || k == OutEWiseFusable
                    } else {
                        k <= Injective
                    }
                };
                if (dom_kind <= Injective || dom_kind == CommReduce)
                    && self.check_path(index, dom, cond)
                {
                    self.commit_fuse(index, dom);
                }
            }
            Injective | Tuple => {
                if phase == 1 && self.check_path(index, dom, |k, _| k <= Injective) {
                    self.commit_fuse(index, dom);
                }
            }
            // Reductions take producers and consumers but never join a post-dominator.
            CommReduce | Opaque => {}
        }
    }
}
