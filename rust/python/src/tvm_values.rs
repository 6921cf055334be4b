//! Reads TVM's JSON-like values (a trace's `TraceAsJSON`: arrays of strings, integers, booleans,
//! floats, `IntImm` and `FloatImm`) straight from tvm-ffi's objects, through the stable C ABI of
//! `tvm/ffi/c_api.h`, and writes them as JSON text the engine reads.
//!
//! TVM's own writers cost about 0.1 ms a conv trace (a MetaSchedule database line) or 0.55 ms
//! (its JSON graph writer), most of a public `extract_features` call; `TraceAsJSON` and this
//! walk together about 0.07 ms, on any thread. The addresses come from live Python objects
//! that the caller keeps alive for the whole call, which returns only once every trace is read
//! (it cannot be interrupted midway), so no object is freed while it is read.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use rayon::prelude::*;

use crate::errors::{InternalError, MalformedInput};

// Type indices fixed by tvm-ffi's C ABI (`TVMFFITypeIndex`).
const NONE: i32 = 0;
const INT: i32 = 1;
const BOOL: i32 = 2;
const FLOAT: i32 = 3;
const SMALL_STR: i32 = 11;
const STR: i32 = 65;
const ARRAY: i32 = 71;

/// Deeper nesting than any trace has: a guard against a cycle or a wrong address.
const MAX_DEPTH: usize = 32;

/// `TVMFFIAny`: a type index, a small string's length, and an 8-byte payload.
#[repr(C)]
struct FfiAny {
    type_index: i32,
    small_str_len: u32,
    payload: u64,
}

/// `TVMFFIObject`, the header every object starts with.
#[repr(C)]
struct FfiObject {
    combined_ref_count: u64,
    type_index: i32,
    padding: u32,
    deleter: usize,
}

/// `TVMFFISeqCell`, which follows the header of an `ffi.Array`.
#[repr(C)]
struct SeqCell {
    data: *const FfiAny,
    size: i64,
    capacity: i64,
    data_deleter: usize,
}

/// `TVMFFIByteArray`, which follows the header of an `ffi.String`.
#[repr(C)]
struct ByteArray {
    data: *const u8,
    size: usize,
}

/// Where the two TVM scalar objects a trace may hold keep their value: a type index (registered
/// at run time) and the byte offset of the `value` field, from tvm-ffi's reflection.
#[derive(Clone, Copy)]
struct Scalars {
    int_imm: (i32, usize),
    float_imm: (i32, usize),
}

const HEADER: usize = std::mem::size_of::<FfiObject>();

/// Writes the value at `any` as JSON.
///
/// # Safety
/// `any` points at a live `TVMFFIAny` whose objects stay alive while it is read.
unsafe fn write_any(
    out: &mut Vec<u8>,
    any: &FfiAny,
    scalars: Scalars,
    depth: usize,
) -> Result<(), String> {
    match any.type_index {
        NONE => out.extend_from_slice(b"null"),
        INT => write_int(out, any.payload as i64),
        // TVM's database writer writes booleans as 0 and 1; so does this.
        BOOL => out.push(if any.payload != 0 { b'1' } else { b'0' }),
        FLOAT => write_float(out, f64::from_bits(any.payload))?,
        SMALL_STR => {
            let len = any.small_str_len as usize;
            if len > 8 {
                return Err(format!("a small string of {len} bytes"));
            }
            write_str(out, &any.payload.to_ne_bytes()[..len])?;
        }
        t if t >= 64 => write_object(
            out,
            any.payload as usize as *const FfiObject,
            scalars,
            depth,
        )?,
        t => return Err(format!("a value of type index {t}")),
    }
    Ok(())
}

/// Writes the object at `obj` as JSON.
///
/// # Safety
/// `obj` is null or points at a live tvm-ffi object whose children stay alive while it is read.
unsafe fn write_object(
    out: &mut Vec<u8>,
    obj: *const FfiObject,
    scalars: Scalars,
    depth: usize,
) -> Result<(), String> {
    if obj.is_null() {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    if depth > MAX_DEPTH {
        return Err(format!("values nested deeper than {MAX_DEPTH}"));
    }
    let base = obj.cast::<u8>();
    match (*obj).type_index {
        ARRAY => {
            let cell = &*base.add(HEADER).cast::<SeqCell>();
            if cell.size < 0 || cell.size > cell.capacity || (cell.size > 0 && cell.data.is_null())
            {
                return Err(format!(
                    "an array of size {} ({} allocated)",
                    cell.size, cell.capacity
                ));
            }
            out.push(b'[');
            for i in 0..cell.size as usize {
                if i > 0 {
                    out.push(b',');
                }
                write_any(out, &*cell.data.add(i), scalars, depth + 1)?;
            }
            out.push(b']');
        }
        STR => {
            let bytes = &*base.add(HEADER).cast::<ByteArray>();
            if bytes.data.is_null() && bytes.size > 0 {
                return Err("a string without data".into());
            }
            let data = if bytes.size == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(bytes.data, bytes.size)
            };
            write_str(out, data)?;
        }
        t if t == scalars.int_imm.0 => {
            // `IntImm.value` is a `BigInt`: a `TVMFFIAny` holding an int when it fits 64 bits.
            let value = &*base.add(scalars.int_imm.1).cast::<FfiAny>();
            match value.type_index {
                INT => write_int(out, value.payload as i64),
                t => return Err(format!("an IntImm whose value has type index {t}")),
            }
        }
        t if t == scalars.float_imm.0 => {
            write_float(out, *base.add(scalars.float_imm.1).cast::<f64>())?
        }
        t => return Err(format!("an object of type index {t}")),
    }
    Ok(())
}

fn write_int(out: &mut Vec<u8>, x: i64) {
    out.extend_from_slice(x.to_string().as_bytes());
}

fn write_float(out: &mut Vec<u8>, x: f64) -> Result<(), String> {
    let n = serde_json::Number::from_f64(x)
        .ok_or_else(|| format!("the number {x}, which JSON cannot hold"))?;
    out.extend_from_slice(n.to_string().as_bytes());
    Ok(())
}

fn write_str(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), String> {
    let s = std::str::from_utf8(bytes).map_err(|_| "a string that is not UTF-8".to_string())?;
    serde_json::to_writer(&mut *out, s).map_err(|e| e.to_string())
}

/// The tvm-ffi C functions [`TraceReader`] calls, by address: `TVMFFIFunctionCall`,
/// `TVMFFIObjectDecRef`, `TVMFFIErrorMoveFromRaised`.
type CallFn = unsafe extern "C" fn(*mut c_void, *mut FfiAny, i32, *mut FfiAny) -> i32;
type DecRefFn = unsafe extern "C" fn(*mut c_void) -> i32;
type MoveErrorFn = unsafe extern "C" fn(*mut *mut c_void);

/// Writes TVM traces as JSON text: TVM's `TraceAsJSON` called through tvm-ffi's C ABI, on any
/// thread, and its value read straight from tvm-ffi's objects. Built once in Python
/// (`fastsearch.ir.loop_nest`) and handed to every call that reads traces.
#[pyclass(frozen, module = "fastsearch._core", name = "TraceReader")]
#[derive(Clone, Copy)]
pub struct TraceReader {
    call: CallFn,
    decref: DecRefFn,
    move_error: MoveErrorFn,
    as_json: usize,
    trace_type: i32,
    scalars: Scalars,
}

#[pymethods]
impl TraceReader {
    /// A reader from what Python found: `trace_type`, the type index of `s_tir.Trace`;
    /// `as_json`, the address of the `TraceAsJSON` function object; `c_api`, the addresses of
    /// `TVMFFIFunctionCall`, `TVMFFIObjectDecRef` and `TVMFFIErrorMoveFromRaised`; `int_imm`
    /// and `float_imm`, `(type index, offset of the value field)` of `ir.IntImm` and
    /// `ir.FloatImm`, from tvm-ffi's reflection.
    ///
    /// Internal to fastsearch: the addresses must be those of live tvm-ffi functions.
    #[new]
    #[pyo3(signature = (*, trace_type, as_json, c_api, int_imm, float_imm))]
    pub fn new(
        trace_type: i32,
        as_json: usize,
        c_api: (usize, usize, usize),
        int_imm: (i32, usize),
        float_imm: (i32, usize),
    ) -> PyResult<TraceReader> {
        let fields = [
            ("int_imm", int_imm),
            ("float_imm", float_imm),
            ("trace_type", (trace_type, HEADER)),
        ];
        for (name, (index, offset)) in fields {
            if index < 64 || offset < HEADER || !offset.is_multiple_of(8) {
                return Err(MalformedInput::new_err(format!(
                    "{name} = ({index}, {offset}) is not an object type's field"
                )));
            }
        }
        let (call, decref, move_error) = c_api;
        if let Some(a) = [as_json, call, decref, move_error]
            .iter()
            .find(|&&a| a == 0)
        {
            return Err(MalformedInput::new_err(format!("{a:#x} is not an address")));
        }
        // SAFETY: the caller passes the addresses of these tvm-ffi C functions (docs above).
        let (call, decref, move_error) = unsafe {
            (
                std::mem::transmute::<usize, CallFn>(call),
                std::mem::transmute::<usize, DecRefFn>(decref),
                std::mem::transmute::<usize, MoveErrorFn>(move_error),
            )
        };
        Ok(TraceReader {
            call,
            decref,
            move_error,
            as_json,
            trace_type,
            scalars: Scalars { int_imm, float_imm },
        })
    }
}

impl TraceReader {
    /// The JSON text of the trace at `trace` (a `Trace`'s `__chandle__()`), or `None` where TVM
    /// fails on it or its value holds a kind a trace rarely holds (a map, an index map).
    ///
    /// # Safety
    /// `trace` is the address of a live tvm-ffi object that stays alive during the call.
    pub unsafe fn text(&self, trace: usize) -> Option<String> {
        if trace == 0 || (*(trace as *const FfiObject)).type_index != self.trace_type {
            return None;
        }
        let mut args = [
            FfiAny {
                type_index: self.trace_type,
                small_str_len: 0,
                payload: trace as u64,
            },
            FfiAny {
                type_index: BOOL,
                small_str_len: 0,
                payload: 0,
            },
        ];
        let mut result = FfiAny {
            type_index: NONE,
            small_str_len: 0,
            payload: 0,
        };
        if (self.call)(
            self.as_json as *mut c_void,
            args.as_mut_ptr(),
            2,
            &mut result,
        ) != 0
        {
            let mut error = std::ptr::null_mut();
            (self.move_error)(&mut error);
            if !error.is_null() {
                (self.decref)(error);
            }
            return None;
        }
        let mut out = Vec::with_capacity(4096);
        let written = write_any(&mut out, &result, self.scalars, 0);
        // The result is owned here: read, then released.
        if result.type_index >= 64 && result.payload != 0 {
            (self.decref)(result.payload as usize as *mut c_void);
        }
        written.ok()?;
        String::from_utf8(out).ok()
    }
}

/// The JSON text of each TVM trace at `traces` (each a `Trace`'s `__chandle__()`), in order, on
/// rayon's threads ([`TraceReader`]): `None` for a trace the caller writes with TVM's own
/// writer instead.
///
/// Internal to fastsearch: the caller passes only addresses of live tvm-ffi objects and keeps
/// the traces alive during the call, which holds the GIL and returns only once every trace is
/// read.
#[pyfunction]
pub fn tvm_trace_texts(reader: &TraceReader, traces: Vec<usize>) -> PyResult<Vec<Option<String>>> {
    let reader = *reader;
    // SAFETY: the caller keeps every trace alive until this returns.
    catch_unwind(AssertUnwindSafe(|| {
        traces
            .par_iter()
            .map(|&t| unsafe { reader.text(t) })
            .collect()
    }))
    .map_err(|_| InternalError::new_err("tvm_trace_texts: panicked"))
}
