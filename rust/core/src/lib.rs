//! fastsearch-core: the search engine of fastsearch, with no Python in it.
//!
//! * [`program`] — the program model imported from TIR (blocks, loops, buffers, accesses).
//! * [`schedule`] — the schedule engine: MetaSchedule instructions applied on the model,
//!   traces read and written in MetaSchedule's JSON.
//! * [`sketch`] — Ansor-style sketch generation and random annotation for CPU.
//! * [`partition`] — fusion groups of a whole model, with the rules of TVM's Relax FuseOps.
//! * [`rng`] — the deterministic random number generator every sampler uses.

pub mod error;
pub mod features;
pub mod model;
pub mod partition;
pub mod program;
pub mod rng;
pub mod schedule;
pub mod search;
pub mod sketch;

pub use error::{Error, Result};
