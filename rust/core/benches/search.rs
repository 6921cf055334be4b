//! Criterion benches of the search engine's hot paths, in candidates per second:
//! sketch sampling, mutation, one evolutionary generation and forest scoring.
//!
//! Run with `cargo bench -p fastsearch-core --bench search`.

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastsearch_core::Forest;
use fastsearch_core::Program;
use fastsearch_core::Rng;
use fastsearch_core::SearchContext;
use fastsearch_core::{emit, mutate, CpuTarget, Genome, SketchSpace};
use fastsearch_core::{evolve, EvolutionConfig};

fn program(name: &str) -> Program {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).expect("fixture")).expect("program")
}

fn tile_score(_: &Program, _: &SketchSpace, genomes: &[Genome]) -> Vec<f64> {
    genomes
        .iter()
        .map(|g| {
            g.tiles
                .values()
                .flatten()
                .map(|t| *t.last().unwrap() as f64)
                .sum()
        })
        .collect()
}

fn forest_json(trees: usize, depth: usize, features: usize) -> String {
    // A complete binary tree per round, splitting on varied features.
    let mut out = Vec::new();
    for t in 0..trees {
        let n = (1usize << (depth + 1)) - 1;
        let inner = (1usize << depth) - 1;
        let left: Vec<i64> = (0..n)
            .map(|i| if i < inner { 2 * i as i64 + 1 } else { -1 })
            .collect();
        let right: Vec<i64> = (0..n)
            .map(|i| if i < inner { 2 * i as i64 + 2 } else { -1 })
            .collect();
        let feat: Vec<usize> = (0..n).map(|i| (i * 7 + t) % features).collect();
        let cond: Vec<f64> = (0..n).map(|i| (i % 13) as f64 * 0.1).collect();
        let dl: Vec<i64> = (0..n).map(|i| (i % 2) as i64).collect();
        out.push(format!(
            r#"{{"left_children":{left:?},"right_children":{right:?},"split_indices":{feat:?},"split_conditions":{cond:?},"default_left":{dl:?}}}"#
        ));
    }
    format!(
        r#"{{"learner":{{"learner_model_param":{{"base_score":"0.5","num_feature":"{features}"}},"gradient_booster":{{"name":"gbtree","model":{{"trees":[{}]}}}}}}}}"#,
        out.join(",")
    )
}

fn benches(c: &mut Criterion) {
    let target = CpuTarget::new(2);
    for name in ["gmm_512", "cbr_small"] {
        let p = program(name);
        let space = SketchSpace::new(&p);
        let mut g = c.benchmark_group(format!("sketch/{name}"));
        g.throughput(Throughput::Elements(1));
        let mut i = 0u64;
        g.bench_function("draw+emit", |b| {
            b.iter(|| {
                i += 1;
                let genome = space.draw(&p, &target, &mut Rng::derive(1, i));
                black_box(emit(&p, &space, &genome).to_string())
            })
        });
        let base = space.draw(&p, &target, &mut Rng::new(3));
        g.bench_function("mutate", |b| {
            b.iter(|| {
                i += 1;
                black_box(mutate(&base, &p, &space, &mut Rng::derive(2, i)))
            })
        });
        g.finish();

        let measured = HashMap::new();
        let ctx = SearchContext {
            program: &p,
            space: &space,
            target: &target,
            measured: &measured,
        };
        let config = EvolutionConfig {
            population: 512,
            generations: 1,
            ..Default::default()
        };
        let mut g = c.benchmark_group(format!("evolution/{name}"));
        // One generation scores the initial population and its children: 2 x population.
        g.throughput(Throughput::Elements(2 * config.population as u64));
        g.sample_size(10);
        g.bench_function("one generation", |b| {
            b.iter(|| black_box(evolve(&ctx, &tile_score, &[], 16, &config, 5)))
        });
        g.finish();
    }

    let forest = Forest::from_json(&forest_json(200, 6, 164)).expect("forest");
    let rows: Vec<f32> = (0..164 * 1000)
        .map(|i| ((i * 31) % 97) as f32 * 0.05)
        .collect();
    let mut g = c.benchmark_group("model");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("forest 200 trees x 1000 rows", |b| {
        b.iter(|| black_box(forest.predict(&rows, 164)))
    });
    g.finish();
}

criterion_group!(all, benches);
criterion_main!(all);
