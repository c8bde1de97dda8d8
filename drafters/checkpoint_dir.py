"""A drafter checkpoint directory, whatever the backbone: ``config.json`` (the config that rebuilds
the drafter, tagged with its ``format``) and ``model.safetensors``, written to a temp dir renamed
into place, read back only whole (a missing or unexpected weight is refused: it would silently
give a broken drafter; a damaged ``model.safetensors`` is refused in one line naming it)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from common.atomic import atomic_dir


def write_checkpoint_dir(model, out_dir: str | os.PathLike, fmt: str, config) -> Path:
    """DIR/config.json ({"format": fmt, **config.to_dict()}) + DIR/model.safetensors (the state dict
    on the CPU), written to a temp dir renamed into place."""
    with atomic_dir(out_dir) as tmp:
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        text = json.dumps({"format": fmt, **config.to_dict()}, indent=2, sort_keys=True)
        (tmp / "config.json").write_text(text)
    return Path(out_dir)


def read_config_dict(path: str | os.PathLike, fmt: str) -> dict:
    """config.json of the checkpoint at ``path``; refuses a directory that is not a whole checkpoint
    or holds another format."""
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise FileNotFoundError(f"{p} is not a drafter checkpoint (needs config.json and model.safetensors)")
    d = json.loads((p / "config.json").read_text())
    if d.get("format") != fmt:
        raise ValueError(f"{p}/config.json has format {d.get('format')!r}, expected {fmt!r}")
    return d


def _damaged(path: str | os.PathLike, e: SafetensorError) -> ValueError:
    return ValueError(f"checkpoint weights {Path(path) / 'model.safetensors'} do not read (truncated or "
                      f"damaged: {e}); write or copy the checkpoint again")


def check_weights(path: str | os.PathLike) -> None:
    """Refuse a ``model.safetensors`` at ``path`` that does not read (truncated, or not safetensors),
    from its header and size alone (no weight is read): a ValueError naming the file and the problem."""
    try:
        with safe_open(str(Path(path) / "model.safetensors"), "pt"):
            pass
    except SafetensorError as e:
        raise _damaged(path, e) from None


def load_weights(model, path: str | os.PathLike):
    """``model`` with the weights of the checkpoint at ``path``: exactly its key set, and a ``d2t``
    (if any) that maps to sorted ids inside the verifier's vocabulary; a damaged weights file is one
    ValueError (``check_weights``)."""
    try:
        state = load_file(str(Path(path) / "model.safetensors"))
    except SafetensorError as e:
        raise _damaged(path, e) from None
    expected = set(model.state_dict())
    missing, extra = expected - set(state), set(state) - expected
    if missing or extra:
        raise ValueError(f"checkpoint {path}: missing weights {sorted(missing)}, unexpected {sorted(extra)}")
    model.load_state_dict(state)
    ids = model.draft_ids()
    if ids is not None and (not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0
                            or int(ids[-1]) >= model.config.vocab_size):
        raise ValueError(f"checkpoint {path}: d2t does not map to sorted ids inside the verifier's "
                         "vocabulary")
    return model
