//! Search over sketch candidates, scored by a cost model, entirely in Rust.
//!
//! * [`evolution`] — evolutionary search: a population seeded with the best measured candidates
//!   and fresh draws, evolved by score-proportional selection, mutation and crossover.
//! * [`annealing`] — simulated annealing on the model's score over parallel chains.
//!
//! Both are deterministic for a seed whatever the number of threads: every random draw comes
//! from a generator derived from (seed, generation, index) and results are kept in index order.

pub mod annealing;
pub mod evolution;

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use crate::program::Program;
use crate::sketch::{emit, CpuTarget, Genome, SketchSpace};

/// Predicts how good candidates are: higher is better (a predicted throughput).
pub trait Scorer: Sync {
    fn score(&self, program: &Program, space: &SketchSpace, genomes: &[Genome]) -> Vec<f64>;
}

impl<F> Scorer for F
where
    F: Fn(&Program, &SketchSpace, &[Genome]) -> Vec<f64> + Sync,
{
    fn score(&self, program: &Program, space: &SketchSpace, genomes: &[Genome]) -> Vec<f64> {
        self(program, space, genomes)
    }
}

/// What a search needs: the program, its sketches, the target and the candidates already
/// measured (by key, the trace JSON), which are never proposed again.
pub struct SearchContext<'a> {
    pub program: &'a Program,
    pub space: &'a SketchSpace,
    pub target: &'a CpuTarget,
    pub measured: &'a HashMap<String, f64>,
}

/// A proposed candidate: its key (trace JSON), its genome and its predicted score.
#[derive(Clone, Debug)]
pub struct Proposal {
    pub key: String,
    pub genome: Genome,
    pub score: f64,
}

/// Keys of genomes, computed in parallel.
pub(crate) fn keys(ctx: &SearchContext<'_>, genomes: &[Genome]) -> Vec<String> {
    genomes
        .par_iter()
        .map(|g| emit(ctx.program, ctx.space, g).to_string())
        .collect()
}

/// Tops `out` up to `n` with random unmeasured draws (exploration, or a search that ran out).
pub(crate) fn fill_random(
    ctx: &SearchContext<'_>,
    out: &mut Vec<Proposal>,
    taken: &mut HashSet<String>,
    n: usize,
    seed: u64,
) {
    let mut rng = crate::rng::Rng::derive(seed, u64::MAX);
    let mut attempts = 0;
    while out.len() < n && attempts < n * 20 + 100 {
        attempts += 1;
        let genome = ctx.space.draw(ctx.program, ctx.target, &mut rng);
        let key = emit(ctx.program, ctx.space, &genome).to_string();
        if !ctx.measured.contains_key(&key) && taken.insert(key.clone()) {
            out.push(Proposal {
                key,
                genome,
                score: f64::NAN,
            });
        }
    }
}
