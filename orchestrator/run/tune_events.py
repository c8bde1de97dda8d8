"""Trial starts and ends, from the Tune sweep's thread to the driver's (orchestrator/run/graph.py).

A module of its own so that the callback class is importable by name: Tune pickles its callbacks
with the experiment's state, and a class pickled by reference keeps pointing at this module's
queues (a class defined in a function would be pickled with a copy of them)."""
from __future__ import annotations

import queue

from ray.tune import Callback

QUEUES: dict[int, queue.Queue] = {}  # the driver's queues by id: the callback holds the id only


class TrialEvents(Callback):
    """Puts ("start" | "end", cell, error or None) on the driver's queue for each trial."""

    def __init__(self, events: queue.Queue):
        QUEUES[id(events)] = events
        self.key = id(events)

    def _put(self, *event) -> None:
        q = QUEUES.get(self.key)
        if q is not None:
            q.put(event)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._put("start", trial.config.get("cell"), None)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._put("end", trial.config.get("cell"), None)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._put("end", trial.config.get("cell"), getattr(trial, "error_msg", None) or "trial failed")
