//! Per-store features, the same 164 values per stored buffer as MetaSchedule's
//! `PerStoreFeature` (CPU targets), computed on the schedule engine's state.
//!
//! * [`lower`] — what TVM's pre-extraction lowering passes do to the loop nest and buffers.
//! * [`index`] — integer index expressions in the form TVM's simplifier leaves them.
//! * [`arith`] — group 1: op counts and loop kinds (57 values).
//! * [`access`] — group 2: buffer accesses, top 5 buffers (90 values).
//! * [`intensity`] — group 3: the arithmetic intensity curve (10 values).
//! * [`alloc`] — groups 4 and 5: allocation and outer loops (4 + 3 values).
//! * [`code_size`] — not a PerStoreFeature: the code LLVM gets after vectorization and
//!   unrolling, which its build time follows.
//!
//! One row per buffer that a store writes with a non-literal value, in the order of the first
//! such store; the row describes the last store to that buffer (as in TVM).

pub mod access;
pub mod alloc;
pub mod arith;
pub mod code_size;
pub mod index;
pub mod intensity;
pub mod lower;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::gpu_target::GpuTarget;
use crate::program::{dtype_bits, Program};
use crate::schedule::{trace, State, Trace};
use lower::{LLoop, Lowered};

/// Length of one feature row.
pub const N_FEATURES: usize = 164;
const BUFFERS_PER_STORE: usize = 5;
const CURVE_SAMPLES: usize = 10;
const CACHE_LINE_BYTES: i64 = 64;

/// `log2(|x| + 1)`, TVM's feature scale.
pub fn slog(x: f64) -> f64 {
    (x.abs() + 1.0).log2()
}

/// The loops around one store.
pub struct LoopNest {
    pub loops: Vec<LLoop>,
    /// Ids of the loops (indices into [`Lowered::loops`]).
    pub ids: Vec<usize>,
    /// Product of the extents.
    pub prod: i64,
    pub is_gpu: bool,
}

fn storage_bytes(dtype: &str) -> i64 {
    (dtype_bits(dtype) / 8).max(1)
}

/// The feature rows of one scheduled state, row-major, `N_FEATURES` values each.
pub fn extract_state(st: &State) -> Result<Vec<f32>> {
    let low = lower::lower(st)?;
    Ok(rows(st, &low, false))
}

/// [`extract_state`] for a GPU target: TVM's lowering for GPUs ([`lower::lower_for`]) and the
/// thread extents of group 1.
pub fn extract_state_gpu(st: &State) -> Result<Vec<f32>> {
    let low = lower::lower_for(st, true)?;
    Ok(rows(st, &low, true))
}

fn rows(st: &State, low: &Lowered, is_gpu: bool) -> Vec<f32> {
    let n_buffers = st.buffers.len() + low.extra_buffers.len();
    let buffer = |b: usize| low.buffer(st, b);
    let bytes: Vec<i64> = (0..n_buffers)
        .map(|b| storage_bytes(&buffer(b).dtype))
        .collect();
    let is_float: Vec<bool> = (0..n_buffers)
        .map(|b| {
            let d = &buffer(b).dtype;
            d.starts_with("float") || d.starts_with("bfloat")
        })
        .collect();
    let info = |b: usize| access::BufferInfo {
        shape: &low.shapes[b],
        bytes: bytes[b],
        name: &buffer(b).name,
    };
    let allocation = |b: usize| -> Option<alloc::Allocation> {
        let numel = |shape: &[i64]| shape.iter().fold(1i64, |a, &d| a.saturating_mul(d));
        if st.is_param(b) {
            let n = numel(&st.buffers[b].shape);
            return Some(alloc::Allocation {
                bytes: n.saturating_mul(bytes[b]),
                numel: n,
                outer_prod: 1,
            });
        }
        low.allocs.iter().find(|a| a.buffer == b).map(|a| {
            let n = numel(&low.shapes[b]);
            alloc::Allocation {
                bytes: n.saturating_mul(bytes[b]),
                numel: n,
                outer_prod: a
                    .loops
                    .iter()
                    .fold(1i64, |p, &l| p.saturating_mul(low.loops[l].extent)),
            }
        })
    };
    let mut touched = access::Touched::default();
    let mut order: Vec<usize> = Vec::new();
    let mut row_of: HashMap<usize, Vec<f64>> = HashMap::new();
    for s in &low.stores {
        if s.constant {
            continue;
        }
        let nest = LoopNest {
            loops: s.loops.iter().map(|&l| low.loops[l].clone()).collect(),
            ids: s.loops.clone(),
            prod: s
                .loops
                .iter()
                .fold(1i64, |p, &l| p.saturating_mul(low.loops[l].extent)),
            is_gpu,
        };
        let mut v = Vec::with_capacity(N_FEATURES);
        let ops = arith::ArithOps::of_value(&s.value, nest.prod as f64, &|b| is_float[b]);
        arith::export(&ops, &nest, &mut v);
        let acc = access::analyze(
            s.buffer,
            &s.indices,
            &s.value,
            &nest,
            &info,
            CACHE_LINE_BYTES,
            &mut touched,
        );
        acc.export(BUFFERS_PER_STORE, &mut v);
        v.extend(intensity::curve(
            CURVE_SAMPLES,
            &nest,
            &acc.for_touched_bytes,
            ops.float_total(),
        ));
        alloc::export_alloc(allocation(s.buffer), nest.prod, &mut v);
        alloc::export_outer(&nest, &mut v);
        debug_assert_eq!(v.len(), N_FEATURES);
        if !row_of.contains_key(&s.buffer) {
            order.push(s.buffer);
        }
        row_of.insert(s.buffer, v);
    }
    order
        .iter()
        .flat_map(|b| row_of[b].iter().map(|&x| x as f32))
        .collect()
}

/// Replays each trace on the program and reads `read` off its state, in parallel; the result
/// does not depend on the thread count. Without `postprocess` the trace's own postprocessing
/// instructions are replayed (a schedule's trace after MetaSchedule's postprocessors); with it,
/// they are skipped and fastsearch's postprocessors run instead (a trace as stored in a
/// database, or a candidate's key, which has none): MetaSchedule's CUDA set for a `gpu`
/// target, else its CPU set.
fn read_replayed<T: Send>(
    program: &Program,
    traces: &[String],
    postprocess: bool,
    gpu: Option<&GpuTarget>,
    read: impl Fn(&State) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    read_made(
        program,
        traces,
        |t| Trace::from_json(t).map(Some),
        postprocess,
        gpu,
        read,
    )
    .into_iter()
    .map(|r| r.and_then(|x| x.ok_or_else(|| Error::Internal("a text made no trace".into()))))
    .collect()
}

/// [`read_replayed`] of traces `make` builds from `sources`, each on the thread that replays
/// it; `None` where `make` has no trace for its source.
fn read_made<S: Sync, T: Send>(
    program: &Program,
    sources: &[S],
    make: impl Fn(&S) -> Result<Option<Trace>> + Sync,
    postprocess: bool,
    gpu: Option<&GpuTarget>,
    read: impl Fn(&State) -> Result<T> + Sync,
) -> Vec<Result<Option<T>>> {
    let base = State::from_program(program);
    map_with_caller(sources, |s| {
        let Some(trace) = make(s)? else {
            return Ok(None);
        };
        let mut st = base.clone()?;
        match gpu {
            Some(target) => trace::apply_trace_gpu(&mut st, &trace, target, postprocess)?,
            None => trace::apply_trace(&mut st, &trace, postprocess)?,
        }
        read(&st).map(Some)
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|| Err(Error::Internal("a candidate was not replayed".into()))))
    .collect()
}

/// The features of a replayed state: for a GPU target where `gpu` is given, else a CPU one.
fn extract_on(gpu: Option<&GpuTarget>) -> fn(&State) -> Result<Vec<f32>> {
    if gpu.is_some() {
        extract_state_gpu
    } else {
        extract_state
    }
}

/// `f` of each item, in order (every one `Some` once the call returns), computed by the calling
/// thread and rayon's workers together: the caller starts at once and the workers join as they
/// wake. On a 2-vCPU virtual machine, a batch of 24 conv candidates took 3.7 ms this way right
/// after other work, and 6.4 ms when the caller waited for the idle pool to wake and do it all.
fn map_with_caller<S: Sync, T: Send>(items: &[S], f: impl Fn(&S) -> T + Sync) -> Vec<Option<T>> {
    let next = AtomicUsize::new(0);
    let done: Vec<Mutex<Option<T>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let drain = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let value = f(item);
        *done[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
    };
    rayon::in_place_scope(|scope| {
        for _ in 1..rayon::current_num_threads().min(items.len()) {
            scope.spawn(|_| drain());
        }
        drain();
    });
    done.into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}

/// The features of the traces `make` builds from `sources` (a trace's postprocessing replayed,
/// as in [`extract_all`]; GPU features for a `gpu` target), each made on the thread that
/// replays it: `None` where `make` has no trace; the first that cannot be made or replayed
/// fails the batch, its index in the error.
pub fn extract_made<S: Sync>(
    program: &Program,
    sources: &[S],
    make: impl Fn(&S) -> Result<Option<Trace>> + Sync,
    gpu: Option<&GpuTarget>,
) -> Result<Vec<Option<Vec<f32>>>> {
    read_made(program, sources, make, false, gpu, extract_on(gpu))
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| naming_candidate(i, e)))
        .collect()
}

/// Replays each trace on the program and extracts its features ([`read_replayed`]).
pub fn extract_traces(
    program: &Program,
    traces: &[String],
    postprocess: bool,
) -> Vec<Result<Vec<f32>>> {
    extract_traces_on(program, traces, postprocess, None)
}

/// [`extract_traces`] for a target: a CUDA one where `gpu` is given (the trace replayed for
/// it, or its CUDA postprocessors run with `postprocess`, and the features TVM extracts for
/// GPU targets), else a CPU one.
pub fn extract_traces_on(
    program: &Program,
    traces: &[String],
    postprocess: bool,
    gpu: Option<&GpuTarget>,
) -> Vec<Result<Vec<f32>>> {
    read_replayed(program, traces, postprocess, gpu, extract_on(gpu))
}

/// Replays each trace on the program and measures its code ([`code_size::code_size`],
/// [`read_replayed`]).
pub fn code_sizes(
    program: &Program,
    traces: &[String],
    postprocess: bool,
) -> Vec<Result<code_size::CodeSize>> {
    read_replayed(program, traces, postprocess, None, code_size::code_size)
}

/// The lowered program the features of one trace are read from, as text: the loops and stores
/// after the modelled lowering passes, for reading why a feature has its value.
pub fn lowered_text(program: &Program, trace_json: &str) -> Result<String> {
    lowered_text_on(program, trace_json, None)
}

/// [`lowered_text`] for a target: a CUDA one where `gpu` is given (TVM's lowering for GPUs).
pub fn lowered_text_on(
    program: &Program,
    trace_json: &str,
    gpu: Option<&GpuTarget>,
) -> Result<String> {
    let mut st = State::from_program(program)?;
    let trace = Trace::from_json(trace_json)?;
    match gpu {
        Some(target) => trace::apply_trace_gpu(&mut st, &trace, target, false)?,
        None => trace::apply_trace(&mut st, &trace, false)?,
    }
    Ok(lower::lower_for(&st, gpu.is_some())?.text(&st))
}

/// [`extract_traces`] from JSON, failing on the first candidate that fails (naming it): the
/// features concatenated, with each trace's row count.
pub fn extract_from_json(program_json: &str, traces: &[String]) -> Result<(Vec<f32>, Vec<usize>)> {
    let each = extract_all(&Program::from_json(program_json)?, traces)?;
    let counts = each.iter().map(|rows| rows.len() / N_FEATURES).collect();
    Ok((each.concat(), counts))
}

/// The features of every trace on `program` (row-major, [`N_FEATURES`] per row), one vector per
/// trace; the first trace that cannot be replayed fails the batch, its index in the error.
pub fn extract_all(program: &Program, traces: &[String]) -> Result<Vec<Vec<f32>>> {
    extract_all_on(program, traces, None)
}

/// [`extract_all`] for a target: a CUDA one where `gpu` is given ([`extract_traces_on`]).
pub fn extract_all_on(
    program: &Program,
    traces: &[String],
    gpu: Option<&GpuTarget>,
) -> Result<Vec<Vec<f32>>> {
    extract_traces_on(program, traces, false, gpu)
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| naming_candidate(i, e)))
        .collect()
}

/// `e`, its message prefixed with the candidate it came from.
fn naming_candidate(i: usize, e: Error) -> Error {
    match e {
        Error::Schedule {
            instruction,
            message,
        } => Error::Schedule {
            instruction,
            message: format!("candidate {i}: {message}"),
        },
        Error::InvalidTrace(m) => Error::InvalidTrace(format!("candidate {i}: {m}")),
        Error::Unsupported(m) => Error::Unsupported(format!("candidate {i}: {m}")),
        Error::Malformed(m) => Error::Malformed(format!("candidate {i}: {m}")),
        Error::Internal(m) => Error::Internal(format!("candidate {i}: {m}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn caller_and_workers_map_every_item_in_order() {
        let items: Vec<u64> = (0..101).collect();
        for threads in [1, 2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            // On a pool of each size: every item once, in order.
            let outside = pool.install(|| map_with_caller(&items, |x| x * x));
            let expected: Vec<Option<u64>> = items.iter().map(|x| Some(x * x)).collect();
            assert_eq!(outside, expected, "{threads} threads");
            assert!(map_with_caller(&[] as &[u64], |x| *x).is_empty());
        }
    }

    fn fixture() -> Vec<(Program, Vec<String>)> {
        let path = format!(
            "{}/tests/fixtures/features_candidates.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v.as_object()
            .unwrap()
            .values()
            .map(|c| {
                let p = Program::from_json(&c["program"].to_string()).unwrap();
                let t = c["traces"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap().to_string())
                    .collect();
                (p, t)
            })
            .collect()
    }

    #[test]
    fn slog_is_log2_of_magnitude_plus_one() {
        assert_eq!(slog(0.0), 0.0);
        assert_eq!(slog(1.0), 1.0);
        assert_eq!(slog(-3.0), 2.0);
    }

    #[test]
    fn every_candidate_gives_full_finite_rows() {
        for (program, traces) in fixture() {
            for rows in extract_traces(&program, &traces, false) {
                let rows = rows.unwrap();
                assert!(!rows.is_empty());
                assert_eq!(rows.len() % N_FEATURES, 0);
                assert!(rows.iter().all(|x| x.is_finite()));
            }
        }
    }

    #[test]
    fn same_rows_on_any_thread_count() {
        for (program, traces) in fixture() {
            let run = |n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap()
                    .install(|| extract_traces(&program, &traces, false))
            };
            assert_eq!(run(1), run(3));
        }
    }

    #[test]
    fn malformed_traces_are_errors() {
        let (program, _) = fixture().remove(0);
        let bad = vec![
            "[".to_string(),
            "[[[\"Split\", [\"l9\"], [], []]], []]".to_string(),
        ];
        for r in extract_traces(&program, &bad, false) {
            assert!(r.is_err());
        }
    }
}
