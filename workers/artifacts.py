"""How a training run on any node reads its inputs from, and writes its checkpoints to, a shared URI.

Layout at the URI mirrors the local run directory: ``epoch-N/`` and ``step-N-B/`` checkpoints
(weights, DeepSpeed state of every rank, ``state.json`` last, so a checkpoint with ``state.json``
is complete) and ``final/``. Once a checkpoint is at the URI, the ones it makes stale are deleted
there (older step checkpoints; epochs beyond ``keep_checkpoints``) and every node drops its local
copies but the newest (the final checkpoint is made from it).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from drafters.checkpoint import checkpoint_position, latest_checkpoint, stale_checkpoints
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


def remote_checkpoints(out_uri: str) -> list[str]:
    """Names of the complete checkpoints (epoch and step) at ``out_uri``."""
    return [n for n in storage.listdir(out_uri)
            if checkpoint_position(n) is not None and storage.exists(storage.join(out_uri, n, "state.json"))]


def prepare(cfg, local_rank: int):
    """For a config with ``out_uri``: a node-local out_dir holding exactly the latest complete
    remote checkpoint (the remote copy is the truth; a stale local run dir is discarded)."""
    if not cfg.out_uri:
        return cfg
    out = storage.node_cache(cfg.out_uri)
    vocab = str(storage.fetch(cfg.draft_vocab)) if cfg.draft_vocab else None
    cfg = dataclasses.replace(cfg, out_dir=str(out), train_data=localize_data(cfg.train_data),
                              heldout_data=localize_data(cfg.heldout_data), draft_vocab=vocab)
    if local_rank == 0:
        shutil.rmtree(out, ignore_errors=True)
        latest = latest_checkpoint(remote_checkpoints(cfg.out_uri))
        if latest is not None:
            storage.sync(storage.join(cfg.out_uri, latest), str(out / latest))
    _barrier()
    return cfg


def drop_local(out: Path, keep: str | None) -> None:
    """Delete this node's checkpoint directories (and unfinished temp copies) but ``keep``."""
    for p in Path(out).iterdir() if Path(out).is_dir() else ():
        name = p.name.removeprefix(".").removesuffix(".tmp")
        if p.name != keep and checkpoint_position(name) is not None:
            shutil.rmtree(p, ignore_errors=True)


def publish_checkpoint(cfg, ckpt_dir: Path, rank: int, local_rank: int) -> None:
    """Every node uploads the files its ranks wrote (ZeRO shards differ per rank); rank 0 adds
    state.json once all have, which marks the checkpoint complete at the URI, then deletes the
    remote checkpoints it makes stale. Each node then keeps only its newest local copy."""
    if not cfg.out_uri:
        return
    dest = storage.join(cfg.out_uri, ckpt_dir.name)
    _barrier()
    if local_rank == 0:
        tmp = ckpt_dir.parent / f".{ckpt_dir.name}.tmp"  # other nodes: rank 0's rename happened elsewhere
        src = ckpt_dir if ckpt_dir.is_dir() else tmp
        if src.is_dir():
            storage.sync(str(src), dest, exclude=("state.json",))
    _barrier()
    if rank == 0:
        storage.sync(str(ckpt_dir / "state.json"), storage.join(dest, "state.json"))
        for stale in stale_checkpoints(remote_checkpoints(cfg.out_uri), cfg.keep_checkpoints):
            storage.remove(storage.join(cfg.out_uri, stale))
    if local_rank == 0:
        drop_local(ckpt_dir.parent, keep=ckpt_dir.name)


def pointer(cfg, ckpt_dir: Path) -> Path:
    """A small local directory whose pointer.json names the published checkpoint, for Ray Train
    to record (rank 0; no second copy of the weights)."""
    p = ckpt_dir.parent / f".pointer-{ckpt_dir.name}"
    p.mkdir(exist_ok=True)
    state = json.loads((ckpt_dir / "state.json").read_text())
    ref = {"epoch_uri": storage.join(cfg.out_uri, ckpt_dir.name), **state}
    (p / "pointer.json").write_text(json.dumps(ref, default=str))
    return p


def publish_final(cfg, final: Path, rank: int) -> None:
    """Rank 0 uploads final/ and keeps only it locally (the node cache eval actors fetch into)."""
    if cfg.out_uri and rank == 0:
        storage.sync(str(final), storage.join(cfg.out_uri, "final"))
        drop_local(final.parent, keep="final")
