//! Criterion benches of per-store feature extraction, in candidates per second: trace replay
//! plus features on MetaSchedule design-space candidates (GMM, C2D), one thread and all.
//!
//! Run with `cargo bench -p fastsearch-core --bench features`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastsearch_core::extract_traces;
use fastsearch_core::Program;
use serde_json::Value;

fn candidates() -> Vec<(String, Program, Vec<String>)> {
    let path = format!(
        "{}/tests/fixtures/features_candidates.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
        .expect("fixture JSON");
    let obj = v.as_object().expect("families");
    obj.iter()
        .map(|(family, c)| {
            let program = Program::from_json(&c["program"].to_string()).expect("program");
            let traces = c["traces"]
                .as_array()
                .expect("traces")
                .iter()
                .map(|t| t.as_str().expect("trace").to_string())
                .collect();
            (family.clone(), program, traces)
        })
        .collect()
}

fn bench_features(c: &mut Criterion) {
    for (family, program, traces) in candidates() {
        let mut group = c.benchmark_group(format!("features/{family}"));
        group.throughput(Throughput::Elements(traces.len() as u64));
        group.bench_function("all threads", |b| {
            b.iter(|| black_box(extract_traces(&program, &traces, false)))
        });
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        group.bench_function("one thread", |b| {
            b.iter(|| one.install(|| black_box(extract_traces(&program, &traces, false))))
        });
        group.finish();
    }
}

criterion_group!(benches, bench_features);
criterion_main!(benches);
