//! The GPU search on the te_workload fixtures: mutations stay within the target's limits,
//! every proposal passes the engine's CUDA postprocessors and VerifyGPUCode and is new, the
//! same seed proposes the same batch on any number of threads, and the analytical model moves
//! in the directions that must hold (operand reuse, wider fetches, unrolling).

use std::collections::HashSet;

use fastsearch_core::{
    estimate_gpu, evolve_gpu, mutate_gpu, sample_gpu_genomes, verify_trace_gpu, GpuEvolutionConfig,
    GpuGenome, GpuRule, GpuSketchSpace, GpuTarget, Program, Rng,
};

const FIXTURES: [&str; 4] = ["gmm_512", "cbr_small", "sfm_small", "tbg_0"];

fn fixture(name: &str) -> Program {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn small_config() -> GpuEvolutionConfig {
    GpuEvolutionConfig {
        population: 64,
        generations: 2,
        ..GpuEvolutionConfig::default()
    }
}

#[test]
fn mutants_respect_the_limits() {
    for target in [
        GpuTarget::new(1024, 32, 49152),
        GpuTarget::new(256, 32, 16384),
    ] {
        for name in FIXTURES {
            let p = fixture(name);
            let space = GpuSketchSpace::new(&p, &target);
            let mut changed = 0;
            for (i, (_, g)) in sample_gpu_genomes(&p, &target, 16, 3, &HashSet::new())
                .iter()
                .enumerate()
            {
                let mut rng = Rng::derive(5, i as u64);
                for _ in 0..8 {
                    if let Some(m) = mutate_gpu(&p, &space, g, &mut rng) {
                        assert!(space.limit_violations(&p, &m).is_empty(), "{name}");
                        assert_ne!(&m, g);
                        changed += 1;
                    }
                }
            }
            assert!(changed >= 32, "{name}: only {changed} mutants");
        }
    }
}

#[test]
fn proposals_are_valid_new_and_deterministic() {
    let target = GpuTarget::new(1024, 32, 49152);
    for name in FIXTURES {
        let p = fixture(name);
        let measured: Vec<(GpuGenome, f64)> =
            sample_gpu_genomes(&p, &target, 4, 1, &HashSet::new())
                .into_iter()
                .enumerate()
                .map(|(i, (_, g))| (g, 1e-3 * (i + 1) as f64))
                .collect();
        let exclude: HashSet<String> = sample_gpu_genomes(&p, &target, 4, 1, &HashSet::new())
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    evolve_gpu(
                        &p,
                        &target,
                        &measured,
                        8,
                        11,
                        &exclude,
                        &small_config(),
                        None,
                    )
                })
        };
        let one = on(1);
        assert!(one.len() >= 4, "{name}: {} proposals", one.len());
        let traces: Vec<&String> = one.iter().map(|q| &q.trace).collect();
        let again: Vec<String> = on(3).into_iter().map(|q| q.trace).collect();
        assert_eq!(traces, again.iter().collect::<Vec<_>>(), "{name}");
        let mut distinct = HashSet::new();
        for q in &one {
            assert!(
                !exclude.contains(&q.trace),
                "{name}: a measured candidate proposed again"
            );
            assert!(distinct.insert(q.trace.clone()), "{name}: proposed twice");
            assert_eq!(
                verify_trace_gpu(&p, &q.trace, &target).unwrap(),
                None,
                "{name}"
            );
        }
    }
}

/// The GMM fixture's tiled genome with its tiles replaced.
fn gmm_with(tiles: Vec<Vec<i64>>, lanes: i64) -> (Program, GpuSketchSpace, GpuGenome) {
    let target = GpuTarget::new(1024, 32, 49152);
    let p = fixture("gmm_512");
    let space = GpuSketchSpace::new(&p, &target);
    let (_, mut g) = sample_gpu_genomes(&p, &target, 64, 7, &HashSet::new())
        .into_iter()
        .find(|(_, g)| g.rules.values().any(|r| matches!(r, GpuRule::Tile { .. })))
        .expect("a tiled GMM candidate");
    let b = *g.tiles.keys().next().unwrap();
    g.tiles.insert(b, tiles);
    for l in g.lanes.get_mut(&b).unwrap().iter_mut() {
        *l = lanes;
    }
    (p, space, g)
}

#[test]
fn the_model_prefers_reuse_wide_fetches_and_unrolling() {
    // GMM (1, 512, 512, 512): b, i, j spatial (5 levels), k reduction (3 levels).
    let reuse = vec![
        vec![1, 1, 1, 1, 1],
        vec![8, 1, 16, 4, 1],
        vec![8, 1, 16, 1, 4],
        vec![64, 8, 1],
    ];
    let no_reuse = vec![
        vec![1, 1, 1, 1, 1],
        vec![32, 1, 16, 1, 1],
        vec![32, 1, 16, 1, 1],
        vec![64, 8, 1],
    ];
    let (p, space, wide) = gmm_with(reuse.clone(), 4);
    let (_, _, narrow) = gmm_with(reuse, 1);
    let (_, _, flat) = gmm_with(no_reuse, 4);
    for g in [&wide, &narrow, &flat] {
        assert!(
            space.limit_violations(&p, g).is_empty(),
            "{:?}",
            space.limit_violations(&p, g)
        );
    }
    let t = |g: &GpuGenome| estimate_gpu(&p, &space, g);
    assert!(
        t(&wide) < t(&flat),
        "16 accumulators a thread reuse operands: {} vs {}",
        t(&wide),
        t(&flat)
    );
    assert!(
        t(&wide) <= t(&narrow),
        "4-wide fetches: {} vs {}",
        t(&wide),
        t(&narrow)
    );
    // Unrolled inner loops are not slower.
    let mut rolled = wide.clone();
    rolled.unroll = 0;
    let mut unrolled = wide.clone();
    unrolled.unroll = 3;
    assert!(t(&unrolled) <= t(&rolled));
}
