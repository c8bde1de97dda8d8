"""Held-out evaluation: the drafter's top-1 agreement with the verifier at depths 1..D, pooled over
every held-out set and per set (a specialist is judged on its own domain's held-out set)."""
from __future__ import annotations

import torch

from .backbones import backbone
from .objective import PRECISION_DTYPES
from .train_config import TrainConfig
from .train_data import batches


@torch.no_grad()
def heldout_metrics(model, embed, head, cfg: TrainConfig, online=None) -> dict:
    """Agreement on all held-out sets pooled (``top1_depth{j}``) and on each one
    (``top1_depth{j}_<corpus>``)."""
    dtype = PRECISION_DTYPES[cfg.precision]
    out = evaluate(model, embed, head, cfg.heldout_data, cfg.eval_depths, online=online, dtype=dtype,
                   backbone_name=cfg.backbone)
    if len(cfg.heldout_data) > 1:
        for entry in cfg.heldout_data:
            corpus = entry[1] if str(entry[0]).startswith("online") else str(entry[1]).split("-")[0]
            per = evaluate(model, embed, head, [entry], cfg.eval_depths, online=online, dtype=dtype,
                           backbone_name=cfg.backbone)
            out.update({f"{k}_{corpus}": v for k, v in per.items()})
    return out


def evaluate(model, embed, head, data, depths: int = 3, batch_size: int = 8, online=None, dtype=None,
             backbone_name: str = "eagle2") -> dict:
    """Top-1 agreement at depths 1..``depths`` on the assistant positions of ``data`` (held-out
    entries), by the backbone's own measure (drafters/backbones.py). With a reduced draft vocabulary
    a verifier token outside it counts as a miss. ``dtype``: the features' (the training precision;
    None: the drafter's own weights' dtype)."""
    b = backbone(backbone_name)
    it = batches(data, batch_size, None, online, collate_fn=b.collate)
    return b.agreement(model, embed, head, it, depths, dtype=dtype)
