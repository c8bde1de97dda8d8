"""One record per trainable backbone, looked up by name: what the trainer needs from each.

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
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from . import eagle2_train, eagle3_train
from .config import BACKBONES
from .features import SHARD_TENSORS
from .losses import collate as aligned_collate


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
