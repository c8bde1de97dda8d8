"""A feature cache written straight to object storage: each shard uploaded as it is finished.

The cache's files live at a URI (``remote``: workers.artifacts.RemoteDir). Extraction
(drafters/features.py ``FeatureStore.extract``) stages each shard under a local directory, uploads
it while the next one is computed, and deletes it once up; the index goes up last, so a reader (or a
resumed extraction, which lists what is already at the store) never takes a half-written cache for
a whole one.
"""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from drafters.features import SHARD_TOKENS, FeatureStore


class StreamingFeatureStore(FeatureStore):
    """A cache whose files live at ``remote`` (object storage: ``put(local, name)``,
    ``put_text(name, text)``, ``read_text(name)``, ``sizes()``, e.g. workers.artifacts.RemoteDir).
    Each shard is written to a temp file under ``staging/<key>/``, uploaded while the next one is
    computed, and deleted there once up; the index goes up last. Local disk holds at most two
    shards (``staging_peak`` bytes, measured)."""

    def __init__(self, staging: str | os.PathLike, key: str, remote, shard_tokens: int = SHARD_TOKENS):
        super().__init__(staging, key, shard_tokens)
        self.remote = remote
        self.staging_peak = 0
        self._staged = 0
        self._lock = threading.Lock()
        self._pending = None
        self._pool = None

    def exists(self) -> bool:
        return self.remote.read_text("manifest.json") is not None

    def manifest(self) -> dict:
        text = self.remote.read_text("manifest.json")
        if text is None:
            raise FileNotFoundError(f"feature cache {self.key}: no manifest.json at its store")
        return json.loads(text)

    def _finished(self) -> dict[str, int]:
        return {n: b for n, b in self.remote.sizes().items() if n.startswith("shard-") and "/" not in n}

    def _commit(self, tmp: Path, name: str) -> None:
        size = tmp.stat().st_size
        with self._lock:  # this shard and the one still uploading: the most on local disk
            self._staged += size
            self.staging_peak = max(self.staging_peak, self._staged)
        self._wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"upload-{self.key}")
        self._pending = self._pool.submit(self._upload, tmp, name, size)

    def _upload(self, tmp: Path, name: str, size: int) -> None:
        try:
            self.remote.put(tmp, name)
        finally:
            tmp.unlink(missing_ok=True)
            with self._lock:
                self._staged -= size

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # an upload's error stops the extraction here

    def _drain(self) -> None:
        try:
            self._wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _write_text(self, name: str, text: str) -> None:
        self.remote.put_text(name, text)

    def _read_text(self, name: str) -> str | None:
        return self.remote.read_text(name)

    def _meta(self, meta: dict) -> dict:
        return super()._meta({**meta, "staging_peak_bytes": self.staging_peak})
