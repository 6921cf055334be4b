//! Sketch generation and random annotation for CPU, after Ansor's derivation rules.
//!
//! A candidate is drawn in two steps. First its structure: for every block, one of the rules
//! that apply to it (always inline; multi-level tiling "SSRSRS" with no cache, a cache-write
//! stage or a fused elementwise consumer, placed after tile level 0 or 1; rfactor of a
//! reduction with little spatial parallelism, its partial and final blocks at the root or under
//! a loop of the block that consumes them, placed together or apart as MetaSchedule samples
//! their locations; a compute location under its consumer). Padding
//! (a conditional elementwise block) is inlined, computed at the root, or computed under one
//! of its tiled consumer's loops down to S2, as MetaSchedule's CPU rules leave it to a sampled
//! location. Then its annotation: tile sizes and the unroll depth, with MetaSchedule's fixed
//! parallel and vectorize limits, which TVM's RewriteParallelVectorizeUnroll turns into loops.
//! Both are emitted as one MetaSchedule trace.

mod analysis;
pub mod gpu;
mod mutate;
mod tile;
mod trace_builder;
mod transfer;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use analysis::{analyze, BlockInfo};
pub use gpu::{
    emit_gpu, mutate_gpu, sample_gpu, sample_gpu_genomes, GpuGenome, GpuRule, GpuSketchSpace,
};
pub use mutate::{crossover, mutate};
pub use tile::{prime_factors, sample_perfect_tile};
pub use trace_builder::TraceBuilder;
pub use transfer::{transfer, transfer_from_sibling};

use crate::program::{Expr, IterKind, Program};
use crate::rng::Rng;
use crate::schedule::arith::{linear, Lin, Ranges};

/// What sketches need to know about a CPU target.
#[derive(Clone, Debug)]
pub struct CpuTarget {
    /// Cores the kernels run on.
    pub num_cores: i64,
    /// SIMD register width in bytes (32 for AVX2, 64 for AVX-512): what the cost model assumes.
    pub vector_bytes: i64,
    /// Vector FMAs of that width a core issues per cycle: 2 on most x86 cores, 1 where
    /// 512-bit vectors run on 256-bit units (AMD Zen 4).
    pub fma_per_cycle: f64,
    /// Architectural vector registers: 32 with AVX-512 (and on AArch64), 16 on x86-64 without
    /// it. What a register tile's accumulators and operands must fit in before they spill.
    pub vector_registers: i64,
    /// How much faster a kernel runs with every core busy than on one core: `num_cores` where
    /// cores scale linearly, less where the runtime runs fewer threads than there are cores
    /// (TVM's default is half the logical CPUs: one thread on a 2-vCPU virtual machine).
    pub parallel_speedup: f64,
}

impl CpuTarget {
    /// A target of `num_cores` cores (at least one), AVX2-wide with AVX2's 16 vector registers,
    /// 2 FMAs per cycle, scaling linearly.
    pub fn new(num_cores: i64) -> Self {
        let num_cores = num_cores.max(1);
        CpuTarget {
            num_cores,
            vector_bytes: 32,
            fma_per_cycle: 2.0,
            vector_registers: 16,
            parallel_speedup: num_cores as f64,
        }
    }

    /// Sets [`CpuTarget::parallel_speedup`], kept within 1 and the core count (`None` or a
    /// value that is not finite: linear scaling).
    pub fn with_parallel_speedup(mut self, speedup: Option<f64>) -> Self {
        let cores = self.num_cores as f64;
        self.parallel_speedup = match speedup {
            Some(s) if s.is_finite() => s.clamp(1.0, cores),
            _ => cores,
        };
        self
    }

    /// Speedup of a kernel that keeps `busy` cores busy on average (1 to `num_cores`) over one
    /// core: linear in `busy`, from 1 on one core to [`CpuTarget::parallel_speedup`] on all.
    pub fn speedup(&self, busy: f64) -> f64 {
        let cores = self.num_cores as f64;
        if self.parallel_speedup >= cores || self.num_cores == 1 {
            return busy;
        }
        1.0 + (self.parallel_speedup - 1.0) * (busy - 1.0).max(0.0) / (cores - 1.0)
    }

    /// The same target with `bytes`-wide vectors (clamped to 8..=256) and the vector registers
    /// an x86-64 CPU of that width has (32 with AVX-512's 64 bytes, else 16); AArch64 sets its
    /// own with [`CpuTarget::with_vector_registers`].
    pub fn with_vector_bytes(mut self, bytes: i64) -> Self {
        self.vector_bytes = bytes.clamp(8, 256);
        self.vector_registers = if self.vector_bytes >= 64 { 32 } else { 16 };
        self
    }

    /// The same target with `registers` architectural vector registers (clamped to 8..=64).
    pub fn with_vector_registers(mut self, registers: i64) -> Self {
        self.vector_registers = registers.clamp(8, 64);
        self
    }

    /// The same target issuing `fmas` vector FMAs per cycle (clamped to 0.25..=8; 2 if not finite).
    pub fn with_fma_per_cycle(mut self, fmas: f64) -> Self {
        self.fma_per_cycle = if fmas.is_finite() {
            fmas.clamp(0.25, 8.0)
        } else {
            2.0
        };
        self
    }
}

/// Largest innermost tile factor, as in MetaSchedule's CPU multi-level tiling.
pub const MAX_INNERMOST_FACTOR: i64 = 64;
/// Shortest reduction worth an rfactor option.
pub const MIN_RFACTOR_EXTENT: i64 = 16;
/// Unroll depths the annotation draws from (`pragma_auto_unroll_max_step`).
pub const UNROLL_CANDIDATES: [i64; 4] = [0, 16, 64, 512];
/// The parallel and vectorize limits every drawn candidate gets, MetaSchedule's CPU defaults
/// (16 jobs per core, loops up to 64 long). They are not searched: drawn from three values each,
/// they made a third of a 64-trial run measure the same tiling again with another limit, at the
/// same speed (BENCHMARKS.md, "Annotations pinned"). Genomes keep both fields, so candidates
/// stored with other limits still replay.
pub const PARALLEL_JOBS_PER_CORE: i64 = 16;
pub const MAX_VECTORIZE_EXTENT: i64 = 64;
/// Odds of the placements a conditional block (padding) is drawn with: inlined into its
/// consumer, a pass of its own at the root, else one of the loops of its consumer.
pub const PADDING_INLINE_PROB: f64 = 0.4;
pub const PADDING_ROOT_PROB: f64 = 0.2;

/// The structural rule chosen for one block.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// Computed inside its consumers.
    Inline,
    /// Multi-level tiling; `cache` says where results are written back.
    Tile {
        /// Where the results are written.
        cache: WriteCache,
        /// Which tile level the write-back (or the fused consumer) sits under.
        level: usize,
    },
    /// rfactor of the fused reduction loop (`outer`: the outer split becomes the partial axis);
    /// `at`, when set, computes the final reduction under loop `depth` of block `host`, beside
    /// the consumer that reads it, and `partial` says where the partial results go (both
    /// fields absent in genomes stored before them).
    RFactor {
        /// Whether the outer split of the reduction loop becomes the partial axis.
        outer: bool,
        /// `(host, depth)`: the block and loop depth the final reduction is computed under.
        #[serde(default)]
        at: Option<(usize, usize)>,
        /// Where the partial results are computed.
        #[serde(default, skip_serializing_if = "Partial::is_with_final")]
        partial: Partial,
    },
    /// Computed under a loop of a consumer block.
    ComputeAt {
        /// The block whose loop it goes under.
        host: usize,
        /// Which of that block's loops (0: outermost).
        depth: usize,
    },
    /// Left at the root as it is, for the postprocessors' parallelization and vectorization.
    Root,
}

impl Rule {
    /// The `(host, depth)` of a rule that computes its block under another block's loop.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            Rule::ComputeAt { host, depth } => Some((*host, *depth)),
            Rule::RFactor { at, .. } => *at,
            _ => None,
        }
    }
}

/// Where an rfactored reduction computes its partial results, as MetaSchedule samples the
/// compute location of an rfactor block apart from its final reduction's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Partial {
    /// Just before the final reduction, under the same loop (at the root when it is).
    #[default]
    WithFinal,
    /// A parallel pass of its own at the root, the final reduction under its consumer.
    Root,
    /// Under the host's loop at this depth, above the loop of the final reduction, which is
    /// then recomputed for every iteration in between.
    At(usize),
}

impl Partial {
    fn is_with_final(&self) -> bool {
        *self == Partial::WithFinal
    }

    /// Whether these partial results may go with a final reduction under loop `depth`: a
    /// loop of their own must be above it.
    pub fn fits_above(&self, depth: usize) -> bool {
        !matches!(*self, Partial::At(above) if above >= depth)
    }
}

/// Where a tiled block writes its results.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WriteCache {
    /// Straight into its output buffer.
    None,
    /// Into a cache written back under the tiles (`cache_write` at `global` scope).
    Global,
    /// Into its output, with this consumer block (an epilogue) computed under its tiles.
    FusedConsumer(usize),
}

/// Everything that decides one candidate: the rule of each block, its tile sizes and the
/// annotations. [`emit`] turns it into a trace; mutation and crossover work on it directly.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Genome {
    /// The rule of each scheduled block, by block index.
    pub rules: BTreeMap<usize, Rule>,
    /// Per tiled block, the factors of each of its loops (outermost first); per rfactored
    /// block, the two factors of its fused reduction loop.
    pub tiles: BTreeMap<usize, Vec<Vec<i64>>>,
    /// `meta_schedule.parallel`: the most parallel jobs the postprocessor may create.
    pub parallel: i64,
    /// `meta_schedule.vectorize`: the longest loop the postprocessor may vectorize.
    pub vectorize: i64,
    /// Index into [`UNROLL_CANDIDATES`].
    pub unroll: usize,
}

/// The rules that apply to each block, in program order of the leaf blocks.
#[derive(Clone, Debug)]
pub struct SketchSpace {
    /// What the analysis found out about each leaf block.
    pub infos: Vec<BlockInfo>,
    /// Blocks every candidate inlines.
    pub inlined: HashSet<usize>,
    /// Blocks a candidate inlines, computes at the root or computes under its consumer: the
    /// conditional ones (padding) and the transposes, which MetaSchedule's CPU AutoInline also
    /// leaves to a sampled compute location.
    pub optional_inline: HashSet<usize>,
}

impl SketchSpace {
    /// Analyzes `program` and decides which blocks every candidate inlines.
    pub fn new(program: &Program) -> SketchSpace {
        let infos = analyze(program);
        // Inline first, consumers before producers, as long as someone still reads the result.
        let mut inlined = HashSet::new();
        let mut optional_inline = HashSet::new();
        for info in infos.iter().rev() {
            if info.inlinable
                && infos.iter().any(|c| {
                    c.block != info.block && c.reads.iter().any(|r| info.writes.contains(r))
                })
            {
                if info.conditional || info.unordered {
                    optional_inline.insert(info.block);
                } else {
                    inlined.insert(info.block);
                }
            }
        }
        SketchSpace {
            infos,
            inlined,
            optional_inline,
        }
    }

    /// The analysis of block `block` (panics for a block that is not a leaf).
    pub fn info(&self, block: usize) -> &BlockInfo {
        self.infos
            .iter()
            .find(|i| i.block == block)
            .expect("known block")
    }

    /// Consumers of `block` once inlined blocks are replaced by their own consumers.
    pub fn consumers(&self, block: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut frontier = vec![block];
        let mut seen = HashSet::new();
        while let Some(b) = frontier.pop() {
            let writes = &self.info(b).writes;
            for c in &self.infos {
                if c.block != b
                    && c.reads.iter().any(|r| writes.contains(r))
                    && seen.insert(c.block)
                {
                    if self.inlined.contains(&c.block) {
                        frontier.push(c.block);
                    } else {
                        out.push(c.block);
                    }
                }
            }
        }
        out.sort_by_key(|b| self.infos.iter().position(|i| i.block == *b));
        out
    }

    /// Draws one structure: a rule per block (blocks in program order).
    pub fn draw_rules(
        &self,
        program: &Program,
        target: &CpuTarget,
        rng: &mut Rng,
    ) -> BTreeMap<usize, Rule> {
        let mut rules: BTreeMap<usize, Rule> = BTreeMap::new();
        for b in &self.inlined {
            rules.insert(*b, Rule::Inline);
        }
        // Blocks already fused into a producer's tile, or hosting nothing yet.
        let mut fused: HashSet<usize> = HashSet::new();
        // Blocks are visited consumers first, so that a producer sees where its consumers are.
        // A consumer its tiled producer may fuse (a conv's bias, activation and residual add)
        // waits until that producer has chosen: a rule of its own, drawn first, would rule the
        // fusion out (and did, for every epilogue).
        let fusable = self.fusable_consumers(program);
        let order = self
            .infos
            .iter()
            .rev()
            .filter(|i| !fusable.contains(&i.block))
            .chain(
                self.infos
                    .iter()
                    .rev()
                    .filter(|i| fusable.contains(&i.block)),
            );
        for info in order {
            if rules.contains_key(&info.block) || fused.contains(&info.block) {
                continue;
            }
            let consumers = self.consumers(info.block);
            if self.optional_inline.contains(&info.block) {
                // Inlined, a pass of its own at the root, or computed under a loop of its
                // consumer, as MetaSchedule's CPU rules leave padding to a sampled compute
                // location: each wins somewhere (the root on C1D and 3x3 convolutions on 7x7
                // images, inlining on depthwise ones).
                let locations = self.locations(program, info, &consumers, &rules);
                let placed = if locations.is_empty() {
                    PADDING_INLINE_PROB + PADDING_ROOT_PROB
                } else {
                    1.0
                };
                let u = rng.unit() * placed;
                let rule = if u < PADDING_INLINE_PROB {
                    Rule::Inline
                } else if u < PADDING_INLINE_PROB + PADDING_ROOT_PROB {
                    Rule::Root
                } else {
                    rng.choose(&locations).clone()
                };
                rules.insert(info.block, rule);
                continue;
            }
            let mut options: Vec<Rule> = Vec::new();
            if info.simple_loops && info.reuse {
                for level in 0..2 {
                    options.push(Rule::Tile {
                        cache: WriteCache::None,
                        level,
                    });
                    options.push(Rule::Tile {
                        cache: WriteCache::Global,
                        level,
                    });
                    if let [c] = consumers.as_slice() {
                        if self.fusable_consumer(program, info, *c, &rules) {
                            options.push(Rule::Tile {
                                cache: WriteCache::FusedConsumer(*c),
                                level,
                            });
                        }
                    }
                }
                // As MetaSchedule: too little spatial parallelism for the cores, and a longer
                // reduction to take it from.
                if info.spatial_extent < info.reduce_extent
                    && info.spatial_extent <= target.num_cores * 16
                    && self.rfactor_applies(program, info)
                {
                    for outer in [false, true] {
                        options.push(Rule::RFactor {
                            outer,
                            at: None,
                            partial: Partial::WithFinal,
                        });
                    }
                }
            } else {
                options.push(Rule::Root);
                let hosts = if info.output {
                    Vec::new()
                } else {
                    self.host_locations(program, info, &consumers, &rules)
                };
                // A reduction without reuse gains from rfactor whenever it is long enough to
                // split: partial results break the dependency chain and vectorize. Under its
                // consumer's loop (MetaSchedule's compute location of an rfactored block), the
                // partial results and the producers feeding them stay in cache.
                if info.simple_loops
                    && !info.spatial
                    && info.reduce_extent >= MIN_RFACTOR_EXTENT
                    && self.rfactor_applies(program, info)
                {
                    for (at, partial) in
                        self.rfactor_placements(program, &consumers, &hosts, &rules)
                    {
                        for outer in [false, true] {
                            options.push(Rule::RFactor { outer, at, partial });
                        }
                    }
                }
                options.extend(hosts);
            }
            let rule = rng.choose(&options).clone();
            if let Rule::Tile {
                cache: WriteCache::FusedConsumer(c),
                ..
            } = rule
            {
                fused.insert(c);
            }
            rules.insert(info.block, rule);
        }
        for b in fused {
            rules.entry(b).or_insert(Rule::Root);
        }
        rules
    }

    /// Draws tile sizes for `block` under `rule` (none for rules without tiles).
    pub fn draw_tiles(
        &self,
        program: &Program,
        block: usize,
        rule: &Rule,
        rng: &mut Rng,
    ) -> Option<Vec<Vec<i64>>> {
        let info = self.info(block);
        match rule {
            Rule::Tile { .. } => Some(
                program.blocks[block]
                    .iter_vars
                    .iter()
                    .zip(&info.loop_extents)
                    .map(|(iv, extent)| {
                        let parts = if iv.kind == IterKind::Reduce { 2 } else { 4 };
                        sample_perfect_tile(rng, *extent, parts, MAX_INNERMOST_FACTOR)
                    })
                    .collect(),
            ),
            Rule::RFactor { .. } => Some(vec![sample_perfect_tile(
                rng,
                info.reduce_extent,
                2,
                MAX_INNERMOST_FACTOR,
            )]),
            _ => None,
        }
    }

    /// Draws a whole candidate: structure, tile sizes and annotations.
    pub fn draw(&self, program: &Program, target: &CpuTarget, rng: &mut Rng) -> Genome {
        let rules = self.draw_rules(program, target, rng);
        let mut tiles = BTreeMap::new();
        for (block, rule) in &rules {
            if let Some(t) = self.draw_tiles(program, *block, rule, rng) {
                tiles.insert(*block, t);
            }
        }
        Genome {
            rules,
            tiles,
            parallel: PARALLEL_JOBS_PER_CORE * target.num_cores,
            vectorize: MAX_VECTORIZE_EXTENT,
            unroll: rng.below(UNROLL_CANDIDATES.len()),
        }
    }

    /// A consumer that can be moved under the producer's tile: spatial, at the root, reading
    /// the producer's output at exactly its own iteration point.
    /// The blocks that are the single, fusable consumer of a block multi-level tiling applies
    /// to (before any rule is drawn).
    fn fusable_consumers(&self, program: &Program) -> HashSet<usize> {
        let none = BTreeMap::new();
        self.infos
            .iter()
            .filter(|p| {
                p.simple_loops
                    && p.reuse
                    && !self.inlined.contains(&p.block)
                    && !self.optional_inline.contains(&p.block)
            })
            .filter_map(|p| self.fusable_consumer_of(program, p.block, &none))
            .collect()
    }

    /// The consumer a tile of `block` may take under its tiles in a genome whose rules are
    /// `rules`: its single consumer, fusable, left at the root and hosting no other block.
    pub(crate) fn fusable_consumer_of(
        &self,
        program: &Program,
        block: usize,
        rules: &BTreeMap<usize, Rule>,
    ) -> Option<usize> {
        let [c] = self.consumers(block)[..] else {
            return None;
        };
        let hosting = rules
            .values()
            .any(|r| matches!(r.location(), Some((host, _)) if host == c));
        let at_root = matches!(rules.get(&c), None | Some(Rule::Root));
        (at_root
            && !hosting
            && self.fusable_consumer(program, self.info(block), c, &BTreeMap::new()))
        .then_some(c)
    }

    fn fusable_consumer(
        &self,
        program: &Program,
        producer: &BlockInfo,
        c: usize,
        rules: &BTreeMap<usize, Rule>,
    ) -> bool {
        let ci = self.info(c);
        if !ci.spatial || !ci.simple_loops || rules.contains_key(&c) {
            return false;
        }
        let pb = &program.blocks[producer.block];
        let n_spatial = pb
            .iter_vars
            .iter()
            .filter(|v| v.kind == IterKind::Spatial)
            .count();
        // The producer's values reach the consumer directly or through inlined elementwise
        // blocks (a bias add, then max and min): each must read them point for point.
        let mut carried = producer.writes.clone();
        for info in &self.infos {
            if self.inlined.contains(&info.block) && info.reads.iter().any(|r| carried.contains(r))
            {
                if !Self::reads_pointwise(program, info.block, &carried, n_spatial) {
                    return false;
                }
                carried.extend(info.writes.iter().copied());
            }
        }
        Self::reads_pointwise(program, c, &carried, n_spatial)
    }

    /// Whether `block` has `n_spatial` iteration variables, reads some buffer of `buffers`, and
    /// reads each at exactly its own iteration point.
    fn reads_pointwise(
        program: &Program,
        block: usize,
        buffers: &BTreeSet<usize>,
        n_spatial: usize,
    ) -> bool {
        let b = &program.blocks[block];
        let mut reads = b
            .reads
            .iter()
            .filter(|r| buffers.contains(&r.buffer))
            .peekable();
        b.iter_vars.len() == n_spatial
            && reads.peek().is_some()
            && reads.all(|r| {
                r.region.iter().zip(&b.iter_vars).all(|((min, ext), v)| {
                    matches!(min, Expr::Var(n) if *n == v.name) && ext.as_int() == Some(1)
                })
            })
    }

    pub(crate) fn rfactor_applies(&self, program: &Program, info: &BlockInfo) -> bool {
        // Spatial iteration variables first, then reductions: the loops to fuse are the tail.
        let kinds = program.blocks[info.block].iter_kinds();
        let n_s = kinds.chars().take_while(|c| *c == 'S').count();
        n_s < kinds.len()
            && kinds[n_s..].chars().all(|c| c == 'R')
            && program.blocks[info.block].writes.len() == 1
    }

    /// The compute locations of an optional-inline block under its consumers, given their
    /// rules: any loop of a single tiled consumer down to its S2 level, or the loops of an
    /// untiled host its result depends on.
    pub fn locations(
        &self,
        program: &Program,
        info: &BlockInfo,
        consumers: &[usize],
        rules: &BTreeMap<usize, Rule>,
    ) -> Vec<Rule> {
        if let [c] = consumers {
            if let Some(Rule::Tile { .. }) = rules.get(c) {
                // Under tiles, a region indexed through a division (transposed and grouped
                // convolutions) has a loop-dependent extent, which TVM's postprocessor refuses.
                let cb = &program.blocks[*c];
                let affine = cb
                    .reads
                    .iter()
                    .filter(|r| info.writes.contains(&r.buffer))
                    .all(|r| {
                        r.region
                            .iter()
                            .all(|(min, _)| linear_in_iter_vars(min, cb).is_some())
                    });
                if !affine {
                    return Vec::new();
                }
                return (0..self.tiled_location_depths(program, *c))
                    .map(|depth| Rule::ComputeAt { host: *c, depth })
                    .collect();
            }
        }
        self.host_locations(program, info, consumers, rules)
    }

    /// The compute locations [`Self::compute_at_host`] allows, as rules.
    fn host_locations(
        &self,
        program: &Program,
        info: &BlockInfo,
        consumers: &[usize],
        rules: &BTreeMap<usize, Rule>,
    ) -> Vec<Rule> {
        match self.compute_at_host(program, info, consumers, rules) {
            Some((host, max_depth)) => (0..max_depth)
                .map(|depth| Rule::ComputeAt { host, depth })
                .collect(),
            None => Vec::new(),
        }
    }

    /// Where an rfactored reduction with compute locations `hosts` may put its final reduction
    /// and its partial results. As MetaSchedule samples the two locations apart: both at the
    /// root; both under a loop its consumer's result depends on; the final reduction there and
    /// the partial results at the root; and, when the host is its only consumer, the final
    /// reduction under a deeper loop of the host (recomputed for each of its iterations, a
    /// few partial sums per output element), the partial results at the root or above it.
    fn rfactor_placements(
        &self,
        program: &Program,
        consumers: &[usize],
        hosts: &[Rule],
        rules: &BTreeMap<usize, Rule>,
    ) -> Vec<(Option<(usize, usize)>, Partial)> {
        let mut out = vec![(None, Partial::WithFinal)];
        for at in hosts.iter().filter_map(Rule::location) {
            out.push((Some(at), Partial::WithFinal));
            out.push((Some(at), Partial::Root));
        }
        if let (Some((host, _)), [only]) = (hosts.first().and_then(Rule::location), consumers) {
            if *only == host {
                let relevant = hosts.len();
                for depth in relevant..self.host_loop_count(program, rules, host) {
                    out.push((Some((host, depth)), Partial::Root));
                    for above in 0..relevant {
                        out.push((Some((host, depth)), Partial::At(above)));
                    }
                }
            }
        }
        out
    }

    /// Loops of a tiled block a producer may be computed under: S0, S1, R0 and S2 (below
    /// them, R1 and S3 would recompute it for every register tile).
    pub fn tiled_location_depths(&self, program: &Program, block: usize) -> usize {
        let (n_s, n_r) = spatial_reduce_counts(program, block);
        3 * n_s + n_r
    }

    /// Loops of `host` once its rule has been applied: the host of a compute location.
    pub fn host_loop_count(
        &self,
        program: &Program,
        rules: &BTreeMap<usize, Rule>,
        host: usize,
    ) -> usize {
        match rules.get(&host) {
            Some(Rule::Tile { .. }) => {
                let (n_s, n_r) = spatial_reduce_counts(program, host);
                4 * n_s + 2 * n_r
            }
            _ => self.info(host).loop_extents.len(),
        }
    }

    /// Where a block can be computed: under the loops of the one block that (directly or
    /// through blocks computed under it) consumes it, down to the loops its result depends on.
    fn compute_at_host(
        &self,
        program: &Program,
        info: &BlockInfo,
        consumers: &[usize],
        rules: &BTreeMap<usize, Rule>,
    ) -> Option<(usize, usize)> {
        let mut host = None;
        let mut max_depth = usize::MAX;
        for &c in consumers {
            let (h, d) = match rules.get(&c).map(|r| (r, r.location())) {
                // The partial results read the producer: it goes where they are.
                Some((Rule::RFactor { partial, .. }, Some((host, depth)))) => match partial {
                    Partial::WithFinal => (host, depth + 1),
                    Partial::At(above) => (host, above + 1),
                    Partial::Root => return None,
                },
                Some((_, Some((host, depth)))) => (host, depth + 1),
                Some((Rule::Root, _)) | None => (c, self.relevant_depth(program, info, c)),
                _ => return None,
            };
            if host.is_some_and(|x| x != h) {
                return None;
            }
            host = Some(h);
            max_depth = max_depth.min(d);
        }
        let h = host?;
        let hi = self.info(h);
        if !hi.simple_loops || !matches!(rules.get(&h), Some(Rule::Root) | None) {
            return None;
        }
        Some((h, max_depth.min(hi.loop_extents.len())))
    }

    /// Leading loops of `consumer` whose variables index its read of `producer`'s output.
    fn relevant_depth(&self, program: &Program, producer: &BlockInfo, consumer: usize) -> usize {
        let cb = &program.blocks[consumer];
        let Some(read) = cb
            .reads
            .iter()
            .find(|r| producer.writes.contains(&r.buffer))
        else {
            return 1;
        };
        let mut used = HashSet::new();
        for (min, _) in &read.region {
            min.visit(&mut |e| {
                if let Expr::Var(n) = e {
                    used.insert(n.clone());
                }
            });
        }
        cb.iter_vars
            .iter()
            .take_while(|v| used.contains(&v.name))
            .count()
    }
}

/// `index` (of an access of `block`) as a linear form over the block's iteration variables,
/// after simplifying with their ranges (`co // 256` is 0 when `co < 256`, as in an ungrouped
/// convolution written for groups); `None` when a division or modulo remains.
pub fn linear_in_iter_vars(index: &Expr, block: &crate::program::Block) -> Option<Lin> {
    let ranges: Ranges = block
        .iter_vars
        .iter()
        .map(|v| (v.name.clone(), v.extent))
        .collect();
    let lin = linear(index, &ranges)?;
    lin.terms
        .values()
        .all(|(atom, _)| matches!(atom, Expr::Var(_)))
        .then_some(lin)
}

/// The iteration variables of `block` that `index` walks, and whether it is linear: those with a
/// nonzero coefficient in [`linear_in_iter_vars`] (`co // 256 * 256 + rc` walks `rc` alone when
/// `co < 256`), or, where a division or modulo remains, every variable that appears in it.
pub fn walked_vars(index: &Expr, block: &crate::program::Block) -> (BTreeSet<usize>, bool) {
    let position = |name: &str| block.iter_vars.iter().position(|v| v.name == name);
    let mut vars = BTreeSet::new();
    if let Some(lin) = linear_in_iter_vars(index, block) {
        for (atom, c) in lin.terms.values() {
            if let (Expr::Var(n), true) = (atom, *c != 0) {
                vars.extend(position(n));
            }
        }
        return (vars, true);
    }
    index.visit(&mut |e| {
        if let Expr::Var(n) = e {
            vars.extend(position(n));
        }
    });
    (vars, false)
}

/// Per read of `block` (in `Block::reads` order), the iteration variables its region walks
/// ([`walked_vars`] of each index).
pub fn read_walks(block: &crate::program::Block) -> Vec<BTreeSet<usize>> {
    block
        .reads
        .iter()
        .map(|r| {
            r.region
                .iter()
                .flat_map(|(min, _)| walked_vars(min, block).0)
                .collect()
        })
        .collect()
}

/// Spatial and reduction iteration variables of a block.
pub(crate) fn spatial_reduce_counts(program: &Program, block: usize) -> (usize, usize) {
    let vars = &program.blocks[block].iter_vars;
    let n_s = vars.iter().filter(|v| v.kind == IterKind::Spatial).count();
    (n_s, vars.len() - n_s)
}

/// Emits the trace of one candidate.
pub fn emit(program: &Program, space: &SketchSpace, genome: &Genome) -> Value {
    let mut t = TraceBuilder::new();
    let func = program.name.as_str();
    let rules = &genome.rules;
    let mut rv: BTreeMap<usize, String> = BTreeMap::new();
    for info in &space.infos {
        rv.insert(
            info.block,
            t.get_block(&program.blocks[info.block].name, func),
        );
    }
    let root = t.get_block(&program.blocks[program.root.block].name, func);
    for info in space.infos.iter().rev() {
        if rules.get(&info.block) == Some(&Rule::Inline) {
            t.compute_inline(&rv[&info.block]);
        }
    }
    for info in space.infos.iter().rev() {
        let b = &rv[&info.block];
        let block = &program.blocks[info.block];
        let tiles = genome.tiles.get(&info.block);
        match (rules.get(&info.block), tiles) {
            (Some(Rule::Tile { cache, level }), Some(tiles)) => {
                t.annotate_str(b, "meta_schedule.tiling_structure", "SSRSRS");
                let loops = t.get_loops(b, info.loop_extents.len());
                let mut s_tiles: Vec<Vec<String>> = vec![Vec::new(); 4];
                let mut r_tiles: Vec<Vec<String>> = vec![Vec::new(); 2];
                for (lp, factors) in loops.iter().zip(tiles) {
                    let split = t.sample_and_split(lp, factors, MAX_INNERMOST_FACTOR);
                    let levels = if factors.len() == 2 {
                        &mut r_tiles
                    } else {
                        &mut s_tiles
                    };
                    for (level, l) in split.into_iter().enumerate() {
                        levels[level].push(l);
                    }
                }
                let order: Vec<String> = [
                    &s_tiles[0],
                    &s_tiles[1],
                    &r_tiles[0],
                    &s_tiles[2],
                    &r_tiles[1],
                    &s_tiles[3],
                ]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
                t.reorder(&order);
                let at = s_tiles[*level].last().cloned();
                match (cache, at) {
                    (WriteCache::Global, Some(at)) => {
                        let cw = t.cache_write(b, 0, "global");
                        t.reverse_compute_at(&cw, &at);
                    }
                    (WriteCache::FusedConsumer(c), Some(at)) => t.reverse_compute_at(&rv[c], &at),
                    _ => {}
                }
            }
            (Some(Rule::RFactor { outer, at, partial }), Some(tiles)) => {
                let loops = t.get_loops(b, info.loop_extents.len());
                let n_s = block
                    .iter_vars
                    .iter()
                    .filter(|v| v.kind == IterKind::Spatial)
                    .count();
                let fused = if loops.len() - n_s > 1 {
                    t.fuse(&loops[n_s..])
                } else {
                    loops[n_s].clone()
                };
                let split = t.sample_and_split(&fused, &tiles[0], MAX_INNERMOST_FACTOR);
                let axis = program.buffers[block.writes[0].buffer].shape.len();
                let partial_rv = t.rfactor(&split[if *outer { 0 } else { 1 }], axis);
                if let Some((host, depth)) = at {
                    // The final reduction first: the partial block goes before its consumer.
                    let host_loops =
                        t.get_loops(&rv[host], space.host_loop_count(program, rules, *host));
                    t.compute_at(b, &host_loops[*depth]);
                    match partial {
                        Partial::WithFinal => t.compute_at(&partial_rv, &host_loops[*depth]),
                        Partial::At(above) => t.compute_at(&partial_rv, &host_loops[*above]),
                        Partial::Root => {}
                    }
                }
            }
            (Some(Rule::ComputeAt { host, depth }), _) => {
                let host_loops =
                    t.get_loops(&rv[host], space.host_loop_count(program, rules, *host));
                t.compute_at(b, &host_loops[*depth]);
            }
            _ => {}
        }
    }
    t.annotate_int(&root, "meta_schedule.parallel", genome.parallel);
    t.annotate_int(&root, "meta_schedule.vectorize", genome.vectorize);
    t.annotate_categorical(
        &root,
        "meta_schedule.unroll_explicit",
        &UNROLL_CANDIDATES,
        genome.unroll,
    );
    t.finish()
}

/// Draws up to `n` distinct candidates (trace JSON strings) not in `exclude`.
pub fn sample(
    program: &Program,
    target: &CpuTarget,
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
) -> Vec<String> {
    sample_genomes(program, target, n, seed, exclude)
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// Draws up to `n` distinct candidates not in `exclude`, with their genomes.
///
/// Candidate `i` is drawn with its own generator derived from `(seed, i)` and results are kept
/// in index order, so the answer does not depend on the number of threads.
pub fn sample_genomes(
    program: &Program,
    target: &CpuTarget,
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
) -> Vec<(String, Genome)> {
    let space = SketchSpace::new(program);
    sample_distinct(n, seed, exclude, |rng| {
        let genome = space.draw(program, target, rng);
        (emit(program, &space, &genome).to_string(), genome)
    })
}

/// Up to `n` distinct traces not in `exclude`, with what they were drawn from: candidate `i`
/// is `draw` called with its own generator derived from `(seed, i)`, drawn in parallel and
/// kept in index order, so the answer does not depend on the number of threads.
pub(crate) fn sample_distinct<G: Send>(
    n: usize,
    seed: u64,
    exclude: &HashSet<String>,
    draw: impl Fn(&mut Rng) -> (String, G) + Sync,
) -> Vec<(String, G)> {
    let mut out = Vec::with_capacity(n);
    let mut seen: HashSet<String> = HashSet::new();
    let mut next = 0u64;
    // Structurally small spaces run out of distinct candidates: stop after a bounded search.
    let max_draws = (n as u64).saturating_mul(20).max(256);
    while out.len() < n && next < max_draws {
        let batch = ((n - out.len()) as u64 * 2).clamp(16, 4096);
        let drawn: Vec<(String, G)> = (next..next + batch)
            .into_par_iter()
            .map(|i| draw(&mut Rng::derive(seed, i)))
            .collect();
        next += batch;
        for (trace, genome) in drawn {
            if out.len() == n {
                break;
            }
            if !exclude.contains(&trace) && seen.insert(trace.clone()) {
                out.push((trace, genome));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn genomes_stored_before_rfactor_locations_still_load() {
        let old: Rule = serde_json::from_str(r#"{"RFactor":{"outer":true}}"#).unwrap();
        assert_eq!(
            old,
            Rule::RFactor {
                outer: true,
                at: None,
                partial: Partial::WithFinal,
            }
        );
        let new: Rule = serde_json::from_str(r#"{"RFactor":{"outer":false,"at":[4,0]}}"#).unwrap();
        assert_eq!(new.location(), Some((4, 0)));
        // Partial results beside the final reduction are stored as before; elsewhere they say so.
        assert_eq!(
            serde_json::to_string(&new).unwrap(),
            r#"{"RFactor":{"outer":false,"at":[4,0]}}"#
        );
        let apart = Rule::RFactor {
            outer: false,
            at: Some((4, 1)),
            partial: Partial::At(0),
        };
        let text = serde_json::to_string(&apart).unwrap();
        assert_eq!(
            text,
            r#"{"RFactor":{"outer":false,"at":[4,1],"partial":{"At":0}}}"#
        );
        assert_eq!(serde_json::from_str::<Rule>(&text).unwrap(), apart);
    }
}
