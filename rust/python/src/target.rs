//! `Target`: the CPU facts the search and the analytical model use, built once per task;
//! `GpuTarget`: a CUDA target's limits, for the schedule engine's CUDA postprocessors.

use fastsearch_core::{CpuTarget, GpuTarget};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A CPU target as the search sees it: cores, SIMD width in bytes (32 for AVX2, 64 for
/// AVX-512), vector FMAs per cycle, the parallel speedup with every core busy (default:
/// `num_cores`; less where the runtime runs fewer threads), and the architectural vector
/// registers (default: x86-64's for that width, 32 with AVX-512, else 16).
#[pyclass(frozen, module = "fastsearch._core", name = "Target")]
pub struct Target {
    pub cpu: CpuTarget,
}

#[pymethods]
impl Target {
    #[new]
    #[pyo3(signature = (
        num_cores, *, vector_bytes = 32, fma_per_cycle = 2.0, parallel_speedup = None, vector_registers = None
    ))]
    #[pyo3(
        text_signature = "(num_cores, *, vector_bytes=32, fma_per_cycle=2.0, parallel_speedup=None, vector_registers=None)"
    )]
    fn new(
        num_cores: i64,
        vector_bytes: i64,
        fma_per_cycle: f64,
        parallel_speedup: Option<f64>,
        vector_registers: Option<i64>,
    ) -> Self {
        let mut cpu = CpuTarget::new(num_cores)
            .with_vector_bytes(vector_bytes)
            .with_fma_per_cycle(fma_per_cycle)
            .with_parallel_speedup(parallel_speedup);
        if let Some(registers) = vector_registers {
            cpu = cpu.with_vector_registers(registers);
        }
        Target { cpu }
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

    #[getter]
    fn vector_registers(&self) -> i64 {
        self.cpu.vector_registers
    }

    fn __repr__(&self) -> String {
        format!(
            "Target(num_cores={}, vector_bytes={}, fma_per_cycle={}, parallel_speedup={}, vector_registers={})",
            self.cpu.num_cores,
            self.cpu.vector_bytes,
            self.cpu.fma_per_cycle,
            self.cpu.parallel_speedup,
            self.cpu.vector_registers
        )
    }
}

/// A CUDA target as the schedule engine sees it: the limits MetaSchedule's CUDA postprocessors
/// read (threads per block, warp size, shared memory per block in bytes).
#[pyclass(frozen, module = "fastsearch._core", name = "GpuTarget")]
pub struct PyGpuTarget {
    pub gpu: GpuTarget,
}

#[pymethods]
impl PyGpuTarget {
    #[new]
    #[pyo3(signature = (*, max_threads_per_block, warp_size, max_shared_memory_per_block))]
    #[pyo3(text_signature = "(*, max_threads_per_block, warp_size, max_shared_memory_per_block)")]
    fn new(
        max_threads_per_block: i64,
        warp_size: i64,
        max_shared_memory_per_block: i64,
    ) -> PyResult<Self> {
        for (name, v) in [
            ("max_threads_per_block", max_threads_per_block),
            ("warp_size", warp_size),
            ("max_shared_memory_per_block", max_shared_memory_per_block),
        ] {
            if v <= 0 {
                return Err(PyValueError::new_err(format!(
                    "{name} must be positive, got {v}"
                )));
            }
        }
        Ok(PyGpuTarget {
            gpu: GpuTarget::new(
                max_threads_per_block,
                warp_size,
                max_shared_memory_per_block,
            ),
        })
    }

    #[getter]
    fn max_threads_per_block(&self) -> i64 {
        self.gpu.max_threads_per_block
    }

    #[getter]
    fn warp_size(&self) -> i64 {
        self.gpu.warp_size
    }

    #[getter]
    fn max_shared_memory_per_block(&self) -> i64 {
        self.gpu.max_shared_memory_per_block
    }

    fn __repr__(&self) -> String {
        format!(
            "GpuTarget(max_threads_per_block={}, warp_size={}, max_shared_memory_per_block={})",
            self.gpu.max_threads_per_block,
            self.gpu.warp_size,
            self.gpu.max_shared_memory_per_block
        )
    }
}
