"""Feature shards a node downloads for its training ranks, within a byte budget on its disk.

A rank reads a cache at a URI through :class:`ShardCache` (drafters.features.reading_through):
each shard it opens is downloaded into the node cache (``storage.node_cache``: the mirror of the
URI, where the cache's manifest already is) unless it is there, and held while it is read. Only
the shards a rank opens are downloaded: its own (drafters/shards.py), and rank 0's held-out sets.
Before a download, the least recently used shards that no one holds are deleted until the new one
fits the budget, so the node's shards (temp files of a download included) stay under it while one
shard per reader fits. Every rank and trial on the node shares the cache (one ``TASKSPEC_STAGING``):
per shard a ``<key>.lock`` file, held shared (``flock``) while the shard is read and whose mtime is
its last use, and one node-wide ``node.lock`` held while a download makes room and runs, so two
ranks never download the same shard twice nor both fill the same free space. Each download is a
line of ``downloads.jsonl`` (rank, shard, bytes, the node's shard bytes after it).

The budget: ``TASKSPEC_FEATURE_CACHE_GB`` in the node's (or the job's) environment, default
``DEFAULT_GB``. A budget that cannot hold the largest shard is refused when the first is opened.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from common.atomic import write_text_atomic
from common import storage

ENV = "TASKSPEC_FEATURE_CACHE_GB"
DEFAULT_GB = 100.0


def budget_bytes(env: dict | None = None) -> int:
    """The node's shard budget in bytes, from ``TASKSPEC_FEATURE_CACHE_GB`` (one line if malformed)."""
    raw = (os.environ if env is None else env).get(ENV)
    try:
        gb = DEFAULT_GB if raw in (None, "") else float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number of GB") from None
    if not gb > 0:
        raise ValueError(f"{ENV} must be > 0 GB, got {raw!r}")
    return int(gb * 2**30)


class ShardCache:
    """Opens shards of caches at URIs: ``remotes`` maps each cache root's node-local mirror
    (``storage.node_cache(uri)``) to its URI; a shard of any other root is read in place."""

    def __init__(self, budget: int, remotes: dict[str, str], rank: int = 0):
        if budget <= 0:
            raise ValueError(f"ShardCache: the budget must be > 0 bytes, got {budget}")
        self.budget, self.rank = budget, rank
        self.remotes = {str(Path(k)): v for k, v in remotes.items()}
        self.dir = storage.node_dir("feature-shards")
        self.downloaded: list[str] = []  # the shards this process downloaded
        self._sizes: dict[str, dict] = {}

    def _remote(self, store_dir: Path) -> str | None:
        uri = self.remotes.get(str(store_dir.parent))
        return None if uri is None else storage.join(uri, store_dir.name)

    def _size(self, ref_dir: str, file: str, nbytes: int | None) -> int:
        if nbytes is None:  # a cache whose index has no bytes: one listing per cache
            if ref_dir not in self._sizes:
                self._sizes[ref_dir] = storage.file_sizes(ref_dir)
            nbytes = self._sizes[ref_dir].get(file)
            if nbytes is None:
                raise FileNotFoundError(f"feature shard {storage.join(ref_dir, file)} is missing")
        if nbytes > self.budget:
            raise ValueError(f"feature shard {file} ({nbytes / 2**20:.1f} MiB) does not fit the node's shard "
                             f"cache ({self.budget / 2**20:.1f} MiB, {ENV}): raise it")
        return nbytes

    @contextlib.contextmanager
    def open(self, store_dir: Path, file: str, nbytes: int | None = None) -> Iterator[Path]:
        """The local path of shard ``file`` of the cache at ``store_dir``, downloaded if missing;
        no prune deletes it inside the block."""
        ref_dir = self._remote(Path(store_dir))
        local = Path(store_dir) / file
        if ref_dir is None:
            yield local
            return
        ref = storage.join(ref_dir, file)
        size = self._size(ref_dir, file, nbytes)
        self.dir.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(ref.encode()).hexdigest()[:16]
        if not (self.dir / f"{key}.ref").is_file():
            entry = {"ref": ref, "local": str(local), "bytes": size}
            write_text_atomic(self.dir / f"{key}.ref", json.dumps(entry))
        with open(self.dir / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # held while read: a prune skips it
            try:
                if not _complete(local, size):
                    with self._node_lock():
                        if not _complete(local, size):
                            self._make_room(size)
                            storage.sync(ref, str(local), force=True)
                            self._log(ref, size)
                os.utime(lock.name)  # the last use, for least-recently-used order
                yield local
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _node_lock(self) -> Iterator[None]:
        with open(self.dir / "node.lock", "a") as mutex:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(mutex, fcntl.LOCK_UN)

    def entries(self) -> list[tuple[float, str, Path, int]]:
        """(last use, key, local file, bytes) of every shard the node holds, oldest first."""
        out = []
        for ref_file in self.dir.glob("*.ref"):
            try:
                info = json.loads(ref_file.read_text())
                used = (self.dir / f"{ref_file.stem}.lock").stat().st_mtime
            except (FileNotFoundError, ValueError):
                continue
            local = Path(info["local"])
            if local.is_file():
                out.append((used, ref_file.stem, local, local.stat().st_size))
        return sorted(out)

    def nbytes(self) -> int:
        return sum(e[3] for e in self.entries())

    def _make_room(self, size: int) -> None:
        """Delete least recently used shards no one holds until ``size`` more bytes fit (node lock held)."""
        entries = self.entries()
        total = sum(e[3] for e in entries)
        for _, key, local, nbytes in entries:
            if total + size <= self.budget:
                break
            with open(self.dir / f"{key}.lock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # being read: it stays
                    continue
                local.unlink(missing_ok=True)
                fcntl.flock(lock, fcntl.LOCK_UN)
            total -= nbytes

    def _log(self, ref: str, size: int) -> None:
        self.downloaded.append(ref)
        line = json.dumps({"rank": self.rank, "ref": ref, "bytes": size, "held_bytes": self.nbytes(),
                           "budget": self.budget, "t": time.time()})
        with open(self.dir / "downloads.jsonl", "a") as f:
            f.write(line + "\n")


def _complete(local: Path, size: int) -> bool:
    try:
        return local.stat().st_size == size
    except FileNotFoundError:
        return False
