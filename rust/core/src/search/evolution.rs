//! Evolutionary search on the cost model's score.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::{
    coarse_shape, fill_random, identity, pick, pick_novel, pick_rare, reduction_split, structure,
    Proposal, Role, Scorer, SearchContext,
};
use crate::rng::Rng;
use crate::sketch::{crossover, mutate, Genome};

/// Knobs of [`evolve`].
#[derive(Clone, Debug)]
pub struct EvolutionConfig {
    /// Candidates per generation.
    pub population: usize,
    /// Generations before the batch is picked.
    pub generations: usize,
    /// Share of the initial population taken from the best measured candidates.
    pub measured_share: f64,
    /// Chance that a child is a crossover of two parents rather than a mutation of one.
    pub crossover_prob: f64,
    /// Share of each returned batch drawn at random instead of by score (exploration).
    pub epsilon: f64,
    /// Share of each batch given, once `novel_after` candidates are measured, to the best-scored
    /// candidates of coarse shapes (rules and outer tiles) not measured yet, one per shape.
    pub novel_share: f64,
    /// Measured candidates after which `novel_share` and `structure_share` apply.
    pub novel_after: usize,
    /// Share of each batch given, from the same point on, to the best-scored candidates of
    /// structures (rules) measured fewer than `structure_tries` times, one per structure.
    pub structure_share: f64,
    /// Measurements after which a structure no longer counts as untried.
    pub structure_tries: usize,
    /// Share of each batch given, from the same point on, to the best-scored candidates of
    /// reduction splits measured fewer than `structure_tries` times, one per split.
    pub reduction_share: f64,
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
            // The model ranks candidates near the measured best no better than chance late in a
            // run (pairwise 0.48-0.59 on the suite's 256-trial runs), so the search settles into
            // one basin; a share of each batch keeps testing other structures and tilings.
            novel_share: 0.25,
            novel_after: 64,
            // In the suite's 256-trial runs, on C2D:1, DEP:1, GMM:2 and TBG:0 0-4% of the
            // measurements after the 64th went to structures measured fewer than 3 times (DEP:1
            // s0: 241 of 256 to one structure). With this share DEP:1 measured 23-26 structures
            // instead of 4-10, and s2's best (padding under the conv) is one it found.
            structure_share: 0.125,
            structure_tries: 3,
            // GMM:2's 256-trial runs measured the reduction split [8, 64] 187-193 times and
            // [128, 4] 0-3 times; MetaSchedule's best kernels split [64, 8] and [128, 4].
            reduction_share: 0.125,
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

/// Every candidate seen in a search with its score, in order of first appearance.
#[derive(Default)]
struct Seen {
    index: HashMap<u64, usize>,
    entries: Vec<(Genome, f64)>,
}

impl Seen {
    /// Scores the genomes not seen before (in one batch) and returns the scores of all.
    fn score(&mut self, ctx: &SearchContext<'_>, scorer: &dyn Scorer, pop: &[Genome]) -> Vec<f64> {
        let ids: Vec<u64> = pop.par_iter().map(identity).collect();
        let mut fresh: Vec<usize> = Vec::new();
        let mut batch_ids: HashSet<u64> = HashSet::new();
        for (i, id) in ids.iter().enumerate() {
            if !self.index.contains_key(id) && batch_ids.insert(*id) {
                fresh.push(i);
            }
        }
        let batch: Vec<Genome> = fresh.iter().map(|&i| pop[i].clone()).collect();
        let scores = scorer.score(ctx.program, ctx.space, &batch);
        for ((g, s), &i) in batch.into_iter().zip(scores).zip(&fresh) {
            self.index.insert(ids[i], self.entries.len());
            self.entries.push((g, s));
        }
        ids.iter()
            .map(|id| self.entries[self.index[id]].1)
            .collect()
    }
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

    let mut seen = Seen::default();
    let mut scores = seen.score(ctx, scorer, &population);
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
                        return mutate(&child, ctx.program, ctx.space, &mut rng);
                    }
                }
                mutate(a, ctx.program, ctx.space, &mut rng)
            })
            .collect();
        let child_scores = seen.score(ctx, scorer, &children);
        // Keep the best of parents and children (elitism), unique; stable sort keeps ties in order.
        let mut merged: Vec<(Genome, f64)> = population
            .into_iter()
            .zip(scores)
            .chain(children.into_iter().zip(child_scores))
            .collect();
        merged.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut kept = HashSet::new();
        let (next_pop, next_scores): (Vec<Genome>, Vec<f64>) = merged
            .into_iter()
            .filter(|(g, _)| kept.insert(identity(g)))
            .take(pop_size)
            .unzip();
        population = next_pop;
        scores = next_scores;
    }

    // Best predicted unmeasured candidates; ties broken by first appearance (deterministic).
    let mut ranked: Vec<(usize, f64)> = seen
        .entries
        .iter()
        .enumerate()
        .map(|(i, (_, s))| (i, *s))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let n_random = ((n as f64) * config.epsilon).round() as usize;
    let late = seeds.len() >= config.novel_after;
    let share = |s: f64| {
        if late {
            ((n as f64) * s).round() as usize
        } else {
            0
        }
    };
    let (n_novel, n_structures) = (share(config.novel_share), share(config.structure_share));
    let n_reductions = share(config.reduction_share);
    let mut taken: HashSet<String> = HashSet::new();
    let measured_shapes: HashSet<u64> = seeds.iter().map(coarse_shape).collect();
    let mut structure_counts: HashMap<u64, usize> = HashMap::new();
    let mut split_counts: HashMap<u64, usize> = HashMap::new();
    for g in seeds {
        *structure_counts.entry(structure(g)).or_insert(0) += 1;
        *split_counts.entry(reduction_split(g)).or_insert(0) += 1;
    }
    // Only picked genomes are cloned: the exploring picks may walk the whole ranking.
    let ranked_refs = || ranked.iter().map(|&(i, s)| (&seen.entries[i].0, s));
    let mut out = pick_rare(
        ctx,
        ranked_refs(),
        n_structures,
        (structure, Role::Structure),
        &structure_counts,
        config.structure_tries,
        &mut taken,
    );
    out.extend(pick_rare(
        ctx,
        ranked_refs(),
        n_reductions,
        (reduction_split, Role::Reduction),
        &split_counts,
        config.structure_tries,
        &mut taken,
    ));
    out.extend(pick_novel(
        ctx,
        ranked_refs(),
        n_novel,
        &measured_shapes,
        &mut taken,
    ));
    let rest = n.saturating_sub(n_random).saturating_sub(out.len());
    out.extend(pick(
        ctx,
        ranked_refs().map(|(g, s)| (g.clone(), s)),
        rest,
        &mut taken,
    ));
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    fill_random(ctx, &mut out, &mut taken, n, seed);
    out
}
