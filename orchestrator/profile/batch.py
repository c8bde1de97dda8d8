"""Batch arithmetic: how one optimizer step's examples split over the training workers."""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.profile.errors import need
from orchestrator.profile.schema import Profile, TrainCfg


@dataclass(frozen=True)
class BatchPlan:
    """One optimizer step: ``workers`` x ``per_worker`` examples x ``grad_accum`` micro-steps."""

    workers: int
    per_worker: int
    grad_accum: int
    derived: bool  # True: from train.global_batch; False: train.batch_size/grad_accum as written

    @property
    def global_batch(self) -> int:
        return self.workers * self.per_worker * self.grad_accum

    def describe(self) -> str:
        how = "train.global_batch" if self.derived else "train.batch_size per worker; no train.global_batch"
        return (f"train batch: global {self.global_batch} = {self.workers} worker(s) x per-worker batch "
                f"{self.per_worker} x gradient accumulation {self.grad_accum} (from {how})")


def batch_plan(p: Profile, train: TrainCfg | None = None) -> BatchPlan:
    """Per-worker batch and gradient accumulation for ``p``'s training (pure; the trainer takes
    ``per_worker`` as its batch_size and ``grad_accum`` as is).

    With ``train.global_batch`` G on W = ``resources.train.num_workers`` workers: per-worker batch
    b = min(train.batch_size, G // W) and accumulation G / (W x b); a G that W x b does not divide
    is refused (one ProfileError line). Without it: train.batch_size and train.grad_accum per worker."""
    t, w = train or p.train, p.resources.train.num_workers
    if t.global_batch is None:
        return BatchPlan(w, t.batch_size, t.grad_accum, derived=False)
    g = t.global_batch
    need(t.grad_accum == 1, f"train.grad_accum is derived from train.global_batch ({g}); leave it at 1, "
         f"got {t.grad_accum!r}", "train.grad_accum")
    need(g >= w, f"train.global_batch {g} is smaller than resources.train.num_workers {w}: "
         "every worker needs at least one example per step", "train.global_batch")
    b = min(t.batch_size, g // w)
    need(g % (w * b) == 0, f"train.global_batch {g} is not divisible by resources.train.num_workers {w} x "
         f"per-worker batch {b} (= {w * b}; per-worker batch = min(train.batch_size {t.batch_size}, "
         f"{g} // {w})); choose a worker count and train.batch_size whose product divides it",
         "train.global_batch")
    return BatchPlan(w, b, g // (w * b), derived=True)
