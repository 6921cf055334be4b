//! Mutations of a GPU candidate that stay within the target's limits: tile sizes (a prime
//! factor moved between two levels of one loop, as MetaSchedule's MutateTileSize does), the
//! vector lanes of a cooperative fetch, the threads of a bound block, the unroll step, and
//! now and then a new structure (a fresh draw). A mutant that breaks a limit is discarded.

use super::tiling::{fits, GPU_MAX_INNERMOST_FACTOR};
use super::{GpuGenome, GpuSketchSpace, GPU_UNROLL_CANDIDATES};
use crate::program::Program;
use crate::rng::Rng;
use crate::sketch::prime_factors;

/// Tries of one mutation before it gives up.
const TRIES: usize = 16;
/// The chance a mutation draws a new structure instead of changing one decision.
const STRUCTURE_CHANCE: f64 = 0.05;

/// A mutant of `genome` within the target's limits, or `None` when no try gave one different
/// from `genome`.
pub fn mutate_gpu(
    program: &Program,
    space: &GpuSketchSpace,
    genome: &GpuGenome,
    rng: &mut Rng,
) -> Option<GpuGenome> {
    for _ in 0..TRIES {
        let mutant = if rng.chance(STRUCTURE_CHANCE) {
            space.draw(program, rng)
        } else {
            let mut g = genome.clone();
            let changed = match rng.below(4) {
                0 => mutate_tile(program, space, &mut g, rng),
                1 => mutate_lanes(program, space, &mut g, rng),
                2 => mutate_threads(program, space, &mut g, rng),
                _ => mutate_unroll(&mut g, rng),
            };
            if !changed {
                continue;
            }
            g
        };
        if mutant != *genome && space.limit_violations(program, &mutant).is_empty() {
            return Some(mutant);
        }
    }
    None
}

/// Moves one prime factor of one loop of a tiled block from one level to another.
fn mutate_tile(
    program: &Program,
    space: &GpuSketchSpace,
    g: &mut GpuGenome,
    rng: &mut Rng,
) -> bool {
    let blocks: Vec<usize> = g.tiles.keys().copied().collect();
    if blocks.is_empty() {
        return false;
    }
    let b = *rng.choose(&blocks);
    let tiles = g.tiles.get_mut(&b).expect("a tiled block");
    let loops: Vec<usize> = (0..tiles.len())
        .filter(|&i| tiles[i].iter().any(|&f| f > 1))
        .collect();
    if loops.is_empty() {
        return false;
    }
    let l = *rng.choose(&loops);
    let from_levels: Vec<usize> = (0..tiles[l].len()).filter(|&i| tiles[l][i] > 1).collect();
    let from = *rng.choose(&from_levels);
    let p = *rng.choose(&prime_factors(tiles[l][from]));
    let to = rng.below(tiles[l].len() - 1);
    let to = if to >= from { to + 1 } else { to };
    let last = tiles[l].len() - 1;
    if to == last && tiles[l][last] * p > GPU_MAX_INNERMOST_FACTOR {
        return false;
    }
    tiles[l][from] /= p;
    tiles[l][to] *= p;
    fits(space, program, b, tiles)
}

/// Another vector width for one cooperative fetch.
fn mutate_lanes(
    program: &Program,
    space: &GpuSketchSpace,
    g: &mut GpuGenome,
    rng: &mut Rng,
) -> bool {
    let choices: Vec<(usize, usize)> = g
        .lanes
        .iter()
        .flat_map(|(&b, lanes)| (0..lanes.len()).map(move |i| (b, i)))
        .collect();
    if choices.is_empty() {
        return false;
    }
    let (b, i) = *rng.choose(&choices);
    let read = space.cached_reads(program, b)[i];
    let buffer = program.blocks[b].reads[read].buffer;
    let lanes = *rng.choose(&space.lane_candidates(program, buffer));
    let slot = &mut g.lanes.get_mut(&b).expect("a tiled block")[i];
    let changed = *slot != lanes;
    *slot = lanes;
    changed
}

/// Another thread count for one bound block or cross-thread reduction.
fn mutate_threads(
    program: &Program,
    space: &GpuSketchSpace,
    g: &mut GpuGenome,
    rng: &mut Rng,
) -> bool {
    let blocks: Vec<usize> = g.threads.keys().copied().collect();
    if blocks.is_empty() {
        return false;
    }
    let b = *rng.choose(&blocks);
    let candidates = space.thread_candidates(program, b, &g.rules);
    let threads = *rng.choose(&candidates);
    let slot = g.threads.get_mut(&b).expect("a bound block");
    let changed = *slot != threads;
    *slot = threads;
    changed
}

fn mutate_unroll(g: &mut GpuGenome, rng: &mut Rng) -> bool {
    let u = rng.below(GPU_UNROLL_CANDIDATES.len());
    let changed = u != g.unroll;
    g.unroll = u;
    changed
}
