"""What a model-guided search keeps next to a task's database, so that a later run starts warm:
the genome of every proposed candidate, each measured candidate's build seconds, and the last
trained cost model.

The files are named after the task and its structural hash (:func:`state_name`): two models
tuned in one work directory often have tasks of the same name (``fused_conv2d_add_relu``) and
different shapes, and one task's genomes or model read as another's would mislead its search.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import tvm
from tvm_ffi import structural_hash

__all__ = ["PREFIX", "SearchState", "state_file", "state_name"]

T = TypeVar("T")

#: Every search-state file starts with this.
PREFIX = "fastsearch_search"


def state_name(task: str, mod: tvm.IRModule | tvm.tirx.PrimFunc) -> str:
    """The name a task's state files carry: its name and 8 hex digits of its structural hash."""
    return f"{task}.{structural_hash(mod) & 0xFFFFFFFF:08x}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def state_file(directory: str | os.PathLike[str], task: str, kind: str) -> Path:
    """The ``kind`` file (``"genomes.jsonl"``, ``"builds.jsonl"``, ``"model.json"``) of the one
    task named ``task`` in ``directory``, whatever its hash, or without one as runs before the
    hash named them (for tools that read a finished run of one workload). ``FileNotFoundError``
    when there is none, ``ValueError`` when several tasks of that name have one."""
    directory = Path(directory)
    pattern = re.compile(rf"{PREFIX}\.{re.escape(_safe(task))}(\.[0-9a-f]{{8}})?\.{re.escape(kind)}")
    found = sorted(p for p in directory.glob(f"{PREFIX}.*") if pattern.fullmatch(p.name))
    if not found:
        raise FileNotFoundError(f"no {kind} of a task named {task!r} in {directory}")
    if len(found) > 1:
        raise ValueError(f"{len(found)} tasks named {task!r} in {directory}: {[p.name for p in found]}")
    return found[0]


class SearchState:
    """What a model-guided search keeps next to the database, so a later run starts warm.

    ``<prefix>.genomes.jsonl`` maps each proposed candidate's key (its trace JSON, the database's
    key) to its genome, one JSON line each, appended as proposals are made; a torn last line
    (a killed run) is skipped. ``<prefix>.builds.jsonl`` holds each measured candidate's build
    seconds the same way. ``<prefix>.model.json`` holds the last trained booster and how many
    records trained it, replaced atomically.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str) -> None:
        """The state named ``name`` (:func:`state_name` of a task) in ``directory``."""
        self.directory = Path(directory)
        safe = _safe(name)
        self.genomes_path = self.directory / f"{PREFIX}.{safe}.genomes.jsonl"
        self.model_path = self.directory / f"{PREFIX}.{safe}.model.json"
        self.builds_path = self.directory / f"{PREFIX}.{safe}.builds.jsonl"

    @classmethod
    def of_task(cls, directory: str | os.PathLike[str], task: str, mod: Any) -> SearchState:
        """The state of the task named ``task`` whose module is ``mod``."""
        return cls(directory, state_name(task, mod))

    @classmethod
    def found(cls, directory: str | os.PathLike[str], task: str, kind: str) -> SearchState:
        """The state of the one task named ``task`` whose ``kind`` file is in ``directory``
        (:func:`state_file`)."""
        path = state_file(directory, task, kind)
        return cls(directory, path.name[len(PREFIX) + 1 : -len(kind) - 1])

    def load_genomes(self) -> dict[str, str]:
        """The genome of every candidate proposed by earlier runs, by key (a torn line: its
        candidate is simply proposed again)."""
        return _read_keyed(self.genomes_path, "genome", str)

    def add_genomes(self, pairs: list[tuple[str, str]]) -> None:
        _append_keyed(self.genomes_path, "genome", pairs)

    def load_builds(self) -> dict[str, float]:
        """Build seconds of the candidates measured by earlier runs, by key."""
        return _read_keyed(self.builds_path, "build_s", float)

    def add_builds(self, pairs: list[tuple[str, float]]) -> None:
        _append_keyed(self.builds_path, "build_s", [(key, round(seconds, 4)) for key, seconds in pairs])

    def load_model(self) -> tuple[str, int] | None:
        """(booster JSON, records it was trained on), or None if absent or unreadable."""
        try:
            saved = json.loads(self.model_path.read_text())
            return json.dumps(saved["booster"]), int(saved["trained_on"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save_model(self, booster_json: str, trained_on: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.model_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"trained_on": trained_on, "booster": json.loads(booster_json)}))
        os.replace(tmp, self.model_path)


def _read_keyed(path: Path, field: str, convert: Callable[[Any], T]) -> dict[str, T]:
    """``{key: convert(entry[field])}`` of a JSON-lines file of ``{"key": ..., field: ...}``
    entries; a line torn by a kill (or whose field is missing or will not convert) is skipped, a
    missing file is empty."""
    out: dict[str, T] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            out[str(entry["key"])] = convert(entry[field])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _append_keyed(path: Path, field: str, pairs: Iterable[tuple[str, object]]) -> None:
    """Appends one ``{"key": key, field: value}`` line per pair (nothing, not even the folder,
    when there are none)."""
    lines = [json.dumps({"key": key, field: value}) + "\n" for key, value in pairs]
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(lines)
