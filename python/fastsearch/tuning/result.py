"""What a tuning run gives back: per-trial records, per-task results, the final round, what
``fusion="search"`` tried, and :class:`TuneResult`, which compiles the tuned model."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm.ir import IRModule
from tvm.s_tir import Trace
from tvm.s_tir import meta_schedule as ms

from fastsearch.database import TuningDatabase
from fastsearch.graph.relax_tasks import apply_database
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.measure.measurer import build_seconds
from fastsearch.search.sample import fresh_copy
from fastsearch.search.warm_start import WarmStart
from fastsearch.tuning.model_round import ModelRound

__all__ = [
    "FinalRound",
    "FusionChange",
    "FusionReport",
    "LayoutChoice",
    "TaskResult",
    "TrialRecord",
    "TuneResult",
]


@dataclass
class FusionChange:
    """One change to the rule-based grouping and what came of it.

    ``sites`` lists the rule-based groups merged at each place the change is made (a change
    that makes the same new function at several places, as repeated layers do, is made at all
    of them, and ``groups`` is their union); ``functions`` lists the PrimFuncs (legalized names)
    of each merged group at the first site; ``removed_us`` is
    what the fastest kernel the change removes took per inference in the rule-based run, at
    the sites it is removed from (how changes are ranked for the trial budget); ``ratio`` is the model's end-to-end latency with the change
    over without it (median of the interleaved rounds); ``reason`` says why it was kept or not.
    """

    kind: str
    groups: list[int]
    functions: list[list[str]]
    sites: list[list[int]] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    removed_us: float | None = None
    trials: int = 0
    ratio: float | None = None
    kept: bool = False
    reason: str = ""

    def summary(self) -> str:
        """One line: the kind, the merged functions, the number of sites and the verdict."""
        what = " + ".join("/".join(f) for f in self.functions)
        sites = f" (x{len(self.sites)} sites)" if len(self.sites) > 1 else ""
        return f"{self.kind:<10} {what}{sites}: {self.reason}"


@dataclass
class FusionReport:
    """What ``fusion="search"`` tried and chose: ``groups`` is the final grouping (node indices
    of the legalized model's graph), ``base_ms`` and ``final_ms`` the median end-to-end
    latencies of the rule-based and the final grouping in the last timing, over ``rounds``
    interleaved rounds."""

    changes: list[FusionChange]
    groups: list[list[int]]
    rule_groups: list[list[int]]
    base_ms: float | None = None
    final_ms: float | None = None
    rounds: int = 0
    trials_rules: int = 0
    trials_changes: int = 0

    @property
    def kept(self) -> list[FusionChange]:
        return [c for c in self.changes if c.kept]


@dataclass
class TrialRecord:
    """One measured candidate, in measurement order (for tuning curves)."""

    trial: int
    task: str
    latency_us: float | None
    min_us: float | None
    median_us: float | None
    error: str | None
    elapsed_s: float
    best_us: float | None
    failure: str | None = None  # one of fastsearch.measure.measurer.FAILURE_KINDS when error is set
    # Seconds its build spent in TVM's passes, in code generation (LLVM) and in export; None
    # where the build did not record them (it failed, or a custom build function ran).
    build_passes_s: float | None = None
    build_codegen_s: float | None = None
    build_export_s: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the candidate built, ran and (when checked) computed the right answer."""
        return self.error is None

    @property
    def build_s(self) -> float | None:
        """Its whole build, the three stages together (None when not recorded)."""
        return build_seconds(
            {"passes": self.build_passes_s, "codegen": self.build_codegen_s, "export": self.build_export_s}
        )


@dataclass
class TaskResult:
    """Outcome of one PrimFunc of the tuned module (one task).

    ``trials`` is the task's share of the run's trials, stored records included: a fixed even
    split with the round-robin scheduler; with the gradient scheduler, what the rule gave it.
    """

    name: str
    mod: IRModule
    trials: int
    trials_measured: int = 0
    trials_stored: int = 0
    failed: int = 0
    best_latency_us: float | None = None
    best_trace: Trace | None = None
    exhausted: bool = False
    failures: dict[str, int] = field(default_factory=dict)  # failed candidates per kind
    failure_examples: dict[str, str] = field(default_factory=dict)  # the first error of each kind
    weight: int = 1  # calls per run of the model (a Relax model's repeated layers share a task)
    skipped: str | None = None  # why a Relax model's fused function is not tuned
    functions: list[str] = field(default_factory=list)  # a Relax model's functions it stands for
    final: FinalRound | None = None  # the best and its runners-up timed side by side at the end
    flops: float | None = None  # floating-point operations per call, when TVM can count them
    cold: bool = False  # timed with its weights flushed from the caches (MeasureConfig.cold_weights)

    @property
    def gflops(self) -> float | None:
        """Throughput of the best candidate, GFLOP/s (``None`` when unknown)."""
        if not self.flops or not self.best_latency_us:
            return None
        return self.flops / (self.best_latency_us * 1e-6) / 1e9


@dataclass
class FinalRound:
    """A task's final round: its best ``len(ratios) + 1`` records built again and timed side by
    side in ``rounds`` interleaved rounds (:meth:`fastsearch.measure.measurer.Measurer.side_by_side`)
    in each of ``processes`` worker processes (the measurer's kept one, then fresh ones).

    ``ratios`` holds each runner-up's mean per-round time over the best's, in the database's
    order; ``times_us`` each finalist's mean time per call over every round and process, the
    best first (NaN for one that could not be built). ``chosen`` is the index in ``ratios`` of
    the runner-up that became the best (``None`` when the best stayed). A chosen runner-up is
    stored again at the lower of its ``times_us`` and just under the best's stored time
    (:func:`fastsearch.database.superseding_run_secs`), so that TVM's ``get_top_k`` and
    ``compile_tir`` pick it too.
    """

    rounds: int
    ratios: list[float]
    chosen: int | None = None
    processes: int = 1
    times_us: list[float] = field(default_factory=list)


@dataclass
class LayoutChoice:
    """What ``layout="search"`` measured before it chose: each layout's model tuned with the
    same ``probe_trials``, scored by its tuned tasks' weighted sum of best latencies (us;
    ``None`` while a task had no valid record), and the layout the rest of the run tuned."""

    chosen: str
    estimates_us: dict[str, float | None]
    probe_trials: int


@dataclass
class TuneResult:
    """What a tuning run found, where it is stored, and where the time went.

    ``best_latency_us`` is the mean run time of the best valid record (how MetaSchedule ranks
    records); for a module of several PrimFuncs it is the sum over them, and for a Relax model
    the sum of weight x best over its tuned tasks (``None`` until every one has a valid
    record). ``tasks`` gives each task's weight, trials and best (for a Relax model also the
    skipped ones, with ``skipped`` saying why). ``timing`` holds seconds
    spent in ``search`` (candidate sampling), ``apply`` (trace replay and postprocessing in TVM),
    ``build``, ``run``, ``verify``, ``database``, ``model``, ``final`` (each task's final round,
    :class:`FinalRound`: its best records built again and timed side by side) and ``total``. ``failures`` counts
    this run's failed candidates per kind (``"build error"``, ``"run timeout"``, ``"run crash"``,
    ``"wrong answer"``, ...: :data:`fastsearch.measure.measurer.FAILURE_KINDS`); ``repairs`` lists what
    was repaired in the database on load (a torn last line of a killed run).
    """

    best_latency_us: float | None
    best_trace: Trace | None
    database: TuningDatabase
    work_dir: Path
    timing: dict[str, float]
    trials_measured: int
    failed: int
    history: list[TrialRecord]
    tasks: dict[str, TaskResult]
    target: tvm.target.Target
    mod: IRModule = field(repr=False)
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)  # kind -> "task: first error"
    repairs: list[str] = field(default_factory=list)
    is_relax: bool = False  # mod is a fused Relax model; compile() gives a VM executable
    task_scheduler: str = "gradient"
    warm_start: WarmStart | None = None  # the records this run started from
    fusion: FusionReport | None = None  # what fusion="search" tried and kept
    model_round: ModelRound | None = None  # each task's best records tried in the model's sequence
    layout_choice: LayoutChoice | None = None  # what layout="search" measured and kept

    @property
    def best_traces(self) -> dict[str, Trace]:
        """Best trace of every task that has a valid record."""
        return {name: t.best_trace for name, t in self.tasks.items() if t.best_trace is not None}

    def write_history(self, path: str | os.PathLike[str]) -> Path:
        """Write the per-trial history (the tuning curve) as CSV; returns the path."""
        out = Path(path)
        fields = [
            "trial",
            "task",
            "latency_us",
            "min_us",
            "median_us",
            "best_us",
            "elapsed_s",
            "failure",
            "error",
            "build_passes_s",
            "build_codegen_s",
            "build_export_s",
        ]
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            for h in self.history:
                row = {k: getattr(h, k) for k in fields}
                row["error"] = (h.error or "").splitlines()[0] if h.error else ""
                writer.writerow(row)
        return out

    def best_module(self) -> IRModule:
        """The tuned IRModule: each PrimFunc replaced by its best schedule from the database.

        For a Relax model, the fused model with ``relax.transform.MetaScheduleApplyDatabase``
        applied (every copy of a tuned function gets its schedule; skipped ones stay as TVM
        lowers them)."""
        if self.is_relax:
            return apply_database(self.mod, self.database.ms_database, self.target)
        funcs = {}
        for gv, func in self.mod.functions_items():
            name = gv.name_hint
            task = self.tasks.get(name)
            if task is not None:
                sch = ms.tir_integration.compile_tir(
                    self.database.ms_database, fresh_copy(task.mod), self.target
                )
                if sch is not None:
                    func = sch.mod["main"]
                    if self.mod[gv].attrs is not None and "global_symbol" in self.mod[gv].attrs:
                        func = func.with_attr("global_symbol", self.mod[gv].attrs["global_symbol"])
            funcs[name] = func
        return IRModule(funcs, attrs=self.mod.attrs)

    def compile(self) -> tvm.runtime.Executable:
        """Build the tuned module for the target (``tvm.compile`` with fastsearch's TIR pipeline,
        :data:`fastsearch.ir.vector_math.TIR_PIPELINE`: vector ``exp``, as the candidates were
        measured); call its functions by name,
        ``lib["main"](*tensors)``. For a Relax model it is a VM executable:
        ``tvm.relax.VirtualMachine(exe, device)["main"](*inputs)``.

        Its kernels were tuned on the target's ``num-cores`` threads (or ``TVM_NUM_THREADS``
        where the user set it). They run in this process on TVM's thread pool, which is sized
        when a thread first runs a parallel kernel (``TVM_NUM_THREADS``, else half the logical
        CPUs: one thread on a 2-vCPU machine) and never grows. To run them on the threads they
        were tuned on, call :func:`fastsearch.set_kernel_threads` before the first kernel runs
        (``fastsearch.set_kernel_threads(int(result.target.attrs["num-cores"]))``, or with no
        argument for every physical core), or set ``TVM_NUM_THREADS`` before Python starts."""
        return tvm.compile(self.best_module(), target=self.target, tir_pipeline=TIR_PIPELINE)
