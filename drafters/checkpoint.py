"""Drafter checkpoints: a directory with config.json + model.safetensors, written atomically."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .atomic import atomic_dir
from .config import DrafterConfig
from .model import FeatureDrafter

FORMAT = "taskspec-drafter-v1"


def init_drafter(cfg: DrafterConfig, draft_ids: torch.Tensor | None = None) -> FeatureDrafter:
    """A randomly initialised drafter; the same seed gives the same weights (merging needs this).

    ``draft_ids`` (sorted verifier ids) is required exactly when the config has a draft vocabulary.
    """
    if (cfg.draft_vocab_size is None) != (draft_ids is None):
        raise ValueError("draft_ids must be given exactly when the config sets draft_vocab_size")
    if draft_ids is not None and draft_ids.shape != (cfg.draft_vocab_size,):
        raise ValueError(f"draft_ids has shape {tuple(draft_ids.shape)}, config says {cfg.draft_vocab_size}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(cfg.seed)
    try:
        model = FeatureDrafter(cfg)
    finally:
        torch.random.set_rng_state(gen_state)
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
