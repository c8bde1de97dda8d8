"""How a training run on any node reads its inputs from, and writes its checkpoints to, a shared URI.

Layout at the URI mirrors the local run directory: ``epoch-N/`` and ``step-N-B/`` checkpoints
(weights, DeepSpeed state of every rank, ``state.json`` last, so a checkpoint with ``state.json``
is complete) and ``final/``. Checkpoints are uploaded in the background while training goes on,
one at a time (:class:`Uploads`). Once a checkpoint is complete at the URI, the ones it makes stale
are deleted there (older step checkpoints; epochs beyond ``keep_checkpoints``) and every node drops
its local copies but the newest (the final checkpoint is made from it).

Feature caches at the URI: a rank fetches their manifests (shard indexes) only; the shards it reads
come through the node's bounded shard cache (workers/shard_cache.py). The features task streams a
cache's shards to the URI as they are finished (:class:`RemoteDir`, :func:`feature_stores`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

from common import storage
from drafters.checkpoint import checkpoint_position, latest_checkpoint, stale_checkpoints

SHARD_TOKENS_ENV = "TASKSPEC_FEATURE_SHARD_TOKENS"  # tokens per feature shard (default: about 1 GiB a shard)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def localize_data(entries: list) -> list:
    """[[root, key, ids], ...] with URI roots replaced by their node-local mirrors, holding each
    cache's manifest (its shard index) only: shards are downloaded when a rank opens them, through
    the node's bounded cache (:func:`shard_cache`)."""
    out = []
    for root, key, ids in entries:
        if storage.is_uri(root):
            storage.fetch(storage.join(root, key, "manifest.json"))  # a temp name, renamed: ranks may race
            root = str(storage.node_cache(root))
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


class UploadFailed(RuntimeError):
    pass


class Uploads:
    """One rank's checkpoint uploads to ``cfg.out_uri``, each in a background thread while training
    goes on (every rank makes one and calls :meth:`start` after each checkpoint is written and
    :meth:`settle` before the next is written and before the final one).

    Every node's first rank uploads the files its node's ranks wrote (ZeRO shards differ per rank),
    ``state.json`` excluded; ``state.json`` follows once every node's files are there, which marks
    the checkpoint complete at the URI (:func:`remote_checkpoints`), and then the remote checkpoints
    it makes stale are deleted. On one node rank 0's thread does all of that at once; with several
    nodes no thread knows when the others are done, so rank 0 completes the checkpoint at the next
    :meth:`settle`, after the ranks agree that every upload succeeded. At most one upload is in
    flight: :meth:`settle` waits for it, so the next checkpoint (and rank 0's drop of the ones it
    makes stale, drafters/train/loop.py) never touches a directory being uploaded. A failed
    upload is raised by :meth:`settle` on every rank. Collectives run in the calling thread only."""

    def __init__(self, cfg, rank: int, local_rank: int, world: int, nodes: int):
        self.cfg = cfg
        self.rank = rank
        self.local_rank = local_rank
        self.world = world
        self.nodes = nodes
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending: Path | None = None  # uploaded on every node, state.json not yet written (nodes > 1)
        self.in_flight: str | None = None  # the checkpoint this rank's thread uploads

    @classmethod
    def for_rank(cls, cfg, rank: int, local_rank: int, world: int) -> Uploads:
        """Every rank calls it (one gather: how many nodes upload)."""
        from drafters.train.runners import gather

        return cls(cfg, rank, local_rank, world, sum(gather(local_rank == 0, world)))

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, *exc) -> None:
        """Leaving the training (a crash too): no upload keeps running beside a restarted run's
        fetch of the latest complete checkpoint (artifacts.prepare); a failure left unraised here
        is the crash's consequence, not news."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def start(self, ckpt_dir: Path) -> None:
        """Checkpoint ``ckpt_dir`` is written on every rank: upload it in the background."""
        if not self.cfg.out_uri:
            return
        self.settle()  # (the trainer settles before it writes; a caller that did not waits here)
        _barrier()  # every rank's files are written
        if self.nodes > 1:
            self._pending = ckpt_dir
        if self.local_rank == 0:
            self.in_flight = ckpt_dir.name
            self._thread = threading.Thread(target=self._run, args=(ckpt_dir,), daemon=True,
                                            name=f"upload-{ckpt_dir.name}")
            self._thread.start()

    def settle(self) -> None:
        """Return once no upload is in flight (and, with several nodes, the last one is complete at
        the URI); raise on every rank if one failed."""
        if not self.cfg.out_uri:
            return
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        name = self.in_flight
        self.in_flight = None
        err, self._error = self._error, None
        from drafters.train.runners import all_ranks

        if not all_ranks(err is None, self.world):
            self._pending = None
            mine = f"the upload of {name} failed: {err!r}" if err else "another node's upload failed"
            raise UploadFailed(f"rank {self.rank}: {mine}") from err
        pending, self._pending = self._pending, None
        if pending is not None and self.rank == 0:
            self._complete(pending)

    def _run(self, ckpt_dir: Path) -> None:
        try:
            dest = storage.join(self.cfg.out_uri, ckpt_dir.name)
            tmp = ckpt_dir.parent / f".{ckpt_dir.name}.tmp"  # other nodes: rank 0's rename happened elsewhere
            src = ckpt_dir if ckpt_dir.is_dir() else tmp
            if src.is_dir():
                storage.sync(str(src), dest, exclude=("state.json",))
            if self.nodes == 1:
                self._complete(ckpt_dir)
            drop_local(ckpt_dir.parent, keep=ckpt_dir.name)  # this node keeps its newest copy only
        except BaseException as e:  # raised by the next settle(), on every rank
            self._error = e

    def _complete(self, ckpt_dir: Path) -> None:
        """(rank 0) state.json to the URI, then the remote checkpoints this one makes stale dropped,
        and any older one left without state.json (an upload a killed run did not finish)."""
        uri, here = self.cfg.out_uri, checkpoint_position(ckpt_dir.name)
        storage.sync(str(ckpt_dir / "state.json"), storage.join(uri, ckpt_dir.name, "state.json"))
        done = remote_checkpoints(uri)
        broken = [n for n in storage.listdir(uri)
                  if n not in done and (checkpoint_position(n) or here) < here]
        for stale in stale_checkpoints(done, self.cfg.keep_checkpoints) + broken:
            storage.remove(storage.join(uri, stale))


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


def shard_cache(cfg, rank: int):
    """The node's bounded cache for the shards of ``cfg``'s caches at URIs (before ``prepare``
    localizes them); budget from TASKSPEC_FEATURE_CACHE_GB (workers/shard_cache.py)."""
    from workers.shard_cache import ShardCache, budget_bytes

    roots = {root for root, _, _ in cfg.train_data + cfg.heldout_data if storage.is_uri(root)}
    return ShardCache(budget_bytes(), {str(storage.node_cache(r)): r for r in roots}, rank)


class RemoteDir:
    """One feature cache's directory at a URI, as drafters.feature_stream.StreamingFeatureStore writes it."""

    def __init__(self, uri: str):
        self.uri = uri

    def sizes(self) -> dict[str, int]:
        return storage.file_sizes(self.uri)

    def put(self, local: Path, name: str) -> None:
        storage.sync(str(local), storage.join(self.uri, name), force=True)

    def put_text(self, name: str, text: str) -> None:
        storage.write_text(storage.join(self.uri, name), text)

    def read_text(self, name: str) -> str | None:
        return storage.read_text(storage.join(self.uri, name))


def feature_store_at(root: str, key: str):
    """The store of cache ``key`` under ``root`` as its writer saw it (at a URI: streamed there), to
    read its parts' records and write its index (FeatureStore.finish_parts)."""
    from drafters.feature_stream import StreamingFeatureStore
    from drafters.features import FeatureStore

    if storage.is_uri(root):
        return StreamingFeatureStore(storage.node_cache(root), key, RemoteDir(storage.join(root, key)))
    return FeatureStore(root, key)


def feature_stores(root: str, model, aux_layers=None, env: dict | None = None):
    """``store_for(local_root, key)`` for drafters.variants.ensure_features: with a URI ``root``
    a StreamingFeatureStore (shards staged under the node mirror, uploaded one by one), else a
    FeatureStore in place. Shards of about 1 GiB for ``model``'s hidden size and aux layers, or
    ``TASKSPEC_FEATURE_SHARD_TOKENS`` tokens; the manifest records the device and dtype."""
    from drafters.feature_stream import StreamingFeatureStore
    from drafters.features import FeatureStore, shard_tokens_for

    raw = (os.environ if env is None else env).get(SHARD_TOKENS_ENV)
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{SHARD_TOKENS_ENV}={raw!r} is not a positive number of tokens")
        tokens = int(raw)
    else:
        tokens = shard_tokens_for(model.config.hidden_size, 0 if aux_layers is None else len(aux_layers))
    extra = {"device": str(model.device), "dtype": str(model.dtype).removeprefix("torch.")}

    def store_for(local_root: str, key: str):
        if storage.is_uri(root):
            store = StreamingFeatureStore(local_root, key, RemoteDir(storage.join(root, key)), tokens)
        else:
            store = FeatureStore(local_root, key, tokens)
        store.extra_meta = extra
        return store

    return store_for
