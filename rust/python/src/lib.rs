//! `fastsearch._core`: the thin PyO3 layer over fastsearch-core.
//!
//! * [`errors`] — the `FastsearchError` tree and `guarded`, through which every call reaches
//!   the core (GIL released, panics caught, Ctrl-C honoured);
//! * [`program`] — `Program`, a task's program model parsed once, with its sketch space;
//! * [`target`] — `Target`, the CPU facts the search uses;
//! * [`forest`] — `Forest`, a learned cost model read once;
//! * [`partition`] — a whole model's fusion groups;
//! * [`tvm_values`] — TVM's JSON-like values (traces) read straight from tvm-ffi's objects.

mod errors;
mod forest;
mod partition;
mod program;
mod target;
mod tvm_values;

use pyo3::prelude::*;

// The engine allocates many small expression nodes per candidate; glibc's malloc took about
// half of feature extraction's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<program::Program>()?;
    m.add_class::<target::Target>()?;
    m.add_class::<target::PyGpuTarget>()?;
    m.add_class::<forest::Forest>()?;
    m.add_class::<tvm_values::TraceReader>()?;
    m.add_function(wrap_pyfunction!(partition::partition_graph, m)?)?;
    m.add_function(wrap_pyfunction!(partition::fusion_proposals, m)?)?;
    m.add_function(wrap_pyfunction!(partition::merge_fusion_groups, m)?)?;
    m.add_function(wrap_pyfunction!(tvm_values::tvm_trace_texts, m)?)?;
    m.add(
        "SKETCH_FEATURE_NAMES",
        fastsearch_core::SKETCH_FEATURE_NAMES.to_vec(),
    )?;
    m.add("CODE_SIZE_NAMES", fastsearch_core::CODE_SIZE_NAMES.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
