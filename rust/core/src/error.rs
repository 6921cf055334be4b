//! Errors of the core, one variant per kind the Python side maps to its own exception.

use thiserror::Error;

/// Why a call into the core failed; the Python side maps each variant to its own exception.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// The program uses a construct the model cannot represent.
    #[error("unsupported workload: {0}")]
    Unsupported(String),
    /// The input JSON does not describe a program, trace or graph.
    #[error("malformed input: {0}")]
    Malformed(String),
    /// A schedule instruction is invalid on the program (TVM refuses it too).
    #[error("schedule error in {instruction}: {message}")]
    Schedule {
        /// The instruction's kind, as MetaSchedule names it (`Split`, `ComputeAt`, ...).
        instruction: String,
        /// What is wrong with it.
        message: String,
    },
    /// A trace cannot be read.
    #[error("invalid trace: {0}")]
    InvalidTrace(String),
    /// A bug in fastsearch: an invariant does not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The result of every fallible call of the core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Schedule`] for `instruction`.
    pub fn schedule(instruction: &str, message: impl Into<String>) -> Self {
        Error::Schedule {
            instruction: instruction.to_string(),
            message: message.into(),
        }
    }
}
