//! `fastsearch._core`: the thin PyO3 layer over fastsearch-core.
//!
//! Each entry point extracts its arguments, releases the GIL for the work, catches any panic
//! (reported as `InternalError`, never as a Rust panic in Python) and maps core errors to the
//! `FastsearchError` hierarchy.

use std::panic::{catch_unwind, AssertUnwindSafe};

use std::collections::HashSet;

use fastsearch_core::program::Program;
use fastsearch_core::sketch::{self, CpuTarget};
use fastsearch_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

create_exception!(
    _core,
    FastsearchError,
    PyException,
    "Base class of every error fastsearch raises."
);
create_exception!(
    _core,
    UnsupportedWorkload,
    FastsearchError,
    "The workload uses a construct fastsearch cannot model."
);
create_exception!(
    _core,
    ScheduleError,
    FastsearchError,
    "A schedule instruction is invalid on the program."
);
create_exception!(
    _core,
    InvalidTrace,
    FastsearchError,
    "A trace or its JSON cannot be read."
);
create_exception!(
    _core,
    MalformedInput,
    FastsearchError,
    "Input JSON handed to the core is malformed."
);
create_exception!(
    _core,
    InternalError,
    FastsearchError,
    "A bug in fastsearch: please report it."
);

fn to_py(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::Unsupported(_) => UnsupportedWorkload::new_err(msg),
        Error::Malformed(_) => MalformedInput::new_err(msg),
        Error::Schedule { .. } => ScheduleError::new_err(msg),
        Error::InvalidTrace(_) => InvalidTrace::new_err(msg),
        Error::Internal(_) => InternalError::new_err(msg),
    }
}

/// Runs `work` without the GIL, turning a panic into `InternalError`.
fn guarded<T: Send>(
    py: Python<'_>,
    what: &str,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match outcome {
        Ok(result) => result.map_err(to_py),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(InternalError::new_err(format!("{what}: {detail}")))
        }
    }
}

/// Imports a program model (the JSON `fastsearch.tir_import` writes) and returns a JSON summary:
/// its blocks with their iteration kinds, loops and arithmetic.
#[pyfunction]
fn program_summary(py: Python<'_>, program_json: String) -> PyResult<String> {
    guarded(py, "program_summary", move || {
        let program = Program::from_json(&program_json)?;
        Ok(fastsearch_core::program::summary(&program).to_string())
    })
}

/// Replays a MetaSchedule trace (the JSON of `Trace.as_json()`) on a program model and returns
/// the JSON loop-nest description of the result. With `postprocess`, the trace's instructions
/// after `EnterPostproc` are skipped and the engine's own CPU postprocessors
/// (RewriteParallelVectorizeUnroll, RewriteReductionBlock) run instead.
#[pyfunction]
#[pyo3(signature = (program_json, trace_json, postprocess = false))]
fn apply_trace(
    py: Python<'_>,
    program_json: String,
    trace_json: String,
    postprocess: bool,
) -> PyResult<String> {
    guarded(py, "apply_trace", move || {
        fastsearch_core::schedule::apply_trace(&program_json, &trace_json, postprocess)
    })
}

/// Draws up to `n` distinct candidates from fastsearch's CPU sketches, as MetaSchedule trace
/// JSON strings (before postprocessing), skipping those in `exclude`.
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, n, seed, exclude=Vec::new()))]
fn sample_sketches(
    py: Python<'_>,
    program_json: String,
    num_cores: i64,
    n: usize,
    seed: u64,
    exclude: Vec<String>,
) -> PyResult<Vec<String>> {
    guarded(py, "sample_sketches", move || {
        let program = Program::from_json(&program_json)?;
        let target = CpuTarget {
            num_cores: num_cores.max(1),
        };
        let exclude: HashSet<String> = exclude.into_iter().collect();
        Ok(sketch::sample(&program, &target, n, seed, &exclude))
    })
}

/// Replays each trace (MetaSchedule trace JSON, postprocessing included) on the program and
/// extracts MetaSchedule's per-store features, 164 float32 values per stored buffer, in
/// parallel. Returns every row in one native-endian float32 buffer and the number of rows of
/// each candidate; `fastsearch.features` turns them into arrays without copying.
#[pyfunction]
fn extract_features(
    py: Python<'_>,
    program_json: String,
    trace_jsons: Vec<String>,
) -> PyResult<(Py<PyBytes>, Vec<usize>)> {
    let (data, counts) = guarded(py, "extract_features", move || {
        fastsearch_core::features::extract_from_json(&program_json, &trace_jsons)
    })?;
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_ne_bytes()).collect();
    Ok((PyBytes::new(py, &bytes).unbind(), counts))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FastsearchError", py.get_type::<FastsearchError>())?;
    m.add("UnsupportedWorkload", py.get_type::<UnsupportedWorkload>())?;
    m.add("ScheduleError", py.get_type::<ScheduleError>())?;
    m.add("InvalidTrace", py.get_type::<InvalidTrace>())?;
    m.add("MalformedInput", py.get_type::<MalformedInput>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(program_summary, m)?)?;
    m.add_function(wrap_pyfunction!(apply_trace, m)?)?;
    m.add_function(wrap_pyfunction!(sample_sketches, m)?)?;
    m.add_function(wrap_pyfunction!(extract_features, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
