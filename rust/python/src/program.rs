//! `Program`: a task's program model, imported once and owning its sketch space, with every
//! operation the search runs on it (sampling, scoring, proposing, transfer, replay, features).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use fastsearch_core::{
    analytical_scores, anneal, apply_trace_to, apply_trace_to_gpu, code_sizes, emit, estimate_gpu,
    evolve, evolve_gpu, extract_all_on, extract_made, extract_traces_on, lowered_text_on,
    program_summary, sample_genomes, sample_gpu, sample_gpu_genomes, sample_traces,
    sketch_features, transfer, transfer_from_sibling, verify_traces_gpu, AnnealingConfig, Error,
    EvolutionConfig, Genome, GpuEvolutionConfig, GpuGenome, GpuSketchSpace, HybridScorer,
    SearchContext, SketchSpace, CODE_SIZE_NAMES, N_FEATURES, SKETCH_FEATURES,
};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::errors::{guarded, to_py, InternalError};
use crate::forest::Forest;
use crate::target::{PyGpuTarget, Target};
use crate::tvm_values::TraceReader;

/// The imported program and its sketch space, built on first use (replay and features do
/// not need it).
struct Imported {
    program: fastsearch_core::Program,
    space: OnceLock<SketchSpace>,
}

impl Imported {
    fn space(&self) -> &SketchSpace {
        self.space.get_or_init(|| SketchSpace::new(&self.program))
    }
}

/// A task's program model (the JSON `fastsearch.ir.tir_import.program_json` writes), parsed
/// once. Candidates cross as keys (trace JSON) and genomes (JSON).
#[pyclass(frozen, module = "fastsearch._core", name = "Program")]
pub struct Program {
    imported: Arc<Imported>,
}

fn parse_genomes(jsons: &[String]) -> Result<Vec<Genome>, Error> {
    jsons
        .iter()
        .map(|j| serde_json::from_str(j).map_err(|e| Error::Malformed(format!("genome JSON: {e}"))))
        .collect()
}

fn genome_json(g: &Genome) -> String {
    serde_json::to_string(g).unwrap_or_default()
}

/// `(key, genome JSON)` on `imported` of each genome JSON that `moved` carries over (in
/// parallel, in input order); `None` where it does not, or where the JSON is not a genome.
fn carry_over(
    imported: &Imported,
    genomes: &[String],
    moved: impl Fn(&Genome) -> Option<Genome> + Sync,
) -> Vec<Option<(String, String)>> {
    let space = imported.space();
    genomes
        .par_iter()
        .map(|text| {
            let genome: Genome = serde_json::from_str(text).ok()?;
            let out = moved(&genome)?;
            Some((
                emit(&imported.program, space, &out).to_string(),
                genome_json(&out),
            ))
        })
        .collect()
}

/// A search proposal as Python sees it: `(key, genome JSON, score, role)`.
type Proposal = (String, String, f64, &'static str);

#[pymethods]
impl Program {
    #[new]
    #[pyo3(text_signature = "(program_json)")]
    fn new(py: Python<'_>, program_json: String) -> PyResult<Self> {
        let program = guarded(py, "Program", move || {
            fastsearch_core::Program::from_json(&program_json)
        })?;
        Ok(Program {
            imported: Arc::new(Imported {
                program,
                space: OnceLock::new(),
            }),
        })
    }

    /// A JSON summary: the blocks with their iteration kinds, loops and arithmetic.
    fn summary(&self, py: Python<'_>) -> PyResult<String> {
        let imported = Arc::clone(&self.imported);
        guarded(py, "Program.summary", move || {
            Ok(program_summary(&imported.program).to_string())
        })
    }

    /// Up to `n` distinct candidates of fastsearch's CPU sketches as MetaSchedule trace JSON
    /// (before postprocessing), skipping the keys in `exclude`.
    #[pyo3(signature = (target, n, seed, *, exclude = Vec::new()))]
    fn sample_sketches(
        &self,
        py: Python<'_>,
        target: &Bound<'_, Target>,
        n: usize,
        seed: u64,
        exclude: Vec<String>,
    ) -> PyResult<Vec<String>> {
        let imported = Arc::clone(&self.imported);
        let cpu = target.get().cpu.clone();
        guarded(py, "Program.sample_sketches", move || {
            let exclude: HashSet<String> = exclude.into_iter().collect();
            Ok(sample_traces(&imported.program, &cpu, n, seed, &exclude))
        })
    }

    /// Up to `n` distinct candidates of fastsearch's GPU sketches for a CUDA `target`, as
    /// MetaSchedule trace JSON (before postprocessing), skipping the keys in `exclude`; tile
    /// sizes, threads and shared memory are drawn within the target's limits.
    #[pyo3(signature = (target, n, seed, *, exclude = Vec::new()))]
    fn sample_gpu_sketches(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyGpuTarget>,
        n: usize,
        seed: u64,
        exclude: Vec<String>,
    ) -> PyResult<Vec<String>> {
        let imported = Arc::clone(&self.imported);
        let gpu = target.gpu.clone();
        guarded(py, "Program.sample_gpu_sketches", move || {
            let exclude: HashSet<String> = exclude.into_iter().collect();
            Ok(sample_gpu(&imported.program, &gpu, n, seed, &exclude))
        })
    }

    /// Like `sample_gpu_sketches`, each candidate as `(key, genome JSON)`.
    #[pyo3(signature = (target, n, seed, *, exclude = Vec::new()))]
    fn sample_gpu_genomes(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyGpuTarget>,
        n: usize,
        seed: u64,
        exclude: Vec<String>,
    ) -> PyResult<Vec<(String, String)>> {
        let imported = Arc::clone(&self.imported);
        let gpu = target.gpu.clone();
        guarded(py, "Program.sample_gpu_genomes", move || {
            let exclude: HashSet<String> = exclude.into_iter().collect();
            Ok(
                sample_gpu_genomes(&imported.program, &gpu, n, seed, &exclude)
                    .into_iter()
                    .map(|(k, g)| (k, serde_json::to_string(&g).unwrap_or_default()))
                    .collect(),
            )
        })
    }

    /// The GPU search: up to `n` valid candidates not in `exclude`, from an evolution seeded
    /// with `measured` (genome JSON, measured seconds), ranked by the analytical GPU model;
    /// each as `(trace JSON, genome JSON, estimated seconds)`. Every candidate has passed the
    /// engine's CUDA postprocessors and VerifyGPUCode for `target`.
    #[pyo3(signature = (target, n, seed, *, measured = Vec::new(), exclude = Vec::new(), population = 512, generations = 4))]
    #[allow(clippy::too_many_arguments)]
    fn propose_gpu(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyGpuTarget>,
        n: usize,
        seed: u64,
        measured: Vec<(String, f64)>,
        exclude: Vec<String>,
        population: usize,
        generations: usize,
    ) -> PyResult<Vec<(String, String, f64)>> {
        let imported = Arc::clone(&self.imported);
        let gpu = target.gpu.clone();
        guarded(py, "Program.propose_gpu", move || {
            let measured = measured
                .iter()
                .map(|(g, t)| {
                    serde_json::from_str::<GpuGenome>(g)
                        .map(|g| (g, *t))
                        .map_err(|e| Error::Malformed(format!("a measured GPU genome: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let exclude: HashSet<String> = exclude.into_iter().collect();
            let config = GpuEvolutionConfig {
                population: population.max(1),
                generations,
                ..GpuEvolutionConfig::default()
            };
            Ok(evolve_gpu(
                &imported.program,
                &gpu,
                &measured,
                n,
                seed,
                &exclude,
                &config,
                None,
            )
            .into_iter()
            .map(|p| {
                (
                    p.trace,
                    serde_json::to_string(&p.genome).unwrap_or_default(),
                    p.score,
                )
            })
            .collect())
        })
    }

    /// The analytical GPU model's estimate, in seconds, of each genome (JSON) on `target`.
    fn estimate_gpu(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyGpuTarget>,
        genomes: Vec<String>,
    ) -> PyResult<Vec<f64>> {
        let imported = Arc::clone(&self.imported);
        let gpu = target.gpu.clone();
        guarded(py, "Program.estimate_gpu", move || {
            let space = GpuSketchSpace::new(&imported.program, &gpu);
            genomes
                .iter()
                .map(|g| {
                    serde_json::from_str::<GpuGenome>(g)
                        .map(|g| estimate_gpu(&imported.program, &space, &g))
                        .map_err(|e| Error::Malformed(format!("a GPU genome: {e}")))
                })
                .collect()
        })
    }

    /// Like `sample_sketches`, each candidate as `(key, genome JSON)`.
    #[pyo3(signature = (target, n, seed, *, exclude = Vec::new()))]
    fn sample_genomes(
        &self,
        py: Python<'_>,
        target: &Bound<'_, Target>,
        n: usize,
        seed: u64,
        exclude: Vec<String>,
    ) -> PyResult<Vec<(String, String)>> {
        let imported = Arc::clone(&self.imported);
        let cpu = target.get().cpu.clone();
        guarded(py, "Program.sample_genomes", move || {
            let exclude: HashSet<String> = exclude.into_iter().collect();
            Ok(sample_genomes(&imported.program, &cpu, n, seed, &exclude)
                .into_iter()
                .map(|(k, g)| (k, genome_json(&g)))
                .collect())
        })
    }

    /// The analytical model's scores (higher is better) of candidates given as genome JSON.
    fn analytical_scores(
        &self,
        py: Python<'_>,
        target: &Bound<'_, Target>,
        genomes: Vec<String>,
    ) -> PyResult<Vec<f64>> {
        let imported = Arc::clone(&self.imported);
        let cpu = target.get().cpu.clone();
        guarded(py, "Program.analytical_scores", move || {
            let genomes = parse_genomes(&genomes)?;
            Ok(analytical_scores(
                &imported.program,
                imported.space(),
                &genomes,
                &cpu,
            ))
        })
    }

    /// The sketch-level features of candidates (genome JSON), one row each:
    /// `(len(genomes), len(SKETCH_FEATURE_NAMES))` float32.
    fn sketch_feature_rows<'py>(
        &self,
        py: Python<'py>,
        target: &Bound<'py, Target>,
        genomes: Vec<String>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let imported = Arc::clone(&self.imported);
        let cpu = target.get().cpu.clone();
        let (rows, n) = guarded(py, "Program.sketch_feature_rows", move || {
            let genomes = parse_genomes(&genomes)?;
            let space = imported.space();
            let rows: Vec<f32> = genomes
                .par_iter()
                .flat_map_iter(|g| sketch_features(&imported.program, space, g, &cpu))
                .collect();
            Ok((rows, genomes.len()))
        })?;
        // The Vec moves into the array: no copy.
        PyArray1::from_vec(py, rows).reshape([n, SKETCH_FEATURES])
    }

    /// Proposes `n` unmeasured candidates with the search `strategy` ("evolutionary" or
    /// "annealing"). `measured` maps keys of measured candidates to their latency; `seeds` are
    /// genomes (JSON) of the best measured, best first. The score is the analytical model's,
    /// blended with `model` (a `Forest` on sketch features) at `model_weight`. `population` and
    /// `generations` are the evolution's (the annealing's chains and steps). Returns
    /// `(key, genome JSON, score, role)`, best predicted first; the role says why each is there:
    /// "exploit", "shape", "structure" or "random".
    #[pyo3(signature = (
        target, *, strategy, n, seed, measured, seeds,
        population = None, generations = None, model = None, model_weight = 0.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        py: Python<'_>,
        target: &Bound<'_, Target>,
        strategy: String,
        n: usize,
        seed: u64,
        measured: HashMap<String, f64>,
        seeds: Vec<String>,
        population: Option<usize>,
        generations: Option<usize>,
        model: Option<&Bound<'_, Forest>>,
        model_weight: f64,
    ) -> PyResult<Vec<Proposal>> {
        let imported = Arc::clone(&self.imported);
        let cpu = target.get().cpu.clone();
        let forest = model.map(|m| Arc::clone(&m.get().trees));
        guarded(py, "Program.propose", move || {
            let program = &imported.program;
            let space = imported.space();
            let seeds = parse_genomes(&seeds)?;
            let ctx = SearchContext {
                program,
                space,
                target: &cpu,
                measured: &measured,
            };
            let scorer = HybridScorer::new(
                program,
                space,
                &cpu,
                forest.as_deref(),
                model_weight,
                seeds.first(),
            );
            let proposals = match strategy.as_str() {
                "evolutionary" => {
                    let mut config = EvolutionConfig::default();
                    config.population = population.unwrap_or(config.population);
                    config.generations = generations.unwrap_or(config.generations);
                    evolve(&ctx, &scorer, &seeds, n, &config, seed)
                }
                "annealing" => {
                    let mut config = AnnealingConfig::default();
                    config.chains = population.unwrap_or(config.chains);
                    config.steps = generations.unwrap_or(config.steps);
                    anneal(&ctx, &scorer, &seeds, n, &config, seed)
                }
                other => {
                    return Err(Error::Malformed(format!(
                        "unknown search strategy `{other}` (\"evolutionary\" or \"annealing\")"
                    )))
                }
            };
            Ok(proposals
                .into_iter()
                .map(|p| (p.key, genome_json(&p.genome), p.score, p.role.as_str()))
                .collect())
        })
    }

    /// Genomes found on other shapes of the same operator, refitted to this program (warm
    /// starts): `(key, genome JSON)` of each, or `None` where it does not carry over.
    fn transfer_genomes(
        &self,
        py: Python<'_>,
        genomes: Vec<String>,
    ) -> PyResult<Vec<Option<(String, String)>>> {
        let imported = Arc::clone(&self.imported);
        guarded(py, "Program.transfer_genomes", move || {
            let space = imported.space();
            Ok(carry_over(&imported, &genomes, |g| {
                transfer(&imported.program, space, g)
            }))
        })
    }

    /// Genomes found on `source` (the same anchor with other fused elementwise blocks) carried
    /// over to this program, blocks matched by name; `None` where one does not carry over.
    fn transfer_sibling_genomes(
        &self,
        py: Python<'_>,
        source: &Bound<'_, Program>,
        genomes: Vec<String>,
    ) -> PyResult<Vec<Option<(String, String)>>> {
        let imported = Arc::clone(&self.imported);
        let source = Arc::clone(&source.get().imported);
        guarded(py, "Program.transfer_sibling_genomes", move || {
            let space = imported.space();
            Ok(carry_over(&imported, &genomes, |g| {
                transfer_from_sibling(&source.program, &imported.program, space, g)
            }))
        })
    }

    /// Replays a MetaSchedule trace (JSON) and returns the loop-nest JSON of the result. With
    /// `postprocess`, the trace's instructions after `EnterPostproc` are skipped and the
    /// engine's own postprocessors run instead: MetaSchedule's CUDA set when `gpu` is given,
    /// else its CPU set.
    #[pyo3(signature = (trace_json, *, postprocess = false, gpu = None))]
    fn apply_trace(
        &self,
        py: Python<'_>,
        trace_json: String,
        postprocess: bool,
        gpu: Option<PyRef<'_, PyGpuTarget>>,
    ) -> PyResult<String> {
        let imported = Arc::clone(&self.imported);
        let gpu = gpu.map(|g| g.gpu.clone());
        guarded(py, "Program.apply_trace", move || match &gpu {
            Some(target) => apply_trace_to_gpu(&imported.program, &trace_json, target, postprocess),
            None => apply_trace_to(&imported.program, &trace_json, postprocess),
        })
    }

    /// VerifyGPUCode's verdict on each trace for the CUDA target `gpu`, after the engine's CUDA
    /// postprocessors: `None` where the candidate passes, else why it fails (the verifier's
    /// reason, or the postprocessors' refusal). An unreadable trace raises `InvalidTrace`.
    #[pyo3(signature = (trace_jsons, *, gpu))]
    fn verify_gpu(
        &self,
        py: Python<'_>,
        trace_jsons: Vec<String>,
        gpu: PyRef<'_, PyGpuTarget>,
    ) -> PyResult<Vec<Option<String>>> {
        let imported = Arc::clone(&self.imported);
        let target = gpu.gpu.clone();
        guarded(py, "Program.verify_gpu", move || {
            verify_traces_gpu(&imported.program, &trace_jsons, &target)
                .into_iter()
                .map(|r| match r {
                    Ok(verdict) => Ok(verdict),
                    Err(e @ Error::Schedule { .. }) => Ok(Some(e.to_string())),
                    Err(e) => Err(e),
                })
                .collect()
        })
    }

    /// MetaSchedule's per-store features of each trace (postprocessing included), in parallel:
    /// one `(n_stores, 164)` float32 array per trace. With `gpu`, the features TVM extracts for
    /// that CUDA target (the trace replayed as a CUDA schedule, the thread extents, TVM's GPU
    /// lowering). A trace that cannot be replayed fails the batch.
    #[pyo3(signature = (trace_jsons, *, gpu = None))]
    fn extract_features<'py>(
        &self,
        py: Python<'py>,
        trace_jsons: Vec<String>,
        gpu: Option<PyRef<'_, PyGpuTarget>>,
    ) -> PyResult<Vec<Bound<'py, PyArray2<f32>>>> {
        let imported = Arc::clone(&self.imported);
        let gpu = gpu.map(|g| g.gpu.clone());
        let each = guarded(py, "Program.extract_features", move || {
            extract_all_on(&imported.program, &trace_jsons, gpu.as_ref())
        })?;
        each.into_iter()
            .map(|data| feature_array(py, data))
            .collect()
    }

    /// `extract_features` of TVM traces given by address (each a `Trace`'s `__chandle__()`):
    /// each is written by TVM's `TraceAsJSON` and replayed on the thread that extracts it
    /// ([`TraceReader`]). `None` for a trace the reader leaves to TVM's own writer; a trace
    /// that cannot be replayed fails the batch.
    ///
    /// Internal to fastsearch: the caller passes only addresses of live tvm-ffi objects and
    /// functions and keeps the traces alive during the call, which cannot be interrupted and
    /// returns only once every trace is read (there is no early return on Ctrl-C). `gpu` as
    /// in `extract_features`.
    #[pyo3(signature = (reader, traces, *, gpu = None))]
    fn extract_features_tvm<'py>(
        &self,
        py: Python<'py>,
        reader: &TraceReader,
        traces: Vec<usize>,
        gpu: Option<PyRef<'_, PyGpuTarget>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyArray2<f32>>>>> {
        let reader = *reader;
        let program = &self.imported.program;
        let gpu = gpu.map(|g| g.gpu.clone());
        let rows = py
            .detach(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    extract_made(
                        program,
                        &traces,
                        |&t| {
                            // SAFETY: the caller keeps every trace alive until this returns.
                            match unsafe { reader.text(t) } {
                                Some(text) => fastsearch_core::Trace::from_json(&text).map(Some),
                                None => Ok(None),
                            }
                        },
                        gpu.as_ref(),
                    )
                }))
            })
            .map_err(|_| InternalError::new_err("Program.extract_features_tvm: panicked"))?
            .map_err(to_py)?;
        rows.into_iter()
            .map(|r| r.map(|data| feature_array(py, data)).transpose())
            .collect()
    }

    /// The lowered program the features of a trace are read from, as text (the loops and
    /// stores after the modelled lowering passes; TVM's GPU lowering with `gpu`), for reading
    /// why a feature has its value.
    #[pyo3(signature = (trace_json, *, gpu = None))]
    fn lowered_text(
        &self,
        py: Python<'_>,
        trace_json: String,
        gpu: Option<PyRef<'_, PyGpuTarget>>,
    ) -> PyResult<String> {
        let imported = Arc::clone(&self.imported);
        let gpu = gpu.map(|g| g.gpu.clone());
        guarded(py, "Program.lowered_text", move || {
            lowered_text_on(&imported.program, &trace_json, gpu.as_ref())
        })
    }

    /// The code each trace hands LLVM after TVM's vectorization and unrolling, in parallel: a
    /// `(len(trace_jsons), len(CODE_SIZE_NAMES))` float32 array of `log2(x + 1)` values, a row
    /// of NaN for a trace that cannot be read or replayed. `postprocess` (the default: traces
    /// as candidates' keys, without their postprocessing) as in `extract_features_each`.
    #[pyo3(signature = (trace_jsons, *, postprocess = true))]
    fn code_sizes<'py>(
        &self,
        py: Python<'py>,
        trace_jsons: Vec<String>,
        postprocess: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let imported = Arc::clone(&self.imported);
        let n = trace_jsons.len();
        let data = guarded(py, "Program.code_sizes", move || {
            Ok(code_sizes(&imported.program, &trace_jsons, postprocess)
                .into_iter()
                .flat_map(|r| r.map_or([f32::NAN; CODE_SIZE_NAMES.len()], |s| s.row()))
                .collect::<Vec<f32>>())
        })?;
        PyArray1::from_vec(py, data).reshape([n, CODE_SIZE_NAMES.len()])
    }

    /// Like `extract_features`, one candidate at a time: `None` for a trace that cannot be read
    /// or replayed. With `postprocess`, the engine's postprocessors run after the trace (for
    /// traces without their postprocessing instructions): MetaSchedule's CUDA set with `gpu`,
    /// else its CPU set.
    #[pyo3(signature = (trace_jsons, *, postprocess = false, gpu = None))]
    fn extract_features_each<'py>(
        &self,
        py: Python<'py>,
        trace_jsons: Vec<String>,
        postprocess: bool,
        gpu: Option<PyRef<'_, PyGpuTarget>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyArray2<f32>>>>> {
        let imported = Arc::clone(&self.imported);
        let gpu = gpu.map(|g| g.gpu.clone());
        let rows = guarded(py, "Program.extract_features_each", move || {
            Ok(
                extract_traces_on(&imported.program, &trace_jsons, postprocess, gpu.as_ref())
                    .into_iter()
                    .map(Result::ok)
                    .collect::<Vec<_>>(),
            )
        })?;
        rows.into_iter()
            .map(|r| r.map(|data| feature_array(py, data)).transpose())
            .collect()
    }
}

/// One candidate's features (row-major, [`N_FEATURES`] a row) as a `(n_stores, 164)` array;
/// the Vec moves into the array, no copy.
fn feature_array(py: Python<'_>, data: Vec<f32>) -> PyResult<Bound<'_, PyArray2<f32>>> {
    let rows = data.len() / N_FEATURES;
    PyArray1::from_vec(py, data).reshape([rows, N_FEATURES])
}
