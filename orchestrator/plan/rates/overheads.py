"""What a task spends beside its modelled work, and how much of its held device-time computes.

Where no run measured them (``Rates.modelled_overheads``: the dry run's estimated rates), each
overhead is a stated assumption (costs.ASSUMPTIONS, each with where its number comes from) or bytes
at a stated bandwidth, and is named with its source in the dry run's output (:func:`sources`):

- a training trial: Ray Train's start-up; the verifier, which every worker loads (in cached mode too:
  its embedding and LM head); its checkpoints (one every ``train.checkpoint_every`` steps and one per
  epoch, costs.checkpoint_bytes each), uploaded in the background while training goes on, one at a
  time (workers/artifacts.py Uploads): an upload costs only the part longer than the compute to the
  next checkpoint, and the last one whole (the end waits for it); the held-out passes before the
  first epoch and after each, every set once and the ranks sharing its batches (the drafter at
  costs.HELDOUT_DEPTHS depths: drafters/train/backbones.py; online, the verifier's forward too); with cached
  features, the wait for shards (orchestrator/plan/io_cost.py);
- a features task: start-up, the verifier load, and its shards written to the object store behind
  its compute;
- an eval shard: its own overhead, and the actors' verifier loads spread over the shards;
- a merge: two finals read and one written at a node's object-store bandwidth, and its own overhead;
- the report: seconds per step row, on a CPU.

A measured run's overheads are its fitted ones (Rates.train_overhead_s ...). Busy: the compute of
training and extraction counts as device-busy (at the assumed MFU the device runs kernels the whole
time; MFU is how well they use it, not idle time); held-out passes too (every GPU of the trial its
share); loads, start-up, upload waits and waits for shards none. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from drafters.corpora import CORPUS_OF
from orchestrator.grid import corpora
from orchestrator.plan.costs import (
    ASSUMPTIONS,
    EAGLE3_AUX_LAYERS,
    HELDOUT_DEPTHS,
    VERIFIERS,
    checkpoint_bytes,
    feature_bytes_per_token,
    final_bytes,
    forward_flops_per_token,
)
from orchestrator.plan.io_cost import READ_AHEAD, STREAM_BYTES_PER_S, STREAMS, trial_io, write_wait
from orchestrator.plan.packing import DTYPE_BYTES
from orchestrator.plan.rates.record import Rates
from orchestrator.profile import Profile, batch_plan

A = ASSUMPTIONS


@dataclass(frozen=True)
class Part:
    """One part of a task's time: ``busy`` is the share of its held device-time the devices compute."""

    name: str
    seconds: float
    busy: float


def combined(parts: list[Part]) -> tuple[float, float]:
    """(seconds, busy share) of a task made of ``parts``."""
    s = sum(x.seconds for x in parts)
    return s, (sum(x.seconds * x.busy for x in parts) / s if s > 0 else 0.0)


def _eff() -> float:
    return A["gpu_peak_flops"] * A["mfu"]


def verifier_load_s(p: Profile) -> float:
    """One process loading the verifier (ASSUMPTIONS' load bandwidth); 0 for an unknown verifier."""
    v = VERIFIERS.get(p.verifier)
    return v["params"] * DTYPE_BYTES[p.verifier_dtype] / A["verifier_load_bytes_per_s"] if v else 0.0


def trial_examples(variant: str, n: int) -> int:
    """Examples one epoch of a drafter variant reads (mixed_half: n/2 of each corpus)."""
    return (n // 2 if variant == "mixed_half" else n) * len(CORPUS_OF[variant])


def checkpoints(p: Profile, backbone: str, variant: str) -> int:
    """Checkpoints a trial uploads: every ``checkpoint_every`` optimizer steps and at each epoch's end."""
    t = p.train.for_backbone(backbone)
    per_epoch = epoch_steps(p, backbone, variant)
    steps = (per_epoch * t.epochs) // t.checkpoint_every if t.checkpoint_every else 0
    return steps + t.epochs


def heldout_seconds(p: Profile, backbone: str, tpe: dict) -> float:
    """One held-out evaluation on one GPU: every held-out set once (the pooled figures are the sets'
    counts summed, drafters/train/backbones.py); a trial's ranks share it."""
    v = VERIFIERS[p.verifier]
    tokens = p.data.heldout * sum(min(tpe[c], p.data.max_length) for c in corpora(p))
    flops = HELDOUT_DEPTHS * forward_flops_per_token(v, backbone)
    flops += 2 * v["params"] if p.data.feature_mode == "online" else 0
    return tokens * flops / _eff()


def checkpoint_gaps(p: Profile, backbone: str, variant: str) -> list[int]:
    """Optimizer steps from each checkpoint to the next, in the order they are written (a step one
    every ``checkpoint_every`` steps of the run, an epoch one at each epoch's end; both where they
    meet), the last one's 0: the end waits for its upload."""
    t = p.train.for_backbone(backbone)
    per_epoch, at = epoch_steps(p, backbone, variant), []
    for end in range(per_epoch, per_epoch * t.epochs + 1, per_epoch):
        first = end - per_epoch
        every = t.checkpoint_every
        at += list(range((first // every + 1) * every, end + 1, every)) if every else []
        at.append(end)
    return [b - a for a, b in zip(at, at[1:])] + [0]


def epoch_steps(p: Profile, backbone: str, variant: str) -> int:
    """Optimizer steps in one epoch of a trial."""
    return -(-trial_examples(variant, p.data.n) // batch_plan(p, p.train.for_backbone(backbone)).global_batch)


def upload_wait_s(p: Profile, backbone: str, variant: str, upload_s: float, step_s: float) -> float:
    """Seconds the loop waits for checkpoint uploads of ``upload_s`` each: an upload runs while the
    next ``gap`` steps of ``step_s`` compute, and the next checkpoint waits for what is left."""
    return sum(max(0.0, upload_s - g * step_s) for g in checkpoint_gaps(p, backbone, variant))


def train_parts(p: Profile, r: Rates, backbone: str, variant: str, tokens: float, gpus: float,
                tpe: dict) -> list[Part]:
    """A trial of ``backbone`` on ``variant`` (``tokens`` per epoch) on ``gpus`` GPUs, in parts."""
    t = p.train.for_backbone(backbone)
    epoch = tokens / (r.train_tokens_per_s[backbone] * gpus / r.train_devices)
    if not r.modelled_overheads or r.verifier not in VERIFIERS:
        return [Part("compute", epoch * t.epochs, 1.0), Part("overhead (measured)", r.train_overhead_s, 0.0)]
    v = VERIFIERS[p.verifier]
    upload_s = (checkpoint_bytes(v, backbone, t.precision, t.deepspeed, t.draft_vocab)
                / A["checkpoint_upload_bytes_per_s"])
    step_s = epoch / epoch_steps(p, backbone, variant)
    parts = [Part("compute", epoch * t.epochs, 1.0), Part("start-up", A["train_startup_s"], 0.0),
             Part("verifier load", verifier_load_s(p), 0.0),
             Part("checkpoint uploads", upload_wait_s(p, backbone, variant, upload_s, step_s), 0.0),
             Part("held-out", (t.epochs + 1) * heldout_seconds(p, backbone, tpe) / gpus, 1.0)]
    if p.data.feature_mode != "online":
        n_aux = EAGLE3_AUX_LAYERS if "eagle3" in p.train.backbones else 0
        io = trial_io(epoch, t.epochs, tokens, int(gpus), p.resources.node, v["hidden"], n_aux,
                      backbone == "eagle3")
        parts.append(Part("waits for shards", io.stall_s, 0.0))
    return parts


def features_parts(p: Profile, r: Rates, tokens: float, gpus: float) -> list[Part]:
    """A features task extracting ``tokens`` on ``gpus`` devices, in parts."""
    compute = tokens / (r.features_tokens_per_s * gpus / r.features_devices)
    if not r.modelled_overheads or r.verifier not in VERIFIERS:
        return [Part("compute", compute, 1.0), Part("overhead (measured)", r.features_overhead_s, 0.0)]
    nbytes = tokens * feature_bytes_per_token(VERIFIERS[p.verifier], "eagle3" in p.train.backbones)
    return [Part("compute", compute, 1.0), Part("start-up", A["features_startup_s"], 0.0),
            Part("verifier load", verifier_load_s(p), 0.0),
            Part("waits for uploads", write_wait(compute, nbytes, gpus, p.resources.node), 0.0)]


def eval_shard_overhead(p: Profile, r: Rates, actors: int, shards: int) -> float:
    """Seconds an eval shard adds beside decoding: its own, and the actors' verifier loads spread."""
    if not r.modelled_overheads:
        return r.eval_overhead_s
    return A["eval_shard_overhead_s"] + verifier_load_s(p) * actors / max(shards, 1)


def merge_seconds(p: Profile, r: Rates, backbone: str) -> float:
    """One merge: two finals read and one written at a node's object-store bandwidth, plus its own."""
    v = VERIFIERS.get(p.verifier)
    if not r.modelled_overheads or v is None:
        return r.merge_s
    t = p.train.for_backbone(backbone)
    moved = 3 * final_bytes(v, backbone, t.precision, t.deepspeed, t.draft_vocab)
    return A["merge_overhead_s"] + moved / (p.resources.node.object_store_gb_s * 1e9)


def report_seconds(r: Rates, step_rows: float) -> float:
    """The report: the measured seconds, or ASSUMPTIONS' seconds per step row times ``step_rows``."""
    return A["report_s_per_step_row"] * step_rows if r.modelled_overheads else r.report_s


def sources(p: Profile) -> list[str]:
    """One line per modelled overhead: its figure and where it comes from."""
    node = p.resources.node
    return [
        f"Ray Train start-up {A['train_startup_s']:g} s a trial, features task start-up "
        f"{A['features_startup_s']:g} s, eval shard {A['eval_shard_overhead_s']:g} s, merge "
        f"{A['merge_overhead_s']:g} s + its bytes (assumed: the rehearsal's stage times per unit, "
        "docs/cluster.md)",
        f"verifier load {verifier_load_s(p):.0f} s a process (assumed: "
        f"{A['verifier_load_bytes_per_s'] / 1e9:g} GB/s "
        "from node disk to GPU), in every training worker, features task and eval actor",
        f"checkpoint uploads at {A['checkpoint_upload_bytes_per_s'] / 1e9:g} GB/s a node (assumed: 8 S3 "
        "connections at 85-90 MB/s), every train.checkpoint_every steps and every epoch, in the "
        "background one at a time: only the part longer than the compute to the next checkpoint costs, "
        "and the last one whole",
        f"held-out passes before training and after every epoch (drafter at {HELDOUT_DEPTHS} depths over "
        "each held-out set once, pooled figures from its counts; the FLOP rate of training), shared by "
        "the trial's ranks",
        f"shards: {node.object_store_gb_s:g} GB/s a node from the object store, {node.disk_gb:,.0f} GB of "
        "node disk "
        f"at {node.disk_gb_s:g} GB/s (resources.node); each rank reads {READ_AHEAD} shards ahead on "
        f"{STREAMS} "
        f"streams of at most {STREAM_BYTES_PER_S / 1e6:.0f} MB/s (orchestrator/plan/io_cost.py over "
        "feature_io.py)",
        f"report {A['report_s_per_step_row'] * 1e6:.1f} s per million step rows on a CPU (measured: 443 s "
        "at 5.0 M, "
        "docs/report.md), linear in step rows",
    ]
