//! The exception tree every entry point raises, and [`guarded`], the one way into the core:
//! the work runs on its own thread with the GIL released, a panic becomes `InternalError`, core
//! errors map to their exception class, and Ctrl-C interrupts the wait.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use fastsearch_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

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

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FastsearchError", py.get_type::<FastsearchError>())?;
    m.add("UnsupportedWorkload", py.get_type::<UnsupportedWorkload>())?;
    m.add("ScheduleError", py.get_type::<ScheduleError>())?;
    m.add("InvalidTrace", py.get_type::<InvalidTrace>())?;
    m.add("MalformedInput", py.get_type::<MalformedInput>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

pub fn to_py(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::Unsupported(_) => UnsupportedWorkload::new_err(msg),
        Error::Malformed(_) => MalformedInput::new_err(msg),
        Error::Schedule { .. } => ScheduleError::new_err(msg),
        Error::InvalidTrace(_) => InvalidTrace::new_err(msg),
        Error::Internal(_) => InternalError::new_err(msg),
    }
}

/// How often a waiting call looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Runs `work` on a thread of its own while the caller waits without the GIL, checking for
/// Ctrl-C (and any other pending signal) every [`SIGNAL_POLL`]. On KeyboardInterrupt the call
/// returns at once; the work cannot be stopped midway, so it finishes in the background and its
/// result is dropped. A panic is `InternalError` naming `what`, never a Rust panic in Python.
pub fn guarded<T: Send + 'static>(
    py: Python<'_>,
    what: &str,
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> PyResult<T> {
    let (done, outcome) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("fastsearch {what}"))
        .spawn(move || {
            let _ = done.send(catch_unwind(AssertUnwindSafe(work)));
        })
        .map_err(|e| InternalError::new_err(format!("{what}: cannot start a thread: {e}")))?;
    let mut outcome = outcome;
    loop {
        // The receiver moves into the detached closure and back (it is Send, not Sync).
        let (received, back) = py.detach(move || (outcome.recv_timeout(SIGNAL_POLL), outcome));
        outcome = back;
        match received {
            Ok(Ok(result)) => return result.map_err(to_py),
            Ok(Err(panic)) => {
                let detail = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                return Err(InternalError::new_err(format!("{what}: {detail}")));
            }
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(InternalError::new_err(format!(
                    "{what}: the worker thread ended without a result"
                )))
            }
        }
    }
}
