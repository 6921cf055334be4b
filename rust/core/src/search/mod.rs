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
pub mod gpu;

use std::collections::{HashMap, HashSet};

use crate::program::Program;
use crate::sketch::{emit, CpuTarget, Genome, SketchSpace};

/// Predicts how good candidates are: higher is better (a predicted throughput).
pub trait Scorer: Sync {
    /// The score of each genome, in order.
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
    /// The program searched.
    pub program: &'a Program,
    /// Its sketch space.
    pub space: &'a SketchSpace,
    /// The CPU the candidates are for.
    pub target: &'a CpuTarget,
    /// Measured candidates: key (trace JSON) to latency in seconds.
    pub measured: &'a HashMap<String, f64>,
}

/// Why a candidate is in a batch. A caller that re-ranks a batch with another model keeps the
/// exploring roles' share of it: that model prefers what the run already measured as much as
/// the search's own does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Among the best scored.
    Exploit,
    /// The best scored of a coarse shape not measured yet ([`pick_novel`]).
    Shape,
    /// The best scored of a structure measured fewer than a few times ([`pick_rare`]).
    Structure,
    /// The best scored of a reduction split measured fewer than a few times ([`pick_rare`]).
    Reduction,
    /// A random draw.
    Random,
}

impl Role {
    /// The role's name as the Python side reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Exploit => "exploit",
            Role::Shape => "shape",
            Role::Structure => "structure",
            Role::Reduction => "reduction",
            Role::Random => "random",
        }
    }
}

/// A proposed candidate: its key (trace JSON), its genome, its predicted score and its role.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// The candidate's trace JSON, which also keys it among the measured.
    pub key: String,
    /// The candidate itself.
    pub genome: Genome,
    /// Its predicted score (higher is better).
    pub score: f64,
    /// Why it is in the batch.
    pub role: Role,
}

/// Key of a proposal: the trace JSON, which is what the database and Python deduplicate on.
pub(crate) fn trace_key(ctx: &SearchContext<'_>, genome: &Genome) -> String {
    emit(ctx.program, ctx.space, genome).to_string()
}

/// The search's 64-bit hash of `value` (the one hasher identities, shapes and structures use).
fn hash_of(value: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// A cheap identity for genomes inside a search: a genome determines its trace, so equal
/// hashes stand for equal candidates without emitting any JSON.
pub(crate) fn identity(genome: &Genome) -> u64 {
    hash_of(genome)
}

/// Most proposals of one batch that may share a [`coarse_shape`]: a quarter of the batch.
const SHAPE_SHARE: usize = 4;

/// What a candidate looks like from afar: its rules and, per tiled loop, the extent its outer
/// two tile levels cover (the loops the postprocessor fuses into parallel jobs). Candidates
/// that differ only in inner tiles, vectorization or unrolling share a shape.
pub fn coarse_shape(genome: &Genome) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    genome.rules.hash(&mut h);
    for (block, loops) in &genome.tiles {
        block.hash(&mut h);
        for factors in loops.iter().filter(|f| f.len() > 2) {
            factors[..2].iter().product::<i64>().hash(&mut h);
        }
    }
    h.finish()
}

/// The structure of a candidate: its rules alone (what is inlined, cached, computed where,
/// reduced by rfactor), whatever its tile sizes and annotations.
pub fn structure(genome: &Genome) -> u64 {
    hash_of(&genome.rules)
}

/// How a candidate splits its reductions: per tiled block, the outer factor of each reduction
/// loop (a loop with fewer tile levels than the block's spatial loops). The outer factor says how
/// many times the inner loops run around the register tile, and how much of each operand one
/// pass of them holds; [`coarse_shape`] leaves it out.
pub fn reduction_split(genome: &Genome) -> u64 {
    let mut split: Vec<(usize, Vec<i64>)> = Vec::new();
    for (block, loops) in &genome.tiles {
        let levels = loops.iter().map(Vec::len).max().unwrap_or(0);
        let outer = loops
            .iter()
            .filter(|f| f.len() < levels)
            .map(|f| f[0])
            .collect();
        split.push((*block, outer));
    }
    hash_of(&split)
}

/// Picks up to `n` unmeasured proposals from `ranked` (best first), emitting keys lazily.
///
/// At most a quarter of the batch may share one coarse shape while other shapes remain: the
/// model is least reliable about the outer structure, so a batch hedges across it rather than
/// spending every measurement on variants of one guess.
pub(crate) fn pick(
    ctx: &SearchContext<'_>,
    ranked: impl IntoIterator<Item = (Genome, f64)>,
    n: usize,
    taken: &mut HashSet<String>,
) -> Vec<Proposal> {
    let cap = n.div_ceil(SHAPE_SHARE).max(1);
    let mut out = Vec::with_capacity(n);
    let mut per_shape: HashMap<u64, usize> = HashMap::new();
    let mut deferred: Vec<Proposal> = Vec::new();
    // Looking further than needed only to fill shapes: bounded, the ranked list can be long.
    for (genome, score) in ranked.into_iter().take(n * 64) {
        if out.len() >= n {
            break;
        }
        let key = trace_key(ctx, &genome);
        if ctx.measured.contains_key(&key) || taken.contains(&key) {
            continue;
        }
        let count = per_shape.entry(coarse_shape(&genome)).or_insert(0);
        taken.insert(key.clone());
        if *count < cap {
            *count += 1;
            out.push(Proposal {
                key,
                genome,
                score,
                role: Role::Exploit,
            });
        } else {
            deferred.push(Proposal {
                key,
                genome,
                score,
                role: Role::Exploit,
            });
        }
    }
    // Too few shapes: the best of the deferred fill the batch, in rank order.
    let missing = n.saturating_sub(out.len());
    for p in deferred.iter().skip(missing) {
        taken.remove(&p.key);
    }
    out.extend(deferred.into_iter().take(missing));
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

/// Picks up to `n` unmeasured proposals from `ranked` (best first), at most one per `class`
/// of genome, of the classes `eligible` accepts, each marked `role`.
fn pick_one_per_class<'a>(
    ctx: &SearchContext<'_>,
    ranked: impl IntoIterator<Item = (&'a Genome, f64)>,
    n: usize,
    class: impl Fn(&Genome) -> u64,
    eligible: impl Fn(u64) -> bool,
    role: Role,
    taken: &mut HashSet<String>,
) -> Vec<Proposal> {
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut picked: HashSet<u64> = HashSet::new();
    for (genome, score) in ranked {
        if out.len() >= n {
            break;
        }
        let c = class(genome);
        if picked.contains(&c) || !eligible(c) {
            continue;
        }
        let key = trace_key(ctx, genome);
        if ctx.measured.contains_key(&key) || taken.contains(&key) {
            continue;
        }
        picked.insert(c);
        taken.insert(key.clone());
        out.push(Proposal {
            key,
            genome: genome.clone(),
            score,
            role,
        });
    }
    out
}

/// Picks up to `n` unmeasured proposals from `ranked` (best first) whose coarse shape is not in
/// `measured_shapes`, at most one per shape: the model's best guess at each structure or
/// tiling the run has not tried.
pub(crate) fn pick_novel<'a>(
    ctx: &SearchContext<'_>,
    ranked: impl IntoIterator<Item = (&'a Genome, f64)>,
    n: usize,
    measured_shapes: &HashSet<u64>,
    taken: &mut HashSet<String>,
) -> Vec<Proposal> {
    let eligible = |shape: u64| !measured_shapes.contains(&shape);
    pick_one_per_class(ctx, ranked, n, coarse_shape, eligible, Role::Shape, taken)
}

/// Picks up to `n` unmeasured proposals from `ranked` (best first), at most one per `class` of
/// genome ([`structure`] or [`reduction_split`]), of classes `measured` holds fewer than `tries`
/// times, each marked `role`: the model's best guess at each structure or reduction split the
/// run has hardly tried. The model extrapolates worst to classes with few records, and rates most
/// reduction splits of a compute-bound kernel alike, so without this share a run keeps measuring
/// the structure or split it found first (GMM:2: one split in 133-215 of 256 measurements, while
/// MetaSchedule's best three used two others).
pub(crate) fn pick_rare<'a>(
    ctx: &SearchContext<'_>,
    ranked: impl IntoIterator<Item = (&'a Genome, f64)>,
    n: usize,
    (class, role): (fn(&Genome) -> u64, Role),
    measured: &HashMap<u64, usize>,
    tries: usize,
    taken: &mut HashSet<String>,
) -> Vec<Proposal> {
    let eligible = |c: u64| measured.get(&c).copied().unwrap_or(0) < tries;
    pick_one_per_class(ctx, ranked, n, class, eligible, role, taken)
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
        let key = trace_key(ctx, &genome);
        if !ctx.measured.contains_key(&key) && taken.insert(key.clone()) {
            out.push(Proposal {
                key,
                genome,
                score: f64::NAN,
                role: Role::Random,
            });
        }
    }
}
