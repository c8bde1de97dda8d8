"""Export a drafter checkpoint to a serving format (vLLM EAGLE and SGLang EAGLE for eagle2/hass;
speculators 0.9 eagle3 and SGLang EAGLE-3 for eagle3), check an export against its format's
contract (drafters/formats.py), and import an export back (old speculators ``eagle`` exports too).

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

from common.atomic import atomic_dir
from drafters.checkpoint import load_checkpoint
from drafters.config import DrafterConfig
from drafters.eagle3 import Eagle3Config, Eagle3Drafter, is_eagle3_checkpoint, load_eagle3
from drafters.formats import (
    EAGLE3_LAYOUTS,
    FORMATS,
    LLAMA_KEYS,
    TOKEN_MAP_FILE,
    WRITTEN,
    Eagle3Layout,
    Format,
    config_at,
    dims,
    shape_of,
)
from drafters.model import DTYPES as _DTYPES
from drafters.model import FeatureDrafter


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


def _config(fmt: Format, cfg: DrafterConfig, vcfg: dict, dtype: str) -> dict:
    provenance = {"backbone": cfg.backbone, "verifier": cfg.verifier, "seed": cfg.seed,
                  "training": cfg.training,
                  "draft_vocab_size": cfg.draft_vocab_size}
    return {**_llama_config(cfg, vcfg, fmt.architectures, dtype), "taskspec": provenance}


def _vocab_maps(ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """EAGLE-3's maps of sorted verifier ids: d2t (N,) int64 offsets, t2d (V,) bool membership."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": (ids.long() - torch.arange(ids.shape[0])).contiguous(), "t2d": t2d}


# the old ``speculators_model_type: eagle`` export: refused with this, read back still
NO_EAGLE_SPECULATORS = (
    "speculators 0.9 no longer ships the EAGLE-1/HASS speculator type ('speculators_model_type: eagle'; its "
    "SpeculatorModelConfig.from_pretrained refuses it), so this project no longer writes it: --format "
    "speculators is for eagle3 checkpoints (speculators 0.9's eagle3 layout); an eagle2/hass drafter exports "
    "to 'eagle' (vLLM) or 'sglang' (SGLang)")


def export(ckpt: str | os.PathLike, fmt_name: str, out: str | os.PathLike, verifier_config: dict,
           verifier_ref: dict, dtype: str = "float32", full_vocab_head: bool = False, depth: int = 5) -> Path:
    """Write ``out`` in format ``fmt_name``; returns it. ``verifier_ref``: {name_or_path, architectures}."""
    known = sorted({*WRITTEN, *EAGLE3_LAYOUTS})
    if fmt_name not in known:
        raise ContractError(f"unknown format {fmt_name!r}; choose one of {known}")
    if dtype not in _DTYPES:
        raise ContractError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if is_eagle3_checkpoint(ckpt):
        return _export_eagle3(ckpt, fmt_name, out, verifier_config, verifier_ref, dtype, depth)
    if fmt_name == "speculators":
        raise ContractError(f"cannot export {ckpt} to 'speculators': {NO_EAGLE_SPECULATORS}")
    if fmt_name not in WRITTEN:
        raise ContractError(f"{fmt_name!r} is an EAGLE-3 layout and {ckpt} is an eagle2/hass drafter: "
                            "export it "
                            f"to one of {list(WRITTEN)} ('sglang' for SGLang)")
    fmt = FORMATS[fmt_name]
    drafter = load_checkpoint(ckpt)
    cfg = drafter.config
    check_compatible(cfg, verifier_config)
    ids = drafter.draft_ids()
    if ids is not None and fmt.vocab_map is None and not full_vocab_head:
        raise ContractError(
            f"{ckpt} has a reduced draft vocabulary ({ids.shape[0]} tokens) and the {fmt_name!r} format "
            "cannot carry "
            "it (vLLM's EAGLE-1 drafter has no draft-to-target map): export to 'sglang', or pass "
            "--full-vocab-head to serve it drafting over the verifier's whole vocabulary (lossless, other "
            "proposals)")
    state = drafter.state_dict()
    weights = {theirs: state[ours].to(_DTYPES[dtype]).contiguous() for ours, theirs in fmt.rename().items()}
    if fmt.fc_bias:
        weights[f"{fmt.fc}.bias"] = torch.zeros(cfg.hidden_size, dtype=_DTYPES[dtype])
    reduced = ids is not None and fmt.vocab_map is not None
    config = _config(fmt, cfg, verifier_config, dtype)
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
    if config.get("speculators_model_type") in ("eagle3", "eagle"):  # eagle: an old export, read only
        return "speculators"
    arch = (config.get("architectures") or [None])[0]
    for name, layout in EAGLE3_LAYOUTS.items():
        if name != "speculators" and arch == layout.architectures[0]:
            return name
    for name, fmt in FORMATS.items():
        if name != "speculators" and arch == fmt.architectures[0]:
            return name
    raise ContractError(f"not an export this project knows: architectures {config.get('architectures')}")


def _eagle3_layout(name: str, config: dict) -> Eagle3Layout | None:
    if name == "speculators":
        return EAGLE3_LAYOUTS[name] if config.get("speculators_model_type") == "eagle3" else None
    return EAGLE3_LAYOUTS.get(name)


def check_export(path: str | os.PathLike, fmt_name: str | None = None) -> Format | Eagle3Layout:
    """Every key, shape and dtype against the format's contract; raises ContractError listing problems."""
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
        raise ContractError(f"{p} is not an export (needs config.json and model.safetensors)")
    config = json.loads((p / "config.json").read_text())
    name = fmt_name or detect_format(config)
    if (layout := _eagle3_layout(name, config)) is not None:
        _check_eagle3(p, config, layout)
        return layout
    fmt = FORMATS[name]
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
            problems.append(f"{TOKEN_MAP_FILE} is not sorted ids inside the vocabulary of "
                            f"{llama['vocab_size']}")
    d = dims(llama["hidden_size"], llama["num_attention_heads"], llama["num_key_value_heads"],
             llama["head_dim"],
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
    if isinstance(fmt, Eagle3Layout):
        return _load_eagle3_export(p, config, verifier, fmt)
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
        backbone=backbone or prov.get("backbone", "eagle2"), verifier=verifier or prov.get("verifier",
                "unknown"),
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


# ---------------------------------------------------------------- EAGLE-3: EAGLE3_LAYOUTS


def _speculators_config(cfg: Eagle3Config, layer: dict, verifier_ref: dict, dtype: str, depth: int) -> dict:
    return {
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
    }


def _sglang_eagle3_config(cfg: Eagle3Config, layer: dict, verifier_ref: dict, dtype: str, depth: int) -> dict:
    aux = [i - EAGLE3_LAYOUTS["sglang-eagle3"].aux_offset for i in cfg.aux_layers]
    return {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": cfg.head_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True}}


_EAGLE3_CONFIGS = {"speculators": _speculators_config, "sglang-eagle3": _sglang_eagle3_config}


def _eagle3_refusal(cfg: Eagle3Config, layout: Eagle3Layout) -> str | None:
    aux = list(cfg.aux_layers)
    if layout.aux_count is not None and len(aux) != layout.aux_count:
        return (f"{layout.name} fuses exactly {layout.aux_count} verifier layers, this drafter fuses "
                f"{len(aux)} ({aux})")
    if layout.aux_offset and not all(layout.aux_offset <= i < cfg.num_verifier_layers for i in aux):
        return (f"{layout.name} captures the inputs of decoder layers {layout.aux_offset}.."
                f"{cfg.num_verifier_layers - 1} only (ids counted as the previous layer's output); this "
                f"drafter's aux layers {aux} include the embeddings (0) or the final output "
                f"({cfg.num_verifier_layers})")
    return None


def _export_eagle3(ckpt, fmt_name: str, out, vcfg: dict, verifier_ref: dict, dtype: str, depth: int) -> Path:
    if fmt_name not in EAGLE3_LAYOUTS:
        raise ContractError(f"{ckpt} is an eagle3 drafter: it exports with --format speculators (speculators "
                            "0.9's eagle3 layout, which vLLM serves) or --format sglang-eagle3 (SGLang's "
                            "EAGLE-3 "
                            f"layout), not {fmt_name!r}")
    layout = EAGLE3_LAYOUTS[fmt_name]
    drafter = load_eagle3(ckpt)
    cfg = drafter.config
    check_compatible(cfg, vcfg)
    n_layers = vcfg.get("num_hidden_layers")
    if n_layers is not None and n_layers != cfg.num_verifier_layers:
        raise ContractError(f"cannot export: the drafter's aux layers {list(cfg.aux_layers)} are for a "
                            f"{cfg.num_verifier_layers}-layer verifier, this verifier has {n_layers}")
    if (why := _eagle3_refusal(cfg, layout)) is not None:
        raise ContractError(f"cannot export {ckpt} to {fmt_name!r}: {why}")
    state, dt = drafter.state_dict(), _DTYPES[dtype]
    weights = {theirs: state[ours].to(dt).contiguous() for ours, (theirs, _) in layout.rename().items()}
    ids = drafter.draft_ids()
    if ids is not None or layout.maps_always:
        weights.update(_vocab_maps(torch.arange(cfg.vocab_size) if ids is None else ids.cpu(),
                                   cfg.vocab_size))
    layer = _llama_config(cfg, vcfg, ("LlamaForCausalLM",), dtype)
    layer["tie_word_embeddings"] = False  # the embedding comes from the verifier, the head is the drafter's
    config = _EAGLE3_CONFIGS[fmt_name](cfg, layer, verifier_ref, dtype, depth)
    config["taskspec"] = {"backbone": cfg.backbone, "verifier": cfg.verifier, "seed": cfg.seed,
                          "training": cfg.training, "ttt_steps": cfg.ttt_steps, "ttt_decay": cfg.ttt_decay,
                          "num_verifier_layers": cfg.num_verifier_layers}
    with atomic_dir(out) as tmp:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        check_export(tmp, fmt_name)  # never rename a directory that breaks the contract into place
    return Path(out)


def _eagle3_config_problems(config: dict, layout: Eagle3Layout) -> list[str]:
    llama = (config.get(layout.llama) or {}) if layout.llama else config
    problems = [f"config misses {k!r}" for k in layout.keys if k not in config]
    where = f"{layout.llama} " if layout.llama else "config "
    problems += [f"{where}misses {k!r}" for k in LLAMA_KEYS if k not in llama and k not in layout.keys]
    if problems:
        return problems
    if list(config.get("architectures") or []) != list(layout.architectures):
        problems.append(f"architectures {config.get('architectures')} != {list(layout.architectures)}")
    if llama["num_hidden_layers"] != 1:
        problems.append(f"num_hidden_layers is {llama['num_hidden_layers']}, this drafter has 1")
    for path, want, why in layout.fixed:
        if config_at(config, path, want) != want:
            problems.append(f"{path} is {json.dumps(config_at(config, path))}, must be {json.dumps(want)} "
                            f"({why})")
    if config.get("target_hidden_size") not in (None, llama["hidden_size"]):
        problems.append(f"target_hidden_size {config['target_hidden_size']} != hidden_size "
                        f"{llama['hidden_size']}")
    aux = config_at(config, layout.aux)
    if (not isinstance(aux, list) or not aux or len(set(aux)) != len(aux)
            or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in aux)):
        problems.append(f"{layout.aux} must be a non-empty list of distinct layer ids >= 0, got "
                        f"{json.dumps(aux)}")
    elif layout.aux_count is not None and len(aux) != layout.aux_count:
        problems.append(f"{layout.aux} has {len(aux)} ids, the loader's fc reads {layout.aux_count} layers")
    n = config.get("draft_vocab_size")
    if not isinstance(n, int) or not 1 <= n <= llama["vocab_size"]:
        problems.append(f"draft_vocab_size must be an int in [1, vocab_size={llama['vocab_size']}], "
                        f"got {n!r}")
    return problems


def _check_eagle3(p: Path, config: dict, layout: Eagle3Layout) -> None:
    label = "speculators eagle3" if layout.name == "speculators" else layout.name
    what = f"{p} breaks the {label} contract: "
    problems = _eagle3_config_problems(config, layout)
    if problems:
        raise ContractError(what + "; ".join(problems))
    llama = config[layout.llama] if layout.llama else config
    aux = config_at(config, layout.aux)
    n, v = int(config["draft_vocab_size"]), llama["vocab_size"]
    d = dims(llama["hidden_size"], llama["num_attention_heads"], llama["num_key_value_heads"],
             llama["head_dim"],
             llama["intermediate_size"], v, n)
    d["AH"] = len(aux) * llama["hidden_size"]
    expected = {k: shape_of(s, d) for k, s in layout.weights(n < v).items()}
    state = load_file(str(p / "model.safetensors"))
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
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
        raise ContractError(what + "; ".join(problems))


def _load_eagle3_export(p: Path, config: dict, verifier: str | None, layout: Eagle3Layout) -> Eagle3Drafter:
    llama = config[layout.llama] if layout.llama else config
    prov = config.get("taskspec", {})
    state = load_file(str(p / "model.safetensors"))
    n, v = int(config["draft_vocab_size"]), llama["vocab_size"]
    aux = [i + layout.aux_offset for i in config_at(config, layout.aux)]
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
    ours = {o: state[t].float() for o, (t, _) in layout.rename().items()}
    if n < v:
        ours["d2t"] = state["d2t"].long()
    model.load_state_dict(ours)
    return model.eval()
