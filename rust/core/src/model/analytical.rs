//! An analytical cost model for the cold start: before any measurement exists, candidates are
//! ranked by an estimate of their run time from arithmetic, bytes moved per cache level,
//! parallelism and vectorization.
//!
//! It reads a candidate at the level of its sketch (rules, tile sizes, annotations), where the
//! loop structure after MetaSchedule's postprocessors is known in closed form: the leading
//! spatial loops are fused and parallelized up to the parallel limit, the innermost spatial
//! loop is vectorized up to the vectorize limit.

use std::collections::BTreeSet;

use crate::program::{Block, Expr, IterKind, OpCounts, Program};
use crate::sketch::{
    linear_in_iter_vars, read_walks, walked_vars, CpuTarget, Genome, Rule, SketchSpace, WriteCache,
    UNROLL_CANDIDATES,
};

/// Cache sizes and bandwidths of a typical x86 core, in bytes and bytes per cycle.
const L1_BYTES: f64 = 48.0 * 1024.0;
const L2_BYTES: f64 = 1024.0 * 1024.0;
const L1_BW: f64 = 128.0;
const L2_BW: f64 = 48.0;
const MEM_BW: f64 = 8.0;
/// Share of the modelled memory traffic that is not hidden behind computation.
const MEMORY_WEIGHT: f64 = 0.1;
/// Latency of a vector FMA in cycles: the independent chains that keep the FMA units busy are
/// this times the FMAs a core issues per cycle (`CpuTarget::fma_per_cycle`; 8 on two ports).
const FMA_LATENCY: f64 = 4.0;
/// FMAs (with their loads) the out-of-order window holds: how far it looks ahead into the next
/// iterations of the loop around the register tile for independent chains.
const OOO_WINDOW_FMAS: f64 = 64.0;
/// Share of the target's vector registers (`CpuTarget::vector_registers`: 32 with AVX-512, 16
/// with AVX2) the register tile's loaded operands (broadcasts, weight vectors) keep busy; the
/// rest hold accumulators: 28 with AVX-512, 14 with AVX2, where LLVM folds the loaded operand
/// into the FMA. On Zen 3 (AVX2, seed 0 of a 256-trial suite) tiles of 14 accumulator vectors
/// were C2D:3's fastest (2019 us), while those of 16 ran 1.5-2.1x their workload's best (GMM:2,
/// C1D:2, C2D:1) and of 28 1.8x (C2D:3): the model had counted 32 registers on every target.
const OPERAND_REGISTER_SHARE: f64 = 0.125;
/// Steps of an inner loop nest LLVM fully unrolls on its own, before its loop vectorizer runs
/// (TVM's explicit unrolling reaches further): a 1x1 convolution with 16 steps below its
/// channel loop vectorizes along the channels with any unroll depth, one with 28 or 32 steps
/// runs 5-20x slower without unrolling; a depthwise one with 72 needs unroll 512.
const LLVM_FULL_UNROLL_STEPS: f64 = 16.0;
/// Steps of vector FMAs (TVM vectorized the innermost loop) LLVM fully unrolls on its own: its
/// threshold counts instructions, and a vector step is a few. Only with an unroll pragma
/// (any depth) or a write cache (a local accumulator LLVM promotes to registers): straight
/// into the output with neither, the accumulators stay in memory. C1D:2's 80-step bodies
/// (S2 co 2 x R1 5 x S3 l 8, and S2 l 4 x co 2 x R1 5 x S3 co 32) re-timed in 4 fresh
/// processes (AVX-512 Xeon): 161-176 us with unroll 16, 64 or 512 and with a write cache at
/// unroll 0; 620 and 217 us writing the output directly at unroll 0.
const LLVM_FULL_UNROLL_VECTOR_STEPS: f64 = 80.0;
/// Largest unrolled body LLVM still vectorizes the loop around: 1x1 convolutions with 224
/// steps ran at the best kernels' speed, with 448 and 512 eight times slower.
const LLVM_MAX_BODY_STEPS: f64 = 256.0;
/// Share of the register tile's reload traffic (stored and loaded again at every S2 step) that
/// adds to its FMAs' time. Re-timed on GMM:2 (AVX-512 Xeon), one 8x32 register tile under an
/// S2 loop of 256 steps with its C tile (256 KiB) in L2: R1 of 64, 32, 8 and 4 steps ran 927,
/// 945, 1069 and 1400 us; the reload traffic is 0.08, 0.17, 0.67 and 1.34 of the FMAs' cycles.
const ACCUMULATOR_RELOAD_WEIGHT: f64 = 0.4;
/// Sharpness of the soft maximum of the register tile's three issue limits ([`issue_bound`]).
/// Timed on C1D:2 (AVX-512 Xeon), one S2 x R1 x S3 nest with the whole reduction at R1:
/// 16 accumulator vectors in an 8x2 tile ran at 160 us, 8 vectors at 184 (4x2), 209 (8x1) and
/// 218 (2x4), 16 in a 16x1 tile (17 loads per 16 FMAs) at 193. A hard maximum scored the 8x2
/// and 4x2 tiles alike; with 4 the 8x2 tile ranks first and the others 1.15-1.3x behind it.
const ISSUE_SOFTNESS: f64 = 4.0;
/// Slowdown of a tiled block's arithmetic when a conditional producer (padding) is inlined
/// into it: every load of that input becomes a compare and a select.
const INLINED_SELECT_COST: f64 = 1.2;

/// One loop of a modelled nest: the iteration variable it walks and its extent.
#[derive(Clone, Copy, Debug)]
struct LoopDim {
    var: usize,
    extent: f64,
    spatial: bool,
}

/// Iteration variables each read of the block depends on, and its bytes per element: those its
/// region walks ([`walked_vars`]; the sketch analysis keeps them per block). The te workloads'
/// convolutions read their input at `co // 256 * 256 + rc`, which does not move with `co` when
/// there is one group (counting `co` made every tile with many output channels read the input
/// as often as the weights).
fn read_vars(program: &Program, space: &SketchSpace, block: usize) -> Vec<(BTreeSet<usize>, f64)> {
    let b = &program.blocks[block];
    let cached = space.infos.iter().find(|i| i.block == block);
    let computed;
    let walks = match cached {
        Some(info) => &info.read_walks,
        None => {
            computed = read_walks(b);
            &computed
        }
    };
    walks
        .iter()
        .zip(&b.reads)
        .map(|(vars, r)| {
            (
                vars.clone(),
                program.buffers[r.buffer].element_bytes() as f64,
            )
        })
        .collect()
}

/// Elements of each read touched by the loops `inner`, and bytes moved into the cache that
/// holds them while the loops `outer` run (classic reuse: trailing outer loops that do not
/// index a read reuse its footprint).
fn traffic(reads: &[(BTreeSet<usize>, f64)], outer: &[LoopDim], inner: &[LoopDim]) -> (f64, f64) {
    let mut footprint = 0.0;
    let mut moved = 0.0;
    for (vars, bytes) in reads {
        let fp: f64 = inner
            .iter()
            .filter(|l| vars.contains(&l.var))
            .map(|l| l.extent)
            .product::<f64>()
            * bytes;
        let mut trips = 1.0;
        let mut reused = true;
        for l in outer.iter().rev() {
            if reused && !vars.contains(&l.var) {
                continue;
            }
            reused = false;
            trips *= l.extent;
        }
        footprint += fp;
        moved += fp * trips;
    }
    (footprint, moved)
}

/// The loops of a block tiled "SSRSRS" with `tiles`, per level in loop order S0 S1 R0 S2 R1 S3.
fn tile_levels(program: &Program, block: usize, tiles: &[Vec<i64>]) -> Vec<Vec<LoopDim>> {
    let mut levels: Vec<Vec<LoopDim>> = vec![Vec::new(); 6];
    for (var, (iv, factors)) in program.blocks[block]
        .iter_vars
        .iter()
        .zip(tiles)
        .enumerate()
    {
        let spatial = iv.kind == IterKind::Spatial;
        let slots: &[usize] = if spatial { &[0, 1, 3, 5] } else { &[2, 4] };
        for (slot, f) in slots.iter().zip(factors) {
            levels[*slot].push(LoopDim {
                var,
                extent: *f as f64,
                spatial,
            });
        }
    }
    levels
}

/// The outermost loop of `block` (tiled) that some block is computed under: the postprocessor
/// parallelizes only the loops above and at it.
fn shallowest_guest(genome: &Genome, block: usize) -> Option<usize> {
    genome
        .rules
        .values()
        .filter_map(|r| match r {
            Rule::ComputeAt { host, depth } if *host == block => Some(*depth),
            _ => None,
        })
        .min()
}

/// Elements of `producer`'s output computed when it runs under loop `depth` of its tiled
/// consumer `host`: per iteration of the loops down to `depth`, the region the loops inside
/// read (overlapping halos are computed again).
fn elements_under_tiles(
    program: &Program,
    producer: usize,
    host: usize,
    nest: &[LoopDim],
    depth: usize,
) -> Option<f64> {
    let hb = &program.blocks[host];
    let written = &program.blocks[producer].writes.first()?.buffer;
    let read = hb.reads.iter().find(|r| r.buffer == *written)?;
    if nest.is_empty() {
        return None;
    }
    let depth = depth.min(nest.len() - 1);
    let trips: f64 = nest[..=depth].iter().map(|l| l.extent).product();
    let mut inner = vec![1.0; hb.iter_vars.len()];
    for l in &nest[depth + 1..] {
        inner[l.var] *= l.extent;
    }
    let shape = &program.buffers[*written].shape;
    let mut region = 1.0;
    for (dim, (min, ext)) in read.region.iter().enumerate() {
        let lin = linear_in_iter_vars(min, hb)?;
        let coef = |name: &str| {
            lin.terms
                .values()
                .filter(|(atom, _)| matches!(atom, Expr::Var(n) if n == name))
                .map(|(_, c)| *c)
                .sum::<i64>()
        };
        let span: f64 = hb
            .iter_vars
            .iter()
            .zip(&inner)
            .map(|(v, e)| coef(&v.name).abs() as f64 * (e - 1.0))
            .sum();
        let full = shape.get(dim).copied().unwrap_or(1) as f64;
        region *= (span + ext.as_int().unwrap_or(1) as f64).min(full);
    }
    Some(trips * region)
}

/// Parallel efficiency of the loops TVM's postprocessor fuses into the parallel loop
/// ([`parallel_loop_count`]: the one that takes the product past `limit` is fused too) on `cores`.
fn parallel_efficiency(nest: &[LoopDim], limit: i64, cores: i64) -> f64 {
    let jobs: f64 = nest[..parallel_loop_count(nest, limit)]
        .iter()
        .map(|l| l.extent)
        .product();
    let c = cores as f64;
    let waves = (jobs / c).ceil();
    jobs / (waves * c)
}

/// Vector efficiency of the innermost loop, and whether it is the output's contiguous axis.
fn vector_efficiency(
    inner: Option<&LoopDim>,
    contiguous_var: Option<usize>,
    limit: i64,
    lanes: f64,
) -> f64 {
    match inner {
        Some(l) if l.spatial && l.extent <= limit as f64 && l.extent > 1.0 => {
            let eff = l.extent / (lanes * (l.extent / lanes).ceil());
            if Some(l.var) == contiguous_var {
                eff
            } else {
                // Vectorized along a strided axis: gathers and scatters.
                eff * 0.25
            }
        }
        _ => 1.0 / lanes,
    }
}

/// Loops TVM's postprocessor fuses into the parallel loop: the leading spatial loops, up to and
/// including the one that takes the product past `limit` (RewriteParallelVectorizeUnroll).
fn parallel_loop_count(nest: &[LoopDim], limit: i64) -> usize {
    let mut prod = 1.0;
    let mut count = 0;
    for l in nest {
        if !l.spatial {
            break;
        }
        count += 1;
        prod *= l.extent;
        if prod > limit as f64 {
            break;
        }
    }
    count
}

/// Per read of `block`, the index expressions (minimums, over `block`'s iteration variables)
/// of what it loads from memory: a read of a buffer that an inlined block writes loads what
/// that block reads, at the indices the inlining substitutes (a transpose inlined into a
/// matmul makes its operand's reads strided).
fn memory_reads(program: &Program, genome: &Genome, block: usize) -> Vec<Vec<Vec<Expr>>> {
    program.blocks[block]
        .reads
        .iter()
        .map(|r| {
            let mins: Vec<Expr> = r.region.iter().map(|(min, _)| min.clone()).collect();
            loads_through_inlined(program, genome, r.buffer, mins, 0)
        })
        .collect()
}

fn loads_through_inlined(
    program: &Program,
    genome: &Genome,
    buffer: usize,
    mins: Vec<Expr>,
    depth: usize,
) -> Vec<Vec<Expr>> {
    let producer =
        program.blocks.iter().enumerate().find(|(_, b)| {
            b.body.len() == 1 && b.writes.len() == 1 && b.writes[0].buffer == buffer
        });
    let Some((p, pb)) = producer else {
        return vec![mins];
    };
    if depth >= 4 || genome.rules.get(&p) != Some(&Rule::Inline) {
        return vec![mins];
    }
    // Inlinable blocks write at identity indices: the producer's i-th write index is an
    // iteration variable, bound to the consumer's i-th index.
    let bound: Vec<(String, Expr)> = pb.writes[0]
        .region
        .iter()
        .zip(&mins)
        .filter_map(|((w, _), m)| match w {
            Expr::Var(n) => Some((n.clone(), m.clone())),
            _ => None,
        })
        .collect();
    if bound.len() != mins.len() {
        return vec![mins];
    }
    let map = |n: &str| bound.iter().find(|(v, _)| v == n).map(|(_, e)| e.clone());
    pb.reads
        .iter()
        .flat_map(|r| {
            let composed = r
                .region
                .iter()
                .map(|(min, _)| min.substitute(&map))
                .collect();
            loads_through_inlined(program, genome, r.buffer, composed, depth + 1)
        })
        .collect()
}

/// Whether `indices` (over `block`'s iteration variables) walk `var` with unit stride in the
/// last dimension or not at all: a vector along `var` is then one load (or a broadcast).
fn contiguous_along(program: &Program, block: usize, indices: &[Expr], var: usize) -> bool {
    let b = &program.blocks[block];
    let name = &b.iter_vars[var].name;
    let last = indices.len().saturating_sub(1);
    indices.iter().enumerate().all(|(dim, index)| {
        let Some(lin) = linear_in_iter_vars(index, b) else {
            return false;
        };
        let coef: i64 = lin
            .terms
            .values()
            .filter(|(atom, _)| matches!(atom, Expr::Var(n) if n == name))
            .map(|(_, c)| *c)
            .sum();
        coef == 0 || (dim == last && coef == 1)
    })
}

/// Whether every load of `block` (its [`memory_reads`]) walks `var` with unit stride in its
/// last dimension or not at all: LLVM's loop vectorizer then loads (or broadcasts) whole
/// vectors along it.
fn reads_contiguous_along(
    program: &Program,
    block: usize,
    loaded: &[Vec<Vec<Expr>>],
    var: usize,
) -> bool {
    loaded
        .iter()
        .flatten()
        .all(|indices| contiguous_along(program, block, indices, var))
}

/// The loop LLVM vectorizes when TVM vectorizes nothing: TVM's explicit unrolling
/// (`pragma_auto_unroll_max_step`) turns the innermost loops into straight-line code as long as
/// their steps multiply to at most `unroll` (LLVM's own full unrolling goes as far as
/// [`LLVM_FULL_UNROLL_STEPS`]); the first loop above them is then LLVM's innermost
/// loop, and when it walks the output's contiguous axis (and every read along it is contiguous
/// or a broadcast) the loop vectorizer vectorizes it, each unrolled output point becoming a
/// vector accumulator. MetaSchedule's best depthwise kernel here is of this kind: channels at
/// S1, a 72-step inner nest, 68 us with unroll 512 against 743 us with none.
/// Returns the index of that loop in `nest` and the unrolled loops' steps.
fn llvm_vector_loop(
    nest: &[LoopDim],
    unroll: f64,
    contiguous_var: Option<usize>,
    parallel_loops: usize,
) -> Option<(usize, f64)> {
    let unroll = unroll.max(LLVM_FULL_UNROLL_STEPS);
    let mut steps = 1.0;
    let mut idx = nest.len();
    while idx > 0 {
        let l = &nest[idx - 1];
        if l.extent > 1.0 && steps * l.extent > unroll {
            break;
        }
        steps *= l.extent;
        idx -= 1;
    }
    let l = nest.get(idx.checked_sub(1)?)?;
    (steps > 1.0
        && steps <= LLVM_MAX_BODY_STEPS
        && l.spatial
        && Some(l.var) == contiguous_var
        && idx > parallel_loops)
        .then_some((idx - 1, steps))
}

/// What the model works out for one block of a candidate; also the learned model's features.
#[derive(Clone, Debug, Default)]
pub struct BlockEstimate {
    pub flops: f64,
    pub cycles: f64,
    pub compute_cycles: f64,
    pub memory_cycles: f64,
    pub parallel_efficiency: f64,
    pub vector_efficiency: f64,
    /// Extent of the innermost loop, and whether it is the output's contiguous axis.
    pub inner_extent: f64,
    pub inner_contiguous: bool,
    /// Accumulators of the register tile (spatial extents of the innermost tile level).
    pub accumulators: f64,
    /// Bytes of reads touched by the L2-level and L1-level tiles, and bytes moved into them.
    pub l2_footprint: f64,
    pub l1_footprint: f64,
    pub l2_moved: f64,
    pub l1_moved: f64,
    /// Products of the tile factors of each SSRSRS level (spatial 0..4, then reduction 0..2).
    pub level_extents: [f64; 6],
    /// Steps of the innermost loops TVM unrolls, when LLVM vectorizes the loop above them
    /// ([`llvm_vector_loop`]); 0 otherwise.
    pub llvm_unrolled_steps: f64,
}

/// What every estimate of one block needs: the block, its arithmetic and the target's rates.
struct BlockContext<'a> {
    program: &'a Program,
    space: &'a SketchSpace,
    genome: &'a Genome,
    block: usize,
    b: &'a Block,
    ops: OpCounts,
    iterations: f64,
    flops: f64,
    lanes: f64,
    /// Vector registers left for accumulators beside the operands in flight.
    accumulator_registers: f64,
    reads: Vec<(BTreeSet<usize>, f64)>,
    /// The iteration variable along which the output is contiguous (its last index).
    contiguous_var: Option<usize>,
    cores: f64,
    /// Dependent FMA chains needed to hide the FMA latency.
    fma_chains: f64,
    /// Two FLOPs per lane of every FMA issued; relative to two FMAs a cycle, as the model was
    /// calibrated (its memory terms are in the same cycles).
    flops_per_cycle: f64,
}

/// Estimates one block under its rule.
pub fn estimate_block(
    program: &Program,
    space: &SketchSpace,
    genome: &Genome,
    block: usize,
    target: &CpuTarget,
) -> BlockEstimate {
    let b = &program.blocks[block];
    let ops = OpCounts::of_block(program, b);
    let iterations: f64 = b.iter_vars.iter().map(|v| v.extent as f64).product();
    let lanes = (target.vector_bytes / 4).max(1) as f64;
    // The output's last index names the axis along which stores are contiguous.
    let contiguous_var = b
        .body
        .first()
        .and_then(|s| s.indices.last())
        .and_then(|e| match e {
            Expr::Var(n) => b.iter_vars.iter().position(|v| v.name == *n),
            _ => None,
        });
    let cx = BlockContext {
        program,
        space,
        genome,
        block,
        b,
        flops: iterations * (ops.float_ops().max(1) as f64),
        ops,
        iterations,
        lanes,
        accumulator_registers: (target.vector_registers as f64 * (1.0 - OPERAND_REGISTER_SHARE))
            .max(1.0),
        reads: read_vars(program, space, block),
        contiguous_var,
        cores: target.num_cores as f64,
        fma_chains: FMA_LATENCY * target.fma_per_cycle,
        flops_per_cycle: lanes * target.fma_per_cycle,
    };
    let mut unroll_bonus = match UNROLL_CANDIDATES.get(genome.unroll) {
        Some(0) | None => 1.0,
        Some(u) if *u <= 64 => 0.9,
        _ => 0.95,
    };
    let mut e = BlockEstimate {
        flops: cx.flops,
        ..Default::default()
    };
    match (genome.rules.get(&block), genome.tiles.get(&block)) {
        (Some(Rule::Tile { cache, .. }), Some(tiles)) => {
            if estimate_tiled(&cx, &mut e, cache, tiles, target) {
                // The unrolled body is the point of LLVM's vector path, whatever the unroll depth.
                unroll_bonus = 0.9;
            }
        }
        (Some(Rule::Inline), _) => return e,
        (Some(Rule::ComputeAt { host, depth }), _)
            if matches!(genome.rules.get(host), Some(Rule::Tile { .. })) =>
        {
            estimate_computed_at(&cx, &mut e, *host, *depth, target)
        }
        (rule, _) => estimate_untiled(&cx, &mut e, rule, target),
    }
    // Prefetching and out-of-order execution hide most of the traffic the reuse model counts:
    // weighting it by MEMORY_WEIGHT ranks measured CPU kernels best (see BENCHMARKS.md).
    let memory = MEMORY_WEIGHT * e.memory_cycles;
    let (hi, lo) = (e.compute_cycles.max(memory), e.compute_cycles.min(memory));
    e.cycles =
        (hi + 0.1 * lo) / target.speedup(e.parallel_efficiency.max(1e-3) * cx.cores) * unroll_bonus;
    e
}

/// A block tiled SSRSRS: traffic at each cache level, the register tile's compute (FMA
/// latency, loads, spills) and, where TVM vectorizes nothing, LLVM's own vector path. True when
/// that path was taken.
fn estimate_tiled(
    cx: &BlockContext,
    e: &mut BlockEstimate,
    cache: &WriteCache,
    tiles: &[Vec<i64>],
    target: &CpuTarget,
) -> bool {
    let (program, genome, block, b) = (cx.program, cx.genome, cx.block, cx.b);
    // SSRSRS: S0 S1 R0 S2 R1 S3, each level holding one loop per axis of its kind.
    let levels = tile_levels(program, block, tiles);
    // Report levels as S0 S1 S2 S3 R0 R1.
    for (i, slot) in [0, 1, 3, 5, 2, 4].iter().enumerate() {
        e.level_extents[i] = levels[*slot].iter().map(|l| l.extent).product();
    }
    let nest: Vec<LoopDim> = levels.concat();
    let n_outer2 = levels[0].len() + levels[1].len();
    let n_outer1 = n_outer2 + levels[2].len();
    (e.l2_footprint, e.l2_moved) = traffic(&cx.reads, &nest[..n_outer2], &nest[n_outer2..]);
    (e.l1_footprint, e.l1_moved) = traffic(&cx.reads, &nest[..n_outer1], &nest[n_outer1..]);
    let out_bytes = program.buffers[b.writes[0].buffer].element_bytes() as f64;
    let parallel_prefix = shallowest_guest(genome, block).map_or(nest.len(), |d| d + 1);
    e.parallel_efficiency = parallel_efficiency(
        &nest[..parallel_prefix.min(nest.len())],
        genome.parallel,
        target.num_cores,
    );
    let inner = nest.last();
    e.inner_extent = inner.map_or(1.0, |l| l.extent);
    e.inner_contiguous = inner.is_some_and(|l| Some(l.var) == cx.contiguous_var);
    e.vector_efficiency = vector_efficiency(inner, cx.contiguous_var, genome.vectorize, cx.lanes);
    let inlined_selects = inlined_selects(cx);
    let loaded_reads = memory_reads(program, genome, block);
    let unroll = UNROLL_CANDIDATES.get(genome.unroll).copied().unwrap_or(0) as f64;
    e.compute_cycles = register_tile_cycles(
        cx,
        e,
        &levels,
        &loaded_reads,
        cache,
        inlined_selects,
        unroll,
    );
    // TVM vectorizes nothing when the contiguous axis has no S3 extent; what LLVM makes
    // of the unrolled inner nest can then be far faster than the scalar loop. Not with
    // padding inlined: its conditional loads keep LLVM from vectorizing (a depthwise
    // kernel at 70 us with its padding computed under the channel loop ran at 324 us
    // with the padding inlined).
    let tvm_vectorizes = inner.is_some_and(|l| l.spatial && l.extent > 1.0) || inlined_selects > 0;
    let parallel_loops =
        parallel_loop_count(&nest[..parallel_prefix.min(nest.len())], genome.parallel);
    let mut llvm_path = false;
    if let Some((at, steps)) = (!tvm_vectorizes)
        .then(|| llvm_vector_loop(&nest, unroll, cx.contiguous_var, parallel_loops))
        .flatten()
        .filter(|(at, _)| reads_contiguous_along(program, block, &loaded_reads, nest[*at].var))
    {
        let (cycles, eff, points) = llvm_vector_cycles(cx, &nest, at, inlined_selects);
        if cycles < e.compute_cycles {
            e.compute_cycles = cycles;
            e.vector_efficiency = eff;
            e.accumulators = points * cx.lanes;
            e.inner_extent = nest[at].extent;
            e.inner_contiguous = true;
            e.llvm_unrolled_steps = steps;
            llvm_path = true;
        }
    }
    let l1_bw = if e.l2_footprint <= L1_BYTES {
        L1_BW
    } else {
        L2_BW
    };
    let outer_bw = if e.l2_footprint <= L2_BYTES {
        L2_BW
    } else {
        MEM_BW
    };
    e.memory_cycles = e.l1_moved / l1_bw + e.l2_moved / outer_bw;
    // Results written back: through a cache stage once per tile, else on every reduction step.
    let spatial_points: f64 = b
        .iter_vars
        .iter()
        .filter(|v| v.kind == IterKind::Spatial)
        .map(|v| v.extent as f64)
        .product();
    e.memory_cycles += match cache {
        WriteCache::None => spatial_points * out_bytes * e.level_extents[4] / L1_BW,
        _ => spatial_points * out_bytes / L2_BW,
    };
    llvm_path
}

/// Conditional producers (the sketch space's optional inlines) inlined into the block.
fn inlined_selects(cx: &BlockContext) -> usize {
    cx.b.reads
        .iter()
        .filter(|r| {
            cx.space.optional_inline.iter().any(|p| {
                cx.genome.rules.get(p) == Some(&Rule::Inline)
                    && cx.space.info(*p).conditional
                    && cx.space.info(*p).writes.contains(&r.buffer)
            })
        })
        .count()
}

/// Compute cycles of the register tile (S3, under R1; S2 x S3 when the nest below R0 is
/// unrolled, [`unrolled_body`]); sets `e.accumulators`.
fn register_tile_cycles(
    cx: &BlockContext,
    e: &mut BlockEstimate,
    levels: &[Vec<LoopDim>],
    loaded_reads: &[Vec<Vec<Expr>>],
    cache: &WriteCache,
    inlined_selects: usize,
    unroll: f64,
) -> f64 {
    let lanes = cx.lanes;
    if let Some(body) = unrolled_body(cx, levels, loaded_reads, cache, unroll) {
        e.accumulators = body.accumulators;
        let vectors = (body.accumulators / lanes).max(1.0);
        let spill = (vectors / cx.accumulator_registers).max(1.0).powi(2);
        return cx.flops / (cx.flops_per_cycle * e.vector_efficiency)
            * spill
            * issue_bound(cx.fma_chains / vectors, body.loads / body.fmas)
            * INLINED_SELECT_COST.powi(inlined_selects as i32);
    }
    // The reduction loop R1 sits between S2 and S3: only S3 stays in registers.
    e.accumulators = levels[5].iter().map(|l| l.extent).product();
    // Accumulators share the registers with the operands in flight; beyond what is
    // left for them, spills add a store and a load to every FMA that touches one.
    let spill = (e.accumulators / lanes / cx.accumulator_registers)
        .max(1.0)
        .powi(2);
    // Each accumulator vector is a chain of dependent FMAs, R1 long per iteration of
    // S2. Out-of-order execution overlaps the next S2 iterations' chains (other
    // accumulators) as far as its window reaches; fewer chains in flight than FMA
    // latency times issue width leave the FMA units waiting.
    let vectors = (e.accumulators / lanes).max(1.0);
    let r1: f64 = levels[4].iter().map(|l| l.extent).product();
    let s2: f64 = levels[3].iter().map(|l| l.extent).product();
    let overlap = (OOO_WINDOW_FMAS / (r1 * vectors)).clamp(1.0, s2.max(1.0));
    let chains = vectors * overlap;
    // Every step of R1 loads the register tile's operands: a vector per `lanes`
    // elements along the vectorized loop, a broadcast per element otherwise. With as
    // many load ports as FMA units, more loads than accumulator vectors wait on loads.
    // A read strided along the vectorized loop (a transpose inlined into it) is
    // gathered: a load per element. On TBG the analytical model ranked kernels with
    // the operand gathered 32 wide first, at twice the time of 16-wide ones.
    let vector_var = levels[5].last().map(|l| l.var);
    let loads: f64 = cx
        .reads
        .iter()
        .zip(loaded_reads)
        .map(|((vars, _), loaded)| {
            let elems: f64 = levels[5]
                .iter()
                .filter(|l| vars.contains(&l.var))
                .map(|l| l.extent)
                .product();
            match vector_var {
                Some(v)
                    if vars.contains(&v)
                        && loaded
                            .iter()
                            .all(|ix| contiguous_along(cx.program, cx.block, ix, v)) =>
                {
                    (elems / lanes).ceil()
                }
                _ => elems,
            }
        })
        .sum();
    cx.flops / (cx.flops_per_cycle * e.vector_efficiency)
        * spill
        * issue_bound(cx.fma_chains / chains, loads / vectors)
        * accumulator_reload(cx, vectors, s2, r1)
        * INLINED_SELECT_COST.powi(inlined_selects as i32)
}

/// Slowdown from storing the register tile's `vectors` accumulators and loading them again
/// around every run of its R1-step chain, at each of `s2` S2 steps. With one S2 step LLVM keeps
/// them in registers across the loops around R1 (it promotes stores to a fixed address); with
/// more, each R0 step walks the S2 x S3 tile, from L1 while it fits there beside the operands
/// (half of L1), else from L2. A ratio to the chain's FMA cycles, weighted by
/// [`ACCUMULATOR_RELOAD_WEIGHT`].
fn accumulator_reload(cx: &BlockContext, vectors: f64, s2: f64, r1: f64) -> f64 {
    if s2 <= 1.0 {
        return 1.0;
    }
    let out_bytes =
        cx.b.writes
            .first()
            .map_or(4.0, |w| cx.program.buffers[w.buffer].element_bytes() as f64);
    let vector_bytes = cx.lanes * out_bytes;
    let tile_bytes = s2 * vectors * vector_bytes;
    let bandwidth = if tile_bytes <= L1_BYTES / 2.0 {
        L1_BW
    } else {
        L2_BW
    };
    let reload_cycles = 2.0 * vectors * vector_bytes / bandwidth;
    let chain_cycles = r1 * vectors / (cx.fma_chains / FMA_LATENCY);
    1.0 + ACCUMULATOR_RELOAD_WEIGHT * reload_cycles / chain_cycles
}

/// Slowdown of a register tile over its FMA issue rate from the other two limits on it: the
/// FMA latency (`latency`: chains needed over chains in flight) and the load ports (`loads`:
/// loads per FMA, with as many load ports as FMA units). A soft maximum: a tile at exactly one
/// limit still loses to one with slack, since any stall then idles the FMA units.
fn issue_bound(latency: f64, loads: f64) -> f64 {
    (1.0 + latency.powf(ISSUE_SOFTNESS) + loads.powf(ISSUE_SOFTNESS)).powf(1.0 / ISSUE_SOFTNESS)
}

/// The straight-line body LLVM sees below the R0 loops of a tiled block: accumulator points,
/// operand loads and vector FMAs of one body.
struct UnrolledBody {
    accumulators: f64,
    loads: f64,
    fmas: f64,
}

/// The S2 R1 S3 nest as one body, when TVM's unrolling (steps up to `unroll`, after the
/// innermost loop is vectorized) or LLVM's own ([`LLVM_FULL_UNROLL_STEPS`],
/// [`LLVM_FULL_UNROLL_VECTOR_STEPS`])
/// covers all of it: every access to the output then has a constant offset in the body, so
/// LLVM keeps all S2 x S3 accumulators in registers across the R0 loop around it, and an
/// operand loaded once serves every FMA of the body that uses it. MetaSchedule's best C1D:2
/// kernel (seed 1 on the AVX-512 host) is of this kind: S2 4x2, R1 5, S3 1x32, unroll 64: 80
/// FMAs on 16 accumulators per step of its channel loop, with 8 broadcasts and 20 weight
/// loads, 146 us; the register tile alone (2 accumulators, 3 loads per 2 FMAs) had the model
/// rank it 1.7x slower than a 16x16 S3 tile that ran at 180 us. None when the body is not
/// unrolled whole or has no S2 loop to gain from.
fn unrolled_body(
    cx: &BlockContext,
    levels: &[Vec<LoopDim>],
    loaded_reads: &[Vec<Vec<Expr>>],
    cache: &WriteCache,
    unroll: f64,
) -> Option<UnrolledBody> {
    let s2: f64 = levels[3].iter().map(|l| l.extent).product();
    if s2 <= 1.0 {
        return None;
    }
    let body: Vec<LoopDim> = [&levels[3], &levels[4], &levels[5]]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    // TVM vectorizes the innermost loop before it unrolls: that loop is one step.
    let vector = levels[5]
        .last()
        .filter(|l| l.spatial && l.extent > 1.0 && l.extent <= cx.genome.vectorize as f64);
    let vector_extent = vector.map_or(1.0, |l| l.extent);
    let steps: f64 = body.iter().map(|l| l.extent).product::<f64>() / vector_extent;
    let accumulator_promoted = unroll > 0.0 || matches!(cache, WriteCache::Global);
    let llvm_steps = if vector.is_some() && accumulator_promoted {
        LLVM_FULL_UNROLL_VECTOR_STEPS
    } else {
        LLVM_FULL_UNROLL_STEPS
    };
    if steps > unroll.max(llvm_steps) {
        return None;
    }
    // The reduction's read of its own output is the accumulator: in registers, not loaded.
    let output = cx.b.writes.first().map(|w| w.buffer);
    let loads: f64 = loaded_reads
        .iter()
        .zip(&cx.b.reads)
        .filter(|(_, r)| Some(r.buffer) != output)
        .flat_map(|(loaded, _)| loaded)
        .map(|indices| body_loads(cx, &body, vector, indices))
        .sum();
    let accumulators: f64 = body
        .iter()
        .filter(|l| l.spatial)
        .map(|l| l.extent)
        .product();
    let fmas = steps * (vector_extent / cx.lanes).ceil();
    // Without an R0 loop around the body, its accumulators are loaded into registers each time.
    let r0: f64 = levels[2].iter().map(|l| l.extent).product();
    let loads = if r0 <= 1.0 {
        loads + (accumulators / cx.lanes).ceil()
    } else {
        loads
    };
    Some(UnrolledBody {
        accumulators,
        loads,
        fmas,
    })
}

/// Loads of one memory access (`indices`, over the block's iteration variables) in an unrolled
/// body: one per distinct element it reads across the body's loops (CSE keeps one load of
/// each), a vector load per `lanes` along the vectorized loop when it walks that loop with unit
/// stride, a broadcast when it does not walk it, a load per lane otherwise. A loop counts when
/// one of the indices walks its variable ([`walked_vars`]: `co // 256` with `co < 256` does not).
fn body_loads(
    cx: &BlockContext,
    body: &[LoopDim],
    vector: Option<&LoopDim>,
    indices: &[Expr],
) -> f64 {
    let mut walked = BTreeSet::new();
    let mut linear = true;
    for ix in indices {
        let (vars, lin) = walked_vars(ix, cx.b);
        walked.extend(vars);
        linear &= lin;
    }
    let walks = |var: usize| walked.contains(&var);
    let vector_var = vector.map(|l| l.var);
    let elems: f64 = body
        .iter()
        .filter(|l| Some(l.var) != vector_var && walks(l.var))
        .map(|l| l.extent)
        .product();
    match vector {
        Some(v) if walks(v.var) => {
            if linear && contiguous_along(cx.program, cx.block, indices, v.var) {
                elems * (v.extent / cx.lanes).ceil()
            } else {
                elems * v.extent
            }
        }
        _ => elems,
    }
}

/// LLVM's vectorization of loop `nest[at]` with the loops inside it unrolled: (compute cycles,
/// vector efficiency, accumulator points of the body).
fn llvm_vector_cycles(
    cx: &BlockContext,
    nest: &[LoopDim],
    at: usize,
    inlined_selects: usize,
) -> (f64, f64, f64) {
    let lanes = cx.lanes;
    let l = nest[at];
    let body = &nest[at + 1..];
    let points: f64 = body
        .iter()
        .filter(|d| d.spatial)
        .map(|d| d.extent)
        .product();
    let fmas: f64 = body.iter().map(|d| d.extent).product();
    let eff = l.extent / (lanes * (l.extent / lanes).ceil());
    // One vector load (or broadcast) per element of each read the body touches,
    // and each accumulator loaded and stored again around the body: the body is
    // one step of L, so partial sums live in memory between its iterations. LLVM
    // interleaves up to 4 vectors of L while registers last, and a broadcast (a
    // read that does not walk L) then serves all of them.
    let interleave = (l.extent / lanes)
        .ceil()
        .min(4.0)
        .min((cx.accumulator_registers / points).floor())
        .max(1.0);
    let loads: f64 = cx
        .reads
        .iter()
        .map(|(vars, _)| {
            let elems: f64 = body
                .iter()
                .filter(|d| vars.contains(&d.var))
                .map(|d| d.extent)
                .product();
            if vars.contains(&l.var) {
                elems
            } else {
                elems / interleave
            }
        })
        .sum::<f64>()
        + 2.0 * points;
    let overlap = (OOO_WINDOW_FMAS / fmas).clamp(1.0, (l.extent / lanes).max(1.0));
    let spill = (points / cx.accumulator_registers).max(1.0).powi(2);
    let cycles = cx.flops / (cx.flops_per_cycle * eff)
        * spill
        * issue_bound(cx.fma_chains / (points * overlap), loads / fmas)
        * INLINED_SELECT_COST.powi(inlined_selects as i32);
    (cycles, eff, points)
}

/// A block computed under a tiled consumer: once per iteration of the loops above it, for the
/// region the loops inside read, while that region is in cache.
fn estimate_computed_at(
    cx: &BlockContext,
    e: &mut BlockEstimate,
    host: usize,
    depth: usize,
    target: &CpuTarget,
) {
    let host_tiles = cx.genome.tiles.get(&host).map(Vec::as_slice).unwrap_or(&[]);
    let levels = tile_levels(cx.program, host, host_tiles);
    let nest: Vec<LoopDim> = levels.concat();
    let elements = elements_under_tiles(cx.program, cx.block, host, &nest, depth)
        .unwrap_or(cx.iterations)
        .max(cx.iterations);
    let ops = cx.ops.float_ops().max(1) as f64;
    e.flops = elements * ops;
    let above = (depth + 1).min(nest.len());
    e.parallel_efficiency =
        parallel_efficiency(&nest[..above], cx.genome.parallel, target.num_cores);
    e.vector_efficiency = 1.0;
    e.inner_extent = nest.last().map_or(1.0, |l| l.extent);
    e.compute_cycles = elements * ops / cx.lanes;
    e.memory_cycles =
        cx.reads.iter().map(|(_, by)| elements * by).sum::<f64>() / L1_BW + elements * 4.0 / L1_BW;
    e.level_extents = [elements, 1.0, 1.0, 1.0, 1.0, 1.0];
}

/// A block left as it is (rooted, rfactored, or computed at an untiled consumer): its own
/// loops, parallel and vectorized as annotated.
fn estimate_untiled(
    cx: &BlockContext,
    e: &mut BlockEstimate,
    rule: Option<&Rule>,
    target: &CpuTarget,
) {
    let (program, b, genome, lanes) = (cx.program, cx.b, cx.genome, cx.lanes);
    let (flops, flops_per_cycle, iterations) = (cx.flops, cx.flops_per_cycle, cx.iterations);
    let (reads, contiguous_var, cores, block, space) =
        (&cx.reads, cx.contiguous_var, cx.cores, cx.block, cx.space);
    let nest: Vec<LoopDim> = b
        .iter_vars
        .iter()
        .enumerate()
        .map(|(var, iv)| LoopDim {
            var,
            extent: iv.extent as f64,
            spatial: iv.kind == IterKind::Spatial,
        })
        .collect();
    e.parallel_efficiency = parallel_efficiency(&nest, cx.genome.parallel, target.num_cores);
    if let Some(Rule::RFactor { .. }) = rule {
        // rfactor turns part of the reduction into a parallel spatial axis.
        e.parallel_efficiency = e.parallel_efficiency.max(0.9);
    }
    if let Some(Rule::ComputeAt { .. }) = rule {
        // Computed inside its consumer: parallel with it, and its result stays in cache.
        e.parallel_efficiency = e.parallel_efficiency.max(0.8);
    }
    let inner = nest.last();
    e.inner_extent = inner.map_or(1.0, |l| l.extent);
    e.inner_contiguous = inner.is_some_and(|l| Some(l.var) == contiguous_var);
    e.vector_efficiency = vector_efficiency(inner, contiguous_var, genome.vectorize, lanes);
    e.compute_cycles = flops / (flops_per_cycle * e.vector_efficiency);
    e.memory_cycles = reads.iter().map(|(_, by)| iterations * by).sum::<f64>() / L2_BW;
    e.level_extents = [iterations, 1.0, 1.0, 1.0, 1.0, 1.0];
    if matches!(rule, Some(Rule::Root)) && space.optional_inline.contains(&block) {
        // Padding as a pass of its own: nothing to overlap it with, so it streams
        // its input and the padded copy (written, then read back by the consumer)
        // at the bandwidth of the level they fit in.
        let written: f64 = b
            .writes
            .iter()
            .map(|w| {
                let buf = &program.buffers[w.buffer];
                buf.shape.iter().product::<i64>() as f64 * buf.element_bytes() as f64
            })
            .sum();
        let read: f64 = reads.iter().map(|(_, by)| iterations * by).sum();
        let bw = if written + read <= L2_BYTES * cores {
            L2_BW
        } else {
            MEM_BW
        };
        e.memory_cycles = (read + 2.0 * written) / bw / MEMORY_WEIGHT;
    }
}

/// Estimated cycles of a whole candidate (lower is better).
pub fn estimate_cycles(
    program: &Program,
    space: &SketchSpace,
    genome: &Genome,
    target: &CpuTarget,
) -> f64 {
    space
        .infos
        .iter()
        .map(|i| estimate_block(program, space, genome, i.block, target).cycles)
        .sum()
}

/// Scores for the search: higher is better (negative log of the estimated cycles).
pub fn score(
    program: &Program,
    space: &SketchSpace,
    genomes: &[Genome],
    target: &CpuTarget,
) -> Vec<f64> {
    genomes
        .iter()
        .map(|g| -estimate_cycles(program, space, g, target).max(1.0).ln())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dim(var: usize, extent: f64, spatial: bool) -> LoopDim {
        LoopDim {
            var,
            extent,
            spatial,
        }
    }

    /// A depthwise convolution's nest (h, w, c; rh, rw) tiled as MetaSchedule's best one here:
    /// S0 (h 7, w 14) S1 (c 64) R0 (rh 3) S2 (h 2, w 2) R1 (rw 3) S3 (h 2, c 1).
    fn depthwise() -> Vec<LoopDim> {
        let (h, w, c, rh, rw) = (0, 1, 2, 3, 4);
        vec![
            dim(h, 7.0, true),
            dim(w, 14.0, true),
            dim(c, 1.0, true),
            dim(h, 1.0, true),
            dim(w, 1.0, true),
            dim(c, 64.0, true),
            dim(rh, 3.0, false),
            dim(rw, 1.0, false),
            dim(h, 2.0, true),
            dim(w, 2.0, true),
            dim(c, 1.0, true),
            dim(rh, 1.0, false),
            dim(rw, 3.0, false),
            dim(h, 2.0, true),
            dim(w, 1.0, true),
            dim(c, 1.0, true),
        ]
    }

    #[test]
    fn llvm_vectorizes_the_channel_loop_once_the_nest_below_it_is_unrolled() {
        let nest = depthwise();
        // 72 steps below c: unroll 512 reaches c, which becomes LLVM's innermost loop.
        assert_eq!(llvm_vector_loop(&nest, 512.0, Some(2), 2), Some((5, 72.0)));
        // Unroll 64 stops at rh, a reduction loop; nothing LLVM vectorizes along c.
        assert_eq!(llvm_vector_loop(&nest, 64.0, Some(2), 2), None);
        assert_eq!(llvm_vector_loop(&nest, 0.0, Some(2), 2), None);
        // Not along the output's contiguous axis, or fused into the parallel loop: no.
        assert_eq!(llvm_vector_loop(&nest, 512.0, Some(0), 2), None);
        assert_eq!(llvm_vector_loop(&nest, 512.0, Some(2), 6), None);
    }

    #[test]
    fn llvm_unrolls_a_short_nest_on_its_own() {
        // A 1x1 convolution: co 64 at S2, rc 8 at R1, h 2 at S3: 16 steps, no TVM unrolling.
        let (h, co, rc) = (0, 1, 2);
        let nest = vec![
            dim(h, 28.0, true),
            dim(co, 1.0, true),
            dim(rc, 8.0, false),
            dim(co, 64.0, true),
            dim(rc, 8.0, false),
            dim(h, 2.0, true),
            dim(co, 1.0, true),
        ];
        assert_eq!(llvm_vector_loop(&nest, 0.0, Some(co), 1), Some((3, 16.0)));
        // rc 32 at R1: 64 steps need TVM's unrolling, and 512 are more than LLVM vectorizes.
        let mut longer = nest.clone();
        longer[4].extent = 32.0;
        assert_eq!(llvm_vector_loop(&longer, 0.0, Some(co), 1), None);
        assert_eq!(
            llvm_vector_loop(&longer, 64.0, Some(co), 1),
            Some((3, 64.0))
        );
        longer[5].extent = 16.0;
        assert_eq!(llvm_vector_loop(&longer, 512.0, Some(co), 1), None);
    }

    #[test]
    fn parallel_loops_include_the_one_that_passes_the_limit() {
        let nest = depthwise();
        // 7 jobs, then 98 > 32: both loops are fused into the parallel loop.
        assert_eq!(parallel_loop_count(&nest, 32), 2);
        assert_eq!(parallel_loop_count(&nest, 128), 6);
    }
}
