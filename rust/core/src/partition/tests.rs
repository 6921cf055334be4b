use super::*;
use proptest::prelude::*;
use OpPattern::*;

fn groups(nodes: Vec<OpNode>) -> Vec<Vec<usize>> {
    groups_with(nodes, PartitionConfig::default())
}

fn groups_with(nodes: Vec<OpNode>, config: PartitionConfig) -> Vec<Vec<usize>> {
    partition(&Graph::new(nodes).unwrap(), &config)
        .unwrap()
        .groups
}

fn op(pattern: OpPattern, inputs: &[usize]) -> OpNode {
    OpNode::new("", pattern, inputs.to_vec())
}

#[test]
fn anchor_takes_its_elementwise_consumers() {
    // conv -> bias add -> relu (output)
    let g = groups(vec![
        op(OutEWiseFusable, &[]),
        op(ElemWise, &[0]),
        op(ElemWise, &[1]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 1, 2]]);
}

#[test]
fn neither_anchors_nor_producers_of_an_anchor_join_over_a_broadcast_edge() {
    let g = groups(vec![
        op(OutEWiseFusable, &[]),
        op(Broadcast, &[0]),
        op(OutEWiseFusable, &[1]),
        op(ElemWise, &[2]).external(),
    ]);
    // The bias add is broadcast, so conv stays alone; it cannot feed the second conv either.
    assert_eq!(g, vec![vec![0], vec![1], vec![2, 3]]);
}

#[test]
fn diamond_after_an_anchor_is_one_group() {
    // conv -> {relu, exp} -> add
    let g = groups(vec![
        op(OutEWiseFusable, &[]),
        op(ElemWise, &[0]),
        op(ElemWise, &[0]),
        op(ElemWise, &[1, 2]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 1, 2, 3]]);
}

#[test]
fn reduction_takes_elementwise_producers_but_no_consumers() {
    // exp -> sum -> relu; transpose -> sum
    let g = groups(vec![
        op(ElemWise, &[]),
        op(CommReduce, &[0]),
        op(ElemWise, &[1]).external(),
        op(Injective, &[]),
        op(CommReduce, &[3]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
}

#[test]
fn injective_chains_fuse_in_the_second_phase() {
    let g = groups(vec![
        op(Injective, &[]),
        op(ElemWise, &[0]),
        op(Injective, &[1]),
        op(Broadcast, &[2]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 1, 2, 3]]);
}

#[test]
fn opaque_nodes_stay_alone_and_cut_paths() {
    let g = groups(vec![
        op(ElemWise, &[]),
        op(Opaque, &[0]),
        op(ElemWise, &[1]),
        op(ElemWise, &[0, 2]).external(),
    ]);
    assert_eq!(g, vec![vec![0], vec![1], vec![2, 3]]);
}

#[test]
fn tuple_fields_join_a_tuple_fused_into_its_consumer() {
    // a, b -> tuple -> concat (injective) -> relu
    let g = groups(vec![
        op(Injective, &[]),
        op(Broadcast, &[]),
        op(Tuple, &[0, 1]),
        op(Injective, &[2]),
        op(ElemWise, &[3]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 1, 2, 3, 4]]);
}

#[test]
fn outputs_stay_materialized() {
    // a feeds an output and another node: nothing post-dominates it.
    let g = groups(vec![
        op(ElemWise, &[]),
        op(ElemWise, &[0]).external(),
        op(ElemWise, &[0]).external(),
    ]);
    assert_eq!(g, vec![vec![0], vec![1], vec![2]]);
}

#[test]
fn max_fuse_depth_splits_long_chains() {
    let chain: Vec<OpNode> = (0..10)
        .map(|i: usize| OpNode::new("", ElemWise, i.checked_sub(1).into_iter().collect()))
        .collect();
    let g = groups_with(chain, PartitionConfig { max_fuse_depth: 4 });
    let sizes: Vec<usize> = g.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![4, 4, 2]);
    let long: Vec<OpNode> = (0..600)
        .map(|i: usize| OpNode::new("", ElemWise, i.checked_sub(1).into_iter().collect()))
        .collect();
    let g = groups(long);
    assert!(g.iter().all(|group| group.len() <= DEFAULT_MAX_FUSE_DEPTH));
    assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 600);
}

#[test]
fn groups_come_in_emission_order() {
    // Group {0, 2} starts before the lone node 1, so it is emitted first.
    let g = groups(vec![
        op(ElemWise, &[]),
        op(OutEWiseFusable, &[]).external(),
        op(ElemWise, &[0]).external(),
    ]);
    assert_eq!(g, vec![vec![0, 2], vec![1]]);
}

#[test]
fn json_errors_are_malformed_input() {
    let config = PartitionConfig::default();
    assert!(matches!(
        partition_json("{", &config),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        partition_json(r#"{"nodes": [{"pattern": 0, "inputs": [3]}]}"#, &config),
        Err(Error::Malformed(_))
    ));
    let p = partition_json(r#"{"nodes": []}"#, &config).unwrap();
    assert!(p.groups.is_empty());
}

/// A random DAG in program order: kinds drawn from all of TVM's, inputs among earlier nodes.
fn random_graph() -> impl Strategy<Value = Vec<OpNode>> {
    let kinds = prop::sample::select(vec![
        ElemWise,
        Broadcast,
        Injective,
        CommReduce,
        OutEWiseFusable,
        Tuple,
        Opaque,
    ]);
    prop::collection::vec(
        (
            kinds,
            prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            any::<u8>(),
        ),
        1..120,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (pattern, inputs, flags))| {
                let inputs = if i == 0 {
                    Vec::new()
                } else {
                    inputs.iter().map(|ix| ix.index(i)).collect()
                };
                let node = OpNode::new("", pattern, inputs);
                if flags % 7 == 0 {
                    node.external()
                } else {
                    node
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_node_is_in_exactly_one_group(nodes in random_graph(), depth in 1usize..300) {
        let graph = Graph::new(nodes).unwrap();
        let p = partition(&graph, &PartitionConfig { max_fuse_depth: depth }).unwrap();
        let mut seen = vec![0u32; graph.len()];
        for (g, members) in p.groups.iter().enumerate() {
            prop_assert!(!members.is_empty());
            prop_assert!(members.len() <= depth.max(1));
            for &node in members {
                seen[node] += 1;
                prop_assert_eq!(p.group_of[node], g);
            }
        }
        prop_assert!(seen.iter().all(|&count| count == 1));
        // Emission order respects dependencies: a group never reads a later one.
        for (node, spec) in graph.nodes().iter().enumerate() {
            for &input in &spec.inputs {
                prop_assert!(p.group_of[input] <= p.group_of[node]);
            }
            // Opaque nodes are alone.
            if spec.pattern == Opaque {
                prop_assert_eq!(p.groups[p.group_of[node]].len(), 1);
            }
        }
    }
}
