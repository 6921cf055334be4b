"""Task schedulers: which task of a multi-task run gets the next batch of trials.

A model is tuned as several tasks (fused operators), each called ``weight`` times per inference;
what matters is the model's total ``sum(weight * best latency)``. The gradient scheduler is
Ansor's (Zheng et al., OSDI 2020, section 6): after a warm-up round that gives every task one
batch, the next batch goes to the task whose weighted latency is expected to drop most, judged
from its own history. The round-robin scheduler gives tasks one batch each in turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "SCHEDULERS",
    "GradientScheduler",
    "RoundRobinScheduler",
    "TaskScheduler",
    "TaskState",
    "expected_gain",
    "floor_rounds",
    "make_scheduler",
]

#: Names accepted by ``tune(task_scheduler=...)``.
SCHEDULERS = ("gradient", "round-robin")


@dataclass
class TaskState:
    """What a scheduler knows of one task: its weight and its best latency (seconds) after each
    batch it was given (``inf`` while it has no valid measurement)."""

    weight: float
    history: list[float] = field(default_factory=list)
    active: bool = True  # False once the task cannot take more trials (budget, search exhausted)
    floor: int = 0  # rounds the task gets before the gradient rule decides (see GradientScheduler)

    @property
    def rounds(self) -> int:
        return len(self.history)

    @property
    def best(self) -> float:
        return self.history[-1] if self.history else math.inf


def expected_gain(task: TaskState, alpha: float = 0.2, window: int = 3, max_failed_rounds: int = 2) -> float:
    """Expected drop of the weighted latency (seconds) if ``task`` gets one more batch.

    Ansor's rule: ``weight * (alpha * backward + (1 - alpha) * forward)`` where ``backward`` is
    the drop per round over the last ``window`` rounds (what the task has just been achieving)
    and ``forward = best / rounds`` (optimistic: the next round gains as much as the average
    round so far, which falls as a task converges). A task with no round yet has an infinite
    gain (the warm-up); one with no valid measurement after its first rounds may simply not
    build, so after ``max_failed_rounds`` it gets none rather than starving the others.
    """
    if task.rounds == 0:
        return math.inf
    best = task.best
    if not math.isfinite(best):
        return math.inf if task.rounds < max_failed_rounds else 0.0
    backward = 0.0
    if task.rounds > window and math.isfinite(task.history[-1 - window]):
        backward = (task.history[-1 - window] - best) / window
    forward = best / task.rounds
    return task.weight * (alpha * backward + (1.0 - alpha) * forward)


class TaskScheduler:
    """Base class: ``next()`` picks the next task (``None`` when none is active), ``record()``
    reports the task's best latency after the batch it was given."""

    def __init__(self, tasks: Sequence[TaskState]) -> None:
        self.tasks = list(tasks)

    def next(self) -> int | None:
        raise NotImplementedError

    def record(self, index: int, best_secs: float) -> None:
        self.tasks[index].history.append(best_secs)

    def deactivate(self, index: int) -> None:
        self.tasks[index].active = False


class GradientScheduler(TaskScheduler):
    """Ansor's gradient rule, deterministic: warm-up in task order, then every task below its
    ``floor`` of rounds (fewest rounds first), then the largest :func:`expected_gain` (ties to
    the first task).

    The floor is there because the rule judges a task by its first batches: a task whose first
    few candidates happened to be poor looks converged and starves (at 300 trials on a
    MobileNetV2, one task got 95 measurements and others 4 or 5)."""

    def __init__(self, tasks: Sequence[TaskState], alpha: float = 0.2, window: int = 3) -> None:
        super().__init__(tasks)
        self.alpha = alpha
        self.window = window

    def gains(self) -> list[float]:
        """Expected gain of every task (``-inf`` for inactive ones)."""
        return [expected_gain(t, self.alpha, self.window) if t.active else -math.inf for t in self.tasks]

    def next(self) -> int | None:
        below = [i for i, t in enumerate(self.tasks) if t.active and 0 < t.rounds < t.floor]
        if below and all(t.rounds > 0 or not t.active for t in self.tasks):
            return min(below, key=lambda i: (self.tasks[i].rounds, i))
        gains = self.gains()
        best = max(range(len(gains)), key=lambda i: (gains[i], -i), default=None)
        if best is None or gains[best] == -math.inf:
            return None
        return best


class RoundRobinScheduler(TaskScheduler):
    """One batch per active task in turn."""

    def __init__(self, tasks: Sequence[TaskState]) -> None:
        super().__init__(tasks)
        self._cursor = 0

    def next(self) -> int | None:
        n = len(self.tasks)
        for step in range(n):
            i = (self._cursor + step) % n
            if self.tasks[i].active:
                self._cursor = i + 1
                return i
        return None


def floor_rounds(
    flops: Sequence[float | None],
    trials: int,
    batch_sizes: Sequence[int],
    min_share: float = 0.01,
    cap: int = 32,
) -> list[int]:
    """Each task's floor of rounds: a task doing at least ``min_share`` of the model's weighted
    FLOPs (``flops[i]``: weight x FLOPs per call, ``None`` when unknown, which counts as
    meaningful) is owed ``min(cap, trials / (2 x such tasks))`` trials, in whole batches (at
    least the warm-up's one); others are owed nothing beyond the warm-up."""
    known = [f for f in flops if f is not None]
    total = sum(known)
    meaningful = [f is None or total <= 0 or f >= min_share * total for f in flops]
    count = sum(meaningful)
    if count == 0:
        return [0] * len(flops)
    owed = min(cap, trials // (2 * count))
    # Whole batches, rounded down so that floors stay within half the budget.
    return [max(1, owed // max(1, b)) if m else 0 for m, b in zip(meaningful, batch_sizes, strict=True)]


def make_scheduler(name: str, tasks: Sequence[TaskState]) -> TaskScheduler:
    """The scheduler called ``name`` (one of :data:`SCHEDULERS`)."""
    if name == "gradient":
        return GradientScheduler(tasks)
    if name == "round-robin":
        return RoundRobinScheduler(tasks)
    raise ValueError(f"unknown task_scheduler {name!r}; available: {', '.join(SCHEDULERS)}")
