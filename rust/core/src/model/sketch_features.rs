//! A fixed-length description of a candidate at the level of its sketch, for the learned
//! cost model: the analytical model's working (tile extents per level, footprints, bytes
//! moved, parallel and vector efficiency) for the block that dominates its estimated time,
//! plus the candidate's annotations and rules. Being shape-relative (logs and ratios), it
//! transfers between workloads of the same kind.

use super::analytical::{estimate_block, BlockEstimate};
use crate::program::Program;
use crate::sketch::{CpuTarget, Genome, Rule, SketchSpace, WriteCache, UNROLL_CANDIDATES};

/// Names of the features, in order.
pub const SKETCH_FEATURE_NAMES: [&str; 35] = [
    "log_flops",
    "log_est_cycles",
    "log_compute_cycles",
    "log_memory_cycles",
    "compute_over_memory",
    "parallel_efficiency",
    "vector_efficiency",
    "log_inner_extent",
    "inner_contiguous",
    "log_accumulators",
    "log_l2_footprint",
    "log_l1_footprint",
    "log_l2_moved",
    "log_l1_moved",
    "log_s0",
    "log_s1",
    "log_s2",
    "log_s3",
    "log_r0",
    "log_r1",
    "tiled",
    "cache_none",
    "cache_global",
    "cache_fused",
    "write_level",
    "log_parallel_limit",
    "log_vectorize_limit",
    "log_unroll",
    "n_inline",
    "n_tile",
    "n_rfactor",
    "n_compute_at",
    "n_root",
    "dominant_share",
    "log_llvm_unrolled_steps",
];

/// Length of a row of [`sketch_features`].
pub const SKETCH_FEATURES: usize = SKETCH_FEATURE_NAMES.len();

fn lg(x: f64) -> f32 {
    (x.max(0.0) + 1.0).log2() as f32
}

/// The features the learned model reads off a candidate: the analytical model's per-block
/// estimates, summarised ([`SKETCH_FEATURE_NAMES`]).
pub fn sketch_features(
    program: &Program,
    space: &SketchSpace,
    genome: &Genome,
    target: &CpuTarget,
) -> [f32; SKETCH_FEATURES] {
    features_of_estimates(genome, &block_estimates(program, space, genome, target))
}

/// The analytical model's estimate of each block of `genome`, in the space's block order: what
/// both the features and the estimated cycles ([`total_cycles`]) are made of, so a scorer
/// that needs both works them out once.
pub fn block_estimates(
    program: &Program,
    space: &SketchSpace,
    genome: &Genome,
    target: &CpuTarget,
) -> Vec<(usize, BlockEstimate)> {
    space
        .infos
        .iter()
        .map(|i| {
            (
                i.block,
                estimate_block(program, space, genome, i.block, target),
            )
        })
        .collect()
}

/// Estimated cycles of the whole candidate: the same sum, in the same order, as
/// [`super::analytical::estimate_cycles`].
pub fn total_cycles(estimates: &[(usize, BlockEstimate)]) -> f64 {
    estimates.iter().map(|(_, e)| e.cycles).sum()
}

/// The features of `genome` from its [`block_estimates`].
pub fn features_of_estimates(
    genome: &Genome,
    estimates: &[(usize, BlockEstimate)],
) -> [f32; SKETCH_FEATURES] {
    let total = total_cycles(estimates);
    let (block, e) = estimates
        .iter()
        .max_by(|a, b| a.1.cycles.total_cmp(&b.1.cycles))
        .cloned()
        .unwrap_or_default();
    let rule = genome.rules.get(&block);
    let count = |f: fn(&Rule) -> bool| genome.rules.values().filter(|r| f(r)).count() as f32;
    let (tiled, cache, level) = match rule {
        Some(Rule::Tile { cache, level }) => (1.0, Some(cache), *level as f32),
        _ => (0.0, None, 0.0),
    };
    let unroll = UNROLL_CANDIDATES.get(genome.unroll).copied().unwrap_or(0) as f64;
    [
        lg(e.flops),
        lg(total),
        lg(e.compute_cycles),
        lg(e.memory_cycles),
        (e.compute_cycles / e.memory_cycles.max(1.0)) as f32,
        e.parallel_efficiency as f32,
        e.vector_efficiency as f32,
        lg(e.inner_extent),
        e.inner_contiguous as u8 as f32,
        lg(e.accumulators),
        lg(e.l2_footprint),
        lg(e.l1_footprint),
        lg(e.l2_moved),
        lg(e.l1_moved),
        lg(e.level_extents[0]),
        lg(e.level_extents[1]),
        lg(e.level_extents[2]),
        lg(e.level_extents[3]),
        lg(e.level_extents[4]),
        lg(e.level_extents[5]),
        tiled,
        matches!(cache, Some(WriteCache::None)) as u8 as f32,
        matches!(cache, Some(WriteCache::Global)) as u8 as f32,
        matches!(cache, Some(WriteCache::FusedConsumer(_))) as u8 as f32,
        level,
        lg(genome.parallel as f64),
        lg(genome.vectorize as f64),
        lg(unroll),
        count(|r| matches!(r, Rule::Inline)),
        count(|r| matches!(r, Rule::Tile { .. })),
        count(|r| matches!(r, Rule::RFactor { .. })),
        count(|r| r.location().is_some()),
        count(|r| matches!(r, Rule::Root)),
        (e.cycles / total.max(1e-9)) as f32,
        lg(e.llvm_unrolled_steps),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::analytical::estimate_cycles;
    use crate::rng::Rng;

    /// The scorer takes the estimate and the features from one set of block estimates: both
    /// must be exactly what the separate functions give.
    #[test]
    fn shared_block_estimates_give_the_same_cycles_and_features() {
        for fixture in [
            "cbr_small.json",
            "gmm_512.json",
            "sfm_small.json",
            "tbg_0.json",
        ] {
            let path = format!("{}/tests/fixtures/{fixture}", env!("CARGO_MANIFEST_DIR"));
            let program = Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
            let space = SketchSpace::new(&program);
            let target = CpuTarget::new(2)
                .with_vector_bytes(64)
                .with_parallel_speedup(Some(1.0));
            for i in 0..200 {
                let genome = space.draw(&program, &target, &mut Rng::derive(7, i));
                let estimates = block_estimates(&program, &space, &genome, &target);
                assert_eq!(
                    total_cycles(&estimates).to_bits(),
                    estimate_cycles(&program, &space, &genome, &target).to_bits()
                );
                let shared = features_of_estimates(&genome, &estimates);
                let apart = sketch_features(&program, &space, &genome, &target);
                assert_eq!(shared.map(f32::to_bits), apart.map(f32::to_bits));
            }
        }
    }
}
