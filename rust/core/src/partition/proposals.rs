//! Changes to a rule-based partition that FuseOps' rules never make, for `fusion="search"` to
//! try and keep only when the model measured end to end gets faster.
//!
//! * **Prologue**: a group of only elementwise, broadcast or injective operators (a transpose,
//!   a reshape that copies) whose outputs feed one reduction group joins it, so the reduction
//!   reads through the index map instead of a materialized copy. FuseOps never fuses an
//!   injective operator into a following reduction anchor.
//! * **Epilogue**: such a group joins the reduction group it alone reads from, which then
//!   writes the transformed layout directly. FuseOps lets only elementwise and broadcast
//!   consumers follow an anchor.
//! * **Horizontal**: two reduction groups that read the same tensor and do not depend on each
//!   other become one function with two outputs.

use super::graph::{Graph, OpPattern};
use super::{order_groups, Partition};
use crate::error::{Error, Result};
use std::collections::BTreeSet;

/// What a [`Proposal`] changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProposalKind {
    /// A producer group merged into its only consumer group.
    Prologue,
    /// A consumer group merged into the group it reads.
    Epilogue,
    /// Sibling groups that read the same input, merged side by side.
    Horizontal,
}

impl ProposalKind {
    /// The kind's name as the Python side reports it.
    pub fn name(self) -> &'static str {
        match self {
            ProposalKind::Prologue => "prologue",
            ProposalKind::Epilogue => "epilogue",
            ProposalKind::Horizontal => "horizontal",
        }
    }
}

/// One change: the groups (indices into the partition's groups, ascending) to merge into one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// What the change is.
    pub kind: ProposalKind,
    /// The groups to merge, ascending.
    pub groups: Vec<usize>,
}

/// The group-level view of a partition: what each group reads from and feeds.
struct GroupGraph {
    /// Groups each group reads from.
    producers: Vec<BTreeSet<usize>>,
    /// Groups reading each group.
    consumers: Vec<BTreeSet<usize>>,
    /// Whether a group holds a function output (a binding of a non-dataflow variable).
    external: Vec<bool>,
    /// The strongest op pattern of each group's members.
    pattern: Vec<OpPattern>,
}

impl GroupGraph {
    fn new(graph: &Graph, partition: &Partition) -> Self {
        let n = partition.groups.len();
        let mut producers = vec![BTreeSet::new(); n];
        let mut consumers = vec![BTreeSet::new(); n];
        let mut external = vec![false; n];
        let mut pattern = vec![OpPattern::ElemWise; n];
        for (g, members) in partition.groups.iter().enumerate() {
            for &node in members {
                let op = graph.node(node);
                external[g] |= op.external;
                pattern[g] = pattern[g].combine(op.pattern);
                for &input in &op.inputs {
                    let p = partition.group_of[input];
                    if p != g {
                        producers[g].insert(p);
                        consumers[p].insert(g);
                    }
                }
            }
        }
        GroupGraph {
            producers,
            consumers,
            external,
            pattern,
        }
    }

    /// A group of elementwise, broadcast and injective operators only.
    fn is_light(&self, g: usize) -> bool {
        self.pattern[g] <= OpPattern::Injective
    }

    /// A group anchored by a reduction (a conv, a matmul, a sum), with no tuple or opaque node.
    fn is_reduction(&self, g: usize) -> bool {
        matches!(
            self.pattern[g],
            OpPattern::CommReduce | OpPattern::OutEWiseFusable
        )
    }

    /// Whether `to` can be reached from `from` along producer-to-consumer edges.
    fn reaches(&self, from: usize, to: usize) -> bool {
        let mut seen = vec![false; self.consumers.len()];
        let mut stack = vec![from];
        while let Some(g) = stack.pop() {
            if g == to {
                return true;
            }
            for &c in &self.consumers[g] {
                // Groups come in a topological order: nothing after `to` leads back to it.
                if c <= to && !seen[c] {
                    seen[c] = true;
                    stack.push(c);
                }
            }
        }
        false
    }
}

/// The changes worth trying on `partition` of `graph`, in order of their first group; none of
/// them makes a group larger than `max_fuse_depth` operators.
pub fn proposals(graph: &Graph, partition: &Partition, max_fuse_depth: usize) -> Vec<Proposal> {
    let groups = &partition.groups;
    let gg = GroupGraph::new(graph, partition);
    let fits = |a: usize, b: usize| groups[a].len() + groups[b].len() <= max_fuse_depth;
    let mut found = Vec::new();
    for g in 0..groups.len() {
        if gg.is_light(g) && !gg.external[g] {
            if let [consumer] = gg.consumers[g].iter().copied().collect::<Vec<_>>()[..] {
                if gg.is_reduction(consumer) && fits(g, consumer) {
                    found.push(Proposal {
                        kind: ProposalKind::Prologue,
                        groups: vec![g, consumer],
                    });
                }
            }
            if let [producer] = gg.producers[g].iter().copied().collect::<Vec<_>>()[..] {
                let only_reader = gg.consumers[producer].len() == 1;
                if gg.is_reduction(producer)
                    && only_reader
                    && !gg.external[producer]
                    && fits(producer, g)
                {
                    found.push(Proposal {
                        kind: ProposalKind::Epilogue,
                        groups: vec![producer, g],
                    });
                }
            }
        }
        if gg.is_reduction(g) {
            // Siblings: later reduction groups reading a node this group reads.
            let reads: BTreeSet<usize> = groups[g]
                .iter()
                .flat_map(|&n| graph.node(n).inputs.iter().copied())
                .filter(|&i| partition.group_of[i] != g)
                .collect();
            for (other, members) in groups.iter().enumerate().skip(g + 1) {
                if !gg.is_reduction(other) || !fits(g, other) {
                    continue;
                }
                let shares = members
                    .iter()
                    .any(|&n| graph.node(n).inputs.iter().any(|i| reads.contains(i)));
                if shares && !gg.reaches(g, other) {
                    found.push(Proposal {
                        kind: ProposalKind::Horizontal,
                        groups: vec![g, other],
                    });
                }
            }
        }
    }
    found.sort_by(|a, b| (a.groups[0], a.kind, &a.groups).cmp(&(b.groups[0], b.kind, &b.groups)));
    found
}

/// `partition` with each set of groups in `merges` made one group, re-ordered so that every
/// group follows its inputs. A merge naming an unknown group, a group named twice, or a merge
/// that would make two groups depend on each other is an error.
pub fn merge_groups(
    graph: &Graph,
    partition: &Partition,
    merges: &[Vec<usize>],
) -> Result<Partition> {
    let n_groups = partition.groups.len();
    let mut target: Vec<usize> = (0..n_groups).collect();
    let mut taken = vec![false; n_groups];
    for merge in merges {
        let Some(&first) = merge.iter().min() else {
            continue;
        };
        for &g in merge {
            if g >= n_groups {
                return Err(Error::Malformed(format!(
                    "merge names group {g}, but the partition has {n_groups}"
                )));
            }
            if taken[g] {
                return Err(Error::Malformed(format!(
                    "group {g} is named by two merges (or twice in one)"
                )));
            }
            taken[g] = true;
            target[g] = first;
        }
    }
    // One representative node per merged group: the first node of its first group.
    let roots: Vec<usize> = partition
        .group_of
        .iter()
        .map(|&g| partition.groups[target[g]][0])
        .collect();
    order_groups(graph, &roots).map_err(|e| match e {
        Error::Internal(msg) => Error::Malformed(format!("the merges make a cycle: {msg}")),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{partition, OpNode, PartitionConfig};
    use OpPattern::*;

    fn op(pattern: OpPattern, inputs: &[usize]) -> OpNode {
        OpNode::new("", pattern, inputs.to_vec())
    }

    fn setup(nodes: Vec<OpNode>) -> (Graph, Partition) {
        let graph = Graph::new(nodes).unwrap();
        let p = partition(&graph, &PartitionConfig::default()).unwrap();
        (graph, p)
    }

    fn kinds(props: &[Proposal]) -> Vec<(ProposalKind, Vec<usize>)> {
        props.iter().map(|p| (p.kind, p.groups.clone())).collect()
    }

    #[test]
    fn transpose_between_two_matmuls_is_a_prologue_and_an_epilogue() {
        // matmul -> add (bias) | reshape -> transpose | matmul (output)
        let (graph, p) = setup(vec![
            op(OutEWiseFusable, &[]),
            op(ElemWise, &[0]),
            op(Injective, &[1]),
            op(Injective, &[2]),
            op(OutEWiseFusable, &[3]).external(),
        ]);
        assert_eq!(p.groups, vec![vec![0, 1], vec![2, 3], vec![4]]);
        let props = proposals(&graph, &p, 256);
        assert_eq!(
            kinds(&props),
            vec![
                (ProposalKind::Epilogue, vec![0, 1]),
                (ProposalKind::Prologue, vec![1, 2]),
            ]
        );
        let merged = merge_groups(&graph, &p, &[vec![1, 2]]).unwrap();
        assert_eq!(merged.groups, vec![vec![0, 1], vec![2, 3, 4]]);
        // The depth limit holds.
        assert!(proposals(&graph, &p, 2)
            .iter()
            .all(|p| p.groups != vec![0, 1]));
    }

    #[test]
    fn light_group_with_two_readers_or_an_output_is_left_alone() {
        // transpose read by two matmuls; a transpose that is a function output.
        let (graph, p) = setup(vec![
            op(OutEWiseFusable, &[]),
            op(Injective, &[0]),
            op(OutEWiseFusable, &[1]).external(),
            op(OutEWiseFusable, &[1]).external(),
            op(Injective, &[0]).external(),
        ]);
        let props = proposals(&graph, &p, 256);
        assert!(
            props.iter().all(|p| p.kind == ProposalKind::Horizontal),
            "{props:?}"
        );
    }

    #[test]
    fn siblings_reading_one_tensor_merge_unless_one_feeds_the_other() {
        // relu feeds conv a and conv b; conv c reads a (so a and c are not siblings of b's
        // kind: c depends on a).
        let (graph, p) = setup(vec![
            op(ElemWise, &[]),
            op(OutEWiseFusable, &[0]),
            op(OutEWiseFusable, &[0]),
            op(OutEWiseFusable, &[1, 0]).external(),
            op(ElemWise, &[2]).external(),
        ]);
        let props = proposals(&graph, &p, 256);
        let horizontal: Vec<_> = props
            .iter()
            .filter(|x| x.kind == ProposalKind::Horizontal)
            .map(|x| x.groups.iter().map(|&g| p.groups[g][0]).collect::<Vec<_>>())
            .collect();
        assert!(horizontal.contains(&vec![1, 2]), "{props:?}");
        assert!(horizontal.contains(&vec![2, 3]), "{props:?}");
        assert!(!horizontal.contains(&vec![1, 3]), "{props:?}");
        for prop in &props {
            merge_groups(&graph, &p, std::slice::from_ref(&prop.groups)).unwrap();
        }
    }

    #[test]
    fn merges_that_make_a_cycle_or_repeat_a_group_are_refused() {
        // a -> b -> c with a and c merged around b.
        let (graph, p) = setup(vec![
            op(OutEWiseFusable, &[]),
            op(OutEWiseFusable, &[0]),
            op(OutEWiseFusable, &[1]).external(),
        ]);
        assert_eq!(p.groups.len(), 3);
        assert!(matches!(
            merge_groups(&graph, &p, &[vec![0, 2]]),
            Err(Error::Malformed(_))
        ));
        assert!(matches!(
            merge_groups(&graph, &p, &[vec![0, 1], vec![1, 2]]),
            Err(Error::Malformed(_))
        ));
        assert!(matches!(
            merge_groups(&graph, &p, &[vec![0, 7]]),
            Err(Error::Malformed(_))
        ));
    }
}
