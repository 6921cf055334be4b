//! The analytical model's cost of reloading the register tile at every S2 step, on a
//! 512 x 512 x 512 matmul (te_workload GMM:2), against kernels re-timed side by side in fresh
//! processes on the AVX-512 host (2 cores, 2 threads).

use fastsearch_core::estimate_cycles;
use fastsearch_core::Program;
use fastsearch_core::{CpuTarget, Genome, SketchSpace};

fn gmm() -> Program {
    let path = format!("{}/tests/fixtures/gmm_512.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A candidate with the write cache `cache`, tiles i, j (four levels each) and k (two), and
/// unroll index `unroll`.
fn genome(p: &Program, cache: &str, tiles: &str, unroll: usize) -> Genome {
    let z = p.block_by_name("Z").unwrap();
    let json = format!(
        r#"{{"rules":{{"{z}":{{"Tile":{{"cache":"{cache}","level":1}}}}}},
            "tiles":{{"{z}":[[1,1,1,1],{tiles}]}},
            "parallel":32,"vectorize":64,"unroll":{unroll}}}"#
    );
    serde_json::from_str(&json).unwrap()
}

fn cycles(p: &Program, g: &Genome) -> f64 {
    estimate_cycles(
        p,
        &SketchSpace::new(p),
        g,
        &CpuTarget::new(2).with_vector_bytes(64),
    )
}

/// fastsearch's best of GMM:2 seed 0 (S2 i 16 x j 16 around an 8 x 32 register tile, its C
/// tile 256 KiB) with the reduction split [k0, k1].
fn wide_s2(p: &Program, k0: i64, k1: i64) -> Genome {
    let tiles = format!("[2,2,16,8],[1,1,16,32],[{k0},{k1}]");
    genome(p, "Global", &tiles, 1)
}

#[test]
fn shorter_chains_between_reloads_rank_slower() {
    let p = gmm();
    // Re-timed 927, 945, 1069 and 1400 us: the tile is stored and loaded from L2 every R1 steps.
    let times: Vec<f64> = [(8, 64), (16, 32), (64, 8), (128, 4)]
        .iter()
        .map(|&(k0, k1)| cycles(&p, &wide_s2(&p, k0, k1)))
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "cycles by R1 64, 32, 8, 4: {times:?}"
    );
    assert!(times[3] > 1.3 * times[0], "{times:?}");
}

#[test]
fn a_register_tile_kept_across_the_reduction_outranks_one_reloaded_from_l2() {
    let p = gmm();
    // MetaSchedule's best of seed 2 (847 us): S2 i 4, R1 4, S3 i 2 x j 32, unroll 64, one
    // unrolled body whose 16 accumulators stay in registers across all 128 R0 steps.
    let kept = genome(&p, "None", "[4,16,4,2],[8,2,1,32],[128,4]", 2);
    let reloaded = wide_s2(&p, 8, 64);
    let (kept, reloaded) = (cycles(&p, &kept), cycles(&p, &reloaded));
    assert!(kept < reloaded, "kept {kept}, reloaded {reloaded}");
}
