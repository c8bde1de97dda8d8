"""EAGLE-2's and HASS's part of drafters/trainer.py: the feature drafter's initial weights, its
objective and its held-out agreement. Batches are drafters/losses.py's ``collate`` (aligned
feature pairs); the loop, runners, checkpoints and resume are the trainer's.

EAGLE-2: 1.0 SmoothL1 on the predicted feature + 0.1 soft CE against the verifier's distribution,
on input features with EAGLE's uniform noise. HASS: the same on each of ``hass_steps`` forward
alignment passes, plus 1.0 top-K distillation once the second stage of its schedule begins.
"""
from __future__ import annotations

import torch

from . import checkpoint
from .config import DrafterConfig
from .losses import aligned_passes, eagle_losses, noise, step_mask


def drafter_config(cfg, verifier_model, draft_ids: torch.Tensor | None) -> DrafterConfig:
    """The drafter a TrainConfig trains, sized by the verifier."""
    return DrafterConfig.for_verifier(verifier_model, cfg.verifier, cfg.backbone, seed=cfg.init_seed,
                                      draft_vocab_size=None if draft_ids is None else int(draft_ids.shape[0]))


def init_drafter(dcfg: DrafterConfig, verifier_model, draft_ids: torch.Tensor | None):
    """The seeded initial drafter (every variant of the backbone starts from it: merging needs one
    initialisation); the verifier's weights are not used."""
    return checkpoint.init_drafter(dcfg, draft_ids)


def check_data(data: list, dcfg: DrafterConfig) -> None:
    """Any feature cache serves (EAGLE-2 and HASS read the same features)."""


def loss(cfg, model, embed, head, batch, generator, use_topk: bool, dtype, *, hass: bool):
    """The objective summed over the alignment passes (1, or ``hass_steps`` with ``hass``) and its
    per-pass parts; the top-K term only with ``hass`` and ``use_topk``. ``topk_total``: that term's
    share of the loss (the trainer's train_base_loss leaves it out)."""
    batch = batch.to(embed.weight.device, dtype)  # host-built -> the drafter's device
    feats = noise(batch.features, generator, batch.lengths) if cfg.feature_noise else batch.features
    preds = aligned_passes(model, embed, batch, cfg.hass_steps if hass else 1, input_features=feats)
    topk_on = hass and use_topk
    total, parts = 0.0, {}
    for j, pred in enumerate(preds, 1):
        m = step_mask(batch.mask, j)
        topk = (batch.top_ids, batch.top_probs) if topk_on else (None, None)
        v, p, t, _ = eagle_losses(pred, batch.target, head, m, *topk)
        step_loss = cfg.vloss_weight * v + cfg.ploss_weight * p + (cfg.topk_weight * t if topk_on else 0.0)
        total = total + step_loss
        parts[f"vloss_{j}"], parts[f"ploss_{j}"] = float(v.detach()), float(p.detach())
        topk_part = cfg.topk_weight * float(t.detach()) if topk_on else 0.0
        parts["topk_total"] = parts.get("topk_total", 0.0) + topk_part
    return total, parts


def agreement_counts(model, embed, head, batch_iter, depths: int = 3, dtype=None) -> tuple[list, list]:
    """Top-1 agreement counts (hits, positions per depth) with the verifier's next token at depth 1
    (teacher-forced) and depths 2..D (rolled out on the drafter's own features), on assistant
    positions of held-out batches.
    With a reduced draft vocabulary a verifier token outside it counts as a miss. ``dtype``: the
    features' (the training precision; None: the drafter's own weights' dtype)."""
    hits, counts = [0] * depths, [0] * depths
    dtype = dtype or next(model.parameters()).dtype
    model.eval()
    for batch in batch_iter:
        batch = batch.to(embed.weight.device, dtype)
        preds = aligned_passes(model, embed, batch, depths)
        for j, pred in enumerate(preds):
            m = step_mask(batch.mask, j + 1)
            sel = m.nonzero(as_tuple=True)
            if not sel[0].numel():
                continue
            a = head.to_verifier(head(pred[sel]).argmax(-1))
            b = batch.top_ids[sel][:, 0]  # the verifier's argmax next token
            hits[j] += int((a == b).sum())
            counts[j] += int(sel[0].numel())
    model.train()
    return hits, counts  # per depth: top-1 hits, positions counted (drafters/backbones.py top1_rates)
