"""The makespan of a grid on a given number of devices: list scheduling over its dependency graph.

Pure Python. A :class:`Task` takes ``seconds`` on ``need`` devices (GPUs, or CPUs for a CPU
profile) and may start once every task in ``deps`` has finished, and then only while its
``group`` (Tune's concurrent trials, the eval actor pool) has a free slot. Ready tasks start in
order of their longest path to the end (the critical path first), smaller ones backfilling
devices a larger one cannot use yet. With ``barriers`` every task of a stage also waits for
every task of the stage before it: the driver's stages (cluster.schedule stages: features, then
the whole training sweep, then merges, then evaluation); with the training barrier alone, the
driver's task graph (cluster.schedule graph: merges and evaluation start on what is ready);
without any, the bound on the same graph.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

STAGE_ORDER = ("features", "train", "merge", "eval", "report")
EPS = 1e-9  # fractional needs (1/3 of a GPU) add up with rounding


@dataclass(frozen=True)
class Task:
    name: str
    stage: str
    seconds: float
    need: float = 1  # devices held while it runs (0: beside them, e.g. a merge on the CPU; 0.5: half a GPU)
    deps: tuple = ()  # names of tasks that must finish first
    group: str | None = None  # a concurrency cap shared with other tasks (``caps``)
    busy: float = 1.0  # the share of its held device-time the devices compute (the rest: host, I/O, loads)


def _with_barriers(tasks: list[Task], stages=STAGE_ORDER) -> list[Task]:
    """Every task of ``stages`` also depends on every task of the nearest earlier stage that has tasks."""
    by_stage = {s: [t.name for t in tasks if t.stage == s] for s in STAGE_ORDER}
    out = []
    for t in tasks:
        if t.stage not in stages:
            out.append(t)
            continue
        before = [s for s in STAGE_ORDER[: STAGE_ORDER.index(t.stage)] if by_stage[s]]
        extra = tuple(by_stage[before[-1]]) if before else ()
        out.append(replace(t, deps=tuple(dict.fromkeys(t.deps + extra))))
    return out


def _priorities(tasks: dict[str, Task], children: dict[str, list[str]]) -> dict[str, float]:
    """Longest path from each task's start to the end of the graph (its own time included)."""
    memo: dict[str, float] = {}
    for name in reversed(_topological(tasks)):
        memo[name] = tasks[name].seconds + max((memo[c] for c in children[name]), default=0.0)
    return memo


def _topological(tasks: dict[str, Task]) -> list[str]:
    order, state = [], {}
    for root in tasks:
        stack = [(root, False)]
        while stack:
            n, done = stack.pop()
            if done:
                state[n] = 2
                order.append(n)
                continue
            if state.get(n) == 2:
                continue
            if state.get(n) == 1:
                raise ValueError(f"the task graph has a cycle through {n!r}")
            state[n] = 1
            stack.append((n, True))
            for d in tasks[n].deps:
                if state.get(d) != 2:
                    stack.append((d, False))
    return order


def _check(tasks: list[Task], by_name: dict[str, Task], devices: float, caps: dict[str, int]) -> None:
    """Refuse a graph the scheduler cannot run: duplicate names, unknown dependencies, a task wider
    than the devices, a group without a slot (ValueError)."""
    if len(by_name) != len(tasks):
        raise ValueError("task names must be unique")
    for t in tasks:
        for d in t.deps:
            if d not in by_name:
                raise ValueError(f"task {t.name!r} depends on unknown task {d!r}")
        if not 0.0 <= t.busy <= 1.0:
            raise ValueError(f"task {t.name!r} is busy {t.busy} of its time; a share is in [0, 1]")
        if t.need > devices + EPS:
            raise ValueError(f"task {t.name!r} needs {t.need} devices; there are {devices}")
        if t.group is not None and caps.get(t.group, 1) < 1:
            raise ValueError(f"group {t.group!r} of task {t.name!r} has no slot (cap {caps[t.group]})")


class _Timeline:
    """The list scheduler's state: ready tasks in one heap per (need, group) (within a class the
    top decides whether any fits), running tasks by end time, free devices, slots used per group,
    the clock, and the device-seconds held."""

    def __init__(self, by_name: dict[str, Task], prio: dict[str, float], devices: float, caps: dict[str,
            int]):
        self.by_name = by_name
        self.prio = prio
        self.caps = caps
        self.ready: dict[tuple, list] = {}
        self.running: list[tuple[float, str]] = []
        self.free = devices
        self.used = {}
        self.now = 0.0
        self.busy = 0.0
        self.stages: dict[str, list[float]] = {}
        self.stage_busy: dict[str, float] = {}
        self.stage_device: dict[str, float] = {}  # device-seconds computing (need x seconds x busy)

    def make_ready(self, n: str) -> None:
        t = self.by_name[n]
        heapq.heappush(self.ready.setdefault((t.need, t.group), []), (-self.prio[n], n))

    def start_what_fits(self) -> None:
        """Start the highest-priority ready task that fits, until none does."""
        while True:
            fits = [(h[0], cls) for cls, h in self.ready.items() if h and cls[0] <= self.free + EPS
                    and (cls[1] is None or self.used.get(cls[1], 0) < self.caps.get(cls[1], 10**9))]
            if not fits:
                return
            _, n = heapq.heappop(self.ready[min(fits)[1]])
            t = self.by_name[n]
            self.free -= t.need
            if t.group is not None:
                self.used[t.group] = self.used.get(t.group, 0) + 1
            heapq.heappush(self.running, (self.now + t.seconds, n))
            self.busy += t.need * t.seconds
            self.stage_busy[t.stage] = self.stage_busy.get(t.stage, 0.0) + t.need * t.seconds
            self.stage_device[t.stage] = self.stage_device.get(t.stage, 0.0) + t.need * t.seconds * t.busy
            span = self.stages.setdefault(t.stage, [self.now, self.now])
            span[0] = min(span[0], self.now)

    def finish_next(self) -> str:
        """Advance the clock to the next task's end and free what it held; its name."""
        self.now, n = heapq.heappop(self.running)
        t = self.by_name[n]
        self.free += t.need
        if t.group is not None:
            self.used[t.group] -= 1
        self.stages[t.stage][1] = max(self.stages[t.stage][1], self.now)
        return n


# the driver's task graph (cluster.schedule graph): training waits for every cache
GRAPH_BARRIERS = ("train",)


def schedule(tasks: list[Task], devices: int, caps: dict[str, int] | None = None,
             barriers: bool | tuple = True) -> dict:
    """{"makespan": s, "stages": {stage: (first start, last end)}, "busy": device-seconds held,
    "stage_busy": {stage: device-seconds held}, "stage_device": {stage: device-seconds computing}}.
    ``devices`` and a task's ``need`` may be fractions (actors sharing a GPU). ``barriers``: True,
    every stage waits for the one before (stage after stage); a tuple, those stages only
    (GRAPH_BARRIERS: the driver's task graph); False, none. Raises ValueError when a task needs more
    devices than there are."""
    caps = caps or {}
    if barriers:
        tasks = _with_barriers(tasks, STAGE_ORDER if barriers is True else barriers)
    by_name = {t.name: t for t in tasks}
    _check(tasks, by_name, devices, caps)
    waiting = {t.name: len(t.deps) for t in tasks}
    children: dict[str, list[str]] = {n: [] for n in by_name}
    for t in tasks:
        for d in t.deps:
            children[d].append(t.name)
    line = _Timeline(by_name, _priorities(by_name, children), devices, caps)
    for n, k in waiting.items():
        if k == 0:
            line.make_ready(n)
    while any(line.ready.values()) or line.running:
        line.start_what_fits()
        if not line.running:
            stuck = [h[0][1] for h in line.ready.values() if h]
            raise ValueError(f"tasks {stuck[:3]} can never start (devices or group caps)")
        n = line.finish_next()
        for c in children[n]:
            waiting[c] -= 1
            if waiting[c] == 0:
                line.make_ready(c)
    return {"makespan": line.now, "stages": {s: tuple(v) for s, v in line.stages.items()}, "busy": line.busy,
            "stage_busy": line.stage_busy, "stage_device": line.stage_device}
