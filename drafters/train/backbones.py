"""What the loop asks of each backbone: its record, the objective of each step, and the held-out
agreement that judges it.

One record per trainable backbone, looked up by name: what the trainer needs from each.

A backbone supplies its drafter config and initial weights, a check of its cached data, its
batches (``collate``), its objective (``loss``), its held-out top-1 agreement counts
(``agreement``) and the verifier layers an online feature pass must capture (``feature_layers``)
and the tensors of a cached shard it reads (``feature_tensors``: a node downloads only those). The
trainer, the objective and the held-out evaluation never branch on a backbone's name.

Signatures (``cfg`` a TrainConfig, ``dcfg`` the backbone's drafter config, ``ids`` the draft
vocabulary's verifier ids or None):

- ``drafter_config(cfg, verifier_model, ids) -> dcfg``; ``check_data(data, dcfg)`` raises on a cache
  the drafter cannot read; ``init(dcfg, verifier_model, ids) -> drafter`` (seeded: every variant of
  a backbone starts from the same weights, which merging needs)
- ``collate(examples, mask_mode=...) -> batch`` (built on the host; ``batch.to(device, dtype)``)
- ``loss(cfg, drafter, embed, head, batch, generator, use_topk, dtype) -> (loss, parts)``, with
  ``parts["topk_total"]`` the part of the loss that HASS's second stage adds (0 elsewhere)
- ``agreement(drafter, embed, head, batches, depths, dtype) -> (hits, positions)``, one count per
  depth 1..D; :func:`top1_rates` makes them ``{"top1_depth{j}": hits / positions}``. Counts, not
  rates, so sets and ranks evaluated apart sum to the figures of one pass over all of them

What each training step optimises and when: the backbone's loss in the training precision,
the learning-rate schedule and the step count it spans, and EAGLE/HASS's clipping by value.

Held-out evaluation: the drafter's top-1 agreement with the verifier at depths 1..D, pooled over
every held-out set and per set (a specialist is judged on its own domain's held-out set).

Each set is evaluated once: the backbone counts hits and positions per depth, and the pooled
figure is the sets' summed hits over their summed positions, what one pass over all sets pooled
gives. Every rank takes part: the sets' batches are dealt round-robin over the ranks (the plan of
one rank, in order), each counts its own and the counts are summed over ranks (one all-reduce), so
no rank waits while another evaluates. Without a process group (one rank, or a simulated one in
tests) the rank evaluates every batch."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.dtypes import torch_dtype
from drafters.config import BACKBONES
from drafters.data.templating import TokenizedExample
from drafters.features import SHARD_TENSORS
from drafters.train import eagle2 as eagle2_train
from drafters.train import eagle3 as eagle3_train
from drafters.train.config import ONLINE_ROOTS, TrainConfig
from drafters.train.data import batches, count_examples, plan_batches
from drafters.train.eagle2 import collate as aligned_collate
from drafters.train.runners import all_sum, distributed
from drafters.train.shards import rank_plan


@dataclass(frozen=True)
class Backbone:
    name: str
    drafter_config: Callable
    check_data: Callable
    init: Callable
    collate: Callable
    loss: Callable
    agreement: Callable
    feature_layers: Callable  # dcfg -> aux layers an online feature pass captures (None: LM-head input only)
    feature_tensors: tuple | None = None  # the cached shards' tensors it reads (None: all of them)


def _feature_backbone(name: str, hass: bool) -> Backbone:
    """EAGLE-2 and HASS: one drafter, one batch layout; HASS adds alignment passes and top-K."""
    return Backbone(name, eagle2_train.drafter_config, eagle2_train.check_data, eagle2_train.init_drafter,
                    aligned_collate, functools.partial(eagle2_train.loss, hass=hass),
                    eagle2_train.agreement_counts, lambda dcfg: None,
                    SHARD_TENSORS)  # never EAGLE-3's aux layers


REGISTRY: dict[str, Backbone] = {
    "eagle2": _feature_backbone("eagle2", hass=False),
    "hass": _feature_backbone("hass", hass=True),
    "eagle3": Backbone("eagle3", eagle3_train.drafter_config, eagle3_train.check_data,
                       eagle3_train.init_drafter, eagle3_train.collate, eagle3_train.loss,
                       eagle3_train.agreement_counts, lambda dcfg: dcfg.aux_layers),
}
assert tuple(REGISTRY) == BACKBONES, "drafters/config.py BACKBONES and this registry name the same backbones"


def top1_rates(hits, positions) -> dict:
    """``{"top1_depth{j}": hits / positions}`` for depths 1..D (NaN at a depth with no position)."""
    pairs = enumerate(zip(hits, positions), 1)
    return {f"top1_depth{j}": h / n if n else float("nan") for j, (h, n) in pairs}


def backbone(name: str) -> Backbone:
    """The registry's record of ``name`` (one of drafters/config.py's BACKBONES)."""
    if name not in REGISTRY:
        raise ValueError(f"backbone must be one of {list(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def compute_loss(cfg: TrainConfig, model, embed, head, batch, generator, use_topk: bool = True):
    """The backbone's objective on ``batch`` (drafters/train/backbones.py): EAGLE-2 1.0 SmoothL1 + 0.1 soft
    CE; HASS + 1.0 top-K (once ``use_topk``: the second stage of its schedule), summed over
    ``hass_steps`` alignment passes; EAGLE-3 the training-time test. Returns (loss, parts)."""
    return backbone(cfg.backbone).loss(cfg, model, embed, head, batch, generator, use_topk,
                                       torch_dtype(cfg.precision))


def schedule_steps(cfg: TrainConfig, world: int) -> int:
    """Micro-batches each rank's schedule spans (optimizer steps x grad_accum): epochs x
    ceil(examples / batch_size) with one rank, epochs x (that // world) with more (the remainder
    is dropped, see drafters/train/data.py ``batches``). From counts alone, so warmup, linear decay
    and HASS's two-stage switch are the same in cached and online mode. Cached data split by
    shards: epochs x the step count every rank shares (drafters/train/shards.py)."""
    if world > 1 and not any(e[0] in ONLINE_ROOTS for e in cfg.train_data):
        return cfg.epochs * rank_plan(cfg.train_data, world, cfg.batch_size).steps
    n_batches = -(-count_examples(cfg.train_data, cfg.online_spec) // cfg.batch_size)
    return cfg.epochs * max(1, n_batches // world)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup over ``warmup`` steps, then (``linear``) linear decay to 0 at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    return max(0.0, (total - step) / (total - warmup))


def clamp_grads_by_value(model: torch.nn.Module, clip: float) -> list:
    """EAGLE/HASS clip by value (clip_grad_value_). A hook on each parameter clamps its gradient
    as it is produced, so it works under DeepSpeed too (per micro-batch and rank, before the
    reduction; with one rank and no accumulation it equals clip_grad_value_)."""
    return [p.register_hook(lambda g: g.clamp(-clip, clip)) for p in model.parameters() if p.requires_grad]


def corpus_of(entry) -> str:
    """The corpus a held-out entry ``[root, key, ids]`` holds (the suffix of its per-set keys)."""
    return entry[1] if str(entry[0]).startswith("online") else str(entry[1]).split("-")[0]


@torch.no_grad()
def heldout_metrics(model, embed, head, cfg: TrainConfig, online=None, rank: int = 0, world: int = 1) -> dict:
    """Agreement on all held-out sets pooled (``top1_depth{j}``) and, with more than one set, on
    each (``top1_depth{j}_<corpus>``). Every one of the ``world`` ranks must call it."""
    dtype = torch_dtype(cfg.precision)  # what the drafter computes in
    if not distributed():
        rank, world = 0, 1  # nothing to sum the counts with: this rank counts every batch
    counts, dealt = [], 0
    for entry in cfg.heldout_data:
        hits, positions, n = set_counts(model, embed, head, entry, cfg, online, dtype, dealt, rank, world)
        counts.append((hits, positions))
        dealt += n
    d = cfg.eval_depths
    flat = all_sum([c for hits, positions in counts for c in (*hits, *positions)], world)  # every rank's
    counts = [(flat[k : k + d], flat[k + d : k + 2 * d]) for k in range(0, len(flat), 2 * d)]
    out = top1_rates([sum(h[j] for h, _ in counts) for j in range(d)],
                     [sum(p[j] for _, p in counts) for j in range(d)])
    if len(cfg.heldout_data) > 1:
        for entry, (hits, positions) in zip(cfg.heldout_data, counts):
            out.update({f"{k}_{corpus_of(entry)}": v for k, v in top1_rates(hits, positions).items()})
    return out


def set_counts(model, embed, head, entry, cfg: TrainConfig, online, dtype, first: int, rank: int,
               world: int, batch_size: int = 8) -> tuple[list, list, int]:
    """(hits, positions, batches planned) of one held-out set: batch i of its plan is batch
    ``first + i`` of the evaluation, and this rank counts the ones with that index ``% world == rank``."""
    b = backbone(cfg.backbone)
    planned = [0]

    def own():
        for i, group in enumerate(plan_batches([entry], batch_size, None, online), first):
            planned[0] += 1
            if i % world == rank:
                yield b.collate(_with_features(group, online), mask_mode="next")

    hits, positions = b.agreement(model, embed, head, own(), cfg.eval_depths, dtype=dtype)
    return hits, positions, planned[0]


def _with_features(group: list, online) -> list:
    """A planned batch with its online examples' features computed (cached ones have theirs)."""
    need = [j for j, e in enumerate(group) if isinstance(e, TokenizedExample)]
    if not need:
        return group
    group = list(group)
    for j, f in zip(need, online.features([group[j] for j in need])):
        group[j] = f
    return group


def evaluate(model, embed, head, data, depths: int = 3, batch_size: int = 8, online=None, dtype=None,
             backbone_name: str = "eagle2") -> dict:
    """Top-1 agreement at depths 1..``depths`` on the assistant positions of ``data`` (held-out
    entries) in one pass over all of them, by the backbone's own measure (drafters/train/backbones.py).
    With a reduced draft vocabulary a verifier token outside it counts as a miss. ``dtype``: the
    features' (the training precision; None: the drafter's own weights' dtype)."""
    b = backbone(backbone_name)
    it = batches(data, batch_size, None, online, collate_fn=b.collate)
    return top1_rates(*b.agreement(model, embed, head, it, depths, dtype=dtype))
