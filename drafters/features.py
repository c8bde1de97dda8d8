"""Verifier feature cache for drafter training.

Per token: the feature the LM head consumes (post final-norm last hidden state, float16), and the
verifier's top-10 next-token ids and probabilities (HASS distillation). Sharded safetensors files
plus a manifest.json, each written to a temp file and renamed, under a content key (verifier +
corpus + selected example ids + max length). Readers stream one shard at a time.
"""
from __future__ import annotations

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


def content_key(verifier: str, corpus: str, example_ids: list[str], max_length: int) -> str:
    h = hashlib.sha256(json.dumps([verifier, corpus, example_ids, max_length]).encode()).hexdigest()
    return f"{corpus}-{h[:16]}"


@torch.no_grad()
def verifier_features(model, examples: list[TokenizedExample], batch_tokens: int = 4096) -> list[FeatureExample]:
    """Run the verifier over tokenized examples (one forward each; right-padded mini-batches)."""
    out = []
    dev = model.device
    i = 0
    while i < len(examples):
        batch = [examples[i]]
        while i + len(batch) < len(examples) and (len(batch) + 1) * max(len(e.input_ids) for e in batch + [examples[i + len(batch)]]) <= batch_tokens:
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
        for b, e in enumerate(batch):
            n = len(e.input_ids)
            out.append(FeatureExample(e.id, ids[b, :n], torch.tensor(e.loss_mask[:n], dtype=torch.bool),
                                      h[b, :n].to(torch.float16).cpu(), top.indices[b, :n].to(torch.int32).cpu(),
                                      top.values[b, :n].to(torch.float16).cpu()))
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
                                     t["top_ids"][a:b], t["top_probs"][a:b])
