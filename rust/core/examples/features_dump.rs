//! Prints the lowered program the per-store features are read from, and the feature rows:
//! `cargo run --release --example features_dump -- program.json trace.json`.

use fastsearch_core::{extract_all, lowered_text, Program, N_FEATURES};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, program, trace_path] = args.as_slice() else {
        return Err("usage: features_dump PROGRAM_JSON TRACE_JSON".into());
    };
    let program = Program::from_json(&std::fs::read_to_string(program)?)?;
    let trace = std::fs::read_to_string(trace_path)?;
    print!("{}", lowered_text(&program, &trace)?);
    for rows in extract_all(&program, std::slice::from_ref(&trace))? {
        for row in rows.chunks(N_FEATURES) {
            println!("{row:?}");
        }
    }
    Ok(())
}
