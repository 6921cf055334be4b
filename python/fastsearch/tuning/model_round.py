"""The model round: each task's best records tried inside the whole model's call sequence.

Tuning times a kernel alone, in a loop: its weights and its input stay in the caches, and both
cores start on data they already hold. In the model, a kernel reads an input the kernel before
it has just written, split between the cores the way that kernel split its work, and weights
that the rest of the model pushed out of the caches. On a 2-core AVX-512 host, MobileNetV2's
kernels add up to 2.56 ms alone and 3.47 ms in the model's sequence, and two candidates within
a few percent of each other alone can differ by 2-3x there (a stride-2 depthwise conv: 23 us
alone, 76 us in the sequence, slower than on one core).

So after the final rounds, a Relax model's best ``candidates`` records per task are built into
whole models (model ``j`` takes each task's ``j``-th best), and a fresh process (a process that
has just tuned times models up to 3x slower) runs the model's kernels in its order, taking each
call's kernel and its prepacked weights from one model and its activations from model 0, so
that every kernel reads what its predecessor really wrote. Task by task, in program order, each
candidate runs in the sequence in interleaved rounds, timed over the task's calls and the call
after each (whose input it wrote); a runner-up that is faster there by more than ``margin``
becomes the task's best, and later tasks are tried with it in place.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from fastsearch.database import TuningDatabase, candidate_key, mean_run_secs, superseding_run_secs
from fastsearch.errors import MeasurementError
from fastsearch.graph.model_timing import kernel_calls, run_in_fresh_process
from fastsearch.graph.relax_tasks import apply_database
from fastsearch.ir.relax_expr import is_tensor_constant
from fastsearch.ir.threads import kernel_threads, target_threads
from fastsearch.ir.vector_math import TIR_PIPELINE

__all__ = ["ModelRound", "TaskChoice", "model_round"]

PREPACKED = "_prepacked"  # what SplitLayoutRewritePreproc appends to a kernel whose weight it prepacks


@dataclass
class TaskChoice:
    """One task in the model round: ``ratios[j]`` is candidate ``j``'s median per-round time in
    the model's sequence over the best's (``ratios[0] == 1``), ``sequence_us`` the best's time
    there (its calls and the call after each), ``chosen`` the candidate that became the best
    (``None`` when the best stayed), ``keys`` the candidates' keys."""

    task: str
    ratios: list[float]
    sequence_us: float
    chosen: int | None = None
    keys: list[str] = field(default_factory=list)  # candidate keys of the records tried


@dataclass
class ModelRound:
    """What the model round tried (:func:`model_round`), task by task in program order, and
    the seconds it took: building the models (``build_s``) and timing them (``time_s``);
    ``skipped`` says why it could not run (the tuning's bests stay)."""

    candidates: int
    rounds: int
    tasks: list[TaskChoice] = field(default_factory=list)
    build_s: float = 0.0
    time_s: float = 0.0
    skipped: str | None = None

    @property
    def chosen(self) -> list[TaskChoice]:
        return [t for t in self.tasks if t.chosen is not None]

    @property
    def gain_us(self) -> float:
        """Estimated microseconds an inference saves: each chosen task's time in the sequence
        times one less its ratio."""
        return sum(t.sequence_us * (1.0 - t.ratios[t.chosen]) for t in self.chosen if t.chosen is not None)

    def summary(self) -> str:
        if self.skipped is not None:
            return f"not run: {self.skipped.splitlines()[0][:200]}"
        return (
            f"{len(self.tasks)} tasks timed in the model's sequence ({self.candidates} candidates, "
            f"{self.rounds} rounds), a runner-up became the best in {len(self.chosen)} "
            f"(about {self.gain_us:.0f} us an inference); {self.build_s:.0f} s building, "
            f"{self.time_s:.0f} s timing"
        )


def _variant_database(
    tops: dict[str, list[ms.database.TuningRecord]], j: int, target: tvm.target.Target
) -> ms.database.Database:
    """A database holding, per task, its ``j``-th best record (its best when it has fewer)."""
    mem = ms.database.MemoryDatabase()
    for records in tops.values():
        rec = records[j] if j < len(records) else records[0]
        workload = mem.commit_workload(rec.workload.mod)
        mem.commit_tuning_record(
            ms.database.TuningRecord(rec.trace, workload, rec.run_secs, target, rec.args_info)
        )
    return mem


def weight_positions(applied: tvm.IRModule) -> list[tuple[str, list[int]]]:
    """Each kernel call of ``main`` in order: the called function's name and the positions of
    its arguments that are constants (weights, prepacked or not)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls: list[tuple[str, list[int]]] = []
    for block in applied["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                args = value.args[1]
                fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
                consts = [i for i, a in enumerate(fields) if is_tensor_constant(a)]
                calls.append((value.args[0].name_hint, consts))
    return calls


def _base_name(name: str) -> str:
    return name.removesuffix(PREPACKED)


def model_round(
    fused: tvm.IRModule,
    db: TuningDatabase,
    target: tvm.target.Target,
    tasks: dict[str, tuple[Any, list[str]]],
    inputs: list[np.ndarray],
    work_dir: Path,
    candidates: int = 3,
    rounds: int = 20,
    margin: float = 0.03,
    tolerance: tuple[float, float] = (1e-3, 1e-4),
    timeout_s: float = 900.0,
) -> ModelRound | None:
    """Try each task's best ``candidates`` records inside the model's sequence (module docs)
    and store every runner-up that wins there as its task's best. ``tasks`` maps a task's name
    to its workload and the model's functions it stands for; ``fused`` is the fused model the
    database applies to. A runner-up is chosen only if the model still computes its output with
    it (within ``tolerance``, relative and absolute as :class:`fastsearch.Verification`'s).
    ``None`` when no task has a runner-up."""
    out = ModelRound(candidates=candidates, rounds=rounds)
    tops = {name: db.top_distinct(wl, candidates, scan=4) for name, (wl, _) in tasks.items()}
    tops = {n: r for n, r in tops.items() if r}
    if not any(len(r) > 1 for r in tops.values()):
        return None
    n_models = max(len(r) for r in tops.values())
    t0 = time.perf_counter()
    folder = Path(work_dir) / "model_round"
    folder.mkdir(parents=True, exist_ok=True)
    libraries, masks = [], []
    for j in range(n_models):
        applied = apply_database(fused, _variant_database(tops, j, target), target)
        masks.append(weight_positions(applied))
        path = folder / f"model{j}.so"
        tvm.compile(applied, target=target, tir_pipeline=TIR_PIPELINE).export_library(str(path))
        libraries.append(str(path))
    out.build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    function_task = {f: name for name, (_, funcs) in tasks.items() if name in tops for f in funcs}
    spec = {
        "libraries": libraries,
        "masks": masks,
        "function_task": function_task,
        "candidates": {name: len(r) for name, r in tops.items()},
        "rounds": rounds,
        "margin": margin,
        "rtol": tolerance[0],
        "atol": tolerance[1],
    }
    threads = kernel_threads(target) or target_threads(target)  # as the run measured its kernels
    found = _run_in_fresh_process(spec, inputs, threads, timeout_s, folder)
    out.time_s = time.perf_counter() - t0
    for row in found:
        choice = TaskChoice(
            task=row["task"],
            ratios=row["ratios"],
            sequence_us=row["sequence_us"],
            keys=[candidate_key(r.trace) for r in tops[row["task"]]],
        )
        j = row["chosen"]
        if j is not None:
            best, runner_up = tops[choice.task][0], tops[choice.task][j]
            secs = superseding_run_secs(
                [float(s) for s in runner_up.run_secs], mean_run_secs([float(s) for s in best.run_secs])
            )
            db.commit(tasks[choice.task][0], runner_up.trace, secs, target, runner_up.args_info)
            choice.chosen = j
        out.tasks.append(choice)
    return out


def _run_in_fresh_process(
    spec: dict[str, Any], inputs: list[np.ndarray], threads: int, timeout_s: float, folder: Path
) -> list[dict[str, Any]]:
    """Run :func:`_child` on ``spec`` in a fresh interpreter; its files (the inputs, the spec as
    ``plan.json``, the result) stay in ``folder`` beside the models."""
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    np.savez(folder / "inputs.npz", *inputs)
    spec = {**spec, "inputs": str(folder / "inputs.npz"), "out": str(folder / "out.json")}
    run_in_fresh_process(
        "fastsearch.tuning.model_round", spec, folder / "plan.json", env, timeout_s, "the model round"
    )
    return list(json.loads((folder / "out.json").read_text()))


# The fresh process ---------------------------------------------------------------------------


def _capture(library: str, args: list[Any]) -> tuple[list[tuple[str, Any, tuple]], Any, Any]:
    """Every kernel call of one inference of ``library``'s ``main`` (name, function, arguments),
    the VM (which keeps every tensor alive) and the output tensor it returned."""
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu(0))
    calls, ret = kernel_calls(vm, args)
    while not hasattr(ret, "numpy"):  # a tuple's first tensor
        ret = ret[0]
    return calls, vm, ret


def _align(called: list[str], planned: list[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
    """The entries of ``planned`` (the calls in the model's IR) that ``called`` (the kernels the
    VM called) made, in order; a planned call may be missing (a reshape the build made a view).
    ``None`` when a called kernel is not planned."""
    out, p = [], 0
    for name in called:
        while p < len(planned) and planned[p][0] != name:
            p += 1
        if p == len(planned):
            return None
        out.append(planned[p])
        p += 1
    return out


class _Sequence:
    """The model's kernel calls, each taken from one of the candidate models."""

    def __init__(self, spec: dict[str, Any], args: list[Any]) -> None:
        captured = [_capture(path, args) for path in spec["libraries"]]
        models = [calls for calls, _, _ in captured]
        self.vms = [vm for _, vm, _ in captured]  # kept alive, and with them every tensor
        # model 0's output tensor: every sequence writes it, as the VM's inference did
        self.output = captured[0][2]
        self.reference = self.output.numpy().copy()
        base = models[0]
        names = [_base_name(n) for n, _, _ in base]
        masks = []
        for j, (model, plan) in enumerate(zip(models, spec["masks"])):
            mask = _align([_base_name(n) for n, _, _ in model], [(_base_name(n), p) for n, p in plan])
            if mask is None or [n for n, _ in mask] != names:
                raise MeasurementError(f"model {j} of the model round calls other kernels than model 0")
            masks.append(mask)
        self.task_of = [spec["function_task"].get(n) for n in names]
        # calls[j][i]: call i with model j's kernel and weights and model 0's activations
        self.calls: list[list[tuple[Any, tuple | None]]] = []
        self.weights: list[list[set[int]]] = []  # per model and call, its weights' positions
        for model, mask in zip(models, masks):
            row: list[tuple[Any, tuple | None]] = []
            self.weights.append([set(m[1]) for m in mask])
            for i, (_, func, fargs) in enumerate(model):
                consts = self.weights[-1][i]
                mixed = tuple(a if k in consts else base[i][2][k] for k, a in enumerate(fargs))
                same = all(
                    getattr(a, "shape", None) == getattr(b, "shape", None) for a, b in zip(mixed, fargs)
                )
                row.append((func, mixed if same else None))  # None: activations of another shape
            self.calls.append(row)
        self.choice = [0] * len(names)

    def computes_the_model(self, rtol: float, atol: float) -> bool:
        """Whether one inference of the sequence as chosen gives model 0's output (a runner-up
        that became the best in the final round was checked; one chosen here was not)."""
        self.output.copyfrom(np.zeros_like(self.reference))
        self.run(set())
        got = self.output.numpy()
        scale = float(np.max(np.abs(self.reference))) if self.reference.size else 1.0
        return bool(np.allclose(got, self.reference, rtol=rtol, atol=atol * max(scale, 1e-30)))

    def run(self, timed: set[int]) -> float:
        """One inference, kernel by kernel; seconds spent in the calls ``timed``."""
        spent = 0.0
        for i, j in enumerate(self.choice):
            func, fargs = self.calls[j][i]
            assert fargs is not None, "a candidate whose activations differ in shape is never chosen"
            if i in timed:
                t0 = time.perf_counter()
                func(*fargs)
                spent += time.perf_counter() - t0
            else:
                func(*fargs)
        return spent


def _choose(seq: _Sequence, task: str, n: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``task``'s ``n`` candidates in the sequence; keep the fastest that computes the
    model's output in ``seq.choice``."""
    rounds, margin = int(spec["rounds"]), float(spec["margin"])
    mine = [i for i, t in enumerate(seq.task_of) if t == task]
    usable = [j for j in range(n) if all(seq.calls[j][i][1] is not None for i in mine)]
    timed = set(mine) | {i + 1 for i in mine if i + 1 < len(seq.choice)}
    times: dict[int, list[float]] = {j: [] for j in usable}
    for r in range(rounds):
        for k in range(len(usable)):
            j = usable[(r + k) % len(usable)]
            for i in mine:
                seq.choice[i] = j
            seq.run(set())  # the candidate's own weights as the previous inference leaves them
            times[j].append(seq.run(timed))
    ratios = [
        statistics.median(t / b for t, b in zip(times[j], times[0])) if j in times else float("nan")
        for j in range(n)
    ]
    chosen = None
    for j in sorted(usable, key=lambda j: ratios[j]):
        if j == 0 or ratios[j] >= 1.0 - margin:
            break
        for i in mine:
            seq.choice[i] = j
        if seq.computes_the_model(float(spec["rtol"]), float(spec["atol"])):
            chosen = j
            break
    for i in mine:
        seq.choice[i] = chosen or 0
    return {
        "task": task,
        "ratios": ratios,
        "sequence_us": statistics.median(times[0]) * 1e6,
        "chosen": chosen,
    }


def _child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    with np.load(spec["inputs"]) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    args = [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs]
    seq = _Sequence(spec, args)
    if not seq.computes_the_model(float(spec["rtol"]), float(spec["atol"])):
        raise MeasurementError("the model's kernels called in its order do not give its output")
    for _ in range(3):  # warm-up
        seq.run(set())
    order = list(dict.fromkeys(t for t in seq.task_of if t is not None))
    found = []
    for task in order:
        n = int(spec["candidates"][task])
        if n > 1:
            found.append(_choose(seq, task, n, spec))
    Path(spec["out"]).write_text(json.dumps(found))


if __name__ == "__main__":
    _child(sys.argv[1])
