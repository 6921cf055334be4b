//! The analytical model's register tile on a one-group 1-D convolution (te_workload C1D:2:
//! 1 x 64 x 256 input, 256 output channels, kernel 5, padding 2), against kernels measured on
//! the AVX-512 host (2 cores, 2 threads).

use fastsearch_core::estimate_cycles;
use fastsearch_core::Program;
use fastsearch_core::{CpuTarget, Genome, SketchSpace};

fn c1d() -> Program {
    let path = format!("{}/tests/fixtures/c1d_2.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A candidate with the padding `pad` (a rule's JSON), the convolution tiled with `cache`,
/// tiles (n, l, co, rl, rc) and unroll index `unroll`.
fn genome(p: &Program, pad: &str, cache: &str, tiles: &str, unroll: usize) -> Genome {
    let (pad_block, conv) = (
        p.block_by_name("PadInput").unwrap(),
        p.block_by_name("conv1d_nlc").unwrap(),
    );
    let pad = pad.replace("HOST", &conv.to_string());
    let json = format!(
        r#"{{"rules":{{"{pad_block}":{pad},"{conv}":{{"Tile":{{"cache":"{cache}","level":0}}}}}},
            "tiles":{{"{conv}":[[1,1,1,1],{tiles}]}},
            "parallel":32,"vectorize":64,"unroll":{unroll}}}"#
    );
    serde_json::from_str(&json).unwrap()
}

fn target() -> CpuTarget {
    CpuTarget::new(2).with_vector_bytes(64)
}

/// MetaSchedule's best (146 us re-timed): S2 l 4 x co 2, R1 rl 5, S3 co 32, the channel
/// reduction at R0 and unroll 64, which LLVM turns into 80 FMAs on 16 accumulators per channel.
fn metaschedule_best(p: &Program, unroll: usize) -> Genome {
    genome(
        p,
        r#""Root""#,
        "Global",
        "[1,16,4,1],[4,1,2,32],[1,5],[256,1]",
        unroll,
    )
}

#[test]
fn the_unrolled_body_outranks_a_wide_register_tile_that_ran_slower() {
    let p = c1d();
    let space = SketchSpace::new(&p);
    // fastsearch's best of the same run (180 us re-timed beside it): a 16 x 16 S3 tile with
    // 64 channels at R1, a broadcast load per FMA.
    let wide = genome(
        &p,
        r#"{"ComputeAt":{"host":HOST,"depth":1}}"#,
        "None",
        "[2,1,2,16],[1,8,2,16],[1,5],[4,64]",
        3,
    );
    let t = target();
    let unrolled = estimate_cycles(&p, &space, &metaschedule_best(&p, 2), &t);
    let wide = estimate_cycles(&p, &space, &wide, &t);
    assert!(
        unrolled < wide,
        "unrolled body {unrolled}, wide tile {wide}"
    );
}

/// MetaSchedule's best of another run: S2 co 2, R1 rl 5, S3 l 8 x co 16 (one vector), the
/// channel reduction at R0, written with `cache`.
fn eighty_steps_of_one_vector(p: &Program, cache: &str, unroll: usize) -> Genome {
    genome(
        p,
        r#""Root""#,
        cache,
        "[8,1,1,8],[8,1,2,16],[1,5],[256,1]",
        unroll,
    )
}

#[test]
fn llvm_unrolls_an_80_step_body_with_any_pragma_or_a_write_cache() {
    let p = c1d();
    let space = SketchSpace::new(&p);
    let t = target();
    let cycles = |g: &Genome| estimate_cycles(&p, &space, g, &t);
    // Re-timed in 4 fresh processes (AVX-512 Xeon), microseconds: straight into the output,
    // unroll 0 / 16 / 64 / 512 ran 620 / 176 / 168 / 166; with a write cache, unroll 0 / 64
    // ran 163 / 164. Unroll 16 covers 16 of the body's 80 vector steps: LLVM unrolls the rest.
    let direct = |u| cycles(&eighty_steps_of_one_vector(&p, "None", u));
    let unrolled = direct(2);
    for (u, g) in [
        (1, direct(1)),
        (3, direct(3)),
        (0, cycles(&eighty_steps_of_one_vector(&p, "Global", 0))),
    ] {
        assert!(
            g < 1.15 * unrolled && unrolled < 1.15 * g,
            "unroll index {u}: {g} against {unrolled}"
        );
    }
    assert!(
        direct(0) > 1.3 * unrolled,
        "rolled {}, unrolled {unrolled}",
        direct(0)
    );
    // The other 80-step body, 2 vectors wide: with a write cache, unroll 0 and 64 ran 169 and
    // 163 us; straight into the output, unroll 0 ran 217.
    let wide = cycles(&metaschedule_best(&p, 2));
    let wide_rolled = cycles(&metaschedule_best(&p, 0));
    assert!(
        wide_rolled < 1.15 * wide,
        "rolled {wide_rolled}, unrolled {wide}"
    );
}

/// The whole reduction at R1 (rl 5 x rc 64) under S2 `l`, around an S3 tile of `rows` output
/// positions by `width` channels, with unroll 16 (too shallow to unroll the body).
fn whole_reduction_at_r1(p: &Program, rows: i64, width: i64) -> Genome {
    let tiles = format!(
        "[2,1,{},{rows}],[{},1,1,{width}],[1,5],[4,64]",
        32 / rows,
        256 / width
    );
    genome(
        p,
        r#"{"ComputeAt":{"host":HOST,"depth":2}}"#,
        "Global",
        &tiles,
        1,
    )
}

#[test]
fn a_tile_with_slack_at_every_issue_limit_outranks_one_at_a_limit() {
    let p = c1d();
    let space = SketchSpace::new(&p);
    let t = target();
    let cycles =
        |rows, width| estimate_cycles(&p, &space, &whole_reduction_at_r1(&p, rows, width), &t);
    // Timed twice in one session: 16 accumulator vectors at 160 us (8 x 32) and 161 (4 x 64);
    // 8 vectors, exactly the chains the FMA latency needs, at 184 (4 x 32) and 218 (2 x 64);
    // 16 vectors with 17 loads per 16 FMAs (16 x 16) at 193.
    let (best, latency_bound) = (cycles(8, 32), cycles(4, 32));
    assert!(best < latency_bound, "8x32 {best}, 4x32 {latency_bound}");
    assert!(cycles(4, 64) < cycles(2, 64));
    assert!(best < cycles(16, 16));
}

#[test]
fn avx2_has_half_the_registers_for_accumulators() {
    // AVX2's 16 vector registers leave 14 for accumulators: its 8-lane vectors in an 8 x 16
    // tile are 16 accumulators, which fit in AVX-512's 32 registers but spill in AVX2's. On
    // Zen 3, tiles of 16 accumulator vectors ran 1.5-2.1x their workload's best.
    let p = c1d();
    let space = SketchSpace::new(&p);
    let avx2 = CpuTarget::new(2);
    assert_eq!(avx2.vector_registers, 16);
    assert_eq!(target().vector_registers, 32);
    let as_if_32 = avx2.clone().with_vector_registers(32);
    let cycles = |rows, width, t: &CpuTarget| {
        estimate_cycles(&p, &space, &whole_reduction_at_r1(&p, rows, width), t)
    };
    let (sixteen, eight) = (cycles(8, 16, &avx2), cycles(4, 16, &avx2));
    assert!(eight < sixteen, "8 vectors {eight}, 16 vectors {sixteen}");
    assert!(cycles(8, 16, &as_if_32) < cycles(4, 16, &as_if_32));
    assert_eq!(eight, cycles(4, 16, &as_if_32)); // no spill either way: the same estimate
}
