"""The driver's task graph: training, merges and evaluation overlapped (``cluster.schedule``).

After the features stage, the Tune sweep runs in a thread of the driver while its main thread
takes each trial's end as it comes (a Tune callback queues it): a finished drafter is recorded,
the merges whose two sources are then known run, and the evaluation units whose drafters all exist
join the queue of an :class:`~orchestrator.run.eval_run.EvalRun`. The units, their keys and the plan
are those the stage-after-stage driver makes (the same checkpoint references), so the manifest,
resume and ``--force`` mean what they meant.

Resources: the eval actors are started only once every trial has started (the sweep's trials go
first on the devices, as the dry run's scheduler puts the critical path first), and they are
killed whenever their queue runs dry while trials still train, so a retried trial (a lost node)
finds devices again. A trial that fails fails its merges and the units that read it, as in the
stages (recorded with the reason).
"""
from __future__ import annotations

import queue
import threading
import time

from orchestrator.grid import merge_cells
from orchestrator.run.eval_run import EvalRun
from orchestrator.run.progress import Progress

WAIT_S = 1.0  # how long the loop waits for a unit or an event before it looks at the other


class _Sweep(threading.Thread):
    """``d.start_sweep`` in a thread: its ResultGrid or its exception once it ends."""

    def __init__(self, d, todo: dict, prog: Progress, events: queue.Queue):
        super().__init__(name="tune-sweep", daemon=True)  # (a killed driver does not wait for it)
        self.d = d
        self.todo = todo
        self.prog = prog
        self.events = events
        self.grid = None
        self.error = None
        self.t0 = time.time()
        self.seconds = 0.0
        self.done = False

    def run(self) -> None:
        try:
            from orchestrator.run.tune_events import TrialEvents  # (imports Ray Tune)

            self.grid = self.d.start_sweep(self.todo, self.prog, callbacks=[TrialEvents(self.events)])
        except BaseException as e:  # noqa: BLE001 - raised again in the driver's thread
            self.error = e
        finally:
            self.seconds, self.done = time.time() - self.t0, True
            from orchestrator.run.tune_events import QUEUES

            QUEUES.pop(id(self.events), None)


class GraphRun:
    """One invocation's training, merges and evaluation as a graph (see the module docstring)."""

    def __init__(self, d, caches):
        self.d = d
        self.before = {s: d.manifest.recorded.get(s, 0) for s in ("train", "merge", "eval")}
        self.ckpts, self.todo, self.tprog = d.train_todo(caches)
        self.known = dict(self.ckpts)  # drafter name -> ref (trained or merged) or None (failed)
        self.merges = [m for m in merge_cells(d.p)]
        for m in self.merges:  # every key before any eval key (an eval key names its drafters' keys)
            d.merge_key(m)
        self.units = units = d._eval_units(d.checkpoint_refs())
        d.manifest.set_plan("eval", [k for _, _, keys, _ in units for k in keys])
        self.n_units = len(units)
        self.eprog = Progress("eval", len(units))
        self.mprog = Progress("merge", len(self.merges))
        waiting, earlier = d._eval_todo(units, self.eprog)
        self.waiting = waiting  # (cell, shard, key) not yet queued: their drafters are not all known
        self.run = EvalRun(d, self.eprog, earlier)
        self.inits = {}
        self.started = set()
        self.ended = set()
        self.missing = {}
        self.no_actor: str | None = None
        self.spans: dict[str, list[float]] = {}

    def _span(self, stage: str, t0: float) -> None:
        s = self.spans.setdefault(stage, [t0, t0])
        s[0], s[1] = min(s[0], t0), time.time()

    def go(self) -> dict:
        events: queue.Queue = queue.Queue()
        sweep = _Sweep(self.d, self.todo, self.tprog, events) if self.todo else None
        if sweep:
            sweep.start()
        self._resolve(final=sweep is None)
        while True:
            self._take(events)
            training = sweep is not None and not sweep.done
            if sweep is not None and sweep.done:
                self._sweep_ended(sweep)
                sweep = None
                self._resolve(final=True)
            if not training and not self.waiting and not self.run.busy:
                break
            self._evaluate(training)
        self.run.close()
        return self._finish()

    def _take(self, events: queue.Queue) -> None:
        """The trials' starts and ends queued since the last look (a short wait when the pool is idle)."""
        idle = self.run.pool is None or not self.run.busy
        try:
            kind, name, error = events.get(timeout=WAIT_S if idle else 0.0)
        except queue.Empty:
            return
        while True:
            if kind == "start":
                self.started.add(name)
            elif name in self.todo and name not in self.ended:
                self._trial_ended(name, error)
            try:
                kind, name, error = events.get_nowait()
            except queue.Empty:
                return

    def _trial_ended(self, name: str, error) -> None:
        t0 = time.time()
        self.ended.add(name)
        ok = self.d.train_finished(name, error, self.ckpts, self.tprog)
        self.known[name] = self.ckpts[name] if ok else None
        self.d._sync()
        self._span("train", t0)
        self._resolve()

    def _sweep_ended(self, sweep: _Sweep) -> None:
        """Every trial the callbacks did not report (a sweep that raised: re-raised here)."""
        if sweep.error is not None:
            raise sweep.error
        errors = {res.config["cell"]: res.error for res in sweep.grid if res.error}
        for name in self.todo:
            if name not in self.ended:
                self._trial_ended(name, errors.get(name))
        self.d.tracker.publish()  # the sweep's tracker records, to the output URI
        self.sweep_seconds = sweep.seconds

    def _resolve(self, final: bool = False) -> None:
        """Merges whose sources are known, then the units whose drafters are: queued or failed
        (``final``: every trial has ended, so a drafter not known by now never will be)."""
        for m in list(self.merges):
            src = [f"{m.backbone}-{v}" for v in ("math", "chat")]
            if all(s in self.known for s in src):
                t0 = time.time()
                self.merges.remove(m)
                out: dict = {}
                self.d._merge_one(m, {s: self.known[s] for s in src}, self.inits, out, self.mprog)
                self.known[m.name] = out.get(m.name)
                self._span("merge", t0)
        ready, failed = [], {}
        for u in self.waiting:
            names = u[0].drafters
            if any(self.known.get(n, "") is None or (final and n not in self.known) for n in names):
                failed.setdefault(u[0].key, u[0])
            elif all(n in self.known for n in names):
                ready.append(u)
        self.waiting = [u for u in self.waiting if u not in ready and u[0].key not in failed]
        for key, cell in failed.items():
            gone = ", ".join(n for n in cell.drafters if self.known.get(n) is None)
            self.missing[key] = cell
            self.d.manifest.record("eval-missing-" + key, "eval", cell.label, "failed",
                                   error="missing drafter: " + gone)
            self.eprog.step(f"{cell.label} skipped: missing drafter: {gone}", skipped=True)
        if ready:
            self.run.add(ready, {n: r for n, r in self.known.items() if r is not None})

    def _evaluate(self, training: bool) -> None:
        """Open the pool once every trial has started and units are queued; close it when it runs dry
        while trials still train; otherwise one step of the pool."""
        if self.no_actor is not None and self.run.queue:
            for (cell, _shard, key), attempt in self.run.queue:
                self.run._failed(cell, key, attempt, self.no_actor, f"FAILED: {self.no_actor[:200]}")
            self.run.queue = []
        if self.run.pool is None:
            if self.run.queue and (not training or len(self.started) >= len(self.todo)):
                t0 = time.time()  # sized for every unit still to come (actors beyond the free devices wait)
                ev = self.d._plan(None, len(self.run.queue) + len(self.waiting)).eval
                self.run.open(ev.units, ev.gpus)
                left = len(self.todo) - len(self.ended)
                self.eprog.log(f"{ev.units} eval actor(s) started" + (
                    f" while {left} trial(s) train" if training else ""))
                self._span("eval", t0)
            return
        if not self.run.busy:
            if training:  # their devices back to a trial that Tune retries
                self.run.close()
                self.eprog.log("eval actors stopped: nothing to evaluate until the next trial ends")
            return
        t0 = time.time()
        if not self.run.step(timeout=WAIT_S):
            self.no_actor = "no evaluation actor could start (see the eval actor lines above)"
            self.run.close()
        self._span("eval", t0)

    def _finish(self) -> dict:
        """Each stage's span (they overlap), recorded as overlapped, and the plan with failed cells."""
        d = self.d
        if self.missing:  # as the stages plan them: a cell with a failed drafter is one failed record
            d.manifest.set_plan("eval", [k for cell, _, keys, _ in self.units for k in (
                ["eval-missing-" + cell.key] if cell.key in self.missing else keys)])
        for stage in ("train", "merge", "eval"):
            if stage in self.spans:
                a, b = self.spans[stage]
                seconds = getattr(self, "sweep_seconds", b - a) if stage == "train" else b - a
                d.stage_seconds[stage] = seconds
                ran = d.manifest.recorded.get(stage, 0) - self.before[stage]
                d.manifest.record_stage(stage, seconds, ran, d.machine, overlapped=True)
        d._sync()
        return {"eval_units": self.n_units}
