//! Fusion-group partitioning of a whole model, with the rules of TVM's Relax `FuseOps`.
//!
//! The input is the dataflow graph of a model's operators ([`Graph`]: each with its TIR
//! op-pattern kind and its inputs); the output is the groups TVM would fuse, in the order TVM
//! emits them. Each group becomes one fused PrimFunc, which is what fastsearch tunes.
//!
//! * [`graph`] — the graph model and its JSON form;
//! * [`postdom`] — the post-dominator tree;
//! * [`rules`] — the fusion rules.

pub mod graph;
pub mod postdom;
pub mod rules;

pub use graph::{Graph, OpNode, OpPattern};
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
