"""Weight-space merges of drafters that share an initialisation and a backbone.

- ``linear``: theta = lambda * theta_math + (1 - lambda) * theta_chat (the study's averaging);
- ``task_arithmetic``: theta = theta_base + sum_i alpha * (theta_i - theta_base);
- ``ties``: TIES-merging (trim each task vector to its top-k% magnitudes, elect a sign per
  parameter by total mass, average the values that agree with it) on top of theta_base.
Each writes an ordinary drafter checkpoint whose config.json records the recipe. Only floating
weights are merged; a reduced draft vocabulary (``d2t``) must be the same in every source (it is
chosen once per backbone) and is carried over unchanged. EAGLE-3 checkpoints merge with EAGLE-3
ones only (same aux layers; their own LM head is merged like every other weight).
"""
from __future__ import annotations

import dataclasses

import torch

from drafters.checkpoint import load_any, save_any
from drafters.config import DrafterConfig
from drafters.eagle3 import Eagle3Config, is_eagle3_checkpoint

MAPS = ("d2t",)  # integer buffers: shared, never averaged


def check_same_format(paths: list[str]) -> None:
    """Refuse, before loading any weight, a merge of EAGLE-3 with EAGLE-2/HASS checkpoints."""
    e3 = [p for p in paths if is_eagle3_checkpoint(p)]
    if e3 and len(e3) != len(paths):
        other = [p for p in paths if p not in e3]
        raise ValueError(f"cannot merge eagle3 checkpoints ({', '.join(e3)}) with eagle2/hass ones "
                         f"({', '.join(other)}): their architectures differ; merge drafters of one backbone")


def _check_same(states: list[dict], configs: list[DrafterConfig | Eagle3Config]) -> None:
    base = configs[0]
    for c in configs[1:]:
        for f in ("backbone", "verifier", "hidden_size", "vocab_size", "intermediate_size",
                  "num_attention_heads",
                  "num_key_value_heads", "draft_vocab_size", "aux_layers", "num_verifier_layers"):
            if getattr(c, f, None) != getattr(base, f, None):
                raise ValueError(f"cannot merge drafters with different {f}: {getattr(base, f)!r} vs "
                                 f"{getattr(c, f)!r}")
    keys = set(states[0])
    for s in states[1:]:
        if set(s) != keys or any(s[k].shape != states[0][k].shape for k in keys):
            raise ValueError("cannot merge drafters with different parameter shapes")
        for k in MAPS:
            if k in keys and not torch.equal(s[k], states[0][k]):
                raise ValueError(f"cannot merge drafters with different draft vocabularies ({k} differs)")


def linear(a: dict, b: dict, lam: float) -> dict:
    """lam * a + (1 - lam) * b, exact at lam in {0, 1}."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    if lam == 1.0:
        return {k: v.clone() for k, v in a.items()}
    if lam == 0.0:
        return {k: v.clone() for k, v in b.items()}
    return {k: lam * a[k] + (1.0 - lam) * b[k] for k in a}


def task_arithmetic(base: dict, tasks: list[dict], alpha: float = 1.0) -> dict:
    return {k: base[k] + alpha * sum(t[k] - base[k] for t in tasks) for k in base}


def ties(base: dict, tasks: list[dict], density: float = 0.2, alpha: float = 1.0) -> dict:
    if not 0 < density <= 1:
        raise ValueError(f"ties density must be in (0, 1], got {density}")
    out = {}
    for k in base:
        tv = torch.stack([t[k] - base[k] for t in tasks])  # (n, ...)
        flat = tv.flatten(1)
        keep = max(1, int(density * flat.shape[1]))
        thresh = flat.abs().kthvalue(flat.shape[1] - keep + 1, dim=1, keepdim=True).values  # (n, 1)
        trimmed = torch.where(flat.abs() >= thresh, flat, torch.zeros_like(flat))
        sign = torch.sign(trimmed.sum(0))  # elected sign per parameter
        agree = (torch.sign(trimmed) == sign) & (trimmed != 0)
        mean = (trimmed * agree).sum(0) / agree.sum(0).clamp_min(1)
        out[k] = base[k] + alpha * mean.view_as(base[k])
    return out


def merge_checkpoints(kind: str, paths: list[str], out: str, lam: float | None = None,
                      base: str | None = None,
                      alpha: float = 1.0, density: float = 0.2):
    """Load, check compatibility, merge, and write a checkpoint with the recipe in config.json."""
    check_same_format(list(paths) + ([base] if base is not None else []))
    models = [load_any(p) for p in paths]
    cfgs = [m.config for m in models]
    states = [m.state_dict() for m in models]
    base_state = None
    if base is not None:
        bm = load_any(base)
        cfgs.append(bm.config)
        states.append(bm.state_dict())
        base_state = states.pop()
    _check_same(states + ([base_state] if base_state is not None else []), cfgs)
    maps = {k: states[0].pop(k) for k in MAPS if k in states[0]}
    for st in states[1:] + ([base_state] if base_state is not None else []):
        for k in maps:
            st.pop(k)
    if kind == "linear":
        if len(states) != 2 or lam is None:
            raise ValueError("linear merge needs exactly two checkpoints (math, chat) and a lambda")
        merged = linear(states[0], states[1], lam)
    elif kind in ("task_arithmetic", "ties"):
        if base_state is None:
            raise ValueError(f"{kind} merge needs a base checkpoint (e.g. the shared random init)")
        merged = task_arithmetic(base_state, states, alpha) if kind == "task_arithmetic" else ties(base_state,
                states, density, alpha)
    else:
        raise ValueError(f"unknown merge kind {kind!r}; choose linear, task_arithmetic or ties")
    recipe = {"merge": kind, "sources": list(paths), "lambda": lam, "base": base, "alpha": alpha,
              "density": density}
    cfg = dataclasses.replace(cfgs[0], training={"merge": recipe})
    m = models[0]
    m.load_state_dict({**merged, **maps})
    return save_any(m, out, cfg)
