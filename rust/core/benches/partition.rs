//! Criterion bench of the fusion-group partitioner on a 10,000-node synthetic model graph
//! (target: under 50 ms), from the typed graph and from its JSON.
//!
//! Run with `cargo bench -p fastsearch-core --bench partition`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use fastsearch_core::Rng;
use fastsearch_core::{partition, partition_json, Graph, OpNode, OpPattern};

/// A model-like DAG: mostly chains of elementwise/broadcast/injective ops after anchors, with
/// residual edges to recent nodes, reductions, opaque ops, rare long-range edges and outputs.
fn synthetic(n: usize, seed: u64) -> Vec<OpNode> {
    use OpPattern::*;
    let kinds = [
        ElemWise,
        Broadcast,
        Injective,
        CommReduce,
        OutEWiseFusable,
        Opaque,
    ];
    let weights = [0.40, 0.15, 0.15, 0.05, 0.22, 0.03];
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let pattern = kinds[rng.weighted(&weights)];
            let mut inputs = Vec::new();
            if i > 0 {
                inputs.push(i - 1);
                if rng.chance(0.3) {
                    inputs.push(i - 1 - rng.below(i.min(20)));
                }
                if rng.chance(0.02) {
                    inputs.push(rng.below(i));
                }
            }
            let node = OpNode::new(format!("op{i}"), pattern, inputs);
            if i + 1 == n || rng.chance(0.01) {
                node.external()
            } else {
                node
            }
        })
        .collect()
}

fn to_json(nodes: &[OpNode]) -> String {
    let nodes: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                r#"{{"name":"{}","pattern":{},"inputs":{:?},"external":{}}}"#,
                n.name,
                n.pattern.code(),
                n.inputs,
                n.external
            )
        })
        .collect();
    format!(r#"{{"nodes":[{}]}}"#, nodes.join(","))
}

fn bench_partition(c: &mut Criterion) {
    let nodes = synthetic(10_000, 7);
    let json = to_json(&nodes);
    let graph = Graph::new(nodes).expect("graph");
    let config = Default::default();
    let groups = partition(&graph, &config).expect("partition").groups.len();
    eprintln!("10,000 nodes -> {groups} groups");
    c.bench_function("partition 10k nodes", |b| {
        b.iter(|| partition(black_box(&graph), &config).expect("partition"))
    });
    c.bench_function("partition 10k nodes from JSON", |b| {
        b.iter(|| partition_json(black_box(&json), &config).expect("partition"))
    });
}

criterion_group!(benches, bench_partition);
criterion_main!(benches);
