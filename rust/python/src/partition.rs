//! Fusion of a whole model's operator graph: FuseOps' partition, the changes its rules never
//! make, and merges of groups. One call per model, so the graph crosses as JSON.

use fastsearch_core::{
    fusion_proposals as proposals, merge_groups, partition_json, Graph, Partition, PartitionConfig,
    DEFAULT_MAX_FUSE_DEPTH,
};
use pyo3::prelude::*;

use crate::errors::guarded;

/// Partitions a model's operator graph (JSON, see `fastsearch_core::Graph`) into
/// the fusion groups of TVM's Relax FuseOps: node indices per group, groups in emission order.
#[pyfunction]
#[pyo3(signature = (graph_json, max_fuse_depth = DEFAULT_MAX_FUSE_DEPTH))]
#[pyo3(text_signature = "(graph_json, max_fuse_depth=256)")]
pub fn partition_graph(
    py: Python<'_>,
    graph_json: String,
    max_fuse_depth: usize,
) -> PyResult<Vec<Vec<usize>>> {
    guarded(py, "partition_graph", move || {
        let config = PartitionConfig { max_fuse_depth };
        Ok(partition_json(&graph_json, &config)?.groups)
    })
}

/// Changes to a partition (`groups`, as `partition_graph` returns them) that FuseOps' rules never
/// make: `(kind, group indices)` with kind `"prologue"`, `"epilogue"` or `"horizontal"`.
#[pyfunction]
#[pyo3(signature = (graph_json, groups, max_fuse_depth = DEFAULT_MAX_FUSE_DEPTH))]
#[pyo3(text_signature = "(graph_json, groups, max_fuse_depth=256)")]
pub fn fusion_proposals(
    py: Python<'_>,
    graph_json: String,
    groups: Vec<Vec<usize>>,
    max_fuse_depth: usize,
) -> PyResult<Vec<(&'static str, Vec<usize>)>> {
    guarded(py, "fusion_proposals", move || {
        let graph = Graph::from_json(&graph_json)?;
        let partition = Partition::from_groups(graph.len(), groups)?;
        Ok(proposals(&graph, &partition, max_fuse_depth)
            .into_iter()
            .map(|p| (p.kind.name(), p.groups))
            .collect())
    })
}

/// `groups` with each list of group indices in `merges` made one group, in emission order.
#[pyfunction]
pub fn merge_fusion_groups(
    py: Python<'_>,
    graph_json: String,
    groups: Vec<Vec<usize>>,
    merges: Vec<Vec<usize>>,
) -> PyResult<Vec<Vec<usize>>> {
    guarded(py, "merge_fusion_groups", move || {
        let graph = Graph::from_json(&graph_json)?;
        let partition = Partition::from_groups(graph.len(), groups)?;
        Ok(merge_groups(&graph, &partition, &merges)?.groups)
    })
}
