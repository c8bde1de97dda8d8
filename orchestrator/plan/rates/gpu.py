"""Rates from the GPU rates script's file (experiments/gpu_rates.py, ``kind: gpu-rates``): features,
training and evaluation measured on one GPU with a verifier of the profile's shape; everything it
does not measure (tau, overheads, tokens per example) stays the dry run's stated assumption.

Scaling, stated: the features rate is one GPU's (a features task on k GPUs extracts k times as
fast); a backbone's training rate is one rank's at micro-batch 1 over the measured lengths, equal
examples of each (MathInstruct's 350 and ShareGPT's 900 tokens: the paper's corpora, n of each), and
a trial on k GPUs trains k times as fast (ZeRO's gradient all-reduce over NVLink not costed); the eval
step and the device time per step are the packing rows' (orchestrator/plan/packing.py), generate's rate
its one-process run's.
"""
from __future__ import annotations

from dataclasses import replace

from orchestrator.plan import packing
from orchestrator.plan.costs import VERIFIERS
from orchestrator.plan.rates.estimates import estimated
from orchestrator.plan.rates.record import Rates
from orchestrator.profile import Profile

KIND = "gpu-rates"


def _features_row(data: dict, eagle3: bool) -> dict | None:
    """The extraction row the profile's cache needs (with EAGLE-3's aux layers when it trains EAGLE-3),
    asynchronous host copies where measured."""
    rows = [r for r in data.get("parts", {}).get("features", {}).get("rows", [])
            if r.get("kind") == ("eagle3" if eagle3 else "hidden")]
    rows.sort(key=lambda r: r.get("copies") != "async")
    return rows[0] if rows else None


def _train_rates(data: dict) -> dict:
    """backbone -> tokens/s of one rank: the measured lengths' tokens over their step times."""
    acc: dict[str, list[float]] = {}
    for r in data.get("parts", {}).get("train", {}).get("rows", []):
        a = acc.setdefault(r["backbone"], [0.0, 0.0])
        a[0] += r["tokens"]
        a[1] += r["ms_per_step"] / 1e3
    return {b: t / s for b, (t, s) in acc.items() if s > 0}


def _check(p: Profile, data: dict, where: str) -> None:
    if data.get("stands_for") != p.verifier:
        raise ValueError(f"{where}: measured with a verifier standing for {data.get('stands_for')!r} "
                         f"({data.get('shape')} shape); profile {p.name!r} uses {p.verifier!r}")
    if not data.get("parts"):
        raise ValueError(f"{where}: no part was measured (the run stopped before its first part ended)")


def from_gpu_rates(p: Profile, data: dict, source: str) -> Rates:
    """``p``'s estimated rates with every rate the file measured put in their place, each source
    naming the file, its device and date."""
    where = f"--rates {source}"
    _check(p, data, where)
    base = estimated(p)
    tag = f"measured: {data.get('device', 'a GPU')}, {data.get('date', 'undated')}, commit " \
          f"{data.get('commit', '?')} ({source})"
    sources = dict(base.sources)
    notes = list(base.notes)
    fields = {}
    if not data.get("full_shape"):
        notes.append(f"the file was measured on the {data.get('shape')!r} shape, not the full shape of "
                     f"{p.verifier}: its rates do not stand for the paper's GPUs")
    feat = _features_row(data, "eagle3" in p.train.backbones)
    if feat:
        fields |= {"features_tokens_per_s": feat["tokens_per_s"], "features_devices": 1}
        sources["features"] = f"{tag}: {feat['kind']} features, {feat['copies']} host copies, one GPU"
    else:
        notes.append("features: not in the file; the assumed rate stands")
    train = _train_rates(data)
    if train:
        fields |= {"train_tokens_per_s": {**base.train_tokens_per_s, **train}, "train_devices": 1}
        lengths = sorted({r["tokens"] for r in data["parts"]["train"]["rows"]})
        sources["train"] = (f"{tag}: one rank, micro-batch 1 x {lengths} tokens, equal examples of each; "
                            f"{', '.join(sorted(train))}" + "".join(
                                f"; {b} assumed" for b in p.train.backbones if b not in train))
    else:
        notes.append("train: not in the file; the assumed rates stand")
    fields |= _eval_fields(p, data, source, tag, sources, notes)
    # measured where the file's verifier has the profile's full shape; a tiny shape's rates stay an estimate
    return replace(base, hardware=f"{data.get('device', 'a GPU')} (rates file; tau and overheads assumed)",
                   measured=bool(data.get("full_shape")), source=source, sources=sources, notes=notes,
                   **fields)


def _eval_fields(p: Profile, data: dict, source: str, tag: str, sources: dict, notes: list) -> dict:
    ev = data.get("parts", {}).get("eval") or {}
    if not ev.get("packing"):
        notes.append("eval: not in the file; the assumed step stands")
        return {}
    pk = packing.fit({**ev, "device": data.get("device"), "dtype": data.get("verifier_dtype")}, source,
                     VERIFIERS.get(p.verifier), p.eval.tree.depth)
    out = {"eval_steps_per_s": {"*": 1.0 / pk["t_step_s"]}, "packing": pk}
    sources["eval steps"] = f"{tag}: strategy {ev.get('strategy')}, tree {ev.get('tree')}, batch 1"
    if ev.get("generate_ms_per_token"):
        out["generate_tokens_per_s"] = 1e3 / ev["generate_ms_per_token"]
        sources["generate"] = f"{tag}: transformers' generate, one process"
    if list(ev.get("tree", [])) != [p.eval.tree.top_k, p.eval.tree.depth, p.eval.tree.total_tokens]:
        notes.append(f"eval: measured with tree {ev.get('tree')}, the profile's is "
                     f"{[p.eval.tree.top_k, p.eval.tree.depth, p.eval.tree.total_tokens]}")
    notes.append("eval tau: the file's verifier is random with a planted next token; the assumed tau stands")
    # the rows drafting together (the engine's way); rows drafting one by one are there for attribution
    rows = [r for r in (ev.get("batched") or {}).get("rows") or []
            if r.get("drafts", "together") == "together"]
    if rows and rows[0]["batch"] == 1:
        out["eval_batch_gain"] = {str(r["batch"]): r["tokens_per_s"] / rows[0]["tokens_per_s"]
                                  for r in rows[1:]}
        sources["eval batching"] = (f"{tag}: one process decoding B = {', '.join(out['eval_batch_gain'])} "
                                    "prompts in lock step (one verifier pass a step, one drafter pass a "
                                    "level), tokens/s over its batch 1")
    return out
