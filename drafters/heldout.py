"""Held-out evaluation: the drafter's top-1 agreement with the verifier at depths 1..D, pooled over
every held-out set and per set (a specialist is judged on its own domain's held-out set).

Each set is evaluated once: the backbone counts hits and positions per depth, and the pooled
figure is the sets' summed hits over their summed positions, what one pass over all sets pooled
gives. Every rank takes part: the sets' batches are dealt round-robin over the ranks (the plan of
one rank, in order), each counts its own and the counts are summed over ranks (one all-reduce), so
no rank waits while another evaluates. Without a process group (one rank, or a simulated one in
tests) the rank evaluates every batch."""
from __future__ import annotations

import torch

from common.dtypes import torch_dtype

from .backbones import backbone, top1_rates
from .collectives import all_sum, distributed
from .data.templating import TokenizedExample
from .train_config import TrainConfig
from .train_data import batches, plan_batches


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
    entries) in one pass over all of them, by the backbone's own measure (drafters/backbones.py).
    With a reduced draft vocabulary a verifier token outside it counts as a miss. ``dtype``: the
    features' (the training precision; None: the drafter's own weights' dtype)."""
    b = backbone(backbone_name)
    it = batches(data, batch_size, None, online, collate_fn=b.collate)
    return top1_rates(*b.agreement(model, embed, head, it, depths, dtype=dtype))
