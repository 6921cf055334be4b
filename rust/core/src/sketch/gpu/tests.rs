use super::tiling::{draw_tiles, fits, min_threads, threads_per_block};
use super::*;

use serde_json::{json, Value};

fn var(n: &str) -> Value {
    json!(["var", n])
}

fn point(vars: &[&str]) -> Value {
    json!(vars
        .iter()
        .map(|v| json!([var(v), ["int", 1]]))
        .collect::<Vec<_>>())
}

/// `C[i, j] += A[i, k] * B[k, j]` over `n x n x n` of `dtype`, then `D = max(C, 0)`.
fn matmul(n: i64, dtype: &str) -> Program {
    let lp = |v: &str, body: Value| json!({"node": "loop", "var": v, "min": 0, "extent": n, "kind": "serial", "body": body});
    let c_block = json!({"node": "block", "block": 1, "bindings": [var("i"), var("j"), var("k")], "predicate": ["bool", true]});
    let d_block = json!({"node": "block", "block": 2, "bindings": [var("x"), var("y")], "predicate": ["bool", true]});
    let iv = |name: &str, kind: &str| json!({"name": name, "min": 0, "extent": n, "kind": kind});
    let buffer =
        |name: &str| json!({"name": name, "shape": [n, n], "dtype": dtype, "scope": "global"});
    let text = json!({
        "name": "main",
        "params": [0, 1, 3],
        "buffers": [buffer("A"), buffer("B"), buffer("C"), buffer("D")],
        "blocks": [
            {"name": "root", "iter_vars": [], "reads": [], "writes": [], "init": null, "body": [],
             "children": [lp("i", json!([lp("j", json!([lp("k", json!([c_block]))]))])), lp("x", json!([lp("y", json!([d_block]))]))],
             "alloc_buffers": [2], "annotations": {}},
            {"name": "C", "iter_vars": [iv("vi", "S"), iv("vj", "S"), iv("vk", "R")],
             "reads": [{"buffer": 0, "region": point(&["vi", "vk"])}, {"buffer": 1, "region": point(&["vk", "vj"])}],
             "writes": [{"buffer": 2, "region": point(&["vi", "vj"])}],
             "init": [{"buffer": 2, "indices": [var("vi"), var("vj")], "value": ["float", 0.0, dtype]}],
             "body": [{"buffer": 2, "indices": [var("vi"), var("vj")], "value": ["add", ["load", 2, [var("vi"), var("vj")]],
                       ["mul", ["load", 0, [var("vi"), var("vk")]], ["load", 1, [var("vk"), var("vj")]]]]}],
             "children": null, "alloc_buffers": [], "annotations": {}},
            {"name": "D", "iter_vars": [iv("vx", "S"), iv("vy", "S")],
             "reads": [{"buffer": 2, "region": point(&["vx", "vy"])}],
             "writes": [{"buffer": 3, "region": point(&["vx", "vy"])}],
             "init": null,
             "body": [{"buffer": 3, "indices": [var("vx"), var("vy")], "value": ["max", ["load", 2, [var("vx"), var("vy")]], ["float", 0.0, dtype]]}],
             "children": null, "alloc_buffers": [], "annotations": {}},
        ],
        "root": {"node": "block", "block": 0, "bindings": [], "predicate": ["bool", true]},
    });
    Program::from_json(&text.to_string()).expect("valid program")
}

#[test]
fn fetch_lanes_follow_the_data_type() {
    let target = GpuTarget::new(1024, 32, 49152);
    for (dtype, lanes) in [
        ("float32", vec![1, 2, 4]),
        ("float16", vec![1, 2, 4, 8]),
        ("int8", vec![1, 2, 4, 8, 16]),
        ("float64", vec![1, 2]),
    ] {
        let p = matmul(64, dtype);
        let space = GpuSketchSpace::new(&p, &target);
        assert_eq!(space.lane_candidates(&p, 0), lanes, "{dtype}");
    }
}

#[test]
fn tiles_fit_small_targets_and_the_fallback_reaches_a_warp() {
    let p = matmul(256, "float32");
    for (threads, shared) in [(1024, 49152), (256, 16384), (64, 4096)] {
        let space = GpuSketchSpace::new(&p, &GpuTarget::new(threads, 32, shared));
        assert_eq!(min_threads(&space, &p, 1), 32);
        for i in 0..50 {
            let tiles = draw_tiles(&space, &p, 1, &mut Rng::derive(5, i));
            assert!(fits(&space, &p, 1, &tiles), "{threads}/{shared}: {tiles:?}");
        }
        let fallback = tiling::fallback_tiles(&space, &p, 1, &mut Rng::new(1));
        let n = threads_per_block(&p, 1, &fallback);
        assert!((32..=threads).contains(&n), "fallback with {n} threads");
    }
}

#[test]
fn a_matmul_is_tiled_with_caches_and_replays() {
    let p = matmul(128, "float32");
    let target = GpuTarget::new(1024, 32, 49152);
    let space = GpuSketchSpace::new(&p, &target);
    let g = space.draw(&p, &mut Rng::new(3));
    assert_eq!(g.rules[&1], GpuRule::Tile { epilogue: Some(2) });
    assert_eq!(g.rules[&2], GpuRule::IntoProducer);
    assert_eq!(g.lanes[&1].len(), 2);
    let trace = emit_gpu(&p, &space, &g).to_string();
    for needle in [
        "\"blockIdx.x\"",
        "\"vthread.x\"",
        "\"threadIdx.x\"",
        "\"local\"",
        "\"shared\"",
        "ReverseComputeInline",
    ] {
        assert!(trace.contains(needle), "{needle} missing from {trace}");
    }
    apply_trace_to_gpu(&p, &trace, &target, true).expect("the engine replays it");
}
