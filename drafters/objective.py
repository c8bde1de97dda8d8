"""What each training step optimises and when: the backbone's loss in the training precision,
the learning-rate schedule and the step count it spans, and EAGLE/HASS's clipping by value."""
from __future__ import annotations

import torch

from common.dtypes import torch_dtype

from .backbones import backbone
from .shards import rank_plan
from .train_config import ONLINE_ROOTS, TrainConfig
from .train_data import count_examples


def compute_loss(cfg: TrainConfig, model, embed, head, batch, generator, use_topk: bool = True):
    """The backbone's objective on ``batch`` (drafters/backbones.py): EAGLE-2 1.0 SmoothL1 + 0.1 soft
    CE; HASS + 1.0 top-K (once ``use_topk``: the second stage of its schedule), summed over
    ``hass_steps`` alignment passes; EAGLE-3 the training-time test. Returns (loss, parts)."""
    return backbone(cfg.backbone).loss(cfg, model, embed, head, batch, generator, use_topk,
                                       torch_dtype(cfg.precision))


def schedule_steps(cfg: TrainConfig, world: int) -> int:
    """Micro-batches each rank's schedule spans (optimizer steps x grad_accum): epochs x
    ceil(examples / batch_size) with one rank, epochs x (that // world) with more (the remainder
    is dropped, see drafters/train_data.py ``batches``). From counts alone, so warmup, linear decay
    and HASS's two-stage switch are the same in cached and online mode. Cached data split by
    shards: epochs x the step count every rank shares (drafters/shards.py)."""
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
