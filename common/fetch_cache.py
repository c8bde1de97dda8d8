"""Checkpoints a node fetched from the output URI, kept within a byte budget on its disk.

Evaluation actors fetch each drafter they load into the node cache (``storage.node_cache``);
a long grid's merged drafters alone would fill a node's disk. :class:`FetchCache` bounds them:
after each use, the least recently used fetched checkpoints go until the node's total is under
the budget. Every actor on a node shares the cache (one ``TASKSPEC_STAGING``), so the
bookkeeping is in files there: per checkpoint, ``<key>.ref`` (its URI) and ``<key>.lock``,
which a user holds shared (``flock``) from its fetch until its load is done and whose mtime is
the last use; a prune deletes only what it can lock exclusively, so never a checkpoint being
fetched or read. Lock files stay (a few bytes per checkpoint the node ever fetched): deleting
one would let two processes lock different files for the same checkpoint. A path that is not a
URI is the checkpoint itself, used in place and never deleted.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import storage
from common.atomic import write_text_atomic


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist). A file that goes while it is
    counted (a fetch's temp file renamed, a prune on another actor) counts 0."""
    total = 0
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        try:
            total += p.stat().st_size if p.is_file() else 0
        except FileNotFoundError:
            pass
    return total


class FetchCache:
    def __init__(self, budget_bytes: float):
        if not budget_bytes > 0:
            raise ValueError(f"FetchCache: the budget must be > 0 bytes, got {budget_bytes!r}")
        self.budget = budget_bytes
        self.dir = storage.node_dir("fetched")
        self.deleted = 0  # checkpoints this process deleted

    def _key(self, ref: str) -> str:
        return hashlib.sha256(ref.encode()).hexdigest()[:16]

    @contextmanager
    def use(self, ref: str) -> Iterator[Path]:
        """A local copy of ``ref`` for the block (fetched if missing or stale); no prune deletes it
        meanwhile. After the block, the cache is pruned to the budget."""
        if not storage.is_uri(ref):
            yield Path(ref)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        key = self._key(ref)
        if not (self.dir / f"{key}.ref").is_file():
            write_text_atomic(self.dir / f"{key}.ref", ref)
        with open(self.dir / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # waits while a prune deletes this checkpoint
            try:
                yield storage.fetch(ref)
            finally:
                os.utime(lock.name)  # the last use, for least-recently-used order
                fcntl.flock(lock, fcntl.LOCK_UN)
        self.prune()

    def entries(self) -> list[tuple[float, str, Path, int]]:
        """(last use, key, local copy, bytes) of every checkpoint this node has fetched and still holds."""
        out = []
        for ref_file in self.dir.glob("*.ref"):
            key = ref_file.stem
            local = storage.node_cache(ref_file.read_text())
            size = tree_bytes(local)
            try:
                used = (self.dir / f"{key}.lock").stat().st_mtime
            except FileNotFoundError:  # its first user has not opened the lock yet: it is about to be used
                continue
            if size:
                out.append((used, key, local, size))
        return sorted(out)

    def nbytes(self) -> int:
        return sum(e[3] for e in self.entries())

    def prune(self) -> int:
        """Delete least recently used checkpoints, skipping those in use, until the node's fetched
        checkpoints fit the budget; returns the bytes freed. One prune at a time per node."""
        if not self.dir.is_dir():
            return 0
        freed = 0
        with open(self.dir / "prune.lock", "a") as mutex:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            entries = self.entries()
            total = sum(e[3] for e in entries)
            for _, key, local, size in entries:
                if total <= self.budget:
                    break
                with open(self.dir / f"{key}.lock", "a") as lock:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # being fetched or loaded: it stays
                        continue
                    if local.is_dir():
                        shutil.rmtree(local, ignore_errors=True)
                    else:
                        local.unlink(missing_ok=True)
                total -= size
                freed += size
                self.deleted += 1
        return freed
