//! fastsearch-core: the search engine of fastsearch, with no Python in it.
//!
//! The modules are private; what a caller uses is re-exported here, by stage:
//!
//! * **Program model** — [`Program`], imported from the JSON that fastsearch's Python side
//!   writes for a TIR function (blocks, loops, buffers, accesses), and its [`program_summary`].
//! * **Schedule engine** — MetaSchedule instructions applied on the model: [`Trace`] (a trace
//!   in MetaSchedule's JSON form), [`apply_trace`] and [`apply_trace_to`].
//! * **Sketches** — Ansor-style sketch generation and random annotation for CPU:
//!   [`SketchSpace`], [`Genome`], [`CpuTarget`], [`sample_traces`], [`sample_genomes`], [`emit`],
//!   [`mutate`], and warm starts from other shapes ([`transfer`], [`transfer_from_sibling`]);
//!   for CUDA GPUs, MetaSchedule's CUDA rules with tile sizes drawn within a [`GpuTarget`]'s
//!   limits: [`GpuSketchSpace`], [`GpuGenome`], [`GpuRule`], [`sample_gpu`],
//!   [`sample_gpu_genomes`], [`emit_gpu`], [`mutate_gpu`].
//! * **Scoring** — the analytical model ([`estimate_cycles`], [`analytical_scores`]), the
//!   trained [`Forest`], and the two combined ([`HybridScorer`]); for GPUs, an analytical
//!   cold-start model ([`estimate_gpu`]).
//! * **Search** — [`evolve`] and [`anneal`] over a [`SearchContext`], proposing a batch to
//!   measure; [`evolve_gpu`] for GPU candidates, which proposes valid ones only.
//! * **Features** — MetaSchedule's per-store features computed on the engine:
//!   [`extract_traces`], [`extract_all`], [`extract_from_json`], and the [`lowered_text`] they
//!   are read from; and the size of the code LLVM is handed ([`code_sizes`], [`CodeSize`]),
//!   which its build time follows.
//! * **Partition** — fusion groups of a whole model with the rules of TVM's Relax FuseOps:
//!   [`partition`], [`partition_json`], [`fusion_proposals`], [`merge_groups`].
//! * [`Rng`] — the deterministic random number generator every sampler uses.
//!
//! Every fallible entry point returns [`Result`], whose [`Error`] says which input was wrong.
#![warn(missing_docs)]

mod error;
mod features;
mod gpu_target;
mod model;
mod partition;
mod program;
mod rng;
mod schedule;
mod search;
mod sketch;
mod verify_gpu;

pub use error::{Error, Result};
pub use features::code_size::{CodeSize, CODE_SIZE_NAMES};
pub use features::{
    code_sizes, extract_all, extract_all_on, extract_from_json, extract_made, extract_traces,
    extract_traces_on, lowered_text, lowered_text_on, N_FEATURES,
};
pub use gpu_target::GpuTarget;
pub use model::analytical::{estimate_cycles, score as analytical_scores};
pub use model::gpu::estimate_gpu;
pub use model::sketch_features::{sketch_features, SKETCH_FEATURES, SKETCH_FEATURE_NAMES};
pub use model::{Forest, HybridScorer};
pub use partition::{
    merge_groups, partition, partition_json, proposals as fusion_proposals, Graph, OpNode,
    OpPattern, Partition, PartitionConfig, Proposal as FusionProposal,
    ProposalKind as FusionProposalKind, DEFAULT_MAX_FUSE_DEPTH,
};
pub use program::{summary as program_summary, Program};
pub use rng::Rng;
pub use schedule::{apply_trace, apply_trace_to, apply_trace_to_gpu, Trace};
pub use search::annealing::{anneal, AnnealingConfig};
pub use search::evolution::{evolve, EvolutionConfig};
pub use search::gpu::{evolve_gpu, GpuEvolutionConfig, GpuProposal, GpuScore};
pub use search::{coarse_shape, reduction_split, structure, Proposal, Role, Scorer, SearchContext};
pub use sketch::{
    emit, emit_gpu, mutate, mutate_gpu, sample as sample_traces, sample_genomes, sample_gpu,
    sample_gpu_genomes, transfer, transfer_from_sibling, CpuTarget, Genome, GpuGenome, GpuRule,
    GpuSketchSpace, Partial, Rule, SketchSpace, WriteCache,
};
pub use verify_gpu::{verify_trace_gpu, verify_traces_gpu};
