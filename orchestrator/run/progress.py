"""Progress lines for the driver log (stage, done/total, ETA) and live Ray metrics.

A long unit's own progress (a features task's examples done of its corpus) reaches the driver log
through a ``Relay`` actor (workers/relay.py): the task sends its latest line at most every
``RELAY_EVERY_S`` seconds, the driver prints what arrived while it waits for the unit
(``wait_relaying``).

Metrics (exported by Ray's metrics agent in Prometheus format, with Ray's ``ray_`` prefix and, for
counters, the ``_total`` suffix): ``ray_taskspec_units_done_total{stage}`` (finished units per
stage) and ``ray_taskspec_acceptance_length{cell}`` (tau of each finished eval cell).
"""
from __future__ import annotations

import sys
import time

import ray

from workers.relay import RELAY_EVERY_S


class Progress:
    def __init__(self, stage: str, total: int, stream=sys.stdout, quiet: bool = False):
        self.stage = stage
        self.total = total
        self.done = 0
        self.t0 = time.time()
        self.stream = stream
        self.skipped = 0  # units finished by an earlier run (or skipped): they say nothing about the rate
        self._metrics = None
        try:
            from ray.util.metrics import Counter, Gauge

            self._metrics = (Counter("taskspec_units_done", "finished units per stage", tag_keys=("stage",)),
                             Gauge("taskspec_acceptance_length", "acceptance length of finished eval cells",
                                   tag_keys=("cell",)))
        except Exception:  # noqa: BLE001 - metrics are optional (no Ray, or no metrics agent)
            self._metrics = None
        if not quiet:
            self.log(f"start: {total} unit(s)")

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] [{self.stage}] {msg}", file=self.stream, flush=True)

    def step(self, what: str = "", n: int = 1, acceptance: float | None = None, cell: str | None = None,
             skipped: bool = False) -> None:
        """``n`` more units done; ``skipped``: done earlier (or not run), so the ETA's rate leaves them
        out."""
        self.done += n
        self.skipped += n if skipped else 0
        el = time.time() - self.t0
        worked = self.done - self.skipped
        left = self.total - self.done
        eta = "0s" if not left else f"{el / worked * left:.0f}s" if worked else "?"
        self.log(f"{self.done}/{self.total} done, elapsed {el:.0f}s, ETA {eta}  {what}")
        if self._metrics:
            try:
                self._metrics[0].inc(n, tags={"stage": self.stage})
                if acceptance is not None and cell:
                    self._metrics[1].set(acceptance, tags={"cell": cell})
            except Exception as e:  # noqa: BLE001 - say so once; progress lines and results are unaffected
                self.log(f"Ray metrics disabled for this stage: {type(e).__name__}: {e}")
                self._metrics = None


def wait_relaying(ref, relay, prog: Progress, every: float = RELAY_EVERY_S):
    """ray.get(ref), printing the units' relayed lines on ``prog``'s log while it runs."""
    while True:
        ready, _ = ray.wait([ref], timeout=every)
        if relay is not None:
            try:
                for line in ray.get(relay.take.remote(), timeout=30).values():
                    prog.log(line)
            except Exception:  # noqa: BLE001 - no relay, no lines; the result still comes
                relay = None
        if ready:
            return ray.get(ref)
