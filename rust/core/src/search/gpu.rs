//! Evolutionary search over GPU candidates: a population seeded with the best measured genomes
//! and fresh draws, mutated within the target's limits ([`mutate_gpu`]) and ranked by a score,
//! of which the best candidates not measured yet are proposed. Every proposal has passed the
//! engine's CUDA postprocessors and its VerifyGPUCode: an invalid candidate is never proposed.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use crate::gpu_target::GpuTarget;
use crate::model::gpu::estimate_gpu;
use crate::program::Program;
use crate::rng::Rng;
use crate::sketch::gpu::{emit_gpu, mutate_gpu, GpuGenome, GpuSketchSpace};
use crate::verify_gpu::verify_trace_gpu;

/// Knobs of [`evolve_gpu`].
#[derive(Clone, Debug)]
pub struct GpuEvolutionConfig {
    /// Candidates per generation.
    pub population: usize,
    /// Generations before the batch is picked.
    pub generations: usize,
    /// Share of the initial population taken from the best measured candidates.
    pub measured_share: f64,
    /// Share of each batch drawn at random among the valid candidates seen (exploration).
    pub epsilon: f64,
}

impl Default for GpuEvolutionConfig {
    fn default() -> Self {
        GpuEvolutionConfig {
            population: 512,
            generations: 4,
            measured_share: 0.2,
            epsilon: 0.05,
        }
    }
}

/// A learned score of a batch of genomes, one value each (lower is better).
pub type GpuScore = dyn Fn(&[GpuGenome]) -> Vec<f64> + Sync;

/// One proposed GPU candidate: its trace (MetaSchedule JSON), genome and score (estimated
/// seconds; lower is better).
#[derive(Clone, Debug)]
pub struct GpuProposal {
    /// The trace to build and measure.
    pub trace: String,
    /// The genome it was emitted from.
    pub genome: GpuGenome,
    /// The score it was ranked by.
    pub score: f64,
}

/// Up to `n` valid candidates not in `exclude` (traces already measured or proposed), best
/// score first, from an evolution seeded with `measured` (genome, measured seconds). The
/// score is the analytical model's estimate unless `score` is given (lower is better).
/// Deterministic for a seed on any number of threads.
#[allow(clippy::too_many_arguments)]
pub fn evolve_gpu(
    program: &Program,
    target: &GpuTarget,
    measured: &[(GpuGenome, f64)],
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
    config: &GpuEvolutionConfig,
    score: Option<&GpuScore>,
) -> Vec<GpuProposal> {
    let space = GpuSketchSpace::new(program, target);
    let rank = |genomes: &[GpuGenome]| -> Vec<f64> {
        match score {
            Some(f) => f(genomes),
            None => genomes
                .par_iter()
                .map(|g| estimate_gpu(program, &space, g))
                .collect(),
        }
    };
    let mut best: Vec<&(GpuGenome, f64)> = measured.iter().collect();
    best.sort_by(|a, b| a.1.total_cmp(&b.1));
    let from_measured =
        ((config.population as f64 * config.measured_share) as usize).min(best.len());
    let mut population: Vec<GpuGenome> = best[..from_measured]
        .iter()
        .map(|(g, _)| g.clone())
        .collect();
    let fresh: Vec<GpuGenome> = (population.len()..config.population)
        .into_par_iter()
        .map(|i| space.draw(program, &mut Rng::derive(seed, i as u64)))
        .collect();
    population.extend(fresh);
    let mut seen: HashMap<GpuGenome, f64> = HashMap::new();
    let mut scores = rank(&population);
    remember(&mut seen, &population, &scores);
    for generation in 0..config.generations {
        let order = ranked(&scores);
        let parents: Vec<&GpuGenome> = order
            .iter()
            .take(population.len().div_ceil(2))
            .map(|&i| &population[i])
            .collect();
        let children: Vec<GpuGenome> = (0..config.population)
            .into_par_iter()
            .filter_map(|i| {
                let mut rng = Rng::derive(
                    seed ^ (generation as u64 + 1).wrapping_mul(0x9E37_79B9),
                    i as u64,
                );
                let parent = parents[rng.below(parents.len())];
                mutate_gpu(program, &space, parent, &mut rng)
            })
            .collect();
        let child_scores = rank(&children);
        remember(&mut seen, &children, &child_scores);
        let mut pool: Vec<(GpuGenome, f64)> = population
            .into_iter()
            .zip(scores)
            .chain(children.into_iter().zip(child_scores))
            .collect();
        pool.sort_by(|a, b| a.1.total_cmp(&b.1));
        pool.dedup_by(|a, b| a.0 == b.0);
        pool.truncate(config.population);
        (population, scores) = pool.into_iter().unzip();
    }
    pick_valid(
        program,
        target,
        &space,
        seen,
        n,
        seed,
        exclude,
        config.epsilon,
    )
}

fn remember(seen: &mut HashMap<GpuGenome, f64>, genomes: &[GpuGenome], scores: &[f64]) {
    for (g, &s) in genomes.iter().zip(scores) {
        seen.entry(g.clone()).or_insert(s);
    }
}

fn ranked(scores: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order
}

/// The best-scored candidates whose traces are new and pass the engine's CUDA postprocessors
/// and VerifyGPUCode, with an `epsilon` share picked at random among the rest.
#[allow(clippy::too_many_arguments)]
fn pick_valid(
    program: &Program,
    target: &GpuTarget,
    space: &GpuSketchSpace,
    seen: HashMap<GpuGenome, f64>,
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
    epsilon: f64,
) -> Vec<GpuProposal> {
    let mut entries: Vec<(GpuGenome, f64)> = seen.into_iter().collect();
    // Score, then the genome's serialized form: the order does not depend on hashing.
    let key = |g: &GpuGenome| serde_json::to_string(g).unwrap_or_default();
    entries.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| key(&a.0).cmp(&key(&b.0))));
    let mut rng = Rng::derive(seed, u64::MAX);
    let explore = ((n as f64) * epsilon).round() as usize;
    let mut order: Vec<usize> = (0..entries.len()).collect();
    // The exploring picks come from the lower half, moved to the front.
    for k in 0..explore.min(entries.len() / 2) {
        let j = entries.len() / 2 + rng.below(entries.len() - entries.len() / 2);
        order.swap(k, j);
    }
    let mut out = Vec::new();
    let mut taken: HashSet<String> = HashSet::new();
    for chunk in order.chunks(64) {
        let checked: Vec<Option<GpuProposal>> = chunk
            .par_iter()
            .map(|&i| {
                let (genome, score) = &entries[i];
                let trace = emit_gpu(program, space, genome).to_string();
                if exclude.contains(&trace) {
                    return None;
                }
                match verify_trace_gpu(program, &trace, target) {
                    Ok(None) => Some(GpuProposal {
                        trace,
                        genome: genome.clone(),
                        score: *score,
                    }),
                    _ => None,
                }
            })
            .collect();
        for p in checked.into_iter().flatten() {
            if out.len() < n && taken.insert(p.trace.clone()) {
                out.push(p);
            }
        }
        if out.len() >= n {
            break;
        }
    }
    out
}
