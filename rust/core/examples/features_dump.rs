//! Prints the lowered program the per-store features are read from, and the feature rows:
//! `cargo run --release --example features_dump -- program.json trace.json`.

use fastsearch_core::features::{self, lower};
use fastsearch_core::program::Program;
use fastsearch_core::schedule::{trace, State, Trace};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, program, trace_path] = args.as_slice() else {
        return Err("usage: features_dump PROGRAM_JSON TRACE_JSON".into());
    };
    let program = Program::from_json(&std::fs::read_to_string(program)?)?;
    let tr = Trace::from_json(&std::fs::read_to_string(trace_path)?)?;
    let mut st = State::from_program(&program)?;
    trace::apply_trace(&mut st, &tr, false)?;
    let low = lower::lower(&st)?;
    print!("{}", low.text(&st));
    let rows = features::extract_state(&st)?;
    for row in rows.chunks(features::N_FEATURES) {
        println!("{row:?}");
    }
    Ok(())
}
