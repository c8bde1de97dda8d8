"""Evaluation actors packed onto GPUs: how fast k batch-1 actors decode on one GPU. Pure Python.

A batch-1 evaluation actor is host-bound: of its step time ``t_step`` the GPU is busy only ``t_dev``
(reading the weights, mostly). k actors on one GPU are a closed queueing system: k customers, each
spending ``t_step - t_dev`` on its host, then ``t_dev`` at the one GPU, first come first served
(kernels of separate processes time-slice a GPU without MPS). Mean value analysis solves it exactly
(:func:`step_time`): the aggregate rate grows ~k / t_step until k reaches the saturation point
k* = t_step / t_dev, then levels off at 1 / t_dev.

``t_step`` and ``t_dev`` come from the GPU check's packing rows (``experiments/gpu_check.py`` writes
a ``gpu-check-packing`` JSON file: per process count, the step time each process saw; the device
time is fitted to the slowdown, :func:`fit_device_time`), or are estimated: ``t_step`` the dry
run's assumed step, ``t_dev`` the bytes a step reads (:func:`device_bytes_per_step`) at the device's
memory bandwidth (:data:`BANDWIDTH`). Every number says where it came from.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from common.dtypes import BYTES

# memory bandwidth per device name (first match wins): vendors' figures for the SXM parts
BANDWIDTH = ((r"H200", 4.8e12, "H200, 4.8 TB/s"), (r"H100.*PCIe", 2.0e12, "H100 PCIe, 2.0 TB/s"),
             (r"H100", 3.35e12, "H100 SXM, 3.35 TB/s"), (r"A100.*80", 2.04e12, "A100 80 GB, 2.04 TB/s"),
             (r"A100", 1.555e12, "A100 40 GB, 1.56 TB/s"))
ASSUMED_GPU = "A100 80GB"  # the dry run's GPU when nothing names one (costs.ASSUMPTIONS' 312 TFLOP/s)
ASSUMED_GPU_MEMORY_GB = 80.0
ACTOR_WORKING_GB = 2.0  # per eval actor beside weights and drafters: KV cache at batch 1, tree, CUDA context
ROW_CONTEXT_TOKENS = 4096  # a stated context per prompt verified at once beyond the first (prompt + answer)
DTYPE_BYTES = {**BYTES, None: BYTES["bfloat16"]}  # None: the verifier's default dtype on a GPU
PACKING_KIND = "gpu-check-packing"


def step_time(t_step: float, t_dev: float, k: int) -> float:
    """Seconds per step of each of ``k`` actors sharing one GPU (exact mean value analysis of the
    closed system above). ``step_time(t, d, 1) == t``; past k* = t / d it tends to k x d."""
    if not (t_step > 0 and 0 < t_dev <= t_step * (1 + 1e-9)) or k < 1:
        raise ValueError(f"need 0 < t_dev <= t_step and k >= 1, got t_step {t_step}, t_dev {t_dev}, k {k}")
    think = max(0.0, t_step - t_dev)
    queue = 0.0
    resp = t_dev
    for n in range(1, int(k) + 1):
        resp = t_dev * (1 + queue)  # the device's time for one step: its own service and the queue ahead
        queue = n / (think + resp) * resp  # Little's law at the device
    return think + resp


def saturation(t_step: float, t_dev: float) -> float:
    """k* = t_step / t_dev: the actors per GPU where k / t_step meets the device's 1 / t_dev."""
    return t_step / t_dev


def fit_device_time(t1: float, rows: list[tuple[int, float]]) -> list[float]:
    """For each (processes, step seconds) row with more than one process, the device time per step
    for which :func:`step_time` gives that row's step back (bisection; the step rises with t_dev).
    A row no slower than ``t1`` (one process's step) gives none: it saw no contention to fit."""
    out = []
    for k, s in rows:
        if k <= 1 or s <= t1 * (1 + 1e-6):
            continue
        if s >= step_time(t1, t1, k):  # fully serialised, or worse: the whole step is device time
            out.append(t1)
            continue
        lo, hi = 0.0, t1
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if step_time(t1, max(mid, 1e-15), k) < s else (lo, mid)
        out.append((lo + hi) / 2)
    return out


def bandwidth(device: str | None) -> tuple[float, str] | None:
    """(bytes/s, label) of a GPU named ``device`` (e.g. "NVIDIA H100 80GB HBM3"); None if unknown."""
    for pattern, bps, label in BANDWIDTH:
        if re.search(pattern, device or "", re.IGNORECASE):
            return bps, label
    return None


def device_bytes_per_step(v: dict, dtype_bytes: int, depth: int) -> float:
    """Bytes one speculative step reads on the device (estimate): the verifier's weights once, and
    per draft level a drafter forward reading its layer (~14 H^2, costs.drafter_params) and the LM
    head (H x vocabulary)."""
    drafter = 14 * v["hidden"] ** 2 + v["hidden"] * v["vocab"]
    return (v["params"] + depth * drafter) * dtype_bytes


def actor_memory_gb(v: dict, dtype_bytes: int, drafter_cache_gb: float, rows: int = 1) -> float:
    """Device memory one eval actor holds (estimate, GB): the verifier's weights, its loaded drafters
    (resources.eval.drafter_cache_gb, GiB) and ACTOR_WORKING_GB, and for each prompt past the first
    it verifies at once (resources.eval.verify_batch) a KV cache of ROW_CONTEXT_TOKENS."""
    return (v["params"] * dtype_bytes / 1e9 + drafter_cache_gb * 2**30 / 1e9 + ACTOR_WORKING_GB
            + (rows - 1) * kv_row_gb(v, dtype_bytes))


def kv_row_gb(v: dict, dtype_bytes: int) -> float:
    """GB of one prompt's KV cache at ROW_CONTEXT_TOKENS: keys and values of every layer's kv heads."""
    head_dim = v["hidden"] // v["heads"]
    return 2 * v["layers"] * v["kv_heads"] * head_dim * dtype_bytes * ROW_CONTEXT_TOKENS / 1e9


def estimate(t_step: float, step_source: str, v: dict | None, dtype_bytes: int, depth: int,
             device: str | None = None) -> dict:
    """A packing model without packing rows: ``t_dev`` from the bytes a step reads at ``device``'s
    bandwidth (the assumed A100 80 GB when it is unknown); without verifier constants (``v`` None)
    t_dev = t_step, i.e. no gain from packing, and said so."""
    if v is None:
        return {"t_step_s": t_step, "t_dev_s": t_step, "step_source": step_source, "rows": [],
                "dev_source": "unknown (no size constants for the verifier): assumed the whole step, "
                              "so packed actors share one actor's rate"}
    bw = bandwidth(device) or bandwidth(ASSUMED_GPU)
    nbytes = device_bytes_per_step(v, dtype_bytes, depth)
    t_dev = min(t_step, nbytes / bw[0])
    return {"t_step_s": t_step, "t_dev_s": t_dev, "step_source": step_source, "rows": [],
            "dev_source": f"estimate: {nbytes / 1e9:.1f} GB read per step (verifier weights + {depth} draft "
                          f"levels) at {bw[1]}"
                          + ("" if bandwidth(device) else f" (assumed GPU; {device!r} has no known bandwidth)"
                             if device else "")}


def read_packing(path: str | Path) -> dict:
    """The GPU check's packing file, validated: one ValueError line naming what is wrong."""
    where = f"--rates {path}"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != PACKING_KIND:
        kind = data.get("kind") if isinstance(data, dict) else None
        raise ValueError(f"{where}: not a {PACKING_KIND} file (its 'kind' is {kind!r})")
    rows = data.get("packing")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: 'packing' must be a non-empty list of rows, got {rows!r}"[:300])
    seen = set()
    for i, row in enumerate(rows):
        step = row.get("step_s") if isinstance(row, dict) else None
        ok = isinstance(row, dict) and isinstance(row.get("processes"), int) and row["processes"] >= 1 \
            and isinstance(step, (int, float)) and math.isfinite(step) and step > 0
        if not ok:
            raise ValueError(f"{where}: packing row {i} needs processes (an integer >= 1) and step_s "
                             f"(seconds > 0), got {row!r}"[:300])
        if row["processes"] in seen:
            raise ValueError(f"{where}: packing rows repeat processes={row['processes']}")
        seen.add(row["processes"])
    if 1 not in seen:
        raise ValueError(f"{where}: the packing rows need one with processes 1 (one actor alone), "
                         f"got {sorted(seen)}")
    return data


def fit(data: dict, source: str, v: dict | None, depth: int) -> dict:
    """The packing model of a validated packing file: t_step its one-process row's step; t_dev the
    median of the rows' fits, or, where no row was slower than one process alone, the estimate at
    its device's bandwidth (else the bound t_step / the most processes measured)."""
    rows = sorted((r["processes"], float(r["step_s"]), r.get("tokens_per_s")) for r in data["packing"])
    t1 = next(s for k, s, _ in rows if k == 1)
    fits = fit_device_time(t1, [(k, s) for k, s, _ in rows])
    step_source = f"measured: one process alone, {data.get('device', 'a GPU')} ({source})"
    out = {"t_step_s": t1, "step_source": step_source, "rows": [list(r) for r in rows]}
    if fits:
        most = max(k for k, _, _ in rows)
        return out | {"t_dev_s": statistics.median(fits),
                      "dev_source": f"fitted to the slowdown of {len(fits)} packing row(s) "
                                    f"(1-{most} processes)"}
    if v is not None and bandwidth(data.get("device")):
        est = estimate(t1, step_source, v, DTYPE_BYTES.get(data.get("dtype"), 2), depth, data.get("device"))
        return out | {"t_dev_s": est["t_dev_s"],
                      "dev_source": "no packing row slower than one process; " + est["dev_source"]}
    most = max(k for k, _, _ in rows)
    return out | {"t_dev_s": t1 / most,
                  "dev_source": f"bound: no slowdown up to {most} processes, so k* >= {most}"}


def describe(pk: dict, k: int, show: int = 4) -> list[str]:
    """Lines for the dry run: the two times and their sources, k*, and the per-GPU rate at 1..show actors."""
    t, d = pk["t_step_s"], pk["t_dev_s"]
    at = step_time(t, d, k)
    per_gpu = ", ".join(f"{n}: {n / step_time(t, d, n):.1f}" for n in range(1, max(show, k) + 1))
    return [f"one actor's step t_step {t * 1e3:.1f} ms ({pk['step_source']})",
            f"device time per step t_dev {d * 1e3:.1f} ms ({pk['dev_source']})",
            f"saturation k* = t_step / t_dev = {saturation(t, d):.1f} actors per GPU; at {k} per GPU "
            f"each step takes {at * 1e3:.1f} ms: {k * t / at:.2f}x one actor's rate per GPU",
            f"steps/s per GPU by actors per GPU: {per_gpu} (limit 1/t_dev = {1 / d:.1f})"]
