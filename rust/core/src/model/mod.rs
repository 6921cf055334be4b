//! Cost models that score candidates inside the search, in Rust.
//!
//! * [`gpu`] — the analytical cold-start model of a GPU candidate.
//! * [`xgb`] — gradient-boosted trees trained by the XGBoost Python package, evaluated here from
//!   the booster's JSON so scoring thousands of candidates costs microseconds each.

pub mod analytical;
pub mod gpu;
pub mod sketch_features;
pub mod xgb;

pub use xgb::Forest;

use crate::program::Program;
use crate::search::Scorer;
use crate::sketch::{CpuTarget, Genome, SketchSpace};
use rayon::prelude::*;

/// The search's scorer: the analytical model on a cold start, blended with the learned forest
/// (on sketch features) as measurements accumulate. Both speak relative throughput: the
/// forest is trained on `best latency / latency`, the analytical estimate is divided into the
/// estimate of the best measured candidate.
pub struct HybridScorer<'a> {
    target: &'a CpuTarget,
    forest: Option<&'a Forest>,
    weight: f64,
    reference_cycles: f64,
}

impl<'a> HybridScorer<'a> {
    /// A scorer for `program`: the analytical estimate relative to `best_measured`'s (when there
    /// is one), blended with `forest`'s prediction at `weight` (0: analytical only, 1: forest only).
    pub fn new(
        program: &Program,
        space: &SketchSpace,
        target: &'a CpuTarget,
        forest: Option<&'a Forest>,
        weight: f64,
        best_measured: Option<&Genome>,
    ) -> Self {
        let reference_cycles = best_measured
            .map(|g| analytical::estimate_cycles(program, space, g, target))
            .unwrap_or(1.0)
            .max(1.0);
        let weight = if forest.is_some() {
            weight.clamp(0.0, 1.0)
        } else {
            0.0
        };
        HybridScorer {
            target,
            forest,
            weight,
            reference_cycles,
        }
    }
}

impl Scorer for HybridScorer<'_> {
    fn score(&self, program: &Program, space: &SketchSpace, genomes: &[Genome]) -> Vec<f64> {
        genomes
            .par_iter()
            .map(|g| match &self.forest {
                Some(f) if self.weight > 0.0 => {
                    // The features are the analytical model's working: estimate the blocks once.
                    let estimates =
                        sketch_features::block_estimates(program, space, g, self.target);
                    let analytical =
                        self.reference_cycles / sketch_features::total_cycles(&estimates).max(1.0);
                    let row = sketch_features::features_of_estimates(g, &estimates);
                    self.weight * f.predict_row(&row) as f64 + (1.0 - self.weight) * analytical
                }
                _ => {
                    self.reference_cycles
                        / analytical::estimate_cycles(program, space, g, self.target).max(1.0)
                }
            })
            .collect()
    }
}
