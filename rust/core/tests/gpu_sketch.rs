//! GPU sketches on the te_workload fixtures: every sampled genome respects the target's limits
//! and replays in the schedule engine with MetaSchedule's CUDA postprocessors; the same seed
//! gives the same traces on one and on several threads; softmax reductions are drawn across
//! threads under their consumer, and a convolution's epilogue is inlined into its write cache.

use std::collections::HashSet;

use fastsearch_core::{
    apply_trace_to_gpu, sample_gpu, sample_gpu_genomes, GpuRule, GpuSketchSpace, GpuTarget, Program,
};

const FIXTURES: [&str; 4] = ["gmm_512", "cbr_small", "sfm_small", "tbg_0"];

fn fixture(name: &str) -> Program {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn targets() -> [GpuTarget; 3] {
    [
        GpuTarget::new(1024, 32, 49152),
        GpuTarget::new(256, 32, 16384),
        GpuTarget::new(512, 64, 32768),
    ]
}

#[test]
fn every_sampled_genome_respects_the_limits_and_replays() {
    for name in FIXTURES {
        let p = fixture(name);
        for target in targets() {
            let space = GpuSketchSpace::new(&p, &target);
            let drawn = sample_gpu_genomes(&p, &target, 48, 9, &HashSet::new());
            assert!(drawn.len() >= 8, "{name}: only {} candidates", drawn.len());
            for (trace, genome) in &drawn {
                let broken = space.limit_violations(&p, genome);
                assert!(broken.is_empty(), "{name} on {target:?}: {broken:?}");
                if let Err(e) = apply_trace_to_gpu(&p, trace, &target, true) {
                    panic!("{name} on {target:?}: the engine refuses {trace}: {e}");
                }
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_traces_on_any_thread_count() {
    let target = GpuTarget::new(1024, 32, 49152);
    for name in FIXTURES {
        let p = fixture(name);
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| sample_gpu(&p, &target, 40, 21, &HashSet::new()))
        };
        let one = on(1);
        assert!(!one.is_empty());
        assert_eq!(one, on(4), "{name}");
        assert_eq!(one, on(3), "{name}");
        assert_ne!(
            one,
            sample_gpu(&p, &target, 40, 22, &HashSet::new()),
            "{name}"
        );
    }
}

#[test]
fn excluded_traces_are_not_drawn_again() {
    let p = fixture("gmm_512");
    let target = GpuTarget::new(1024, 32, 49152);
    let first: HashSet<String> = sample_gpu(&p, &target, 20, 1, &HashSet::new())
        .into_iter()
        .collect();
    let again = sample_gpu(&p, &target, 20, 1, &first);
    assert!(again.iter().all(|t| !first.contains(t)));
}

#[test]
fn softmax_reductions_go_across_threads_and_epilogues_into_the_write_cache() {
    let target = GpuTarget::new(1024, 32, 49152);
    let sfm = fixture("sfm_small");
    let drawn = sample_gpu_genomes(&sfm, &target, 64, 4, &HashSet::new());
    let hosted = drawn
        .iter()
        .filter(|(_, g)| {
            g.rules
                .values()
                .any(|r| matches!(r, GpuRule::CrossThread { host: Some(_) }))
        })
        .count();
    let at_root = drawn
        .iter()
        .filter(|(_, g)| {
            g.rules
                .values()
                .any(|r| *r == GpuRule::CrossThread { host: None })
        })
        .count();
    assert!(
        hosted > 0 && at_root > 0,
        "hosted {hosted}, at the root {at_root}"
    );
    let cbr = fixture("cbr_small");
    for (trace, g) in sample_gpu_genomes(&cbr, &target, 16, 4, &HashSet::new()) {
        assert!(g.rules.values().any(|r| *r == GpuRule::IntoProducer));
        assert!(trace.contains("ReverseComputeInline"));
    }
}
