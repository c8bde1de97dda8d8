"""Drafter checkpoints: a directory with config.json + model.safetensors, written atomically."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from common.atomic import atomic_dir
from .config import DrafterConfig
from .eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3, is_eagle3_checkpoint, load_eagle3, save_eagle3
from .model import FeatureDrafter, seeded

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
        model.d2t.copy_(draft_ids.long() - torch.arange(draft_ids.shape[0]))
    return model


def save_checkpoint(model: FeatureDrafter, out_dir: str | os.PathLike, config: DrafterConfig | None = None) -> Path:
    """Write DIR/config.json + DIR/model.safetensors via a temp dir renamed into place."""
    cfg = config or model.config
    with atomic_dir(out_dir) as tmp:
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps({"format": FORMAT, **cfg.to_dict()}, indent=2, sort_keys=True))
    return Path(out_dir)


def load_config(path: str | os.PathLike) -> DrafterConfig:
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise FileNotFoundError(f"{p} is not a drafter checkpoint (needs config.json and model.safetensors)")
    d = json.loads((p / "config.json").read_text())
    if d.get("format") != FORMAT:
        raise ValueError(f"{p}/config.json has format {d.get('format')!r}, expected {FORMAT!r}")
    return DrafterConfig.from_dict(d)


def load_checkpoint(path: str | os.PathLike, device: str = "cpu", dtype=torch.float32) -> FeatureDrafter:
    """Load a checkpoint; refuses a missing or unexpected weight (a silently broken drafter)."""
    cfg = load_config(path)
    model = FeatureDrafter(cfg)
    state = load_file(str(Path(path) / "model.safetensors"))
    expected = set(model.state_dict())
    missing, extra = expected - set(state), set(state) - expected
    if missing or extra:
        raise ValueError(f"checkpoint {path}: missing weights {sorted(missing)}, unexpected {sorted(extra)}")
    model.load_state_dict(state)
    ids = model.draft_ids()
    if ids is not None and (not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0 or int(ids[-1]) >= cfg.vocab_size):
        raise ValueError(f"checkpoint {path}: d2t does not map to sorted ids inside the verifier's vocabulary")
    return model.to(device=device, dtype=dtype).eval()  # .to(dtype) casts floating tensors only: d2t stays int


def load_any(path: str | os.PathLike, device: str = "cpu", dtype=torch.float32) -> FeatureDrafter | Eagle3Drafter:
    """A checkpoint of any backbone: EAGLE-3's format (drafters/eagle3.py) or EAGLE-2/HASS's."""
    return (load_eagle3 if is_eagle3_checkpoint(path) else load_checkpoint)(path, device=device, dtype=dtype)


def load_any_config(path: str | os.PathLike) -> DrafterConfig | Eagle3Config:
    """The config of a checkpoint of any backbone, without loading its weights."""
    if not is_eagle3_checkpoint(path):
        return load_config(path)
    if not (Path(path) / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} is not a drafter checkpoint (needs config.json and model.safetensors)")
    return Eagle3Config.from_dict(json.loads((Path(path) / "config.json").read_text()))


def save_any(model, out_dir: str | os.PathLike, config: DrafterConfig | Eagle3Config | None = None) -> Path:
    """``save_eagle3`` for an EAGLE-3 drafter, ``save_checkpoint`` for the others."""
    return (save_eagle3 if isinstance(model, Eagle3Drafter) else save_checkpoint)(model, out_dir, config)


def initial_of(path: str | os.PathLike, lm_head_weight: torch.Tensor | None = None):
    """The seeded initial drafter that a trained checkpoint started from: every variant of a
    backbone starts from it, so it is the base of task arithmetic and TIES. An EAGLE-3 init holds
    the verifier's LM-head rows of the draft vocabulary: pass the verifier's head (V, H) as
    ``lm_head_weight`` for it (the trainer's init, drafters/eagle3_train.py); EAGLE-2/HASS need none.
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
