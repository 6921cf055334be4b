//! Tile sizes of a GPU multi-level tiling, drawn within the target's limits.
//!
//! A spatial loop is split in five (thread block, virtual thread, thread, two inner levels), a
//! reduction loop in three. VerifyGPUCode rejects a candidate whose threads per block fall
//! outside the block's `thread_extent_low_inclusive`..`high_inclusive` annotation (a warp to
//! the target's maximum) or whose shared memory exceeds the target's; it also rejects more
//! than `max_vthread` virtual threads. Beyond what it checks, a register budget keeps the
//! per-thread accumulators ([`MAX_ACCUMULATORS`]) from spilling.

use super::GpuSketchSpace;
use crate::program::{IterKind, Program};
use crate::rng::Rng;
use crate::sketch::{linear_in_iter_vars, sample_perfect_tile};

/// Largest innermost tile factor (MetaSchedule's CUDA multi-level tiling).
pub const GPU_MAX_INNERMOST_FACTOR: i64 = 64;
/// The most accumulators a thread keeps in registers (virtual threads times its inner tiles).
pub const MAX_ACCUMULATORS: i64 = 64;
/// Random tilings tried before the constructive fallback.
const TRIES: usize = 2000;

/// Levels of a spatial and a reduction loop.
pub const SPATIAL_LEVELS: usize = 5;
/// Levels of a reduction loop.
pub const REDUCE_LEVELS: usize = 3;

/// The product, over the loops of `kind`, of each loop's factors at `levels`.
pub fn level_product(
    program: &Program,
    block: usize,
    tiles: &[Vec<i64>],
    kind: IterKind,
    levels: &[usize],
) -> i64 {
    program.blocks[block]
        .iter_vars
        .iter()
        .zip(tiles)
        .filter(|(v, _)| v.kind == kind)
        .map(|(_, f)| levels.iter().map(|l| f[*l]).product::<i64>())
        .product()
}

fn spatial_product(program: &Program, block: usize, tiles: &[Vec<i64>], level: &[usize]) -> i64 {
    level_product(program, block, tiles, IterKind::Spatial, level)
}

/// Tile levels of a loop of `kind`: five for a spatial loop, three for a reduction.
fn levels(kind: IterKind) -> usize {
    if kind == IterKind::Reduce {
        REDUCE_LEVELS
    } else {
        SPATIAL_LEVELS
    }
}

/// Threads per block of a tiling: the product of the spatial thread tiles.
pub fn threads_per_block(program: &Program, block: usize, tiles: &[Vec<i64>]) -> i64 {
    spatial_product(program, block, tiles, &[2])
}

/// Virtual threads of a tiling.
pub fn vthreads(program: &Program, block: usize, tiles: &[Vec<i64>]) -> i64 {
    spatial_product(program, block, tiles, &[1])
}

/// Accumulators per thread: its virtual threads times its two inner spatial tiles.
pub fn accumulators(program: &Program, block: usize, tiles: &[Vec<i64>]) -> i64 {
    spatial_product(program, block, tiles, &[1, 3, 4])
}

/// Bytes of shared memory the read caches of a tiling take: per read, the region one thread
/// block reads in one step of the outer reduction tiles (a dimension indexed other than
/// linearly counts whole).
pub fn shared_bytes(
    space: &GpuSketchSpace,
    program: &Program,
    block: usize,
    tiles: &[Vec<i64>],
) -> i64 {
    let b = &program.blocks[block];
    let span = |name: &str| -> i64 {
        b.iter_vars
            .iter()
            .zip(tiles)
            .find(|(v, _)| v.name == name)
            .map_or(1, |(_, f)| f[1..].iter().product())
    };
    space
        .cached_reads(program, block)
        .into_iter()
        .map(|i| {
            let read = &b.reads[i];
            let buffer = &program.buffers[read.buffer];
            let elements: i64 = read
                .region
                .iter()
                .zip(&buffer.shape)
                .map(|((min, ext), dim)| {
                    let ext = ext.as_int().unwrap_or(*dim);
                    let extent = match linear_in_iter_vars(min, b) {
                        Some(lin) => lin.terms.values().fold(ext, |acc, (atom, coef)| {
                            let name = match atom {
                                crate::program::Expr::Var(n) => n.as_str(),
                                _ => "",
                            };
                            acc + coef.abs() * (span(name) - 1)
                        }),
                        None => *dim,
                    };
                    extent.min(*dim).max(1)
                })
                .product();
            elements * buffer.element_bytes()
        })
        .sum()
}

/// The least threads per block a tiled block's annotation allows: a warp, unless its spatial
/// loops iterate at most two warps' worth (MetaSchedule's rule).
pub fn min_threads(space: &GpuSketchSpace, program: &Program, block: usize) -> i64 {
    let spatial: i64 = program.blocks[block]
        .iter_vars
        .iter()
        .filter(|v| v.kind == IterKind::Spatial)
        .map(|v| v.extent)
        .product();
    if spatial > 2 * space.target.warp_size {
        space.target.warp_size
    } else {
        1
    }
}

/// Whether a tiling respects every limit.
pub fn fits(space: &GpuSketchSpace, program: &Program, block: usize, tiles: &[Vec<i64>]) -> bool {
    let t = &space.target;
    let threads = threads_per_block(program, block, tiles);
    threads >= min_threads(space, program, block)
        && threads <= t.max_threads_per_block
        && vthreads(program, block, tiles) <= t.max_vthread
        && accumulators(program, block, tiles) <= MAX_ACCUMULATORS
        && shared_bytes(space, program, block, tiles) <= t.max_shared_memory_per_block
}

/// Draws a tiling of `block` within the limits: random perfect tilings (as MetaSchedule
/// samples them) until one fits, else a constructive one.
pub fn draw_tiles(
    space: &GpuSketchSpace,
    program: &Program,
    block: usize,
    rng: &mut Rng,
) -> Vec<Vec<i64>> {
    let b = &program.blocks[block];
    for _ in 0..TRIES {
        let tiles: Vec<Vec<i64>> = b
            .iter_vars
            .iter()
            .map(|v| sample_perfect_tile(rng, v.extent, levels(v.kind), GPU_MAX_INNERMOST_FACTOR))
            .collect();
        if fits(space, program, block, &tiles) {
            return tiles;
        }
    }
    fallback_tiles(space, program, block, rng)
}

/// Everything in the outer tiles but enough prime factors of the spatial loops, taken in a
/// random order, in the thread tiles to reach the least thread count.
pub(super) fn fallback_tiles(
    space: &GpuSketchSpace,
    program: &Program,
    block: usize,
    rng: &mut Rng,
) -> Vec<Vec<i64>> {
    let b = &program.blocks[block];
    let mut tiles: Vec<Vec<i64>> = b
        .iter_vars
        .iter()
        .map(|v| {
            let mut f = vec![1; levels(v.kind)];
            f[0] = v.extent;
            f
        })
        .collect();
    let mut primes: Vec<(usize, i64)> = b
        .iter_vars
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == IterKind::Spatial)
        .flat_map(|(i, v)| {
            crate::sketch::prime_factors(v.extent)
                .into_iter()
                .map(move |p| (i, p))
        })
        .collect();
    // A seeded Fisher-Yates shuffle.
    for i in (1..primes.len()).rev() {
        primes.swap(i, rng.below(i + 1));
    }
    let low = min_threads(space, program, block);
    let max = space.target.max_threads_per_block;
    let mut threads = 1;
    for (i, p) in primes {
        if threads >= low {
            break;
        }
        if threads * p <= max {
            tiles[i][0] /= p;
            tiles[i][2] *= p;
            threads *= p;
        }
    }
    tiles
}
