"""Verifier feature cache for drafter training.

Per token: the feature the LM head consumes (post final-norm last hidden state, float16), and the
verifier's top-10 next-token ids and probabilities (HASS distillation). An EAGLE-3 cache
(``aux_layers`` given) also holds the verifier's hidden states at those ``output_hidden_states``
indices, concatenated (float16), captured by hooks on those layers only. Sharded safetensors files
plus a manifest.json, each written to a temp file and renamed, under a content key (verifier +
corpus + selected example ids + max length). Readers stream one shard at a time.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .atomic import atomic_file, write_text_atomic
from .data.templating import TokenizedExample

TOPK = 10


@dataclass
class FeatureExample:
    id: str
    input_ids: torch.Tensor  # (L,) long
    loss_mask: torch.Tensor  # (L,) bool
    features: torch.Tensor  # (L, H) verifier features f_0..f_{L-1}
    top_ids: torch.Tensor  # (L, K) verifier top-K next-token ids at each position
    top_probs: torch.Tensor  # (L, K)
    aux: torch.Tensor | None = None  # (L, A*H) EAGLE-3: hidden states of the aux layers, concatenated


def content_key(verifier: str, corpus: str, example_ids: list[str], max_length: int) -> str:
    h = hashlib.sha256(json.dumps([verifier, corpus, example_ids, max_length]).encode()).hexdigest()
    return f"{corpus}-{h[:16]}"


def aux_tag(aux_layers) -> str:
    """The cache-key suffix of an EAGLE-3 cache (``-aux2-15-27``); '' for EAGLE-2/HASS's."""
    return "" if aux_layers is None else "-aux" + "-".join(str(int(i)) for i in aux_layers)


def check_aux_layers(model, aux_layers) -> tuple[int, ...]:
    n = model.config.num_hidden_layers
    layers = tuple(aux_layers)
    if not layers or len(set(layers)) != len(layers) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= n for i in layers):
        raise ValueError(f"aux_layers must be distinct ints in [0, {n}] (output_hidden_states indices of a "
                         f"{n}-layer verifier), got {list(layers)}")
    return layers


@contextlib.contextmanager
def captured_layers(model, aux_layers):
    """{i: hidden state} filled by each forward pass: ``output_hidden_states[i]``, i.e. the input of
    decoder layer i (a pre-hook on that layer only); i = L, the final normed state, is not hooked
    (the caller has it as ``last_hidden_state``)."""
    got, hooks = {}, []
    for i in check_aux_layers(model, aux_layers):
        if i < model.config.num_hidden_layers:
            def hook(mod, args, kwargs, i=i):
                got[i] = args[0] if args else kwargs["hidden_states"]
            hooks.append(model.model.layers[i].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def verifier_features(model, examples: list[TokenizedExample], batch_tokens: int = 4096,
                      aux_layers=None) -> list[FeatureExample]:
    """Run the verifier over tokenized examples (one forward each; right-padded mini-batches).
    ``aux_layers``: also each example's hidden states at those layers (EAGLE-3), in that order."""
    out = []
    dev = model.device
    n_layers = model.config.num_hidden_layers
    capture = captured_layers(model, aux_layers) if aux_layers is not None else contextlib.nullcontext({})
    i = 0
    with capture as got:
        while i < len(examples):
            batch = [examples[i]]
            while i + len(batch) < len(examples) and (len(batch) + 1) * max(
                    len(e.input_ids) for e in batch + [examples[i + len(batch)]]) <= batch_tokens:
                batch.append(examples[i + len(batch)])
            i += len(batch)
            L = max(len(e.input_ids) for e in batch)
            ids = torch.zeros(len(batch), L, dtype=torch.long)
            att = torch.zeros(len(batch), L, dtype=torch.long)
            for b, e in enumerate(batch):
                ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
                att[b, : len(e.input_ids)] = 1
            h = model.model(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state  # (B, L, H)
            probs = model.lm_head(h).float().softmax(-1)  # (B, L, V)
            top = probs.topk(TOPK, dim=-1)
            aux = None
            if aux_layers is not None:
                aux = torch.cat([h if j == n_layers else got[j] for j in aux_layers], dim=-1)  # (B, L, A*H)
            for b, e in enumerate(batch):
                n = len(e.input_ids)
                out.append(FeatureExample(
                    e.id, ids[b, :n], torch.tensor(e.loss_mask[:n], dtype=torch.bool),
                    h[b, :n].to(torch.float16).cpu(), top.indices[b, :n].to(torch.int32).cpu(),
                    top.values[b, :n].to(torch.float16).cpu(),
                    None if aux is None else aux[b, :n].to(torch.float16).cpu()))
    return out


def _atomic_save(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


class FeatureStore:
    """One cache entry: DIR/<key>/{manifest.json, shard-00000.safetensors, ...}."""

    def __init__(self, root: str | os.PathLike, key: str):
        self.dir = Path(root) / key
        self.key = key

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def write(self, examples_iter, meta: dict, shard_tokens: int = 200_000) -> dict:
        """Consume FeatureExamples, write shards, then the manifest (the commit point)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        shards, buf, ntok, ids_all, t0 = [], [], 0, [], time.perf_counter()

        def flush():
            nonlocal buf, ntok
            if not buf:
                return
            name = f"shard-{len(shards):05d}.safetensors"
            lens = torch.tensor([len(e.input_ids) for e in buf])
            tensors = {
                "lengths": lens, "input_ids": torch.cat([e.input_ids for e in buf]),
                "loss_mask": torch.cat([e.loss_mask for e in buf]).to(torch.uint8),
                "features": torch.cat([e.features for e in buf]), "top_ids": torch.cat([e.top_ids for e in buf]),
                "top_probs": torch.cat([e.top_probs for e in buf]),
            }
            if buf[0].aux is not None:  # an EAGLE-3 cache (EAGLE-2/HASS shards are unchanged)
                tensors["aux"] = torch.cat([e.aux for e in buf])
            _atomic_save(tensors, self.dir / name, {"ids": json.dumps([e.id for e in buf])})
            shards.append({"file": name, "examples": len(buf), "tokens": int(lens.sum())})
            buf, ntok = [], 0

        for e in examples_iter:
            buf.append(e)
            ids_all.append(e.id)
            ntok += len(e.input_ids)
            if ntok >= shard_tokens:
                flush()
        flush()
        # seconds: the verifier's forward passes included (the iterator computes them): the
        # extraction rate orchestrator/rates.py reads
        manifest = {"key": self.key, **meta, "examples": len(ids_all), "tokens": sum(s["tokens"] for s in shards),
                    "seconds": time.perf_counter() - t0, "shards": shards}
        write_text_atomic(self.manifest_path, json.dumps(manifest, indent=1))
        return manifest

    def iter_examples(self, select: set[str] | None = None) -> Iterator[FeatureExample]:
        """Stream examples shard by shard (only one shard in memory)."""
        for s in self.manifest()["shards"]:
            from safetensors import safe_open

            with safe_open(str(self.dir / s["file"]), "pt") as f:
                ids = json.loads(f.metadata()["ids"])
            t = load_file(str(self.dir / s["file"]))
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), t["lengths"].cumsum(0)])
            for j, eid in enumerate(ids):
                if select is not None and eid not in select:
                    continue
                a, b = int(offsets[j]), int(offsets[j + 1])
                yield FeatureExample(eid, t["input_ids"][a:b], t["loss_mask"][a:b].bool(), t["features"][a:b],
                                     t["top_ids"][a:b], t["top_probs"][a:b],
                                     t["aux"][a:b] if "aux" in t else None)
