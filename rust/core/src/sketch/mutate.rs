//! Mutation and crossover of candidates, for the evolutionary search.
//!
//! Mutations keep a candidate inside its sketch: they move a prime factor between tile levels,
//! redraw one loop's tiling, change the unroll depth, or change where a tile writes back or
//! where a block is computed.

use super::{prime_factors, sample_perfect_tile, SketchSpace, MAX_INNERMOST_FACTOR};
use super::{Genome, Partial, Rule, WriteCache, UNROLL_CANDIDATES};
use crate::program::Program;
use crate::rng::Rng;

/// Moves one prime factor of one loop's tiling to another level (innermost bound respected).
fn move_factor(factors: &mut [i64], rng: &mut Rng) -> bool {
    let from: Vec<usize> = (0..factors.len()).filter(|&i| factors[i] > 1).collect();
    if from.is_empty() || factors.len() < 2 {
        return false;
    }
    let src = *rng.choose(&from);
    let primes = prime_factors(factors[src]);
    let p = *rng.choose(&primes);
    let mut dst = rng.below(factors.len() - 1);
    if dst >= src {
        dst += 1;
    }
    let last = factors.len() - 1;
    if dst == last && factors[last] * p > MAX_INNERMOST_FACTOR {
        return false;
    }
    factors[src] /= p;
    factors[dst] *= p;
    true
}

/// One random change to `genome`; the result may equal the input when no change applied.
pub fn mutate(genome: &Genome, program: &Program, space: &SketchSpace, rng: &mut Rng) -> Genome {
    let mut g = genome.clone();
    let tiled: Vec<usize> = g.tiles.keys().copied().collect();
    for _ in 0..8 {
        let changed = match rng.below(10) {
            // Tile sizes are where most of the performance is: mutate them most often. The
            // parallel and vectorize limits are fixed (`PARALLEL_JOBS_PER_CORE`).
            0..=6 if !tiled.is_empty() => {
                let block = *rng.choose(&tiled);
                let loops = g.tiles.get_mut(&block).expect("tiled block");
                let li = rng.below(loops.len());
                if rng.chance(0.7) {
                    move_factor(&mut loops[li], rng)
                } else {
                    let extent: i64 = loops[li].iter().product();
                    let parts = loops[li].len();
                    let fresh = sample_perfect_tile(rng, extent, parts, MAX_INNERMOST_FACTOR);
                    let changed = fresh != loops[li];
                    loops[li] = fresh;
                    changed
                }
            }
            7 => {
                let u = rng.below(UNROLL_CANDIDATES.len());
                std::mem::replace(&mut g.unroll, u) != u
            }
            _ => mutate_structure(&mut g, program, space, rng),
        };
        if changed {
            break;
        }
    }
    g
}

/// Changes the write-back level or cache of a tile, the rfactor loop, a compute location
/// depth, or whether a conditional block is inlined or computed under its consumer.
fn mutate_structure(g: &mut Genome, program: &Program, space: &SketchSpace, rng: &mut Rng) -> bool {
    let blocks: Vec<usize> = g
        .rules
        .iter()
        .filter(|(b, r)| {
            space.optional_inline.contains(b)
                || matches!(
                    r,
                    Rule::Tile { .. } | Rule::RFactor { .. } | Rule::ComputeAt { depth: 1.., .. }
                )
        })
        .map(|(b, _)| *b)
        .collect();
    if blocks.is_empty() {
        return false;
    }
    let block = *rng.choose(&blocks);
    if space.optional_inline.contains(&block) {
        return move_optional_inline(g, program, space, block, rng);
    }
    // Only a tile's write-back can take its consumer (found before `rule` borrows the rules).
    let fusable = matches!(g.rules[&block], Rule::Tile { .. })
        .then(|| space.fusable_consumer_of(program, block, &g.rules))
        .flatten();
    let rule = g.rules.get_mut(&block).expect("block with a rule");
    match rule {
        Rule::Tile { cache, level } => {
            if rng.chance(0.5) {
                *level = 1 - *level;
            } else {
                // Any other write-back, a fused epilogue included where one applies: a
                // population drawn without it never reached it before (MobileNetV2's
                // 112x112 expansion measured 89 unfused candidates and no fused one).
                let mut others = vec![WriteCache::None, WriteCache::Global];
                others.extend(fusable.map(WriteCache::FusedConsumer));
                others.retain(|c| c != cache);
                *cache = rng.choose(&others).clone();
            }
        }
        Rule::RFactor {
            at: Some((_, depth @ 1..)),
            partial,
            ..
        } if rng.chance(0.5) && partial.fits_above(*depth - 1) => *depth -= 1,
        // The partial results to the root or back beside the final reduction (their producers
        // may have to move too; the replay refuses the mutant if so).
        Rule::RFactor {
            at: Some(_),
            partial,
            ..
        } if rng.chance(0.5) => {
            *partial = match partial {
                Partial::Root => Partial::WithFinal,
                _ => Partial::Root,
            }
        }
        Rule::RFactor { outer, .. } => *outer = !*outer,
        Rule::ComputeAt { depth, .. } => *depth -= 1,
        _ => return false,
    }
    true
}

/// Moves a conditional block (padding) one loop in or out under its consumer, or to another of
/// its placements: inlined, a pass of its own at the root, or a random loop of its consumer.
fn move_optional_inline(
    g: &mut Genome,
    program: &Program,
    space: &SketchSpace,
    block: usize,
    rng: &mut Rng,
) -> bool {
    let locations = space.locations(
        program,
        space.info(block),
        &space.consumers(block),
        &g.rules,
    );
    let elsewhere = |rng: &mut Rng, other: Rule| {
        if locations.is_empty() || rng.chance(0.5) {
            other
        } else {
            rng.choose(&locations).clone()
        }
    };
    let current = g.rules[&block].clone();
    let next = match &current {
        Rule::ComputeAt { host, depth } if rng.chance(0.5) => {
            let deeper = Rule::ComputeAt {
                host: *host,
                depth: depth + 1,
            };
            if rng.chance(0.5) && locations.contains(&deeper) {
                deeper
            } else if *depth > 0 {
                Rule::ComputeAt {
                    host: *host,
                    depth: depth - 1,
                }
            } else {
                Rule::Root
            }
        }
        Rule::ComputeAt { .. } => {
            if rng.chance(0.5) {
                Rule::Inline
            } else {
                Rule::Root
            }
        }
        Rule::Inline => elsewhere(rng, Rule::Root),
        _ => elsewhere(rng, Rule::Inline),
    };
    let changed = next != current;
    g.rules.insert(block, next);
    changed
}

/// A child taking each block's tiling from one parent or the other; `None` when the parents
/// have different structures (their tilings would not fit each other).
pub fn crossover(a: &Genome, b: &Genome, rng: &mut Rng) -> Option<Genome> {
    if a.rules != b.rules {
        return None;
    }
    let mut child = a.clone();
    for (block, tiles) in child.tiles.iter_mut() {
        if rng.chance(0.5) {
            *tiles = b.tiles[block].clone();
        }
    }
    if rng.chance(0.5) {
        child.unroll = b.unroll;
    }
    Some(child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn moving_a_factor_keeps_the_product(f in proptest::collection::vec(1i64..17, 2..5), seed in any::<u64>()) {
            let mut rng = crate::rng::Rng::new(seed);
            let mut factors = f.clone();
            let last = factors.len() - 1;
            factors[last] = factors[last].min(MAX_INNERMOST_FACTOR);
            let before: i64 = factors.iter().product();
            move_factor(&mut factors, &mut rng);
            prop_assert_eq!(factors.iter().product::<i64>(), before);
            prop_assert!(factors[last] <= MAX_INNERMOST_FACTOR);
        }
    }
}
