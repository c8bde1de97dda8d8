"""Evaluation actors as slots that outlive actor and node failures, without blocking each other.

Each slot runs one shard at a time. When a shard fails, its slot's actor is probed in the
background (``pid()`` answers once a restarted actor has reloaded its verifier) while the other
slots keep taking shards. An actor whose probe fails (it will not restart) or that has not
answered after ``restart_s`` seconds (no node could take it) is killed and replaced by a new
actor under a new, unique name. A slot whose actor fails to start ``max_starts`` times in a row
(a constructor that always raises: a verifier that cannot load, a node type that cannot hold it)
is retired; when every slot is retired the pool raises :class:`NoEvalActor`, naming the last
error, instead of replacing actors forever while the queue waits.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import ray


class NoEvalActor(RuntimeError):
    """Every slot's actor failed to start ``max_starts`` times in a row."""


class EvalPool:
    def __init__(self, make: Callable[[str], object], n: int, restart_s: float = 600.0, log=print,
                 max_starts: int = 3):
        """``make(name)``: a new actor (a handle with ``pid`` and the methods ``submit`` calls)."""
        self.make = make
        self.restart_s = restart_s
        self.log = log
        self.max_starts = max_starts
        self.actors = [self._new(i) for i in range(n)]
        self.free = list(range(n))
        self.running: dict = {}  # ObjectRef -> (slot, item)
        self.probes: dict = {}  # ObjectRef of pid() -> (slot, deadline)
        self.replaced = 0
        self.failed_starts = [0] * n  # per slot, in a row
        self.retired: set[int] = set()

    def _new(self, slot: int):
        return self.make(f"eval-worker-{slot}-{uuid.uuid4().hex[:8]}")

    def submit(self, call: Callable[[object], ray.ObjectRef], item) -> None:
        """Run ``call(actor)`` (it returns an ObjectRef) on a free slot; ``item`` comes back with it."""
        slot = self.free.pop()
        self.running[call(self.actors[slot])] = (slot, item)

    def _probe(self, slot: int) -> None:
        # retried while the actor restarts (a call to a restarting actor fails at once with
        # max_task_retries=0)
        ref = self.actors[slot].pid.options(max_task_retries=-1).remote()
        self.probes[ref] = (slot, time.time() + self.restart_s)

    def _replace(self, slot: int, why: str) -> None:
        ray.kill(self.actors[slot], no_restart=True)
        self.actors[slot] = self._new(slot)
        self.replaced += 1
        self.log(f"eval actor {slot} replaced ({why})")
        self._probe(slot)

    def next(self, timeout: float | None = None):
        """Wait for a shard or a probe (at most ``timeout`` seconds; None: until one comes). A shard:
        (item, result, None) or (item, None, error), the slot probed after an error; a probe, or
        nothing before the timeout: None (a probed slot is free again, or being replaced)."""
        deadline = min((d for _, d in self.probes.values()), default=None)
        wait = None if deadline is None else max(0.0, deadline - time.time())
        wait = timeout if wait is None else wait if timeout is None else min(wait, timeout)
        refs = [*self.running, *self.probes]
        if not refs:  # an idle pool: nothing to wait for
            time.sleep(wait or 0.0)
            return None
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait)
        if not ready:  # the timeout, or a probe ran out of time: no node took the restarted actor
            for ref, (slot, d) in list(self.probes.items()):
                if d <= time.time():
                    del self.probes[ref]
                    self._replace(slot, f"not back after {self.restart_s:.0f}s")
            return None
        ref = ready[0]
        if ref in self.probes:
            slot, _ = self.probes.pop(ref)
            try:
                ray.get(ref)
                self.failed_starts[slot] = 0
                self.free.append(slot)
            except Exception as e:  # noqa: BLE001 - the actor will not come back
                self.failed_starts[slot] += 1
                if self.failed_starts[slot] < self.max_starts:
                    self._replace(slot, f"it did not restart: {type(e).__name__}")
                    return None
                self.retired.add(slot)
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
                self.log(f"eval actor {slot} retired: it failed to start {self.max_starts} times in a row "
                         f"({why})")
                if len(self.retired) == len(self.actors):
                    raise NoEvalActor(f"no evaluation actor could start ({len(self.actors)} slot(s), "
                                      f"{self.max_starts} tries each); the last error: {why}") from e
            return None
        slot, item = self.running.pop(ref)
        try:
            result = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - decoding failed or the actor died: the caller retries
            self._probe(slot)
            return item, None, e
        self.free.append(slot)
        return item, result, None

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
