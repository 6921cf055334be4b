//! The searches on real programs (fixtures exported from TVM by `fastsearch.tir_import`),
//! scored by a synthetic model whose optimum is known.

use std::collections::HashMap;

use fastsearch_core::program::Program;
use fastsearch_core::search::annealing::{anneal, AnnealingConfig};
use fastsearch_core::search::evolution::{evolve, EvolutionConfig};
use fastsearch_core::search::SearchContext;
use fastsearch_core::sketch::{CpuTarget, Genome, Rule, SketchSpace};

fn program(name: &str) -> Program {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Prefers innermost tiles of 16 and middle tiles of 4 on every loop of tiled blocks.
fn synthetic(_: &Program, _: &SketchSpace, genomes: &[Genome]) -> Vec<f64> {
    genomes
        .iter()
        .map(|g| {
            let mut s = 0.0;
            for (block, tiles) in &g.tiles {
                if !matches!(g.rules[block], Rule::Tile { .. }) {
                    continue;
                }
                for t in tiles {
                    let last = *t.last().unwrap() as f64;
                    s -= (last.log2() - 4.0).abs();
                    if t.len() == 4 {
                        s -= ((t[2] as f64).log2() - 2.0).abs();
                    }
                }
            }
            s
        })
        .collect()
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn evolution_beats_random_draws_and_skips_measured() {
    let p = program("gmm_512");
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let empty = HashMap::new();
    let ctx = SearchContext {
        program: &p,
        space: &space,
        target: &target,
        measured: &empty,
    };
    let config = EvolutionConfig {
        population: 256,
        generations: 4,
        epsilon: 0.0,
        ..Default::default()
    };
    let best = evolve(&ctx, &synthetic, &[], 16, &config, 7);
    assert_eq!(best.len(), 16);
    let random: Vec<Genome> = (0..256)
        .map(|i| space.draw(&p, &target, &mut fastsearch_core::rng::Rng::derive(99, i)))
        .collect();
    let evolved: Vec<Genome> = best.iter().map(|x| x.genome.clone()).collect();
    let (e, r) = (
        mean(&synthetic(&p, &space, &evolved)),
        mean(&synthetic(&p, &space, &random)),
    );
    assert!(e > r + 1.0, "evolved mean score {e} not above random {r}");

    // Measured candidates are never proposed again.
    let measured: HashMap<String, f64> =
        best.iter().take(8).map(|x| (x.key.clone(), 1.0)).collect();
    let ctx = SearchContext {
        program: &p,
        space: &space,
        target: &target,
        measured: &measured,
    };
    let again = evolve(&ctx, &synthetic, &[], 16, &config, 7);
    assert!(again.iter().all(|x| !measured.contains_key(&x.key)));
}

#[test]
fn search_is_the_same_on_one_or_many_threads() {
    let p = program("cbr_small");
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let empty = HashMap::new();
    let ctx = SearchContext {
        program: &p,
        space: &space,
        target: &target,
        measured: &empty,
    };
    let config = EvolutionConfig {
        population: 128,
        generations: 3,
        ..Default::default()
    };
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let e: Vec<String> = evolve(&ctx, &synthetic, &[], 12, &config, 3)
                .into_iter()
                .map(|x| x.key)
                .collect();
            let a: Vec<String> = anneal(
                &ctx,
                &synthetic,
                &[],
                12,
                &AnnealingConfig {
                    chains: 64,
                    steps: 8,
                    start_temperature: 1.0,
                },
                3,
            )
            .into_iter()
            .map(|x| x.key)
            .collect();
            (e, a)
        })
    };
    assert_eq!(run(1), run(4));
}

#[test]
fn annealing_improves_on_its_start() {
    let p = program("gmm_512");
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let empty = HashMap::new();
    let ctx = SearchContext {
        program: &p,
        space: &space,
        target: &target,
        measured: &empty,
    };
    let config = AnnealingConfig {
        chains: 64,
        steps: 32,
        start_temperature: 0.5,
    };
    let out = anneal(&ctx, &synthetic, &[], 8, &config, 5);
    let random: Vec<Genome> = (0..64)
        .map(|i| space.draw(&p, &target, &mut fastsearch_core::rng::Rng::derive(5, i)))
        .collect();
    let got: Vec<Genome> = out.iter().map(|x| x.genome.clone()).collect();
    assert!(mean(&synthetic(&p, &space, &got)) > mean(&synthetic(&p, &space, &random)) + 1.0);
}

#[test]
fn small_spaces_still_fill_the_batch() {
    let p = program("sfm_small");
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let empty = HashMap::new();
    let ctx = SearchContext {
        program: &p,
        space: &space,
        target: &target,
        measured: &empty,
    };
    let out = evolve(
        &ctx,
        &synthetic,
        &[],
        8,
        &EvolutionConfig {
            population: 64,
            ..Default::default()
        },
        1,
    );
    assert_eq!(out.len(), 8);
}
