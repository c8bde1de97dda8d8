"""The :class:`Rates` record: throughput of each stage on one kind of hardware, and what it was
measured or assumed on; the devices a profile's tasks hold, which the rates scale by."""
from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field

from orchestrator.profile import Profile


@dataclass(frozen=True)
class Rates:
    hardware: str  # e.g. "AMD EPYC 7B13 (2 CPUs)" or "A100 (estimate)"
    verifier: str
    device: str  # "cpu" | "gpu": which resource a task's devices are
    measured: bool
    source: str
    features_tokens_per_s: float | None  # one features task on ``features_devices``
    features_devices: float
    train_tokens_per_s: dict  # backbone -> tokens/s of one trial on ``train_devices``
    train_devices: float
    train_overhead_s: float  # per trial: workers, DeepSpeed, held-out metrics, checkpoints
    merge_s: float  # per merge
    eval_steps_per_s: dict  # strategy -> verifier calls/s of one eval actor on ``eval_devices``
    eval_tau: dict  # strategy -> tokens per verifier call
    generate_tokens_per_s: float  # transformers' generate in an eval actor (baseline and paired cells)
    eval_devices: float
    eval_overhead_s: float  # per eval unit (shard): drafter loads, prefill of the tree auto fit, records
    tokens_per_example: dict  # corpus -> training tokens per example
    tokens_per_turn: dict  # benchmark -> generated tokens per turn at ``max_new_tokens``
    max_new_tokens: int | None
    report_s: float = 0.0
    features_overhead_s: float = 0.0  # per features task: loading the verifier, the draft vocabulary
    notes: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # what -> where its rate came from (measured, assumed)
    # GPU eval packing (orchestrator/plan/packing.py): t_step_s, t_dev_s and their sources; None: estimated
    packing: dict | None = None
    # prompts verified at once in one eval actor (resources.eval.verify_batch, decoding/batch.py): "B" -> its
    # tokens/s over batch 1's in one process, measured; none measured: planned one prompt at a time
    eval_batch_gain: dict = field(default_factory=dict)
    # True: start-up, loads, checkpoint uploads, held-out passes, the I/O term, merges and the report are
    # the dry run's model (orchestrator/plan/rates/overheads.py); False: the overheads above, measured
    modelled_overheads: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def hardware() -> str:
    """This machine in one line: the CPU model and count, and the GPU if torch sees one. (Imports
    torch: the driver's call, never the dry run's.)"""
    import torch

    from decoding.cpu.kernel import cpuinfo

    out = f"{cpuinfo('model name') or platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"
    if torch.cuda.is_available():
        out += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return out


def _device(p: Profile) -> str:
    r = p.resources
    return "gpu" if r.train.use_gpu or r.eval.num_gpus or r.features.num_gpus else "cpu"


def devices_per_task(p: Profile) -> dict:
    """Devices one features task, training trial and eval actor hold (GPUs, or CPUs on a CPU profile)."""
    r = p.resources
    if _device(p) == "gpu":
        return {"features": r.features.num_gpus, "train": r.train.num_workers, "eval": r.eval.num_gpus}
    return {"features": r.features.num_cpus, "train": r.train.num_workers * r.train.cpus_per_worker,
            "eval": r.eval.num_cpus}
