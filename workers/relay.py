"""A running task's progress lines, relayed to the driver: the task's ``RelaySender`` puts its
latest line into a ``Relay`` actor at most every ``RELAY_EVERY_S`` seconds; the driver takes them
while it waits for the task (orchestrator/run/progress.py: ``wait_relaying``)."""
from __future__ import annotations

import time

import ray

RELAY_EVERY_S = 60.0


@ray.remote(num_cpus=0)
class Relay:
    """The latest progress line of each running unit, kept until the driver reads it."""

    def __init__(self):
        self.lines: dict[str, str] = {}

    def put(self, unit: str, line: str) -> None:
        self.lines[unit] = line

    def take(self) -> dict[str, str]:
        out, self.lines = self.lines, {}
        return out


class RelaySender:
    """A task's side: ``send(line)`` forwards at most one line per ``every`` seconds (never blocks;
    a relay that is gone is ignored: progress lines are not results)."""

    def __init__(self, relay, unit: str, every: float = RELAY_EVERY_S):
        self.relay = relay
        self.unit = unit
        self.every = every
        self.last = 0.0

    def send(self, line: str) -> None:
        now = time.time()
        if self.relay is None or now - self.last < self.every:
            return
        self.last = now
        try:
            self.relay.put.remote(self.unit, line)
        except Exception:  # noqa: BLE001 - the relay died: the unit goes on without it
            self.relay = None
