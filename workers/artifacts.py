"""How a training run on any node reads its inputs from, and writes its epochs to, a shared URI.

Layout at the URI mirrors the local run directory: ``epoch-N/`` (weights, DeepSpeed state of
every rank, ``state.json`` last, so an epoch with ``state.json`` is complete) and ``final/``.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from orchestrator import storage


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def localize_data(entries: list) -> list:
    """[[root, key, ids], ...] with URI roots replaced by node-local copies of the caches."""
    out = []
    for root, key, ids in entries:
        if storage.is_uri(root):
            root = str(storage.fetch(storage.join(root, key)).parent)
        out.append([root, key, ids])
    return out


def latest_remote_epoch(out_uri: str) -> int | None:
    done = [int(n.split("-")[1]) for n in storage.listdir(out_uri)
            if n.startswith("epoch-") and storage.exists(storage.join(out_uri, n, "state.json"))]
    return max(done) if done else None


def prepare(cfg, local_rank: int):
    """For a config with ``out_uri``: a node-local out_dir holding exactly the latest complete
    remote epoch (the remote copy is the truth; a stale local run dir is discarded)."""
    if not cfg.out_uri:
        return cfg
    out = storage.node_cache(cfg.out_uri)
    vocab = str(storage.fetch(cfg.draft_vocab)) if cfg.draft_vocab else None
    cfg = dataclasses.replace(cfg, out_dir=str(out), train_data=localize_data(cfg.train_data),
                              heldout_data=localize_data(cfg.heldout_data), draft_vocab=vocab)
    if local_rank == 0:
        shutil.rmtree(out, ignore_errors=True)
        epoch = latest_remote_epoch(cfg.out_uri)
        if epoch is not None:
            storage.sync(storage.join(cfg.out_uri, f"epoch-{epoch}"), str(out / f"epoch-{epoch}"))
    _barrier()
    return cfg


def publish_epoch(cfg, epoch_dir: Path, rank: int, local_rank: int) -> Path | None:
    """Every node uploads the files its ranks wrote (ZeRO shards differ per rank); rank 0 adds
    state.json once all have, which marks the epoch complete at the URI. Returns (on rank 0) a
    small local directory whose pointer.json names the published epoch, for Ray Train to record."""
    if not cfg.out_uri:
        return None
    dest = storage.join(cfg.out_uri, epoch_dir.name)
    _barrier()
    if local_rank == 0:
        tmp = epoch_dir.parent / f".{epoch_dir.name}.tmp"  # other nodes: rank 0's rename happened elsewhere
        src = epoch_dir if epoch_dir.is_dir() else tmp
        if src.is_dir():
            storage.sync(str(src), dest, exclude=("state.json",))
    _barrier()
    if rank != 0:
        return None
    storage.sync(str(epoch_dir / "state.json"), storage.join(dest, "state.json"))
    pointer = epoch_dir.parent / f".pointer-{epoch_dir.name}"
    pointer.mkdir(exist_ok=True)
    (pointer / "pointer.json").write_text(json.dumps({"epoch_uri": dest, **json.loads((epoch_dir / "state.json").read_text())},
                                                     default=str))
    return pointer


def publish_final(cfg, final: Path, rank: int) -> None:
    if cfg.out_uri and rank == 0:
        storage.sync(str(final), storage.join(cfg.out_uri, "final"))
