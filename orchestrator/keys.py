"""Every unit key a run writes, and every rule that keeps the keys of earlier runs valid (here only).

A unit (a corpus's features, the draft vocabulary, a drafter's training, a merge, a shard of an
evaluation cell) is done once per key: the manifest records it under its key, and a run that finds
the key done skips the unit. A key hashes what the unit's result depends on, so a setting added
later enters a key only away from the value runs had before it existed (tests/test_keys_unchanged.py
holds the keys of the shipped profiles to the ones earlier runs wrote: the commit is named in
docs/design.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json


def key_of(obj) -> str:
    """A short stable hash of a JSON-able object (dict keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def data_spec(p) -> dict:
    """The data settings every features, train and vocab key hashes."""
    d = p.data
    spec = {"n": d.n, "heldout": d.heldout, "max_length": d.max_length, "seed": d.seed}
    if d.self_distill:  # only when set, so the keys of runs without it stay what they were
        spec["self_distill"] = d.self_distill
    if d.self_distill_corpora is not None:  # the same: only when set
        spec["self_distill_corpora"] = sorted(d.self_distill_corpora)
    return spec


# train settings that do not change the trained drafter (how often it is saved, which cells run)
_NOT_IN_RESULT = ("backbones", "variants", "checkpoint_every", "keep_checkpoints", "per_backbone")
# settings added after runs existed: in a key only away from the value those runs had
_TRAIN_ADDED = (("loss_mask", "next"), ("global_batch", None), ("precision", "fp32"))


def train_key_settings(p, backbone: str) -> dict:
    """The train settings a drafter's result depends on (its backbone's own values in)."""
    tcfg = dataclasses.asdict(p.train.for_backbone(backbone))
    for k in _NOT_IN_RESULT:
        tcfg.pop(k)
    for k, default in _TRAIN_ADDED:
        if tcfg[k] == default:
            tcfg.pop(k)
    return tcfg


def features_key(p, verifier: str, corpus: str, aux: bool) -> str:
    """One corpus's feature cache; ``aux``: with EAGLE-3's three layers (serves every backbone)."""
    return "features-" + key_of([verifier, corpus, data_spec(p)] + (["eagle3-aux"] if aux else []))


def vocab_key(p, verifier: str, corpora: list[str]) -> str:
    return "vocab-" + key_of([verifier, corpora, data_spec(p), p.train.draft_vocab])


def train_key(p, verifier: str, backbone: str, variant: str) -> str:
    return "train-" + key_of([verifier, data_spec(p), train_key_settings(p, backbone), backbone, variant])


def merge_key(p, kind: str, lam, source_keys: list) -> str:
    """A merge of the drafters trained under ``source_keys`` (math, chat): retrained sources, new key."""
    return "merge-" + key_of([kind, lam, p.merge.ties_density, source_keys])


def eval_key(p, cell, verifier: str, prompt_ids: list, ckpt_refs: list[str], ckpt_keys: list) -> str:
    """One shard of an evaluation cell: its cell key, the decode settings outside the cell, its
    prompts, and its drafters (by place in the run and by the key of the unit that made them)."""
    e = p.eval
    parts = [cell.key, verifier, e.max_new_tokens, e.seed, e.tree.top_k, e.tree.depth, prompt_ids,
             ckpt_refs, ckpt_keys]
    if e.routing_decide_steps != 1 and cell.routing_granularity != "step":
        parts.append(e.routing_decide_steps)  # (1 keeps the keys runs had before this setting)
    if e.paired_baseline:  # the same: unpaired keys are the keys runs had before
        parts.append("paired-baseline")
    if e.system_prompt is not None:  # the same: without one, the keys runs had before
        parts.append(["system", e.system_prompt])
    return "eval-" + key_of(parts)
