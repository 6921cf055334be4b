//! The dataflow graph the partitioner works on: operators in program order, each with its TIR
//! op-pattern kind and the operators it reads.

use serde::Deserialize;

use crate::error::{Error, Result};

/// TVM's `OpPatternKind`, with TVM's integer codes. The order matters: the fusion rules compare
/// kinds (`kind <= Injective`), so the discriminants follow TVM's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum OpPattern {
    /// Output element i reads input element i only (`relu`, same-shape `add`).
    ElemWise = 0,
    /// Elementwise with broadcasting along some axes.
    Broadcast = 1,
    /// Any one-to-one index remapping (`transpose`, `reshape`, `concatenate`).
    Injective = 2,
    /// A commutative reduction (`sum`, `max`).
    CommReduce = 3,
    /// A complex op whose output can take elementwise consumers (`conv2d`, `matmul`).
    OutEWiseFusable = 4,
    /// A tuple of values.
    Tuple = 7,
    /// Never fused with anything.
    Opaque = 8,
}

impl OpPattern {
    /// The kind for TVM's integer code (`op_pattern` attribute of a PrimFunc).
    pub fn from_code(code: i64) -> Result<Self> {
        Ok(match code {
            0 => OpPattern::ElemWise,
            1 => OpPattern::Broadcast,
            2 => OpPattern::Injective,
            3 => OpPattern::CommReduce,
            4 => OpPattern::OutEWiseFusable,
            7 => OpPattern::Tuple,
            8 => OpPattern::Opaque,
            other => {
                return Err(Error::Malformed(format!(
                    "unknown op pattern kind {other} (expected 0-4, 7 or 8)"
                )))
            }
        })
    }

    /// TVM's integer code of the kind.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// TVM's `CombinePattern`: the more complex of two kinds. TVM refuses to combine two kinds
    /// above `Broadcast`; wherever the combination is read, a second complex kind means "do not
    /// fuse" anyway (the path check rejects it), so the maximum is kept instead of failing.
    pub fn combine(self, other: OpPattern) -> OpPattern {
        self.max(other)
    }
}

/// One operator (a binding of the Relax dataflow block).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpNode {
    /// A label for the caller (the PrimFunc called, for Relax); not used by the rules.
    pub name: String,
    /// Its TIR op-pattern kind, which decides what it may fuse with.
    pub pattern: OpPattern,
    /// The operators whose results this one reads, one entry per use (indices of earlier
    /// nodes; a repeated input is a repeated edge, as in TVM).
    pub inputs: Vec<usize>,
    /// The value is visible outside the graph (a function output): nothing may be fused after
    /// it, since its value must stay materialized.
    pub external: bool,
}

impl OpNode {
    /// An operator that is not a function output.
    pub fn new(name: impl Into<String>, pattern: OpPattern, inputs: Vec<usize>) -> Self {
        OpNode {
            name: name.into(),
            pattern,
            inputs,
            external: false,
        }
    }

    /// Marks the node as a graph output.
    pub fn external(mut self) -> Self {
        self.external = true;
        self
    }
}

/// A validated DAG: nodes in a topological (program) order, with consumer lists.
#[derive(Clone, Debug)]
pub struct Graph {
    nodes: Vec<OpNode>,
    /// For each node, the nodes reading it, one entry per edge.
    consumers: Vec<Vec<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeJson {
    #[serde(default)]
    name: String,
    pattern: i64,
    #[serde(default)]
    inputs: Vec<i64>,
    #[serde(default)]
    external: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphJson {
    nodes: Vec<NodeJson>,
}

impl Graph {
    /// Checks that every input names an earlier node (which makes the graph a DAG in program
    /// order) and builds the consumer lists.
    pub fn new(nodes: Vec<OpNode>) -> Result<Self> {
        let mut consumers = vec![Vec::new(); nodes.len()];
        for (index, node) in nodes.iter().enumerate() {
            for &input in &node.inputs {
                if input >= index {
                    return Err(Error::Malformed(format!(
                        "node {index} (`{}`) reads node {input}, which does not come before it",
                        node.name
                    )));
                }
                consumers[input].push(index);
            }
        }
        Ok(Graph { nodes, consumers })
    }

    /// Parses `{"nodes": [{"name": str, "pattern": int, "inputs": [int], "external": bool}]}`.
    pub fn from_json(json: &str) -> Result<Self> {
        let parsed: GraphJson = serde_json::from_str(json)
            .map_err(|e| Error::Malformed(format!("partition graph JSON: {e}")))?;
        let mut nodes = Vec::with_capacity(parsed.nodes.len());
        for (index, node) in parsed.nodes.into_iter().enumerate() {
            let pattern = OpPattern::from_code(node.pattern)
                .map_err(|e| Error::Malformed(format!("node {index}: {e}")))?;
            let inputs = node
                .inputs
                .iter()
                .map(|&i| {
                    usize::try_from(i).map_err(|_| {
                        Error::Malformed(format!("node {index}: negative input index {i}"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            nodes.push(OpNode {
                name: node.name,
                pattern,
                inputs,
                external: node.external,
            });
        }
        Graph::new(nodes)
    }

    /// Number of operators.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no operator.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The operator at `index` (panics when out of range, like slice indexing).
    pub fn node(&self, index: usize) -> &OpNode {
        &self.nodes[index]
    }

    /// Every operator, in topological order.
    pub fn nodes(&self) -> &[OpNode] {
        &self.nodes
    }

    /// The nodes reading `index`, one entry per edge.
    pub fn consumers(&self, index: usize) -> &[usize] {
        &self.consumers[index]
    }

    /// The kind of the edge into `consumer`: as in Relax's graph, the consumer's own kind.
    pub fn edge_pattern(&self, consumer: usize) -> OpPattern {
        self.nodes[consumer].pattern
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let g = Graph::from_json(
            r#"{"nodes": [{"name": "a", "pattern": 0}, {"name": "b", "pattern": 4, "inputs": [0, 0], "external": true}]}"#,
        )
        .unwrap();
        assert_eq!(g.consumers(0), &[1, 1]);
        assert!(g.node(1).external);
        for bad in [
            r#"{"nodes": [{"pattern": 5}]}"#,
            r#"{"nodes": [{"pattern": 0, "inputs": [0]}]}"#,
            r#"{"nodes": [{"pattern": 0, "inputs": [-1]}]}"#,
            r#"{"nodes": [{"pattern": 0, "colour": 1}]}"#,
            r#"[1, 2]"#,
        ] {
            assert!(
                matches!(Graph::from_json(bad), Err(Error::Malformed(_))),
                "{bad}"
            );
        }
    }
}
