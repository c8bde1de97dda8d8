"""Drafter checkpoints: a directory with config.json + model.safetensors, written atomically."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from drafters.checkpoint_dir import load_weights, read_config_dict, write_checkpoint_dir
from drafters.config import DrafterConfig
from drafters.eagle3 import FORMAT as EAGLE3_FORMAT
from drafters.eagle3 import (
    Eagle3Config,
    Eagle3Drafter,
    init_eagle3,
    is_eagle3_checkpoint,
    load_eagle3,
    save_eagle3,
)
from drafters.model import FeatureDrafter, seeded
from drafters.vocab import d2t_of

FORMAT = "taskspec-drafter-v1"


def init_drafter(cfg: DrafterConfig, draft_ids: torch.Tensor | None = None) -> FeatureDrafter:
    """A randomly initialised drafter; the same seed gives the same weights (merging needs this).

    ``draft_ids`` (sorted verifier ids) is required exactly when the config has a draft vocabulary.
    """
    if (cfg.draft_vocab_size is None) != (draft_ids is None):
        raise ValueError("draft_ids must be given exactly when the config sets draft_vocab_size")
    if draft_ids is not None and draft_ids.shape != (cfg.draft_vocab_size,):
        raise ValueError(f"draft_ids has shape {tuple(draft_ids.shape)}, config says {cfg.draft_vocab_size}")
    model = seeded(cfg.seed, lambda: FeatureDrafter(cfg))
    if draft_ids is not None:
        model.d2t.copy_(d2t_of(draft_ids))
    return model


def save_checkpoint(model: FeatureDrafter, out_dir: str | os.PathLike,
                    config: DrafterConfig | None = None) -> Path:
    """Write DIR/config.json + DIR/model.safetensors via a temp dir renamed into place."""
    return write_checkpoint_dir(model, out_dir, FORMAT, config or model.config)


def load_config(path: str | os.PathLike) -> DrafterConfig:
    return DrafterConfig.from_dict(read_config_dict(path, FORMAT))


def load_checkpoint(path: str | os.PathLike, device: str = "cpu", dtype=torch.float32) -> FeatureDrafter:
    """Load a checkpoint; refuses a missing or unexpected weight (a silently broken drafter)."""
    model = load_weights(FeatureDrafter(load_config(path)), path)
    return model.to(device=device, dtype=dtype).eval()  # .to(dtype) casts floating tensors: d2t stays int


def load_any(path: str | os.PathLike, device: str = "cpu",
             dtype=torch.float32) -> FeatureDrafter | Eagle3Drafter:
    """A checkpoint of any backbone: EAGLE-3's format (drafters/eagle3.py) or EAGLE-2/HASS's."""
    return (load_eagle3 if is_eagle3_checkpoint(path) else load_checkpoint)(path, device=device, dtype=dtype)


def load_any_config(path: str | os.PathLike) -> DrafterConfig | Eagle3Config:
    """The config of a checkpoint of any backbone, without loading its weights."""
    if not is_eagle3_checkpoint(path):
        return load_config(path)
    return Eagle3Config.from_dict(read_config_dict(path, EAGLE3_FORMAT))


def save_any(model, out_dir: str | os.PathLike, config: DrafterConfig | Eagle3Config | None = None) -> Path:
    """``save_eagle3`` for an EAGLE-3 drafter, ``save_checkpoint`` for the others."""
    return (save_eagle3 if isinstance(model, Eagle3Drafter) else save_checkpoint)(model, out_dir, config)


def initial_of(path: str | os.PathLike, lm_head_weight: torch.Tensor | None = None):
    """The seeded initial drafter that a trained checkpoint started from: every variant of a
    backbone starts from it, so it is the base of task arithmetic and TIES. An EAGLE-3 init holds
    the verifier's LM-head rows of the draft vocabulary: pass the verifier's head (V, H) as
    ``lm_head_weight`` for it (the trainer's init, drafters/train/eagle3.py); EAGLE-2/HASS need none.
    Returns ``(model, config)``, the config marked ``training: {"init": True}``."""
    cfg = dataclasses.replace(load_any_config(path), training={"init": True})
    ids = load_any(path).draft_ids()
    if isinstance(cfg, Eagle3Config):
        if lm_head_weight is None:
            raise ValueError(f"{path} is an eagle3 checkpoint: its initial drafter needs the verifier's "
                             "LM head (lm_head_weight)")
        return init_eagle3(cfg, ids, lm_head_weight), cfg
    return init_drafter(cfg, ids), cfg


# ---------------------------------------------------------------- training checkpoints (resume points)
# A training run's directory holds ``epoch-E`` (end of epoch E) and ``step-E-B`` (inside epoch E,
# after B micro-batches) checkpoints; each is complete once its ``state.json`` is there.


def checkpoint_position(name: str) -> tuple[int, int] | None:
    """(epochs completed, micro-batches done in the next epoch) of a checkpoint directory name;
    None for any other name. Positions order checkpoints: the largest is the latest."""
    parts = name.split("-")
    if len(parts) == 2 and parts[0] == "epoch" and parts[1].isdigit():
        return int(parts[1]), 0
    if len(parts) == 3 and parts[0] == "step" and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]) - 1, int(parts[2])
    return None


def latest_checkpoint(names) -> str | None:
    """The latest of ``names`` (complete checkpoints) by position; None if there is none."""
    named = [(checkpoint_position(n), n) for n in names if checkpoint_position(n) is not None]
    return max(named)[1] if named else None


def stale_checkpoints(names, keep_epochs: int | None) -> list[str]:
    """Checkpoints a run no longer needs once the latest of ``names`` is complete: every step
    checkpoint before it, and epochs older than the last ``keep_epochs`` (None keeps them all)."""
    ckpts = sorted((checkpoint_position(n), n) for n in names if checkpoint_position(n) is not None)
    if not ckpts:
        return []
    latest = ckpts[-1][1]
    steps = [n for _, n in ckpts[:-1] if n.startswith("step-")]
    epochs = [n for _, n in ckpts if n.startswith("epoch-")]
    old = epochs[: max(0, len(epochs) - keep_epochs)] if keep_epochs else []
    return [n for n in steps + old if n != latest]
