//! Evolutionary search on the cost model's score.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::{fill_random, keys, Proposal, Scorer, SearchContext};
use crate::rng::Rng;
use crate::sketch::{crossover, mutate, Genome};

#[derive(Clone, Debug)]
pub struct EvolutionConfig {
    pub population: usize,
    pub generations: usize,
    /// Share of the initial population taken from the best measured candidates.
    pub measured_share: f64,
    pub crossover_prob: f64,
    /// Share of each returned batch drawn at random instead of by score (exploration).
    pub epsilon: f64,
}

impl Default for EvolutionConfig {
    fn default() -> Self {
        // Scoring costs microseconds here, so the search looks at many candidates per trial.
        EvolutionConfig {
            population: 2048,
            generations: 4,
            measured_share: 0.2,
            crossover_prob: 0.1,
            epsilon: 0.05,
        }
    }
}

/// Score-proportional parent selection over scores normalized to [0, 1].
fn selection_weights(scores: &[f64]) -> Vec<f64> {
    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
    let min = scores.iter().cloned().fold(f64::MAX, f64::min);
    let span = (max - min).max(1e-12);
    // Squaring sharpens selection towards the best without discarding the rest.
    scores
        .iter()
        .map(|s| ((s - min) / span).powi(2) + 1e-3)
        .collect()
}

/// Proposes up to `n` unmeasured candidates, best predicted first, with an epsilon share of
/// random ones. `seeds` are measured genomes to start from (best first).
pub fn evolve(
    ctx: &SearchContext<'_>,
    scorer: &dyn Scorer,
    seeds: &[Genome],
    n: usize,
    config: &EvolutionConfig,
    seed: u64,
) -> Vec<Proposal> {
    let pop_size = config.population.max(n).max(8);
    let n_seeds = ((pop_size as f64 * config.measured_share) as usize).min(seeds.len());
    let mut population: Vec<Genome> = seeds[..n_seeds].to_vec();
    let fresh: Vec<Genome> = (population.len()..pop_size)
        .into_par_iter()
        .map(|i| {
            ctx.space
                .draw(ctx.program, ctx.target, &mut Rng::derive(seed, i as u64))
        })
        .collect();
    population.extend(fresh);

    // Every candidate seen, with its score; the output is picked from these.
    let mut seen: HashMap<String, (Genome, f64)> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut score_new = |pop: &[Genome], seen: &mut HashMap<String, (Genome, f64)>| -> Vec<f64> {
        let ks = keys(ctx, pop);
        let mut todo: Vec<usize> = Vec::new();
        let mut first: HashSet<&str> = HashSet::new();
        for (i, k) in ks.iter().enumerate() {
            if !seen.contains_key(k) && first.insert(k) {
                todo.push(i);
            }
        }
        let batch: Vec<Genome> = todo.iter().map(|&i| pop[i].clone()).collect();
        let scores = scorer.score(ctx.program, ctx.space, &batch);
        for (&i, s) in todo.iter().zip(scores) {
            seen.insert(ks[i].clone(), (pop[i].clone(), s));
            order.push(ks[i].clone());
        }
        ks.iter().map(|k| seen[k].1).collect()
    };

    let mut scores = score_new(&population, &mut seen);
    for generation in 0..config.generations {
        let weights = selection_weights(&scores);
        let gen_seed = seed ^ ((generation as u64 + 1) << 48);
        let children: Vec<Genome> = (0..pop_size)
            .into_par_iter()
            .map(|i| {
                let mut rng = Rng::derive(gen_seed, i as u64);
                let a = &population[rng.weighted(&weights)];
                if rng.chance(config.crossover_prob) {
                    let b = &population[rng.weighted(&weights)];
                    if let Some(child) = crossover(a, b, &mut rng) {
                        return mutate(&child, ctx.target, &mut rng);
                    }
                }
                mutate(a, ctx.target, &mut rng)
            })
            .collect();
        let child_scores = score_new(&children, &mut seen);
        // Keep the best of parents and children (elitism), unique by key.
        let mut merged: Vec<(Genome, f64)> = population
            .into_iter()
            .zip(scores)
            .chain(children.into_iter().zip(child_scores))
            .collect();
        merged.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut kept_keys = HashSet::new();
        let merged_keys = keys(
            ctx,
            &merged.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>(),
        );
        let mut next_pop = Vec::with_capacity(pop_size);
        let mut next_scores = Vec::with_capacity(pop_size);
        for ((g, s), k) in merged.into_iter().zip(merged_keys) {
            if next_pop.len() == pop_size {
                break;
            }
            if kept_keys.insert(k) {
                next_pop.push(g);
                next_scores.push(s);
            }
        }
        population = next_pop;
        scores = next_scores;
    }

    // Best predicted unmeasured candidates; ties broken by first appearance (deterministic).
    let mut ranked: Vec<(usize, &String)> = order.iter().enumerate().collect();
    ranked.sort_by(|a, b| seen[b.1].1.total_cmp(&seen[a.1].1).then(a.0.cmp(&b.0)));
    let n_random = ((n as f64) * config.epsilon).round() as usize;
    let mut out: Vec<Proposal> = Vec::with_capacity(n);
    let mut taken: HashSet<String> = HashSet::new();
    for (_, k) in ranked {
        if out.len() + n_random >= n {
            break;
        }
        if !ctx.measured.contains_key(k) && taken.insert(k.clone()) {
            let (g, s) = &seen[k];
            out.push(Proposal {
                key: k.clone(),
                genome: g.clone(),
                score: *s,
            });
        }
    }
    fill_random(ctx, &mut out, &mut taken, n, seed);
    out
}
