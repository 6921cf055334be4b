//! The post-dominator tree of the graph, built as TVM does: since the graph is a DAG whose
//! nodes come in program order, each node's immediate post-dominator is the least common
//! ancestor (in the tree built so far) of its consumers, computed in one reverse pass.

use super::graph::{Graph, OpPattern};

/// Immediate post-dominators, with for each node the combined kind of everything between the
/// node and its post-dominator (the edges out of the node and the tree paths up to the LCA).
#[derive(Clone, Debug)]
pub struct PostDomTree {
    parent: Vec<Option<usize>>,
    depth: Vec<u32>,
    pattern: Vec<OpPattern>,
}

impl PostDomTree {
    pub fn new(graph: &Graph) -> Self {
        let n = graph.len();
        let mut tree = PostDomTree {
            parent: vec![None; n],
            depth: vec![1; n],
            pattern: vec![OpPattern::Opaque; n],
        };
        // Consumers come after their producers, so a reverse pass sees every consumer first.
        for index in (0..n).rev() {
            // An output must stay materialized: it is a root, nothing post-dominates it.
            if graph.node(index).external {
                continue;
            }
            let mut pattern = OpPattern::ElemWise;
            let consumers = graph.consumers(index);
            let parent = match consumers.split_first() {
                None => None,
                Some((&first, rest)) => {
                    pattern = pattern.combine(graph.edge_pattern(first));
                    let mut parent = Some(first);
                    for &consumer in rest {
                        parent = tree.lca(parent, Some(consumer), &mut pattern);
                        pattern = pattern.combine(graph.edge_pattern(consumer));
                    }
                    parent
                }
            };
            tree.parent[index] = parent;
            tree.depth[index] = parent.map_or(1, |p| tree.depth[p] + 1);
            tree.pattern[index] = pattern;
        }
        tree
    }

    /// Least common ancestor of two tree nodes (`None` is the virtual root above all roots),
    /// folding the kinds of the tree nodes walked over into `pattern`.
    fn lca(
        &self,
        mut lhs: Option<usize>,
        mut rhs: Option<usize>,
        pattern: &mut OpPattern,
    ) -> Option<usize> {
        while lhs != rhs {
            let (l, r) = (lhs?, rhs?);
            if self.depth[l] < self.depth[r] {
                *pattern = pattern.combine(self.pattern[r]);
                rhs = self.parent[r];
            } else if self.depth[r] < self.depth[l] {
                *pattern = pattern.combine(self.pattern[l]);
                lhs = self.parent[l];
            } else {
                *pattern = pattern.combine(self.pattern[l]).combine(self.pattern[r]);
                lhs = self.parent[l];
                rhs = self.parent[r];
            }
        }
        lhs
    }

    /// The immediate post-dominator of `index`, if any.
    pub fn parent(&self, index: usize) -> Option<usize> {
        self.parent[index]
    }

    /// The combined kind of the edges between `index` and its immediate post-dominator.
    pub fn pattern(&self, index: usize) -> OpPattern {
        self.pattern[index]
    }
}

#[cfg(test)]
mod tests {
    use super::super::graph::OpNode;
    use super::*;
    use OpPattern::*;

    #[test]
    fn diamond_is_post_dominated_by_its_join() {
        // 0 -> {1, 2} -> 3 -> 4(output)
        let g = Graph::new(vec![
            OpNode::new("conv", OutEWiseFusable, vec![]),
            OpNode::new("a", ElemWise, vec![0]),
            OpNode::new("b", Broadcast, vec![0]),
            OpNode::new("add", ElemWise, vec![1, 2]),
            OpNode::new("out", Injective, vec![3]).external(),
        ])
        .unwrap();
        let t = PostDomTree::new(&g);
        assert_eq!(t.parent(0), Some(3));
        assert_eq!(t.pattern(0), Broadcast);
        assert_eq!(t.parent(1), Some(3));
        assert_eq!(t.parent(3), Some(4));
        assert_eq!(t.parent(4), None);
    }

    #[test]
    fn a_branch_to_an_output_has_no_post_dominator() {
        let g = Graph::new(vec![
            OpNode::new("a", ElemWise, vec![]),
            OpNode::new("b", ElemWise, vec![0]).external(),
            OpNode::new("c", ElemWise, vec![0]),
        ])
        .unwrap();
        let t = PostDomTree::new(&g);
        assert_eq!(t.parent(0), None);
        assert_eq!(t.parent(1), None);
    }
}
