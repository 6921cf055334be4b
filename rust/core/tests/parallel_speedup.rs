//! The analytical model divides a kernel's work by the speedup its busy cores give: linear in
//! the core count unless the target's measured `parallel_speedup` says the cores scale less.

use fastsearch_core::estimate_cycles;
use fastsearch_core::Program;
use fastsearch_core::{CpuTarget, Genome, SketchSpace};

fn gmm() -> Program {
    let path = format!("{}/tests/fixtures/gmm_512.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The 512^3 matmul with 8 x 64 register tiles, the whole reduction at R1 (no reload of the
/// tile between reduction steps, which costs the serial kernel's larger S2 loop more);
/// `parallel`: outer tiles of 32 x 2 (64 parallel jobs), else every outer tile 1 (one job: a
/// serial kernel).
fn genome(p: &Program, parallel: bool) -> Genome {
    let z = p.block_by_name("Z").unwrap();
    let (i0, j0) = if parallel { (32, 2) } else { (1, 1) };
    let json = format!(
        r#"{{"rules":{{"{z}":{{"Tile":{{"cache":"Global","level":1}}}}}},
            "tiles":{{"{z}":[[1,1,1,1],[{i0},1,{},8],[{j0},1,{},64],[1,512]]}},
            "parallel":32,"vectorize":64,"unroll":1}}"#,
        512 / 8 / i0,
        512 / 64 / j0,
    );
    serde_json::from_str(&json).unwrap()
}

#[test]
fn cores_that_scale_less_make_serial_kernels_relatively_cheaper() {
    let p = gmm();
    let space = SketchSpace::new(&p);
    let linear = CpuTarget::new(2).with_vector_bytes(64);
    let shared = CpuTarget::new(2)
        .with_vector_bytes(64)
        .with_parallel_speedup(Some(1.0));
    let cycles = |t: &CpuTarget, parallel| estimate_cycles(&p, &space, &genome(&p, parallel), t);

    let (serial, parallel) = (cycles(&linear, false), cycles(&linear, true));
    assert!(
        serial > 1.8 * parallel,
        "linear: serial {serial}, parallel {parallel}"
    );
    // A serial kernel keeps one core busy whatever the cores scale like; a parallel one gains
    // only what the target measured (here nothing).
    assert_eq!(cycles(&shared, false), serial);
    let shared_parallel = cycles(&shared, true);
    assert!(
        (shared_parallel / parallel - 2.0).abs() < 1e-9,
        "{shared_parallel} vs {parallel}"
    );
    assert!(cycles(&shared, false) < 1.1 * shared_parallel);
}

#[test]
fn speedup_is_linear_by_default_and_interpolates_a_measured_one() {
    let linear = CpuTarget::new(4);
    for busy in [1.0, 1.5, 3.0, 4.0] {
        assert_eq!(linear.speedup(busy), busy);
    }
    assert_eq!(
        CpuTarget::new(4)
            .with_parallel_speedup(None)
            .parallel_speedup,
        4.0
    );
    let measured = CpuTarget::new(4).with_parallel_speedup(Some(2.5));
    assert_eq!(measured.speedup(1.0), 1.0);
    assert_eq!(measured.speedup(4.0), 2.5);
    assert!((measured.speedup(2.5) - 1.75).abs() < 1e-12);
    // Out of range or not a number: kept within 1 and the cores, or linear.
    assert_eq!(
        CpuTarget::new(4)
            .with_parallel_speedup(Some(9.0))
            .parallel_speedup,
        4.0
    );
    assert_eq!(
        CpuTarget::new(4)
            .with_parallel_speedup(Some(0.2))
            .parallel_speedup,
        1.0
    );
    assert_eq!(
        CpuTarget::new(4)
            .with_parallel_speedup(Some(f64::NAN))
            .parallel_speedup,
        4.0
    );
}
