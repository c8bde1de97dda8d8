"""Evaluation units through a pool of actors: queued as they become ready, retried, recorded.

The driver's evaluation loop as an object, so that it can run in two ways: stage after stage (every
unit queued at once, then :meth:`EvalRun.drain`), or inside the task graph (orchestrator/run/graph.py),
where units join the queue as their drafters finish training or merging and the pool is opened
and closed around the trials (:meth:`open`, :meth:`close`, :meth:`step` with a timeout).
"""
from __future__ import annotations

import traceback

from orchestrator.grid import eval_job
from orchestrator.run.eval_pool import NoEvalActor


class EvalRun:
    """Units ``(cell, shard, key)`` for the driver ``d``: each recorded "running" with its attempt
    before it starts, then done (traces written) or, after ``d.p.retries`` retries, failed."""

    def __init__(self, d, prog, earlier: dict):
        self.d = d
        self.prog = prog
        self.earlier = earlier  # attempts of earlier drivers, per key
        self.queue: list = []  # ((cell, shard, key), attempt)
        self.pool = None
        self.refs: dict = {}  # drafter name -> checkpoint ref, for the units queued so far

    def add(self, units: list, refs: dict) -> None:
        self.refs.update(refs)
        self.queue += [(u, 1) for u in units]

    @property
    def busy(self) -> bool:
        """Units queued or running."""
        return bool(self.queue or (self.pool is not None and self.pool.running))

    def open(self, n: int, gpus: float) -> None:
        """``n`` actors with ``gpus`` each (the plan's numbers), unless a pool is open."""
        if self.pool is None:
            from orchestrator.run.cluster import eval_pool  # (the cluster module imports Ray's actor classes)

            self.pool = eval_pool(self.d.p, n, log=self.prog.log, num_gpus=gpus)

    def close(self) -> None:
        """Kill the actors (their resources go back to the cluster); queued units wait for the next pool."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def drain(self) -> None:
        while self.busy:
            if not self.step():
                break

    def step(self, timeout: float | None = None) -> bool:
        """Submit queued units to free actors, then wait (at most ``timeout`` seconds) for one unit or
        probe and handle it. False once no actor can ever start (the rest recorded failed)."""
        pool = self.pool
        while self.queue and pool.free:
            (cell, shard, key), attempt = item = self.queue.pop(0)
            # "running", with the attempt, before it starts: a driver that resumes after this one is
            # killed counts the attempt (attempts in the manifest count over every driver of the output)
            self.d.manifest.record(key, "eval", cell.label, "running", attempts=self.earlier[key] + attempt)
            job = eval_job(self.d.p, cell)  # its DecodeConfig (tree included), through Ray as it is
            drafters = [self.refs[n] for n in cell.drafters]
            pool.submit(lambda a, job=job, drafters=drafters, shard=shard, name=f"eval:{cell.label}":
                        a.run.options(name=name).remote(job, drafters, shard), item)
        try:
            finished = pool.next(timeout)
        except NoEvalActor as e:  # every actor failed to start, again and again: the rest fail with why
            for (cell, _shard, key), attempt in self.queue + [item for _, item in pool.running.values()]:
                self._failed(cell, key, attempt, str(e), f"FAILED: {str(e)[:200]}")
            self.queue, pool.running = [], {}
            return False
        if finished is not None:  # (None: a probe answered, a slot is free again, or the wait timed out)
            self._finished(*finished)
        return True

    def _finished(self, item, result, e) -> None:
        (cell, shard, key), attempt = item
        if e is None:
            self.d._record_eval(cell, shard, key, self.earlier[key] + attempt, result, self.prog)
        elif attempt <= self.d.p.retries:  # the actor died or decoding failed: retry, then record
            self.prog.log(f"{cell.label}: attempt {attempt} failed ({type(e).__name__}); retrying")
            self.queue.append(((cell, shard, key), attempt + 1))
        else:
            self._failed(cell, key, attempt, "".join(traceback.format_exception_only(type(e), e))[-2000:],
                         f"FAILED after {attempt} attempts")

    def _failed(self, cell, key: str, attempt: int, error: str, line: str) -> None:
        self.d.manifest.record(key, "eval", cell.label, "failed", attempts=self.earlier[key] + attempt,
                               error=error)
        self.prog.step(f"{cell.label} {line}")
