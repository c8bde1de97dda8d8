"""Export a drafter checkpoint to a serving format (vLLM EAGLE, SGLang EAGLE, speculators), check an
export against its format's contract (drafters/formats.py), and import an export back.

The verifier's own config (sizes, ``max_position_embeddings``, rope, end-of-turn ids) is passed in
as a dict, so this module never loads a model. Every export is checked against the contract
before it is renamed into place: a directory that a loader would silently half-fill is never
written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .atomic import atomic_dir
from .checkpoint import load_checkpoint
from .config import DrafterConfig
from .eagle3 import Eagle3Config, Eagle3Drafter, is_eagle3_checkpoint, load_eagle3
from .formats import (EAGLE3_KEYS, EAGLE3_WEIGHTS, FORMATS, LLAMA_KEYS, TOKEN_MAP_FILE, Format, dims,
                      eagle3_weights, shape_of)
from .model import DTYPES as _DTYPES
from .model import FeatureDrafter


class ContractError(ValueError):
    """An export (or a checkpoint to be exported) that does not satisfy a format's contract."""


def _rope_problem(vcfg: dict, theta: float) -> str | None:
    rope = vcfg.get("rope_parameters") or vcfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    v_theta = vcfg.get("rope_theta", rope.get("rope_theta"))
    if kind not in (None, "default"):
        return f"the verifier uses {kind!r} RoPE scaling; the drafter was built with plain RoPE"
    if v_theta is not None and float(v_theta) != float(theta):
        return f"rope_theta {theta} != the verifier's {v_theta}"
    return None


def check_compatible(cfg: DrafterConfig, vcfg: dict) -> None:
    """Refuse to export a drafter whose sizes or RoPE differ from the verifier it would serve."""
    problems = [f"{k} {getattr(cfg, k)} != the verifier's {vcfg.get(k)}"
                for k in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads")
                if vcfg.get(k) != getattr(cfg, k)]
    if vcfg.get("head_dim") not in (None, cfg.head_dim):
        problems.append(f"head_dim {cfg.head_dim} != the verifier's {vcfg['head_dim']}")
    if (rp := _rope_problem(vcfg, cfg.rope_theta)) is not None:
        problems.append(rp)
    if problems:
        raise ContractError("cannot export: " + "; ".join(problems))


def _llama_config(cfg: DrafterConfig, vcfg: dict, architectures, dtype: str) -> dict:
    return {
        "model_type": "llama", "architectures": list(architectures), "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": int(vcfg["max_position_embeddings"]), "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": bool(vcfg.get("tie_word_embeddings", False)),
        "bos_token_id": vcfg.get("bos_token_id"), "eos_token_id": vcfg.get("eos_token_id"),
        "pad_token_id": vcfg.get("pad_token_id"), "torch_dtype": dtype,
    }


def _config(fmt: Format, cfg: DrafterConfig, vcfg: dict, verifier_ref: dict, dtype: str, depth: int) -> dict:
    provenance = {"backbone": cfg.backbone, "verifier": cfg.verifier, "seed": cfg.seed, "training": cfg.training,
                  "draft_vocab_size": cfg.draft_vocab_size}
    if fmt.name != "speculators":
        return {**_llama_config(cfg, vcfg, fmt.architectures, dtype), "taskspec": provenance}
    layer = _llama_config(cfg, vcfg, ("LlamaForCausalLM",), dtype)
    layer["tie_word_embeddings"] = False  # the speculator's embedding/head come from the verifier
    out = {
        "speculators_model_type": "eagle", "architectures": list(fmt.architectures),
        "transformer_layer_architecture": "LlamaDecoderLayer", "transformer_layer_config": layer,
        "layernorms": False, "fusion_bias": False, "speculators_version": "0.9.0", "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": "eagle",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": depth}],
            "default_proposal_method": "greedy",
            "verifier": verifier_ref,
        },
        "taskspec": provenance,
    }
    if cfg.draft_vocab_size is not None:
        out["draft_vocab_size"] = cfg.draft_vocab_size
    return out


def export(ckpt: str | os.PathLike, fmt_name: str, out: str | os.PathLike, verifier_config: dict,
           verifier_ref: dict, dtype: str = "float32", full_vocab_head: bool = False, depth: int = 5) -> Path:
    """Write ``out`` in format ``fmt_name``; returns it. ``verifier_ref``: {name_or_path, architectures}."""
    if fmt_name not in FORMATS:
        raise ContractError(f"unknown format {fmt_name!r}; choose one of {sorted(FORMATS)}")
    if dtype not in _DTYPES:
        raise ContractError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if is_eagle3_checkpoint(ckpt):
        return _export_eagle3(ckpt, fmt_name, out, verifier_config, verifier_ref, dtype, depth)
    fmt = FORMATS[fmt_name]
    drafter = load_checkpoint(ckpt)
    cfg = drafter.config
    check_compatible(cfg, verifier_config)
    ids = drafter.draft_ids()
    if ids is not None and fmt.vocab_map is None and not full_vocab_head:
        raise ContractError(
            f"{ckpt} has a reduced draft vocabulary ({ids.shape[0]} tokens) and the {fmt_name!r} format cannot carry "
            "it (vLLM's EAGLE-1 drafter has no draft-to-target map): export to 'sglang' or 'speculators', or pass "
            "--full-vocab-head to serve it drafting over the verifier's whole vocabulary (lossless, other proposals)")
    state = drafter.state_dict()
    weights = {theirs: state[ours].to(_DTYPES[dtype]).contiguous() for ours, theirs in fmt.rename().items()}
    if fmt.fc_bias:
        weights[f"{fmt.fc}.bias"] = torch.zeros(cfg.hidden_size, dtype=_DTYPES[dtype])
    reduced = ids is not None and fmt.vocab_map is not None
    if reduced and fmt.vocab_map == "d2t_t2d":
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        weights.update({"d2t": drafter.d2t.long().clone(), "t2d": t2d})
    config = _config(fmt, cfg, verifier_config, verifier_ref, dtype, depth)
    if not reduced:
        config["taskspec"]["draft_vocab_size"] = None
    with atomic_dir(out) as tmp:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if reduced and fmt.vocab_map == "token_map":
            torch.save([int(i) for i in ids], tmp / TOKEN_MAP_FILE)
        check_export(tmp, fmt_name)  # never rename a directory that breaks the contract into place
    return Path(out)


def detect_format(config: dict) -> str:
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if config.get("speculators_model_type") == "eagle":
        return "speculators"
    arch = (config.get("architectures") or [None])[0]
    for name, fmt in FORMATS.items():
        if name != "speculators" and arch == fmt.architectures[0]:
            return name
    raise ContractError(f"not an export this project knows: architectures {config.get('architectures')}")


def check_export(path: str | os.PathLike, fmt_name: str | None = None) -> Format:
    """Every key, shape and dtype against the format's contract; raises ContractError listing problems."""
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise ContractError(f"{p} is not an export (needs config.json and model.safetensors)")
    config = json.loads((p / "config.json").read_text())
    fmt = FORMATS[fmt_name or detect_format(config)]
    if fmt.name == "speculators" and config.get("speculators_model_type") == "eagle3":
        _check_eagle3(p, config)
        return fmt
    llama = config["transformer_layer_config"] if fmt.name == "speculators" else config
    problems = [f"config misses {k!r}" for k in LLAMA_KEYS if k not in llama]
    if problems:
        raise ContractError(f"{p} breaks the {fmt.name} contract: " + "; ".join(problems))
    if fmt.name == "speculators":
        for k in ("transformer_layer_architecture", "layernorms", "fusion_bias", "speculators_config"):
            if k not in config:
                problems.append(f"config misses {k!r}")
        if config.get("layernorms") or config.get("fusion_bias"):
            problems.append("layernorms/fusion_bias must be false for an EAGLE-2/HASS drafter")
    elif list(config["architectures"]) != list(fmt.architectures):
        problems.append(f"architectures {config['architectures']} != {list(fmt.architectures)}")
    if llama["num_hidden_layers"] != 1:
        problems.append(f"num_hidden_layers is {llama['num_hidden_layers']}, a drafter has 1")
    token_map = p / TOKEN_MAP_FILE
    n = config.get("draft_vocab_size") if fmt.vocab_map == "d2t_t2d" else None
    if fmt.vocab_map == "token_map" and token_map.is_file():
        hot = torch.tensor(torch.load(token_map, weights_only=True), dtype=torch.long)
        n = int(hot.shape[0])
        if not bool((hot[1:] > hot[:-1]).all()) or int(hot[0]) < 0 or int(hot[-1]) >= llama["vocab_size"]:
            problems.append(f"{TOKEN_MAP_FILE} is not sorted ids inside the vocabulary of {llama['vocab_size']}")
    d = dims(llama["hidden_size"], llama["num_attention_heads"], llama["num_key_value_heads"], llama["head_dim"],
             llama["intermediate_size"], llama["vocab_size"], n)
    expected = {k: shape_of(s, d) for k, s in fmt.weights(n is not None).items()}
    state = load_file(str(p / "model.safetensors"))
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing:
        problems.append(f"missing weights {missing} (a loader would leave them at random initialisation)")
    if extra:
        problems.append(f"unexpected weights {extra} (a loader would skip them silently)")
    want_dtype = _DTYPES.get(llama["torch_dtype"])
    for k in sorted(set(expected) & set(state)):
        if tuple(state[k].shape) != expected[k]:
            problems.append(f"{k} has shape {tuple(state[k].shape)}, expected {expected[k]}")
        kind = {"d2t": torch.int64, "t2d": torch.bool}.get(k, want_dtype)
        if state[k].dtype != kind:
            problems.append(f"{k} is {state[k].dtype}, expected {kind}")
    if problems:
        raise ContractError(f"{p} breaks the {fmt.name} contract: " + "; ".join(problems))
    return fmt


def load_export(path: str | os.PathLike, verifier: str | None = None,
                backbone: str | None = None) -> FeatureDrafter | Eagle3Drafter:
    """An export back as a FeatureDrafter (an Eagle3Drafter for an eagle3 export; float32), checked
    against its contract first."""
    p = Path(path)
    fmt = check_export(p)
    config = json.loads((p / "config.json").read_text())
    if config.get("speculators_model_type") == "eagle3":
        return _load_eagle3_export(p, config, verifier)
    llama = config["transformer_layer_config"] if fmt.name == "speculators" else config
    prov = config.get("taskspec", {})
    state = load_file(str(p / "model.safetensors"))
    if fmt.fc_bias and bool(state[f"{fmt.fc}.bias"].any()):
        raise ContractError(f"{p}: {fmt.fc}.bias is not zero; this project's drafter has no fusion bias")
    ids = None
    if fmt.vocab_map == "token_map" and (p / TOKEN_MAP_FILE).is_file():
        ids = torch.tensor(torch.load(p / TOKEN_MAP_FILE, weights_only=True), dtype=torch.long)
    elif fmt.vocab_map == "d2t_t2d" and "d2t" in state:
        ids = state["d2t"].long() + torch.arange(state["d2t"].shape[0])
        if not torch.equal(state["t2d"].nonzero().flatten(), ids):
            raise ContractError(f"{p}: d2t and t2d describe different draft vocabularies")
    cfg = DrafterConfig(
        backbone=backbone or prov.get("backbone", "eagle2"), verifier=verifier or prov.get("verifier", "unknown"),
        hidden_size=llama["hidden_size"], vocab_size=llama["vocab_size"],
        num_attention_heads=llama["num_attention_heads"], num_key_value_heads=llama["num_key_value_heads"],
        intermediate_size=llama["intermediate_size"], rms_norm_eps=llama["rms_norm_eps"],
        rope_theta=float(llama["rope_theta"]), seed=prov.get("seed", 0),
        draft_vocab_size=None if ids is None else int(ids.shape[0]), training=prov.get("training", {}),
    )
    model = FeatureDrafter(cfg)
    ours = {o: state[t].float() for o, t in fmt.rename().items()}
    if ids is not None:
        ours["d2t"] = ids - torch.arange(ids.shape[0])
    model.load_state_dict(ours)
    return model.eval()


# ---------------------------------------------------------------- EAGLE-3: speculators 0.9's eagle3 layout


def _export_eagle3(ckpt, fmt_name: str, out, vcfg: dict, verifier_ref: dict, dtype: str, depth: int) -> Path:
    if fmt_name != "speculators":
        raise ContractError(f"{ckpt} is an eagle3 drafter: it exports with --format speculators (speculators "
                            f"0.9's eagle3 layout, which vLLM serves), not {fmt_name!r}")
    drafter = load_eagle3(ckpt)
    cfg = drafter.config
    check_compatible(cfg, vcfg)
    n_layers = vcfg.get("num_hidden_layers")
    if n_layers is not None and n_layers != cfg.num_verifier_layers:
        raise ContractError(f"cannot export: the drafter's aux layers {list(cfg.aux_layers)} are for a "
                            f"{cfg.num_verifier_layers}-layer verifier, this verifier has {n_layers}")
    state = drafter.state_dict()
    weights = {theirs: state[ours].to(_DTYPES[dtype]).contiguous() for ours, (theirs, _) in EAGLE3_WEIGHTS.items()}
    ids = drafter.draft_ids()
    if ids is not None:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        weights.update({"d2t": drafter.d2t.long().clone(), "t2d": t2d})
    layer = _llama_config(cfg, vcfg, ("LlamaForCausalLM",), dtype)
    layer["tie_word_embeddings"] = False  # the embedding comes from the verifier, the head is the drafter's
    config = {
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer, "draft_vocab_size": cfg.head_size,
        "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False, "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
        "speculators_version": "0.9.0", "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": depth}],
            "default_proposal_method": "greedy",
            "verifier": verifier_ref,
        },
        "taskspec": {"backbone": cfg.backbone, "verifier": cfg.verifier, "seed": cfg.seed,
                     "training": cfg.training, "ttt_steps": cfg.ttt_steps, "ttt_decay": cfg.ttt_decay,
                     "num_verifier_layers": cfg.num_verifier_layers},
    }
    with atomic_dir(out) as tmp:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        check_export(tmp, "speculators")
    return Path(out)


def _check_eagle3(p: Path, config: dict) -> None:
    problems = [f"config misses {k!r}" for k in EAGLE3_KEYS if k not in config]
    llama = config.get("transformer_layer_config") or {}
    problems += [f"transformer_layer_config misses {k!r}" for k in LLAMA_KEYS if k not in llama]
    if problems:
        raise ContractError(f"{p} breaks the speculators eagle3 contract: " + "; ".join(problems))
    if llama["num_hidden_layers"] != 1:
        problems.append(f"num_hidden_layers is {llama['num_hidden_layers']}, this drafter has 1")
    for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        if config.get(k):
            problems.append(f"{k} must be false (this drafter's layer has the reference's norms)")
    if config.get("target_hidden_size") not in (None, llama["hidden_size"]):
        problems.append(f"target_hidden_size {config['target_hidden_size']} != hidden_size {llama['hidden_size']}")
    aux = config.get("eagle_aux_hidden_state_layer_ids") or []
    n = int(config["draft_vocab_size"])
    v = llama["vocab_size"]
    d = dims(llama["hidden_size"], llama["num_attention_heads"], llama["num_key_value_heads"], llama["head_dim"],
             llama["intermediate_size"], v, n)
    d["AH"] = len(aux) * llama["hidden_size"]
    expected = {k: shape_of(s, d) for k, s in eagle3_weights(n < v).items()}
    state = load_file(str(p / "model.safetensors"))
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if not aux:
        problems.append("eagle_aux_hidden_state_layer_ids is empty")
    if missing:
        problems.append(f"missing weights {missing} (a loader would leave them at random initialisation)")
    if extra:
        problems.append(f"unexpected weights {extra} (a loader would skip them silently)")
    want = _DTYPES.get(llama["torch_dtype"])
    for k in sorted(set(expected) & set(state)):
        if tuple(state[k].shape) != expected[k]:
            problems.append(f"{k} has shape {tuple(state[k].shape)}, expected {expected[k]}")
        kind = {"d2t": torch.int64, "t2d": torch.bool}.get(k, want)
        if state[k].dtype != kind:
            problems.append(f"{k} is {state[k].dtype}, expected {kind}")
    if "d2t" in state and "t2d" in state and not problems:
        ids = state["d2t"].long() + torch.arange(n)
        if not torch.equal(state["t2d"].nonzero().flatten(), ids):
            problems.append("d2t and t2d describe different draft vocabularies")
    if problems:
        raise ContractError(f"{p} breaks the speculators eagle3 contract: " + "; ".join(problems))


def _load_eagle3_export(p: Path, config: dict, verifier: str | None) -> Eagle3Drafter:
    llama, prov = config["transformer_layer_config"], config.get("taskspec", {})
    state = load_file(str(p / "model.safetensors"))
    n, v = int(config["draft_vocab_size"]), llama["vocab_size"]
    aux = list(config["eagle_aux_hidden_state_layer_ids"])
    cfg = Eagle3Config(
        verifier=verifier or prov.get("verifier", "unknown"), hidden_size=llama["hidden_size"], vocab_size=v,
        num_attention_heads=llama["num_attention_heads"], num_key_value_heads=llama["num_key_value_heads"],
        intermediate_size=llama["intermediate_size"],
        num_verifier_layers=prov.get("num_verifier_layers", max(aux) + 3), aux_layers=tuple(aux),
        rms_norm_eps=llama["rms_norm_eps"], rope_theta=float(llama["rope_theta"]), seed=prov.get("seed", 0),
        draft_vocab_size=n if n < v else None, ttt_steps=prov.get("ttt_steps", 7),
        ttt_decay=prov.get("ttt_decay", 0.8), training=prov.get("training", {}),
    )
    model = Eagle3Drafter(cfg)
    ours = {o: state[t].float() for o, (t, _) in EAGLE3_WEIGHTS.items()}
    if n < v:
        ours["d2t"] = state["d2t"].long()
    model.load_state_dict(ours)
    return model.eval()
