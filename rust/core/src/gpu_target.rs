//! A CUDA GPU as the schedule engine and MetaSchedule's CUDA postprocessors see it.

/// The limits of a CUDA target that scheduling checks: the attributes MetaSchedule's CUDA
/// postprocessors read from a TVM target (`max_threads_per_block`, `thread_warp_size`,
/// `max_shared_memory_per_block`), plus the two limits VerifyGPUCode fixes itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTarget {
    /// Threads a thread block may hold (1024 on every GPU since Fermi).
    pub max_threads_per_block: i64,
    /// Threads of a warp (32 on NVIDIA GPUs).
    pub warp_size: i64,
    /// Static shared memory a block may allocate, in bytes (48 KB without opting in).
    pub max_shared_memory_per_block: i64,
    /// Virtual threads a kernel may use (VerifyGPUCode's fixed 8).
    pub max_vthread: i64,
    /// Bytes a vectorized access may move at once (VerifyGPUCode's fixed 16).
    pub max_vector_bytes: i64,
}

impl GpuTarget {
    /// A target with the given limits and VerifyGPUCode's fixed vthread and vector limits.
    pub fn new(
        max_threads_per_block: i64,
        warp_size: i64,
        max_shared_memory_per_block: i64,
    ) -> Self {
        GpuTarget {
            max_threads_per_block,
            warp_size,
            max_shared_memory_per_block,
            max_vthread: 8,
            max_vector_bytes: 16,
        }
    }
}
