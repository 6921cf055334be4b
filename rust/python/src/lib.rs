//! `fastsearch._core`: the thin PyO3 layer over fastsearch-core.
//!
//! Each entry point extracts its arguments, releases the GIL for the work, catches any panic
//! (reported as `InternalError`, never as a Rust panic in Python) and maps core errors to the
//! `FastsearchError` hierarchy.

use std::panic::{catch_unwind, AssertUnwindSafe};

use std::collections::{HashMap, HashSet};

use fastsearch_core::model::analytical;
use fastsearch_core::model::sketch_features::{sketch_features, SKETCH_FEATURES};
use fastsearch_core::model::{Forest, HybridScorer};
use fastsearch_core::program::Program;
use fastsearch_core::search::annealing::{anneal, AnnealingConfig};
use fastsearch_core::search::evolution::{evolve, EvolutionConfig};
use fastsearch_core::search::SearchContext;
use fastsearch_core::sketch::{self, CpuTarget, Genome, SketchSpace};
use fastsearch_core::Error;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use rayon::prelude::*;

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

fn to_py(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::Unsupported(_) => UnsupportedWorkload::new_err(msg),
        Error::Malformed(_) => MalformedInput::new_err(msg),
        Error::Schedule { .. } => ScheduleError::new_err(msg),
        Error::InvalidTrace(_) => InvalidTrace::new_err(msg),
        Error::Internal(_) => InternalError::new_err(msg),
    }
}

/// Runs `work` without the GIL, turning a panic into `InternalError`.
fn guarded<T: Send>(
    py: Python<'_>,
    what: &str,
    work: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match outcome {
        Ok(result) => result.map_err(to_py),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(InternalError::new_err(format!("{what}: {detail}")))
        }
    }
}

/// Imports a program model (the JSON `fastsearch.tir_import` writes) and returns a JSON summary:
/// its blocks with their iteration kinds, loops and arithmetic.
#[pyfunction]
fn program_summary(py: Python<'_>, program_json: String) -> PyResult<String> {
    guarded(py, "program_summary", move || {
        let program = Program::from_json(&program_json)?;
        Ok(fastsearch_core::program::summary(&program).to_string())
    })
}

/// Draws up to `n` distinct candidates from fastsearch's CPU sketches, as MetaSchedule trace
/// JSON strings (before postprocessing), skipping those in `exclude`.
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, n, seed, exclude=Vec::new()))]
fn sample_sketches(
    py: Python<'_>,
    program_json: String,
    num_cores: i64,
    n: usize,
    seed: u64,
    exclude: Vec<String>,
) -> PyResult<Vec<String>> {
    guarded(py, "sample_sketches", move || {
        let program = Program::from_json(&program_json)?;
        let target = CpuTarget::new(num_cores);
        let exclude: HashSet<String> = exclude.into_iter().collect();
        Ok(sketch::sample(&program, &target, n, seed, &exclude))
    })
}

/// Replays each trace (MetaSchedule trace JSON, postprocessing included) on the program and
/// extracts MetaSchedule's per-store features in parallel: one `(n_stores, 164)` float32 array
/// per trace, rows in PerStoreFeature's order.
#[pyfunction]
fn extract_features<'py>(
    py: Python<'py>,
    program_json: String,
    trace_jsons: Vec<String>,
) -> PyResult<Vec<Bound<'py, PyArray2<f32>>>> {
    let (data, counts) = guarded(py, "extract_features", move || {
        fastsearch_core::features::extract_from_json(&program_json, &trace_jsons)
    })?;
    let n = fastsearch_core::features::N_FEATURES;
    let mut out = Vec::with_capacity(counts.len());
    let mut start = 0;
    for rows in counts {
        let end = start + rows * n;
        out.push(PyArray1::from_slice(py, &data[start..end]).reshape([rows, n])?);
        start = end;
    }
    Ok(out)
}

/// Like `extract_features`, one candidate at a time: `None` for a trace that cannot be read or
/// replayed instead of an error for the batch. With `postprocess`, fastsearch's CPU
/// postprocessors run after the trace (for traces without their postprocessing instructions).
#[pyfunction]
#[pyo3(signature = (program_json, trace_jsons, postprocess=false))]
fn extract_features_each<'py>(
    py: Python<'py>,
    program_json: String,
    trace_jsons: Vec<String>,
    postprocess: bool,
) -> PyResult<Vec<Option<Bound<'py, PyArray2<f32>>>>> {
    let rows = guarded(py, "extract_features_each", move || {
        let program = Program::from_json(&program_json)?;
        Ok(
            fastsearch_core::features::extract_traces(&program, &trace_jsons, postprocess)
                .into_iter()
                .map(Result::ok)
                .collect::<Vec<_>>(),
        )
    })?;
    let n = fastsearch_core::features::N_FEATURES;
    rows.into_iter()
        .map(|r| {
            r.map(|data| {
                let rows = data.len() / n;
                PyArray1::from_vec(py, data).reshape([rows, n])
            })
            .transpose()
        })
        .collect()
}

fn parse_genomes(jsons: &[String]) -> Result<Vec<Genome>, Error> {
    jsons
        .iter()
        .map(|j| serde_json::from_str(j).map_err(|e| Error::Malformed(format!("genome JSON: {e}"))))
        .collect()
}

/// The model's view of a CPU target from the binding's arguments.
fn cpu(
    num_cores: i64,
    vector_bytes: i64,
    fma_per_cycle: f64,
    parallel_speedup: Option<f64>,
) -> CpuTarget {
    CpuTarget::new(num_cores)
        .with_vector_bytes(vector_bytes)
        .with_fma_per_cycle(fma_per_cycle)
        .with_parallel_speedup(parallel_speedup)
}

fn genome_json(g: &Genome) -> String {
    serde_json::to_string(g).unwrap_or_default()
}

/// Like `sample_sketches`, with each candidate's genome (JSON) next to its key.
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, vector_bytes, n, seed, exclude=Vec::new(), fma_per_cycle=2.0, parallel_speedup=None))]
#[allow(clippy::too_many_arguments)]
fn sample_genomes(
    py: Python<'_>,
    program_json: String,
    num_cores: i64,
    vector_bytes: i64,
    n: usize,
    seed: u64,
    exclude: Vec<String>,
    fma_per_cycle: f64,
    parallel_speedup: Option<f64>,
) -> PyResult<Vec<(String, String)>> {
    guarded(py, "sample_genomes", move || {
        let program = Program::from_json(&program_json)?;
        let target = cpu(num_cores, vector_bytes, fma_per_cycle, parallel_speedup);
        let exclude: HashSet<String> = exclude.into_iter().collect();
        Ok(sketch::sample_genomes(&program, &target, n, seed, &exclude)
            .into_iter()
            .map(|(k, g)| (k, genome_json(&g)))
            .collect())
    })
}

/// Genomes found on other shapes of the same operator, refitted to this program (warm starts):
/// `(key, genome JSON)` of each, or `None` where it does not carry over (other blocks or rules,
/// a trace the schedule engine refuses here, or genome JSON that cannot be read).
#[pyfunction]
fn transfer_genomes(
    py: Python<'_>,
    program_json: String,
    genomes: Vec<String>,
) -> PyResult<Vec<Option<(String, String)>>> {
    guarded(py, "transfer_genomes", move || {
        let program = Program::from_json(&program_json)?;
        let space = SketchSpace::new(&program);
        Ok(carry_over(&program, &space, &genomes, |g| {
            sketch::transfer(&program, &space, g)
        }))
    })
}

/// `(key, genome JSON)` on `program` of each genome JSON that `moved` carries over (in
/// parallel, in input order); `None` where it does not, or where the JSON is not a genome.
fn carry_over(
    program: &Program,
    space: &SketchSpace,
    genomes: &[String],
    moved: impl Fn(&Genome) -> Option<Genome> + Sync,
) -> Vec<Option<(String, String)>> {
    genomes
        .par_iter()
        .map(|text| {
            let genome: Genome = serde_json::from_str(text).ok()?;
            let out = moved(&genome)?;
            Some((
                sketch::emit(program, space, &out).to_string(),
                genome_json(&out),
            ))
        })
        .collect()
}

/// Genomes found on a sibling program (the same anchor with other fused elementwise blocks)
/// carried over to this one, blocks matched by name: `(key, genome JSON)` of each, or `None`
/// where it does not carry over.
#[pyfunction]
fn transfer_sibling_genomes(
    py: Python<'_>,
    source_program_json: String,
    program_json: String,
    genomes: Vec<String>,
) -> PyResult<Vec<Option<(String, String)>>> {
    guarded(py, "transfer_sibling_genomes", move || {
        let source = Program::from_json(&source_program_json)?;
        let program = Program::from_json(&program_json)?;
        let space = SketchSpace::new(&program);
        Ok(carry_over(&program, &space, &genomes, |g| {
            sketch::transfer_from_sibling(&source, &program, &space, g)
        }))
    })
}

/// The analytical model's scores (higher is better) of candidates given as genome JSON.
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, vector_bytes, genomes, fma_per_cycle=2.0, parallel_speedup=None))]
fn analytical_scores(
    py: Python<'_>,
    program_json: String,
    num_cores: i64,
    vector_bytes: i64,
    genomes: Vec<String>,
    fma_per_cycle: f64,
    parallel_speedup: Option<f64>,
) -> PyResult<Vec<f64>> {
    guarded(py, "analytical_scores", move || {
        let program = Program::from_json(&program_json)?;
        let target = cpu(num_cores, vector_bytes, fma_per_cycle, parallel_speedup);
        let space = SketchSpace::new(&program);
        let genomes = parse_genomes(&genomes)?;
        Ok(analytical::score(&program, &space, &genomes, &target))
    })
}

/// Proposes `n` unmeasured candidates with the search `strategy` ("evolutionary" or
/// "annealing"), scored by the analytical model. `measured` maps keys of measured candidates
/// to their latency; `seeds` are genomes (JSON) of the best measured, best first.
/// Returns `(key, genome JSON, score, role)` tuples, best predicted first, where role says why
/// each is there: "exploit", "shape", "structure" or "random" (`search::Role`).
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, vector_bytes, strategy, n, seed, measured, seeds, population=None, generations=None, model_json=None, model_weight=0.0, fma_per_cycle=2.0, parallel_speedup=None))]
#[allow(clippy::too_many_arguments)]
fn propose(
    py: Python<'_>,
    program_json: String,
    num_cores: i64,
    vector_bytes: i64,
    strategy: String,
    n: usize,
    seed: u64,
    measured: HashMap<String, f64>,
    seeds: Vec<String>,
    population: Option<usize>,
    generations: Option<usize>,
    model_json: Option<String>,
    model_weight: f64,
    fma_per_cycle: f64,
    parallel_speedup: Option<f64>,
) -> PyResult<Vec<(String, String, f64, &'static str)>> {
    guarded(py, "propose", move || {
        let program = Program::from_json(&program_json)?;
        let target = cpu(num_cores, vector_bytes, fma_per_cycle, parallel_speedup);
        let space = SketchSpace::new(&program);
        let seeds = parse_genomes(&seeds)?;
        let ctx = SearchContext {
            program: &program,
            space: &space,
            target: &target,
            measured: &measured,
        };
        let forest = model_json.as_deref().map(Forest::from_json).transpose()?;
        let scorer = HybridScorer::new(
            &program,
            &space,
            &target,
            forest,
            model_weight,
            seeds.first(),
        );
        let proposals = match strategy.as_str() {
            "evolutionary" => {
                let mut config = EvolutionConfig::default();
                if let Some(p) = population {
                    config.population = p;
                }
                if let Some(g) = generations {
                    config.generations = g;
                }
                evolve(&ctx, &scorer, &seeds, n, &config, seed)
            }
            "annealing" => {
                let mut config = AnnealingConfig::default();
                if let Some(p) = population {
                    config.chains = p;
                }
                if let Some(g) = generations {
                    config.steps = g;
                }
                anneal(&ctx, &scorer, &seeds, n, &config, seed)
            }
            other => {
                return Err(Error::Malformed(format!(
                    "unknown search strategy `{other}`"
                )))
            }
        };
        Ok(proposals
            .into_iter()
            .map(|p| (p.key, genome_json(&p.genome), p.score, p.role.as_str()))
            .collect())
    })
}

/// The sketch-level features of candidates (genome JSON), one row each: `(n, SKETCH_FEATURES)`.
#[pyfunction]
#[pyo3(signature = (program_json, num_cores, vector_bytes, genomes, fma_per_cycle=2.0, parallel_speedup=None))]
fn sketch_feature_rows<'py>(
    py: Python<'py>,
    program_json: String,
    num_cores: i64,
    vector_bytes: i64,
    genomes: Vec<String>,
    fma_per_cycle: f64,
    parallel_speedup: Option<f64>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (rows, n) = guarded(py, "sketch_feature_rows", move || {
        let program = Program::from_json(&program_json)?;
        let target = cpu(num_cores, vector_bytes, fma_per_cycle, parallel_speedup);
        let space = SketchSpace::new(&program);
        let genomes = parse_genomes(&genomes)?;
        let rows: Vec<f32> = genomes
            .par_iter()
            .flat_map_iter(|g| sketch_features(&program, &space, g, &target))
            .collect();
        Ok((rows, genomes.len()))
    })?;
    // The Vec moves into the array: no copy.
    PyArray1::from_vec(py, rows).reshape([n, SKETCH_FEATURES])
}

/// Margins of an XGBoost model (booster JSON) on feature rows, evaluated in Rust.
#[pyfunction]
fn forest_predict(
    py: Python<'_>,
    model_json: String,
    rows: PyReadonlyArray2<'_, f32>,
) -> PyResult<Vec<f32>> {
    let width = rows.shape()[1];
    let data: Vec<f32> = rows.as_array().iter().copied().collect();
    guarded(py, "forest_predict", move || {
        Ok(Forest::from_json(&model_json)?.predict(&data, width))
    })
}

/// Replays a MetaSchedule trace (the JSON of `Trace.as_json()`) on a program model and returns
/// the JSON loop-nest description of the result. With `postprocess`, the trace's instructions
/// after `EnterPostproc` are skipped and the engine's own CPU postprocessors
/// (RewriteParallelVectorizeUnroll, RewriteReductionBlock) run instead.
#[pyfunction]
#[pyo3(signature = (program_json, trace_json, postprocess = false))]
fn apply_trace(
    py: Python<'_>,
    program_json: String,
    trace_json: String,
    postprocess: bool,
) -> PyResult<String> {
    guarded(py, "apply_trace", move || {
        fastsearch_core::schedule::apply_trace(&program_json, &trace_json, postprocess)
    })
}

/// Partitions a model's operator graph (JSON, see `fastsearch_core::partition::Graph`) into
/// the fusion groups of TVM's Relax FuseOps: node indices per group, groups in emission order.
#[pyfunction]
#[pyo3(signature = (graph_json, max_fuse_depth = fastsearch_core::partition::DEFAULT_MAX_FUSE_DEPTH))]
#[pyo3(text_signature = "(graph_json, max_fuse_depth=256)")]
fn partition_graph(
    py: Python<'_>,
    graph_json: String,
    max_fuse_depth: usize,
) -> PyResult<Vec<Vec<usize>>> {
    guarded(py, "partition_graph", move || {
        let config = fastsearch_core::partition::PartitionConfig { max_fuse_depth };
        Ok(fastsearch_core::partition::partition_json(&graph_json, &config)?.groups)
    })
}

/// Changes to a partition (`groups`, as `partition_graph` returns them) that FuseOps' rules never
/// make: `(kind, group indices)` with kind `"prologue"`, `"epilogue"` or `"horizontal"`.
#[pyfunction]
#[pyo3(signature = (graph_json, groups, max_fuse_depth = fastsearch_core::partition::DEFAULT_MAX_FUSE_DEPTH))]
#[pyo3(text_signature = "(graph_json, groups, max_fuse_depth=256)")]
fn fusion_proposals(
    py: Python<'_>,
    graph_json: String,
    groups: Vec<Vec<usize>>,
    max_fuse_depth: usize,
) -> PyResult<Vec<(&'static str, Vec<usize>)>> {
    guarded(py, "fusion_proposals", move || {
        use fastsearch_core::partition::{proposals, Graph};
        let graph = Graph::from_json(&graph_json)?;
        let partition = partition_of(&graph, groups)?;
        Ok(proposals(&graph, &partition, max_fuse_depth)
            .into_iter()
            .map(|p| (p.kind.name(), p.groups))
            .collect())
    })
}

/// `groups` with each list of group indices in `merges` made one group, in emission order.
#[pyfunction]
fn merge_fusion_groups(
    py: Python<'_>,
    graph_json: String,
    groups: Vec<Vec<usize>>,
    merges: Vec<Vec<usize>>,
) -> PyResult<Vec<Vec<usize>>> {
    guarded(py, "merge_fusion_groups", move || {
        use fastsearch_core::partition::{merge_groups, Graph};
        let graph = Graph::from_json(&graph_json)?;
        let partition = partition_of(&graph, groups)?;
        Ok(merge_groups(&graph, &partition, &merges)?.groups)
    })
}

fn partition_of(
    graph: &fastsearch_core::partition::Graph,
    groups: Vec<Vec<usize>>,
) -> fastsearch_core::Result<fastsearch_core::partition::Partition> {
    fastsearch_core::partition::Partition::from_groups(graph.len(), groups)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FastsearchError", py.get_type::<FastsearchError>())?;
    m.add("UnsupportedWorkload", py.get_type::<UnsupportedWorkload>())?;
    m.add("ScheduleError", py.get_type::<ScheduleError>())?;
    m.add("InvalidTrace", py.get_type::<InvalidTrace>())?;
    m.add("MalformedInput", py.get_type::<MalformedInput>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(program_summary, m)?)?;
    m.add_function(wrap_pyfunction!(sample_sketches, m)?)?;
    m.add_function(wrap_pyfunction!(extract_features, m)?)?;
    m.add_function(wrap_pyfunction!(extract_features_each, m)?)?;
    m.add_function(wrap_pyfunction!(sample_genomes, m)?)?;
    m.add_function(wrap_pyfunction!(analytical_scores, m)?)?;
    m.add_function(wrap_pyfunction!(transfer_genomes, m)?)?;
    m.add_function(wrap_pyfunction!(propose, m)?)?;
    m.add_function(wrap_pyfunction!(sketch_feature_rows, m)?)?;
    m.add_function(wrap_pyfunction!(transfer_sibling_genomes, m)?)?;
    m.add_function(wrap_pyfunction!(forest_predict, m)?)?;
    m.add(
        "SKETCH_FEATURE_NAMES",
        fastsearch_core::model::sketch_features::SKETCH_FEATURE_NAMES.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(apply_trace, m)?)?;
    m.add_function(wrap_pyfunction!(partition_graph, m)?)?;
    m.add_function(wrap_pyfunction!(fusion_proposals, m)?)?;
    m.add_function(wrap_pyfunction!(merge_fusion_groups, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
