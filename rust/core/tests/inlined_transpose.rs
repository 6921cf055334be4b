//! A transpose inlined into a matmul (TBG: `C[h, i, j] = sum_k Q[i, h, k] * V[j, h, k]`) makes
//! the operand the vectorized loop walks strided: the analytical model counts a load per
//! element of it (a gather), not one per vector.

use fastsearch_core::estimate_cycles;
use fastsearch_core::Program;
use fastsearch_core::{CpuTarget, Genome, SketchSpace};

fn tbg() -> Program {
    let path = format!("{}/tests/fixtures/tbg_0.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The matmul tiled with `rows` x `cols` in registers (heads 3x1x4x1, k 1x64), the two
/// transposes ruled `transposes` ("Inline" or "Root").
fn genome(p: &Program, transposes: &str, rows: i64, cols: i64) -> Genome {
    let (q, v, c) = (
        p.block_by_name("query_T").unwrap(),
        p.block_by_name("value_T").unwrap(),
        p.block_by_name("C").unwrap(),
    );
    let json = format!(
        r#"{{"rules":{{"{q}":"{transposes}","{v}":"{transposes}","{c}":{{"Tile":{{"cache":"None","level":0}}}}}},
            "tiles":{{"{c}":[[1,1,1,1],[3,1,4,1],[1,1,{},{rows}],[1,{},1,{cols}],[1,64]]}},
            "parallel":32,"vectorize":64,"unroll":1}}"#,
        128 / rows,
        128 / cols
    );
    serde_json::from_str(&json).unwrap()
}

#[test]
fn inlined_transpose_makes_wide_column_tiles_gather() {
    let p = tbg();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2).with_vector_bytes(64);
    let cycles = |transposes, rows, cols| {
        estimate_cycles(&p, &space, &genome(&p, transposes, rows, cols), &target)
    };
    // Both hold 16 accumulator vectors. Measured here (Zen 4, transposes inlined, as the
    // sketches always have them): 16 x 16 at 264 us, 8 x 32 at 518 us.
    let (square, wide) = (cycles("Inline", 16, 16), cycles("Inline", 8, 32));
    assert!(square < wide, "16x16 {square} against 8x32 {wide}");
    // Transposed into buffers of their own, the columns are contiguous again and the wide
    // tile, with fewer loads per FMA, is the cheaper one.
    let (square, wide) = (cycles("Root", 16, 16), cycles("Root", 8, 32));
    assert!(wide <= square, "16x16 {square} against 8x32 {wide}");
}
