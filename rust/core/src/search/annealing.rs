//! Simulated annealing on the cost model's score (after AutoTVM's SA optimizer): parallel
//! chains propose mutations, accept worse ones with a probability that shrinks as the
//! temperature falls, and the best states visited are returned.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::{fill_random, identity, pick, Proposal, Scorer, SearchContext};
use crate::rng::Rng;
use crate::sketch::{mutate, Genome};

/// Knobs of [`anneal`].
#[derive(Clone, Debug)]
pub struct AnnealingConfig {
    /// Independent chains (at least the batch size): the first quarter start from the seeds
    /// given, the others from random candidates.
    pub chains: usize,
    /// Mutations tried per chain.
    pub steps: usize,
    /// Temperature of the first step, relative to the spread of the starting scores; it cools
    /// linearly to zero.
    pub start_temperature: f64,
}

impl Default for AnnealingConfig {
    fn default() -> Self {
        AnnealingConfig {
            chains: 256,
            steps: 48,
            start_temperature: 1.0,
        }
    }
}

/// Proposes up to `n` unmeasured candidates by simulated annealing from `seeds` (measured
/// genomes, best first) and random starts, best scored first.
pub fn anneal(
    ctx: &SearchContext<'_>,
    scorer: &dyn Scorer,
    seeds: &[Genome],
    n: usize,
    config: &AnnealingConfig,
    seed: u64,
) -> Vec<Proposal> {
    let chains = config.chains.max(n).max(1);
    let mut states: Vec<Genome> = (0..chains)
        .into_par_iter()
        .map(|i| match seeds.get(i) {
            Some(g) if i < chains / 4 => g.clone(),
            _ => ctx
                .space
                .draw(ctx.program, ctx.target, &mut Rng::derive(seed, i as u64)),
        })
        .collect();
    let mut scores = scorer.score(ctx.program, ctx.space, &states);
    // Every state visited, by identity, with its score and order of first visit.
    let mut visited: HashMap<u64, (Genome, f64, usize)> = HashMap::new();
    let record = |gs: &[Genome], ss: &[f64], visited: &mut HashMap<u64, (Genome, f64, usize)>| {
        for (g, s) in gs.iter().zip(ss) {
            let next = visited.len();
            visited.entry(identity(g)).or_insert((g.clone(), *s, next));
        }
    };
    record(&states, &scores, &mut visited);
    // Temperatures are relative to the spread of scores, so any score scale works.
    let spread = {
        let max = scores.iter().cloned().fold(f64::MIN, f64::max);
        let min = scores.iter().cloned().fold(f64::MAX, f64::min);
        (max - min).max(1e-9)
    };
    for step in 0..config.steps {
        let temperature =
            config.start_temperature * spread * (1.0 - step as f64 / config.steps as f64);
        let step_seed = seed ^ ((step as u64 + 1) << 40);
        let proposals: Vec<Genome> = states
            .par_iter()
            .enumerate()
            .map(|(i, g)| {
                mutate(
                    g,
                    ctx.program,
                    ctx.space,
                    &mut Rng::derive(step_seed, i as u64),
                )
            })
            .collect();
        let new_scores = scorer.score(ctx.program, ctx.space, &proposals);
        record(&proposals, &new_scores, &mut visited);
        for (i, (p, s)) in proposals.into_iter().zip(new_scores).enumerate() {
            let mut rng = Rng::derive(step_seed ^ 0xA5A5, i as u64);
            let delta = s - scores[i];
            if delta >= 0.0 || (temperature > 0.0 && rng.unit() < (delta / temperature).exp()) {
                states[i] = p;
                scores[i] = s;
            }
        }
    }
    let mut ranked: Vec<(Genome, f64, usize)> = visited.into_values().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    let mut taken = HashSet::new();
    let mut out = pick(
        ctx,
        ranked.into_iter().map(|(g, s, _)| (g, s)),
        n,
        &mut taken,
    );
    fill_random(ctx, &mut out, &mut taken, n, seed);
    out
}
