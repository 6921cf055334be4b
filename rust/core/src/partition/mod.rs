//! Fusion-group partitioning of a whole model, with the rules of TVM's Relax `FuseOps`.
//!
//! The input is the dataflow graph of a model's operators ([`Graph`]: each with its TIR
//! op-pattern kind and its inputs); the output is the groups TVM would fuse, in the order TVM
//! emits them. Each group becomes one fused PrimFunc, which is what fastsearch tunes.
//!
//! * [`graph`] — the graph model and its JSON form;
//! * [`postdom`] — the post-dominator tree;
//! * [`rules`] — the fusion rules;
//! * [`proposals`] — changes the rules never make, for `fusion="search"` to measure.

pub mod graph;
pub mod postdom;
pub mod proposals;
pub mod rules;

pub use graph::{Graph, OpNode, OpPattern};
pub use proposals::{merge_groups, proposals, Proposal, ProposalKind};
pub use rules::DEFAULT_MAX_FUSE_DEPTH;

use crate::error::{Error, Result};

/// Knobs of the partitioner, with TVM's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionConfig {
    /// Largest number of operators in one group (`relax.FuseOps.max_depth`).
    pub max_fuse_depth: usize,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            max_fuse_depth: DEFAULT_MAX_FUSE_DEPTH,
        }
    }
}

/// The groups of a graph: every node is in exactly one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Node indices of each group, in program order; groups in emission order.
    pub groups: Vec<Vec<usize>>,
    /// The group (index into `groups`) of each node.
    pub group_of: Vec<usize>,
}

impl Partition {
    /// A partition of `n_nodes` nodes from its groups; every node must be in exactly one.
    pub fn from_groups(n_nodes: usize, groups: Vec<Vec<usize>>) -> Result<Self> {
        let mut group_of = vec![usize::MAX; n_nodes];
        for (g, members) in groups.iter().enumerate() {
            if members.is_empty() {
                return Err(Error::Malformed(format!("group {g} is empty")));
            }
            for &node in members {
                match group_of.get_mut(node) {
                    None => {
                        return Err(Error::Malformed(format!(
                            "group {g} names node {node}, but the graph has {n_nodes}"
                        )))
                    }
                    Some(slot) if *slot != usize::MAX => {
                        return Err(Error::Malformed(format!("node {node} is in two groups")))
                    }
                    Some(slot) => *slot = g,
                }
            }
        }
        if let Some(node) = group_of.iter().position(|&g| g == usize::MAX) {
            return Err(Error::Malformed(format!("node {node} is in no group")));
        }
        Ok(Partition { groups, group_of })
    }
}

/// Partitions `graph` into fusion groups.
pub fn partition(graph: &Graph, config: &PartitionConfig) -> Result<Partition> {
    let roots = rules::Partitioner::new(graph, config.max_fuse_depth).run();
    order_groups(graph, &roots)
}

/// Parses a graph (see [`Graph::from_json`]) and partitions it.
pub fn partition_json(json: &str, config: &PartitionConfig) -> Result<Partition> {
    partition(&Graph::from_json(json)?, config)
}

/// Orders the groups as TVM's `OperatorFusor` emits them: groups in order of their first node,
/// each preceded by the groups it reads from (a group's call must follow its inputs, and a
/// group's last node can come after a node of another group that reads the first).
fn order_groups(graph: &Graph, roots: &[usize]) -> Result<Partition> {
    let n = graph.len();
    // Dense ids in order of first appearance.
    let mut id_of_root = vec![usize::MAX; n];
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut group = vec![0; n];
    for (node, &root) in roots.iter().enumerate() {
        if id_of_root[root] == usize::MAX {
            id_of_root[root] = members.len();
            members.push(Vec::new());
        }
        group[node] = id_of_root[root];
        members[group[node]].push(node);
    }
    let deps: Vec<Vec<usize>> = members
        .iter()
        .enumerate()
        .map(|(g, nodes)| {
            nodes
                .iter()
                .flat_map(|&node| graph.node(node).inputs.iter().map(|&i| group[i]))
                .filter(|&d| d != g)
                .collect()
        })
        .collect();

    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        Open,
        Done,
    }
    let mut state = vec![State::New; members.len()];
    let mut order = Vec::with_capacity(members.len());
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for start in 0..members.len() {
        if state[start] != State::New {
            continue;
        }
        state[start] = State::Open;
        stack.push((start, 0));
        while let Some(top) = stack.last_mut() {
            let (g, next) = *top;
            if let Some(&dep) = deps[g].get(next) {
                top.1 += 1;
                match state[dep] {
                    State::New => {
                        state[dep] = State::Open;
                        stack.push((dep, 0));
                    }
                    State::Open => {
                        return Err(Error::Internal(format!(
                            "fusion groups of nodes {} and {} depend on each other",
                            members[g][0], members[dep][0]
                        )))
                    }
                    State::Done => {}
                }
            } else {
                state[g] = State::Done;
                order.push(g);
                stack.pop();
            }
        }
    }
    let mut rank = vec![0; members.len()];
    for (position, &g) in order.iter().enumerate() {
        rank[g] = position;
    }
    let mut groups = vec![Vec::new(); members.len()];
    for (g, nodes) in members.into_iter().enumerate() {
        groups[rank[g]] = nodes;
    }
    let group_of = group.iter().map(|&g| rank[g]).collect();
    Ok(Partition { groups, group_of })
}

#[cfg(test)]
mod tests;
