//! The analytical cold-start model of a GPU candidate: an estimate of its run time from its
//! genome, before anything is measured.
//!
//! Each kernel is the slowest of three pipes, stretched by how full the GPU is:
//! * **compute**: the busiest SM's share of the multiply-adds (thread blocks spread over the
//!   SMs), at the rate its resident warps issue them: residency from threads, registers and
//!   shared memory per block, and instruction-level parallelism from the accumulators a thread
//!   keeps in flight;
//! * **global memory**: the bytes its thread blocks load into shared memory and store, at the
//!   memory's bandwidth lowered by uncoalesced stores (contiguous bytes a warp writes, in
//!   32-byte sectors) and by narrow fetch vectors (more load instructions per byte);
//! * **shared memory**: the operands threads read from the shared caches, fewer the more
//!   accumulators a thread reuses them for, lowered by bank conflicts when a warp's threads
//!   read down a column.
//!
//! The constants are an H100's (132 SMs, ~1.7 GHz, 3.35 TB/s) and have not been checked against
//! measurements: no GPU has run fastsearch's candidates yet. The model is a ranking device for
//! the first batches; it is tested for the directions that must hold (more reuse, wider fetches,
//! fuller GPUs are faster) and replaced by the learned model as measurements come in.

use crate::program::{IterKind, Program};
use crate::sketch::gpu::{tiling, GpuGenome, GpuRule, GpuSketchSpace};

/// Per-multiprocessor and whole-GPU figures of the modelled machine (an H100 SXM).
#[derive(Clone, Debug)]
pub struct GpuMachine {
    /// Streaming multiprocessors.
    pub sms: f64,
    /// FP32 FMAs per SM per second.
    pub fma_per_sm: f64,
    /// DRAM bytes per second, the whole GPU.
    pub dram_bytes: f64,
    /// Shared-memory bytes per SM per second.
    pub shared_bytes_per_sm: f64,
    /// Resident threads per SM.
    pub threads_per_sm: f64,
    /// Registers per SM.
    pub registers_per_sm: f64,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: f64,
    /// Resident thread blocks per SM.
    pub blocks_per_sm: f64,
    /// Seconds a kernel launch costs.
    pub launch: f64,
}

impl Default for GpuMachine {
    fn default() -> Self {
        GpuMachine {
            sms: 132.0,
            fma_per_sm: 128.0 * 1.7e9,
            dram_bytes: 3.35e12,
            shared_bytes_per_sm: 128.0 * 1.7e9,
            threads_per_sm: 2048.0,
            registers_per_sm: 65536.0,
            shared_per_sm: 228.0 * 1024.0,
            blocks_per_sm: 32.0,
            launch: 3e-6,
        }
    }
}

/// How a kernel's thread blocks sit on the GPU: thread blocks spread over the SMs, so the
/// busiest SM runs `busiest` of them, `resident` at a time.
struct Placement {
    /// Thread blocks the busiest SM runs, over the whole kernel.
    busiest: f64,
    /// Of those, how many are resident at once (threads, registers and shared memory allow).
    resident: f64,
    /// SMs that get any thread block.
    active_sms: f64,
}

fn placement(m: &GpuMachine, grid: f64, threads: f64, registers: f64, shared: f64) -> Placement {
    let threads = threads.max(1.0);
    let per_sm = (m.threads_per_sm / threads)
        .min(m.registers_per_sm / (registers.clamp(16.0, 255.0) * threads))
        .min(if shared > 0.0 {
            m.shared_per_sm / shared
        } else {
            f64::MAX
        })
        .min(m.blocks_per_sm)
        .floor()
        .max(1.0);
    let busiest = (grid / m.sms).ceil().max(1.0);
    Placement {
        busiest,
        resident: busiest.min(per_sm),
        active_sms: grid.min(m.sms).max(1.0),
    }
}

/// The share of an SM's peak its resident warps reach: four schedulers each need about four
/// warps of independent instructions in flight, fewer when each warp has `ilp` of its own.
fn issue_efficiency(warps: f64, ilp: f64) -> f64 {
    (warps * ilp.clamp(1.0, 8.0) / 16.0).min(1.0)
}

/// Estimated seconds of the whole candidate: the sum of its kernels.
pub fn estimate_gpu(program: &Program, space: &GpuSketchSpace, genome: &GpuGenome) -> f64 {
    let m = GpuMachine::default();
    genome
        .rules
        .iter()
        .map(|(&b, rule)| match rule {
            GpuRule::Tile { .. } => match genome.tiles.get(&b) {
                Some(tiles) => tiled_kernel(&m, program, space, genome, b, tiles),
                None => 0.0,
            },
            GpuRule::Bind | GpuRule::CrossThread { host: None } => {
                let threads = genome.threads.get(&b).copied().unwrap_or(256) as f64;
                streaming_kernel(&m, program, b, threads)
            }
            // Inlined blocks and reductions inside another kernel cost nothing of their own.
            _ => 0.0,
        })
        .sum()
}

fn tiled_kernel(
    m: &GpuMachine,
    program: &Program,
    space: &GpuSketchSpace,
    genome: &GpuGenome,
    b: usize,
    tiles: &[Vec<i64>],
) -> f64 {
    let blk = &program.blocks[b];
    let fmas: f64 = blk.iter_vars.iter().map(|v| v.extent as f64).product();
    let grid = tiling::level_product(program, b, tiles, IterKind::Spatial, &[0]) as f64;
    let threads = tiling::threads_per_block(program, b, tiles) as f64;
    let accumulators = tiling::accumulators(program, b, tiles) as f64;
    let shared = tiling::shared_bytes(space, program, b, tiles) as f64;
    let steps = tiling::level_product(program, b, tiles, IterKind::Reduce, &[0]) as f64;
    // Registers: ptxas gave 48-167 for 16 accumulators a thread and 110-255 for 64 on 24 sm_90
    // cubins of GMM (1, 512, 512, 512) candidates; a line through their middle.
    let registers = 1.5 * accumulators + 30.0;
    let at = placement(m, grid, threads, registers, shared);
    let warps = at.resident * (threads / 32.0).ceil();
    let unrolled = if genome.unroll > 0 { 1.0 } else { 0.9 };
    // The busiest SM's share of the work, at the rate its resident warps issue.
    let per_block = fmas / grid;
    let compute =
        at.busiest * per_block / (m.fma_per_sm * issue_efficiency(warps, accumulators) * unrolled);

    let bytes = |buffer: usize| program.buffers[buffer].element_bytes() as f64;
    // A cooperative fetch walks its region contiguously; narrower vectors issue more loads.
    let lanes = genome.lanes.get(&b).cloned().unwrap_or_default();
    let fetch_efficiency = if lanes.is_empty() {
        1.0
    } else {
        lanes
            .iter()
            .map(|&l| 0.85 + 0.0375 * (l.min(4) as f64))
            .sum::<f64>()
            / lanes.len() as f64
    };
    let loaded = grid * steps * shared;
    let out_bytes: f64 = blk
        .writes
        .iter()
        .map(|w| program.buffers[w.buffer].elements() as f64 * bytes(w.buffer))
        .sum();
    let store_efficiency = sector_efficiency(inner_thread_run(program, b, tiles) * 4.0);
    // Too few SMs issuing loads cannot keep the memory busy.
    let bandwidth = m.dram_bytes * (2.0 * at.active_sms / m.sms).min(1.0);
    let memory =
        loaded / (bandwidth * fetch_efficiency) + out_bytes / (bandwidth * store_efficiency);

    // Each FMA reads its operands from shared memory once per reuse across the accumulators.
    let shared_reads = per_block * 2.0 * 4.0 / accumulators.sqrt().max(1.0);
    let conflicts = if inner_thread_run(program, b, tiles) >= 32.0 {
        1.0
    } else {
        2.0
    };
    let shared_time = at.busiest * shared_reads * conflicts / m.shared_bytes_per_sm;
    compute.max(memory).max(shared_time) + m.launch
}

/// Contiguous elements the threads of a warp cover along the innermost output dimension: the
/// thread tile of the last spatial loop.
fn inner_thread_run(program: &Program, b: usize, tiles: &[Vec<i64>]) -> f64 {
    program.blocks[b]
        .iter_vars
        .iter()
        .zip(tiles)
        .rfind(|(v, _)| v.kind == IterKind::Spatial)
        .map_or(1.0, |(_, f)| f[2] as f64)
}

/// The share of each 32-byte sector a warp uses when its 32 threads read `run` contiguous
/// bytes per step (1 when a warp covers whole sectors).
fn sector_efficiency(run: f64) -> f64 {
    (run / 32.0).clamp(1.0 / 8.0, 1.0)
}

/// A bound or cross-thread kernel: it streams its buffers once.
fn streaming_kernel(m: &GpuMachine, program: &Program, b: usize, threads: f64) -> f64 {
    let blk = &program.blocks[b];
    let iterations: f64 = blk.iter_vars.iter().map(|v| v.extent as f64).product();
    let bytes: f64 = blk
        .reads
        .iter()
        .chain(&blk.writes)
        .map(|a| {
            program.buffers[a.buffer].elements() as f64
                * program.buffers[a.buffer].element_bytes() as f64
        })
        .sum();
    let grid = (iterations / threads).ceil();
    let at = placement(m, grid, threads, 32.0, 0.0);
    let warps = at.resident * (threads / 32.0).ceil();
    let efficiency =
        issue_efficiency(warps, 2.0) * (at.active_sms / m.sms) * sector_efficiency(threads * 4.0);
    bytes / (m.dram_bytes * efficiency) + m.launch
}
