"""Throughput of each stage on one kind of hardware, and the grid's makespan from it.

A :class:`Rates` is either measured from a finished run (:func:`measure`: its manifest's stage
wall times, the feature caches' token counts, the trainers' per-epoch throughput and the eval
traces' verifier calls) or estimated from the dry run's stated GPU assumptions
(:func:`estimated`, marked ``measured: false`` until a GPU run records real ones). :func:`tasks`
turns a profile into the grid's task graph timed with those rates, for ``makespan.schedule``.

Scaling rules, stated because they are assumptions: a stage's rate grows linearly with the
devices one task holds (features task, training trial; on a CPU profile the eval actor) relative
to the measuring run's; a GPU eval actor is host-bound at batch 1, so its step follows the packing
model (orchestrator/plan/packing.py: k actors per GPU, saturating at k* = t_step / t_dev), never a
share of the GPU's rate; eval time per prompt is turns x tokens per turn / tau / verifier steps per second,
with tau and steps/s per strategy from the measuring run (a strategy it did not run takes the
mean of the ones it did); tokens per turn are measured when the profile's max_new_tokens is the
measuring run's, else min(max_new_tokens, the assumed 400).

By concern: record.py (the :class:`Rates` record, the devices a profile's tasks hold),
estimates.py (assumed rates, the GPU check's packing file, scaled backbones), taskgraph.py (the
timed task graph and what derives from it), measured.py (a finished run's rates); :func:`load`
here reads any of them from ``--rates``; ``python -m orchestrator.plan.rates RUN_DIR`` (__main__.py)
saves a run's.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.plan import packing
from orchestrator.plan.rates.estimates import estimated, from_packing, with_scaled_backbones
from orchestrator.plan.rates.gpu import KIND as GPU_RATES_KIND
from orchestrator.plan.rates.gpu import from_gpu_rates
from orchestrator.plan.rates.measured import measure
from orchestrator.plan.rates.record import Rates, _device, devices_per_task, hardware
from orchestrator.plan.rates.taskgraph import (
    TURNS,
    caps,
    eval_batching,
    eval_hold_factor,
    eval_slowdown,
    optimizer_step_seconds,
    packing_model,
    profile_devices,
    tasks,
    trial_order,
    trial_tokens,
)
from orchestrator.profile import Profile

__all__ = ["GPU_RATES", "TURNS", "Rates", "caps", "devices_per_task", "estimated", "eval_batching",
           "eval_hold_factor",
           "eval_slowdown", "from_packing", "hardware", "load", "measure", "optimizer_step_seconds",
           "packing_model", "profile_devices", "tasks", "trial_order", "trial_tokens",
           "with_scaled_backbones",
           "_device"]  # (the dry run and billing ask a profile's device kind by this name)

GPU_RATES = "gpu_rates.json"  # a directory holding the GPU check's packing file under this name


def load(path: str | os.PathLike, p: Profile | None = None) -> Rates:
    """A rates JSON file, the GPU rates script's file (``kind: gpu-rates``, orchestrator/plan/rates/gpu.py),
    the GPU check's packing file (``kind: gpu-check-packing``, or a directory
    holding one as ``gpu_rates.json``: its eval steps over ``p``'s estimated rates), or a finished
    run's directory (measured on the spot)."""
    path = Path(path)
    if path.is_dir() and (path / GPU_RATES).is_file():
        path = path / GPU_RATES
    elif path.is_dir():
        return measure(path)
    if not path.is_file():
        raise FileNotFoundError(f"--rates {path}: no such file or run directory")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"--rates {path}: not a rates file ({e})") from None
    if isinstance(data, dict) and data.get("kind") == GPU_RATES_KIND:
        if p is None:
            raise ValueError(f"--rates {path}: a GPU rates file is read against a profile; load it with one")
        return from_gpu_rates(p, data, str(path))
    if isinstance(data, dict) and data.get("kind") == packing.PACKING_KIND:
        if p is None:
            raise ValueError(f"--rates {path}: a packing file times a profile's evaluation only; load it "
                             "with one")
        return from_packing(p, packing.read_packing(path), str(path))
    try:
        return Rates(**data)
    except TypeError as e:
        raise ValueError(f"--rates {path}: not a rates file ({e})") from None
