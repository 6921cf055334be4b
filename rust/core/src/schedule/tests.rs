//! Unit and property tests of the schedule engine on small hand-built programs.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::state::{Child, State};
use super::trace::{apply_trace, Trace};
use super::{loops, nest};
use crate::program::{IterKind, Program};

fn var(n: &str) -> Value {
    json!(["var", n])
}

fn point(vars: &[&str]) -> Value {
    Value::Array(vars.iter().map(|v| json!([var(v), ["int", 1]])).collect())
}

/// `C[i, j] += A[i, k] * B[k, j]` (n x n x n) followed by `D[i, j] = max(C[i, j], 0)`.
fn matmul_relu(n: i64) -> Program {
    let lp = |v: &str, body: Value| json!({"node": "loop", "var": v, "min": 0, "extent": n, "kind": "serial", "body": body});
    let c_block = json!({"node": "block", "block": 1, "bindings": [var("i"), var("j"), var("k")], "predicate": ["bool", true]});
    let d_block = json!({"node": "block", "block": 2, "bindings": [var("x"), var("y")], "predicate": ["bool", true]});
    let iv = |name: &str, kind: &str| json!({"name": name, "min": 0, "extent": n, "kind": kind});
    let text = json!({
        "name": "main",
        "params": [0, 1, 3],
        "buffers": [
            {"name": "A", "shape": [n, n], "dtype": "float32", "scope": "global"},
            {"name": "B", "shape": [n, n], "dtype": "float32", "scope": "global"},
            {"name": "C", "shape": [n, n], "dtype": "float32", "scope": "global"},
            {"name": "D", "shape": [n, n], "dtype": "float32", "scope": "global"},
        ],
        "blocks": [
            {"name": "root", "iter_vars": [], "reads": [], "writes": [], "init": null, "body": [],
             "children": [lp("i", json!([lp("j", json!([lp("k", json!([c_block]))]))])), lp("x", json!([lp("y", json!([d_block]))]))],
             "alloc_buffers": [2], "annotations": {}},
            {"name": "C", "iter_vars": [iv("vi", "S"), iv("vj", "S"), iv("vk", "R")],
             "reads": [{"buffer": 0, "region": point(&["vi", "vk"])}, {"buffer": 1, "region": point(&["vk", "vj"])}],
             "writes": [{"buffer": 2, "region": point(&["vi", "vj"])}],
             "init": [{"buffer": 2, "indices": [var("vi"), var("vj")], "value": ["float", 0.0, "float32"]}],
             "body": [{"buffer": 2, "indices": [var("vi"), var("vj")], "value": ["add", ["load", 2, [var("vi"), var("vj")]],
                       ["mul", ["load", 0, [var("vi"), var("vk")]], ["load", 1, [var("vk"), var("vj")]]]]}],
             "children": null, "alloc_buffers": [], "annotations": {}},
            {"name": "D", "iter_vars": [iv("vx", "S"), iv("vy", "S")],
             "reads": [{"buffer": 2, "region": point(&["vx", "vy"])}],
             "writes": [{"buffer": 3, "region": point(&["vx", "vy"])}],
             "init": null,
             "body": [{"buffer": 3, "indices": [var("vx"), var("vy")], "value": ["max", ["load", 2, [var("vx"), var("vy")]], ["float", 0.0, "float32"]]}],
             "children": null, "alloc_buffers": [], "annotations": {}},
        ],
        "root": {"node": "block", "block": 0, "bindings": [], "predicate": ["bool", true]},
    });
    Program::from_json(&text.to_string()).expect("valid program")
}

fn state(n: i64) -> State {
    State::from_program(&matmul_relu(n)).expect("state")
}

fn run(st: &mut State, insts: Value) -> crate::Result<()> {
    let trace = Trace::from_value(&json!([insts, []]))?;
    apply_trace(st, &trace, false)
}

/// Total iterations of the block under each leaf: product of enclosing extents.
fn iterations(st: &State, b: usize) -> i64 {
    st.loops_of(b).iter().map(|&l| st.loops[l].extent).product()
}

#[test]
fn matmul_tiling_with_cache_write_and_postprocessors() {
    let mut st = state(64);
    let insts = json!([
        ["GetSBlock", [], ["C", "main"], ["b0"]],
        ["GetSBlock", [], ["root", "main"], ["b1"]],
        ["GetLoops", ["b0"], [], ["l0", "l1", "l2"]],
        ["Split", ["l0", 4, 16], [1, 0], ["l3", "l4"]],
        ["Split", ["l1", "None", 8], [1, 0], ["l5", "l6"]],
        ["Reorder", ["l3", "l5", "l2", "l4", "l6"], [], []],
        ["CacheWrite", ["b0", []], [0, "global"], ["b2"]],
        ["ReverseComputeAt", ["b2", "l5"], [1, -1], []],
        ["Annotate", ["b1", 16], ["meta_schedule.parallel"], []],
        ["Annotate", ["b1", 64], ["meta_schedule.vectorize"], []],
    ]);
    let trace = Trace::from_value(&json!([insts, []])).unwrap();
    apply_trace(&mut st, &trace, true).unwrap();
    let nest = nest::loop_nest(&st);
    // Parallel over the fused outer tiles (4 * 8 = 32 > 16: both fused), an init block first.
    let outer = &nest["body"][0]["loop"];
    assert_eq!(outer["kind"], "parallel");
    assert_eq!(outer["extent"], 32);
    let names: Vec<String> = st
        .all_blocks()
        .iter()
        .map(|&b| st.blocks[b].block.name.clone())
        .collect();
    assert_eq!(names, ["C_init", "C_update", "C_global", "D"]);
    assert_eq!(nest["buffers"][1]["name"], "C_global");
}

#[test]
fn compute_at_covers_the_consumer_tile() {
    let mut st = state(64);
    run(
        &mut st,
        json!([
            ["GetSBlock", [], ["C", "main"], ["b0"]],
            ["GetSBlock", [], ["D", "main"], ["b1"]],
            ["GetLoops", ["b1"], [], ["l0", "l1"]],
            ["Split", ["l0", "None", 16], [1, 0], ["l2", "l3"]],
            ["ComputeAt", ["b0", "l2"], [1, -1], []],
        ]),
    )
    .unwrap();
    let c = st.block_by_name("C").unwrap();
    let extents: Vec<i64> = st.loops_of(c).iter().map(|&l| st.loops[l].extent).collect();
    // Under the outer tile of D: 16 rows, all 64 columns, the whole reduction.
    assert_eq!(extents, [4, 16, 64, 64]);
    assert_eq!(iterations(&st, c), 64 * 64 * 64);
}

#[test]
fn inline_and_invalid_primitives() {
    let mut st = state(32);
    // C is a reduction: it cannot be inlined.
    let err = run(
        &mut st,
        json!([
            ["GetSBlock", [], ["C", "main"], ["b0"]],
            ["ComputeInline", ["b0"], [], []]
        ]),
    );
    assert!(matches!(err, Err(crate::Error::Schedule { .. })));
    let mut st = state(32);
    let err = run(
        &mut st,
        json!([
            ["GetSBlock", [], ["C", "main"], ["b0"]],
            ["GetLoops", ["b0"], [], ["l0", "l1", "l2"]],
            ["Vectorize", ["l2"], [], []]
        ]),
    );
    assert!(
        matches!(err, Err(crate::Error::Schedule { instruction, .. }) if instruction == "Vectorize")
    );
    // D reverse-inlined into C's loops is refused (C is a reduction); C into D cannot inline.
    let mut st = state(32);
    let err = run(
        &mut st,
        json!([
            ["GetSBlock", [], ["D", "main"], ["b0"]],
            ["ReverseComputeInline", ["b0"], [], []]
        ]),
    );
    assert!(err.is_err());
}

#[test]
fn rfactor_makes_a_write_back_block() {
    let mut st = state(32);
    run(
        &mut st,
        json!([
            ["GetSBlock", [], ["C", "main"], ["b0"]],
            ["GetLoops", ["b0"], [], ["l0", "l1", "l2"]],
            ["Split", ["l2", "None", 8], [1, 0], ["l3", "l4"]],
            ["RFactor", ["l4"], [0], ["b1"]],
        ]),
    )
    .unwrap();
    let rf = st.block_by_name("C_rf").unwrap();
    assert_eq!(st.blocks[rf].block.iter_kinds(), "SSSR");
    let wb = st.block_by_name("C").unwrap();
    assert_eq!(st.blocks[wb].block.iter_kinds(), "RSS");
    assert_eq!(
        st.loops_of(wb)
            .iter()
            .map(|&l| st.loops[l].extent)
            .collect::<Vec<_>>(),
        [32, 32, 8]
    );
    assert!(st
        .buffers
        .iter()
        .any(|b| b.name == "C.rf" && b.shape == [8, 32, 32]));
}

#[test]
fn trace_json_round_trips() {
    let text = r#"[[["GetSBlock",[],["C","main"],["b0"]],["SampleCategorical",[],[[1,2],[0.5,0.5]],["v1"]]],[[1,1]]]"#;
    let t = Trace::from_json(text).unwrap();
    assert_eq!(Trace::from_value(&t.to_value()).unwrap(), t);
    assert!(matches!(
        Trace::from_json("[[[1]], []]"),
        Err(crate::Error::InvalidTrace(_))
    ));
}

proptest! {
    #[test]
    fn split_then_fuse_preserves_iterations(n in 1i64..200, f in 1i64..40, infer_outer in any::<bool>()) {
        let mut st = state(n);
        let c = st.block_by_name("C").unwrap();
        let l0 = st.loops_of(c)[0];
        let factors = if infer_outer { vec![None, Some(f)] } else { vec![Some(f), None] };
        let parts = loops::split(&mut st, l0, &factors, true, false).unwrap();
        let prod: i64 = parts.iter().map(|&l| st.loops[l].extent).product();
        prop_assert!(prod >= n && prod - n < f.max((n + f - 1) / f));
        let fused = loops::fuse(&mut st, &parts, true).unwrap();
        prop_assert_eq!(st.loops[fused].extent, prod);
        prop_assert_eq!(st.loops_of(c).len(), 3);
        // The fused loop is still the spatial loop of vi.
        prop_assert_eq!(st.loop_iter_kind(fused), IterKind::Spatial);
    }

    #[test]
    fn reorder_is_a_permutation(perm in Just(vec![0usize, 1, 2, 3]).prop_shuffle()) {
        let mut st = state(16);
        let c = st.block_by_name("C").unwrap();
        let l0 = st.loops_of(c)[0];
        let parts = loops::split(&mut st, l0, &[None, Some(4)], true, false).unwrap();
        let before = st.loops_of(c);
        prop_assert_eq!(before.len(), 4);
        prop_assert_eq!(&before[..2], &parts[..]);
        let order: Vec<usize> = perm.iter().map(|&i| before[i]).collect();
        loops::reorder(&mut st, &order).unwrap();
        prop_assert_eq!(st.loops_of(c), order);
        prop_assert_eq!(iterations(&st, c), 16 * 16 * 16);
        // Bindings keep every loop variable in use.
        let used: usize = st.loops_of(c).iter().filter(|&&l| st.blocks[c].bindings.iter().any(|e| super::arith::uses_var(e, &st.loops[l].var))).count();
        prop_assert_eq!(used, 4);
        prop_assert!(matches!(st.top[0], Child::Loop(_)));
    }
}

#[test]
fn a_database_line_reads_as_its_trace() {
    let trace = r#"[[["GetSBlock",[],["C","main"],["b0"]]],[]]"#;
    let line = format!("[0, [{trace}, [1.5e-05], null, null]]");
    assert_eq!(
        Trace::from_json(&line).unwrap(),
        Trace::from_json(trace).unwrap()
    );
    assert!(Trace::from_json("[0, []]").is_err());
}

#[test]
fn storage_is_relaxed_across_the_threads_that_share_it() {
    use super::compute::can_relax_under_thread;
    // Shared memory is shared by a block's threads and virtual threads, not across blocks.
    assert!(can_relax_under_thread("shared", "threadIdx.x"));
    assert!(can_relax_under_thread("shared", "vthread.x"));
    assert!(can_relax_under_thread("shared.dyn", "threadIdx.y"));
    assert!(!can_relax_under_thread("shared", "blockIdx.x"));
    // Local memory belongs to one thread; global memory is never relaxed this way.
    assert!(!can_relax_under_thread("local", "threadIdx.x"));
    assert!(!can_relax_under_thread("global", "threadIdx.x"));
    assert!(!can_relax_under_thread("", "blockIdx.x"));
    // Warp memory only across threadIdx.x.
    assert!(can_relax_under_thread("warp", "threadIdx.x"));
    assert!(!can_relax_under_thread("warp", "threadIdx.y"));
}

#[test]
fn a_fuse_past_32_bits_is_refused() {
    let mut st = state(65536);
    let c = st.block_by_name("C").unwrap();
    let ls = st.loops_of(c);
    // 65536 * 65536 = 2^32 iterations: TVM's 32-bit loop variable would wrap around.
    let err = loops::fuse(&mut st, &ls[..2], true).unwrap_err();
    assert!(err.to_string().contains("32-bit"), "{err}");
    let parts = loops::split(&mut st, ls[0], &[Some(256), None], true, false).unwrap();
    let fused = loops::fuse(&mut st, &parts, true).unwrap();
    assert_eq!(st.loops[fused].extent, 65536);
}
