//! `Target`: the CPU facts the search and the analytical model use, built once per task.

use fastsearch_core::CpuTarget;
use pyo3::prelude::*;

/// A CPU target as the search sees it: cores, SIMD width in bytes (32 for AVX2, 64 for
/// AVX-512), vector FMAs per cycle, and the parallel speedup with every core busy (default:
/// `num_cores`; less where the runtime runs fewer threads).
#[pyclass(frozen, module = "fastsearch._core", name = "Target")]
pub struct Target {
    pub cpu: CpuTarget,
}

#[pymethods]
impl Target {
    #[new]
    #[pyo3(signature = (num_cores, *, vector_bytes = 32, fma_per_cycle = 2.0, parallel_speedup = None))]
    #[pyo3(
        text_signature = "(num_cores, *, vector_bytes=32, fma_per_cycle=2.0, parallel_speedup=None)"
    )]
    fn new(
        num_cores: i64,
        vector_bytes: i64,
        fma_per_cycle: f64,
        parallel_speedup: Option<f64>,
    ) -> Self {
        Target {
            cpu: CpuTarget::new(num_cores)
                .with_vector_bytes(vector_bytes)
                .with_fma_per_cycle(fma_per_cycle)
                .with_parallel_speedup(parallel_speedup),
        }
    }

    #[getter]
    fn num_cores(&self) -> i64 {
        self.cpu.num_cores
    }

    #[getter]
    fn vector_bytes(&self) -> i64 {
        self.cpu.vector_bytes
    }

    #[getter]
    fn fma_per_cycle(&self) -> f64 {
        self.cpu.fma_per_cycle
    }

    #[getter]
    fn parallel_speedup(&self) -> f64 {
        self.cpu.parallel_speedup
    }

    fn __repr__(&self) -> String {
        format!(
            "Target(num_cores={}, vector_bytes={}, fma_per_cycle={}, parallel_speedup={})",
            self.cpu.num_cores,
            self.cpu.vector_bytes,
            self.cpu.fma_per_cycle,
            self.cpu.parallel_speedup
        )
    }
}
