//! Sketch generation and random annotation for CUDA GPUs, after MetaSchedule's CUDA rules.
//!
//! A candidate's structure gives every leaf block one [`GpuRule`]:
//!
//! * elementwise blocks are inlined into their consumers (MetaSchedule's CUDA AutoInline, which,
//!   unlike the CPU one, also inlines padding, transposes and `exp`);
//! * a reduction with data reuse is tiled "SSSRRSRS", its fused spatial tiles bound to
//!   `blockIdx.x`, `vthread.x` and `threadIdx.x`, with a local write cache under the thread
//!   tile, shared read caches under the outer reduction tile (cooperative fetch) and its
//!   elementwise epilogue inlined into the write cache (MultiLevelTiling as TVM's CUDA rules
//!   configure it);
//! * a reduction with little spatial parallelism may instead reduce across threads, at the root
//!   or computed under the thread block of the consumer that reads it (CrossThreadReduction);
//! * every other block has its leading spatial loops fused and split over thread blocks and
//!   threads (AutoBind).
//!
//! Unlike TVM's design space, tile sizes are drawn within the target's limits (threads per
//! block, virtual threads, shared memory, a register budget; [`tiling`]), so that almost every
//! candidate passes VerifyGPUCode. [`emit_gpu`] writes a genome as a MetaSchedule trace.

mod emit;
mod mutate;
pub mod tiling;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

pub use emit::emit_gpu;
pub use mutate::mutate_gpu;

use super::{sample_distinct, spatial_reduce_counts, BlockInfo, SketchSpace};
use crate::gpu_target::GpuTarget;
use crate::program::{Expr, IterKind, Program};
use crate::rng::Rng;
use crate::schedule::apply_trace_to_gpu;

/// Unroll depths of `meta_schedule.unroll_explicit` (MetaSchedule's CUDA candidates).
pub const GPU_UNROLL_CANDIDATES: [i64; 8] = [0, 16, 32, 64, 128, 256, 512, 1024];
/// Threads per block AutoBind draws from (those up to the loop's extent and the target's limit).
pub const AUTO_BIND_THREADS: [i64; 6] = [32, 64, 128, 256, 512, 1024];
/// Threads a cross-thread reduction draws from (MetaSchedule's candidates).
pub const CROSS_THREAD_THREADS: [i64; 8] = [4, 8, 16, 32, 64, 128, 256, 512];
/// Draws of one candidate before one the schedule engine refuses is kept anyway.
pub const REDRAWS: usize = 8;
/// Vector lanes of a cooperative fetch, before the filter by data type. MetaSchedule also
/// draws 3; fastsearch does not: TVM's ThreadSync pass fails to build some 3-lane fetches
/// (10 of 297 sm_90 candidates with one, in `benches.gpu_cubins` over all 13 families).
pub const FETCH_LANES: [i64; 5] = [1, 2, 4, 8, 16];

/// The structural rule of one block of a GPU candidate.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuRule {
    /// Computed inside its consumers.
    Inline,
    /// Inlined into the local write cache of the tiled block that produces it (its epilogue).
    IntoProducer,
    /// Multi-level tiling SSSRRSRS with caches; `epilogue`: the consumer inlined into its
    /// write cache.
    Tile {
        /// The elementwise consumer reverse-inlined into the write cache, if any.
        epilogue: Option<usize>,
    },
    /// Reduction across the threads of a block; with `host`, computed (in shared memory) under
    /// the thread block of that consumer, which then shares its thread count.
    CrossThread {
        /// The block whose thread block computes this reduction, if any.
        host: Option<usize>,
    },
    /// Leading spatial loops fused and split over `blockIdx.x` and `threadIdx.x`.
    Bind,
}

/// Everything that decides one GPU candidate; [`emit_gpu`] turns it into a trace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuGenome {
    /// The rule of each leaf block, by block index.
    pub rules: BTreeMap<usize, GpuRule>,
    /// Per tiled block, the factors of each loop (5 per spatial loop, 3 per reduction loop).
    pub tiles: BTreeMap<usize, Vec<Vec<i64>>>,
    /// Per tiled block, the vector lanes of each shared read cache (in read order).
    pub lanes: BTreeMap<usize, Vec<i64>>,
    /// Per bound block (and per cross-thread reduction at the root), its threads per block.
    pub threads: BTreeMap<usize, i64>,
    /// Index into [`GPU_UNROLL_CANDIDATES`].
    pub unroll: usize,
}

/// The rules that apply to each block of a program on one GPU.
#[derive(Clone, Debug)]
pub struct GpuSketchSpace {
    /// The analysis, with the blocks every GPU candidate inlines as its `inlined` set.
    pub base: SketchSpace,
    /// The limits candidates are drawn within.
    pub target: GpuTarget,
}

impl GpuSketchSpace {
    /// Analyzes `program` for `target`.
    pub fn new(program: &Program, target: &GpuTarget) -> GpuSketchSpace {
        let infos = super::analyze(program);
        let mut inlined = HashSet::new();
        for info in infos.iter().rev() {
            let read = infos
                .iter()
                .any(|c| c.block != info.block && c.reads.iter().any(|r| info.writes.contains(r)));
            if info.inlinable_any_cost && read {
                inlined.insert(info.block);
            }
        }
        let base = SketchSpace {
            infos,
            inlined,
            optional_inline: HashSet::new(),
        };
        GpuSketchSpace {
            base,
            target: target.clone(),
        }
    }

    fn info(&self, block: usize) -> &BlockInfo {
        self.base.info(block)
    }

    /// Whether multi-level tiling applies: a reduction with data reuse on trivial loops.
    pub fn tileable(&self, program: &Program, block: usize) -> bool {
        let info = self.info(block);
        info.simple_loops
            && info.reuse
            && program.blocks[block]
                .iter_vars
                .iter()
                .all(|v| matches!(v.kind, IterKind::Spatial | IterKind::Reduce))
    }

    /// Whether cross-thread reduction applies, as MetaSchedule decides it: a reduction over
    /// trivial loops (spatial, then reduction), and, for one with data reuse, more reduction
    /// than spatial iterations and no more spatial iterations than threads in a block.
    pub fn cross_thread_applies(&self, program: &Program, block: usize) -> bool {
        let info = self.info(block);
        if !info.simple_loops || info.spatial || !self.base.rfactor_applies(program, info) {
            return false;
        }
        if self.tileable(program, block) {
            info.spatial_extent < info.reduce_extent
                && info.spatial_extent <= self.target.max_threads_per_block
        } else {
            info.reduce_extent > 1
        }
    }

    /// Draws one structure: a rule per leaf block.
    pub fn draw_rules(&self, program: &Program, rng: &mut Rng) -> BTreeMap<usize, GpuRule> {
        let mut rules: BTreeMap<usize, GpuRule> = BTreeMap::new();
        for b in &self.base.inlined {
            rules.insert(*b, GpuRule::Inline);
        }
        // Tiled blocks first: their epilogues are taken out of the rest.
        for info in self.base.infos.iter().rev() {
            let b = info.block;
            if rules.contains_key(&b) || !self.tileable(program, b) {
                continue;
            }
            if self.cross_thread_applies(program, b) && rng.chance(0.5) {
                continue;
            }
            let epilogue = self
                .base
                .fusable_consumer_of(program, b, &BTreeMap::new())
                .filter(|c| !rules.contains_key(c));
            if let Some(c) = epilogue {
                rules.insert(c, GpuRule::IntoProducer);
            }
            rules.insert(b, GpuRule::Tile { epilogue });
        }
        // The rest, consumers first, so that a reduction sees where its consumers are.
        for info in self.base.infos.iter().rev() {
            let b = info.block;
            if rules.contains_key(&b) {
                continue;
            }
            let rule = if self.cross_thread_applies(program, b) {
                let mut options = vec![GpuRule::CrossThread { host: None }];
                if let Some(host) = self.cross_thread_host(program, b, &rules) {
                    options.push(GpuRule::CrossThread { host: Some(host) });
                }
                if !self.tileable(program, b) {
                    options.push(GpuRule::Bind);
                }
                rng.choose(&options).clone()
            } else {
                GpuRule::Bind
            };
            rules.insert(b, rule);
        }
        rules
    }

    /// The consumer under whose thread block reduction `block` can be computed: every consumer
    /// of its result is that block (bound, spatial, with more loops than `block` has spatial
    /// ones and the same leading extents) or a reduction already computed there, and each
    /// reads the result row for row along its leading loops.
    pub fn cross_thread_host(
        &self,
        program: &Program,
        block: usize,
        rules: &BTreeMap<usize, GpuRule>,
    ) -> Option<usize> {
        let (n_s, _) = spatial_reduce_counts(program, block);
        let consumers = self.base.consumers(block);
        let mut host = None;
        for &c in &consumers {
            let h = match rules.get(&c)? {
                GpuRule::CrossThread { host: Some(h) } => *h,
                GpuRule::Bind => c,
                _ => return None,
            };
            if host.is_some_and(|x| x != h) {
                return None;
            }
            host = Some(h);
        }
        let h = host?;
        let hi = self.info(h);
        let leading: Vec<i64> = program.blocks[block]
            .iter_vars
            .iter()
            .take(n_s)
            .map(|v| v.extent)
            .collect();
        let aligned = n_s >= 1
            && hi.spatial
            && hi.simple_loops
            && hi.loop_extents.len() > n_s
            && hi.loop_extents[..n_s] == leading[..]
            && self.reads_row_aligned(program, block, n_s);
        aligned.then_some(h)
    }

    /// Whether every block reading `block`'s result (directly or through inlined blocks) reads
    /// it at its own first `n` iteration variables in its first `n` dimensions.
    fn reads_row_aligned(&self, program: &Program, block: usize, n: usize) -> bool {
        let mut carried: BTreeSet<usize> = self.info(block).writes.clone();
        for info in &self.base.infos {
            if info.block == block || !info.reads.iter().any(|r| carried.contains(r)) {
                continue;
            }
            let b = &program.blocks[info.block];
            let aligned = b
                .reads
                .iter()
                .filter(|r| carried.contains(&r.buffer))
                .all(|r| {
                    r.region.len() >= n
                        && b.iter_vars.len() >= n
                        && r.region[..n]
                            .iter()
                            .zip(&b.iter_vars)
                            .all(|((min, _), v)| matches!(min, Expr::Var(x) if *x == v.name))
                });
            if !aligned {
                return false;
            }
            if self.base.inlined.contains(&info.block) {
                carried.extend(info.writes.iter().copied());
            }
        }
        true
    }

    /// The threads-per-block candidates of a bound block or a cross-thread reduction.
    pub fn thread_candidates(
        &self,
        program: &Program,
        block: usize,
        rules: &BTreeMap<usize, GpuRule>,
    ) -> Vec<i64> {
        let max = self.target.max_threads_per_block;
        let hosting = rules
            .values()
            .any(|r| *r == GpuRule::CrossThread { host: Some(block) });
        if hosting || matches!(rules.get(&block), Some(GpuRule::CrossThread { .. })) {
            let c: Vec<i64> = CROSS_THREAD_THREADS
                .iter()
                .copied()
                .filter(|t| *t <= max)
                .collect();
            return if c.is_empty() { vec![max] } else { c };
        }
        let extent = self.bind_extent(program, block).min(max).max(1);
        let c: Vec<i64> = AUTO_BIND_THREADS
            .iter()
            .copied()
            .filter(|t| *t <= extent)
            .collect();
        if c.is_empty() {
            vec![extent]
        } else {
            c
        }
    }

    /// Loops AutoBind fuses: the leading spatial loops of a block with trivial loops (0 where
    /// they are not trivial: TVM's RewriteUnboundBlock binds such a block).
    pub fn bind_loops(&self, program: &Program, block: usize) -> usize {
        if !self.info(block).simple_loops {
            return 0;
        }
        program.blocks[block]
            .iter_vars
            .iter()
            .take_while(|v| v.kind == IterKind::Spatial)
            .count()
    }

    fn bind_extent(&self, program: &Program, block: usize) -> i64 {
        let n = self.bind_loops(program, block);
        self.info(block).loop_extents[..n].iter().product()
    }

    /// Vector lanes a cooperative fetch of `buffer` may use: at most 16 bytes, and for 16-bit
    /// types one or an even count (MetaSchedule's filter).
    pub fn lane_candidates(&self, program: &Program, buffer: usize) -> Vec<i64> {
        let buf = &program.buffers[buffer];
        let bytes = buf.element_bytes();
        FETCH_LANES
            .iter()
            .copied()
            .filter(|l| l * bytes <= self.target.max_vector_bytes)
            .filter(|l| bytes != 2 || *l == 1 || l % 2 == 0)
            .collect()
    }

    /// The reads of `block` that get a shared cache: those of buffers it does not write.
    pub fn cached_reads(&self, program: &Program, block: usize) -> Vec<usize> {
        let b = &program.blocks[block];
        (0..b.reads.len())
            .filter(|i| !b.writes.iter().any(|w| w.buffer == b.reads[*i].buffer))
            .collect()
    }

    /// Draws a whole candidate: structure, tile sizes, fetch lanes, threads and unrolling.
    pub fn draw(&self, program: &Program, rng: &mut Rng) -> GpuGenome {
        let rules = self.draw_rules(program, rng);
        let mut genome = GpuGenome {
            rules: BTreeMap::new(),
            tiles: BTreeMap::new(),
            lanes: BTreeMap::new(),
            threads: BTreeMap::new(),
            unroll: 0,
        };
        for (&b, rule) in &rules {
            match rule {
                GpuRule::Tile { .. } => {
                    genome
                        .tiles
                        .insert(b, tiling::draw_tiles(self, program, b, rng));
                    let lanes = self
                        .cached_reads(program, b)
                        .into_iter()
                        .map(|i| {
                            let buffer = program.blocks[b].reads[i].buffer;
                            *rng.choose(&self.lane_candidates(program, buffer))
                        })
                        .collect();
                    genome.lanes.insert(b, lanes);
                }
                GpuRule::Bind | GpuRule::CrossThread { host: None } => {
                    let candidates = self.thread_candidates(program, b, &rules);
                    genome.threads.insert(b, *rng.choose(&candidates));
                }
                _ => {}
            }
        }
        genome.rules = rules;
        genome.unroll = rng.below(GPU_UNROLL_CANDIDATES.len());
        genome
    }
}

impl GpuSketchSpace {
    /// The target limits `genome` breaks, described (empty when it respects them all): per
    /// tiled block, threads within its annotation's bounds, virtual threads, the register
    /// budget and shared memory; per bound block or cross-thread reduction, its threads.
    pub fn limit_violations(&self, program: &Program, genome: &GpuGenome) -> Vec<String> {
        let t = &self.target;
        let mut out = Vec::new();
        let name = |b: usize| program.blocks[b].name.clone();
        for (&b, tiles) in &genome.tiles {
            let threads = tiling::threads_per_block(program, b, tiles);
            let low = tiling::min_threads(self, program, b);
            if threads < low || threads > t.max_threads_per_block {
                out.push(format!("{}: {threads} threads", name(b)));
            }
            let vthreads = tiling::vthreads(program, b, tiles);
            if vthreads > t.max_vthread {
                out.push(format!("{}: {vthreads} virtual threads", name(b)));
            }
            let acc = tiling::accumulators(program, b, tiles);
            if acc > tiling::MAX_ACCUMULATORS {
                out.push(format!("{}: {acc} accumulators per thread", name(b)));
            }
            let shared = tiling::shared_bytes(self, program, b, tiles);
            if shared > t.max_shared_memory_per_block {
                out.push(format!("{}: {shared} bytes of shared memory", name(b)));
            }
        }
        for (&b, &threads) in &genome.threads {
            if threads < 1 || threads > t.max_threads_per_block {
                out.push(format!("{}: {threads} threads", name(b)));
            }
        }
        out
    }

    /// Draws a candidate and its trace, drawing again (up to [`REDRAWS`] times) while the
    /// schedule engine refuses the trace with MetaSchedule's CUDA postprocessors: a shared
    /// cache of a region indexed through a division (transposed convolutions) can have a
    /// loop-dependent extent, which DisallowDynamicLoop rejects.
    pub fn draw_checked(&self, program: &Program, rng: &mut Rng) -> (String, GpuGenome) {
        let mut last = None;
        for _ in 0..REDRAWS {
            let genome = self.draw(program, rng);
            let trace = emit_gpu(program, self, &genome).to_string();
            if apply_trace_to_gpu(program, &trace, &self.target, true).is_ok() {
                return (trace, genome);
            }
            last = Some((trace, genome));
        }
        last.expect("at least one draw")
    }
}

/// Draws up to `n` distinct GPU candidates (trace JSON strings) not in `exclude`.
pub fn sample_gpu(
    program: &Program,
    target: &GpuTarget,
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
) -> Vec<String> {
    sample_gpu_genomes(program, target, n, seed, exclude)
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// Draws up to `n` distinct GPU candidates not in `exclude`, with their genomes; candidate `i`
/// has its own generator derived from `(seed, i)`, so the answer does not depend on the number
/// of threads.
pub fn sample_gpu_genomes(
    program: &Program,
    target: &GpuTarget,
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
) -> Vec<(String, GpuGenome)> {
    let space = GpuSketchSpace::new(program, target);
    sample_distinct(n, seed, exclude, |rng| space.draw_checked(program, rng))
}

#[cfg(test)]
mod tests;
