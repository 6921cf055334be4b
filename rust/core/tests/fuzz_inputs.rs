//! Fuzzing of the entry points that parse outside input: program import, trace JSON (parsed and
//! applied by the schedule engine, then features extracted), the partitioner's graph JSON and
//! XGBoost model JSON. Inputs are valid documents mutated at the JSON level (numbers replaced by
//! extreme or negative values, strings and types swapped, elements dropped or duplicated,
//! objects emptied) and at the byte level (truncation, byte flips). Every input must come back
//! as `Ok` or a typed `Err`; a panic fails the test.
//!
//! `cargo test --release --test fuzz_inputs` runs 20,000 inputs per entry point;
//! `FUZZ_INPUTS=250000 cargo test --release --test fuzz_inputs` runs a million in all.

use fastsearch_core::apply_trace;
use fastsearch_core::extract_from_json;
use fastsearch_core::Forest;
use fastsearch_core::Program;
use fastsearch_core::Rng;
use fastsearch_core::{partition_json, PartitionConfig};
use rayon::prelude::*;
use serde_json::{json, Value};

fn inputs_per_entry_point() -> u64 {
    std::env::var("FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("fixture")
}

/// Values that break naive code: extremes, negatives, zero, wrong types.
fn nasty(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(i64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1u64 << 40),
        5 => json!(1.5e300),
        6 => json!(""),
        7 => json!("b0"),
        8 => Value::Null,
        9 => json!([]),
        10 => json!({}),
        _ => json!(true),
    }
}

/// Mutates one randomly chosen place of `v` (depth-first walk to a random node).
fn mutate_value(v: &mut Value, rng: &mut Rng) {
    let descend = rng.chance(0.85);
    match v {
        Value::Array(items) if !items.is_empty() && descend => {
            let i = rng.below(items.len());
            mutate_value(&mut items[i], rng);
        }
        Value::Object(map) if !map.is_empty() && descend => {
            let i = rng.below(map.len());
            let key = map.keys().nth(i).cloned().expect("key");
            mutate_value(map.get_mut(&key).expect("value"), rng);
        }
        Value::Array(items) => match rng.below(4) {
            0 if !items.is_empty() => {
                items.remove(rng.below(items.len()));
            }
            1 if !items.is_empty() => {
                let i = rng.below(items.len());
                let dup = items[i].clone();
                items.insert(i, dup);
            }
            2 => items.push(nasty(rng)),
            _ => *v = nasty(rng),
        },
        Value::Object(map) => {
            if rng.chance(0.5) && !map.is_empty() {
                let i = rng.below(map.len());
                let key = map.keys().nth(i).cloned().expect("key");
                map.remove(&key);
            } else {
                *v = nasty(rng);
            }
        }
        Value::Number(n) => {
            *v = if rng.chance(0.5) {
                let x = n.as_i64().unwrap_or(1);
                json!(x.wrapping_add(rng.below(5) as i64 - 2))
            } else {
                nasty(rng)
            };
        }
        _ => *v = nasty(rng),
    }
}

/// A mutated document: 1-4 JSON-level mutations, sometimes followed by byte-level damage.
fn mutated(doc: &Value, rng: &mut Rng) -> String {
    let mut v = doc.clone();
    for _ in 0..1 + rng.below(4) {
        mutate_value(&mut v, rng);
    }
    let mut text = v.to_string();
    if rng.chance(0.1) {
        let mut bytes = text.into_bytes();
        if rng.chance(0.5) {
            bytes.truncate(rng.below(bytes.len() + 1));
        } else if !bytes.is_empty() {
            let i = rng.below(bytes.len());
            bytes[i] = rng.below(128) as u8;
        }
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

/// Runs `check` on `n` mutants of the seed documents, in parallel, each from its own generator.
fn fuzz(seed: u64, seeds: &[Value], n: u64, check: impl Fn(&str, usize) + Sync) {
    // FUZZ_FROM skips the first inputs: to bisect a failure to the one input that causes it.
    let from = std::env::var("FUZZ_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (from..n).into_par_iter().for_each(|i| {
        let mut rng = Rng::derive(seed, i);
        let which = rng.below(seeds.len());
        check(&mutated(&seeds[which], &mut rng), which);
    });
}

#[test]
fn program_import_never_panics() {
    let seeds: Vec<Value> = ["gmm_512.json", "cbr_small.json", "sfm_small.json"]
        .iter()
        .map(|f| serde_json::from_str(&fixture(f)).unwrap())
        .collect();
    fuzz(1, &seeds, inputs_per_entry_point(), |text, _| {
        let _ = Program::from_json(text);
    });
}

#[test]
fn trace_parsing_replay_and_features_never_panic() {
    let doc: Value = serde_json::from_str(&fixture("features_candidates.json")).unwrap();
    let mut programs = Vec::new();
    let mut traces = Vec::new();
    for (_, entry) in doc.as_object().unwrap() {
        let program = entry["program"].to_string();
        for t in entry["traces"].as_array().unwrap() {
            programs.push(program.clone());
            traces.push(t.clone());
        }
    }
    fuzz(2, &traces, inputs_per_entry_point(), |text, which| {
        let program = &programs[which];
        let _ = apply_trace(program, text, false);
        let _ = apply_trace(program, text, true);
        let _ = extract_from_json(program, &[text.to_string()]);
    });
}

#[test]
fn partition_graph_never_panics() {
    let graph = json!({"nodes": [
        {"name": "conv", "pattern": 4, "inputs": [], "external": false},
        {"name": "add", "pattern": 1, "inputs": [0], "external": false},
        {"name": "relu", "pattern": 0, "inputs": [1], "external": false},
        {"name": "sum", "pattern": 3, "inputs": [2], "external": false},
        {"name": "tuple", "pattern": 7, "inputs": [2, 3], "external": false},
        {"name": "reshape", "pattern": 2, "inputs": [2], "external": false},
        {"name": "sort", "pattern": 8, "inputs": [5], "external": false},
        {"name": "mul", "pattern": 0, "inputs": [6, 2], "external": true}
    ]});
    fuzz(3, &[graph], inputs_per_entry_point(), |text, _| {
        for depth in [1, 2, 256] {
            let _ = partition_json(
                text,
                &PartitionConfig {
                    max_fuse_depth: depth,
                },
            );
        }
    });
}

#[test]
fn xgboost_model_json_never_panics() {
    // A two-tree booster in XGBoost's JSON layout (the fields the forest reads).
    let tree = |split: i64, cond: f64| {
        json!({
            "left_children": [1, -1, -1], "right_children": [2, -1, -1],
            "split_indices": [split, 0, 0], "split_conditions": [cond, -0.5, 0.5],
            "default_left": [1, 0, 0], "base_weights": [0.0, -0.5, 0.5],
            "tree_param": {"num_nodes": "3", "num_feature": "4"}
        })
    };
    let model = json!({"learner": {
        "learner_model_param": {"base_score": "5E-1", "num_feature": "4"},
        "gradient_booster": {"model": {"trees": [tree(0, 0.3), tree(3, -1.0)],
                                       "gbtree_model_param": {"num_trees": "2"}}},
        "objective": {"name": "reg:squarederror"}
    }});
    let rows = vec![0.1f32, 0.2, f32::NAN, -3.0];
    fuzz(4, &[model], inputs_per_entry_point(), |text, _| {
        if let Ok(forest) = Forest::from_json(text) {
            let _ = forest.predict(&rows, 4);
        }
    });
}

#[test]
fn genome_transfer_never_panics() {
    use fastsearch_core::estimate_cycles;
    use fastsearch_core::{emit, mutate, sample_genomes, transfer, CpuTarget, SketchSpace};
    use std::collections::HashSet;

    // Genomes of one program (as a warm start reads them from a genomes file), mutated, then
    // refitted onto each program; whatever comes through must emit, mutate and score.
    let programs: Vec<Program> = ["gmm_512.json", "cbr_small.json", "sfm_small.json"]
        .iter()
        .map(|f| Program::from_json(&fixture(f)).unwrap())
        .collect();
    let target = CpuTarget::new(2).with_vector_bytes(64);
    let spaces: Vec<SketchSpace> = programs.iter().map(SketchSpace::new).collect();
    let seeds: Vec<Value> = programs
        .iter()
        .flat_map(|p| sample_genomes(p, &target, 4, 7, &HashSet::new()))
        .map(|(_, g)| serde_json::to_value(g).unwrap())
        .collect();
    fuzz(5, &seeds, inputs_per_entry_point(), |text, which| {
        let Ok(genome) = serde_json::from_str(text) else {
            return;
        };
        for (program, space) in programs.iter().zip(&spaces) {
            if let Some(moved) = transfer(program, space, &genome) {
                let _ = emit(program, space, &moved);
                let _ = estimate_cycles(program, space, &moved, &target);
                let _ = mutate(&moved, program, space, &mut Rng::derive(which as u64, 0));
            }
        }
    });
}
