"""manifest.json: every unit of work (key, stage, status, attempts, error, output files), atomic.

A unit is done when it is recorded done and its files are there; a Parquet file it lists must
also read back (its footer) with the row count recorded in ``file_rows``, else the unit is redone.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from drafters.atomic import write_text_atomic

STAGES = ("features", "train", "merge", "eval", "report")


def parquet_rows(path: str | os.PathLike) -> int | None:
    """Rows of a Parquet file from its footer (cheap); None if it is missing or does not read back."""
    try:
        return pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException):
        return None


class Manifest:
    """``present``: for a run whose artifacts live at a URI, the files known to exist there (one
    listing at start, plus every file recorded since); None checks the manifest's own directory.
    Parquet files are read back only in the second case: at a URI objects are published whole
    (a single or multipart upload completes or leaves nothing), and reading every footer there
    would cost requests per unit on each resume."""

    def __init__(self, path: str | os.PathLike, present: set[str] | None = None):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.present = present
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"cells": {}}

    def _exists(self, rel: str) -> bool:
        return rel in self.present if self.present is not None else Path(self.path.parent, rel).exists()

    def get(self, key: str) -> dict | None:
        return self.data["cells"].get(key)

    def done(self, key: str) -> bool:
        c = self.get(key)
        if not (c and c["status"] == "done" and all(self._exists(f) for f in c.get("files", []))):
            return False
        return self.present is not None or self._reads_back(c)

    def _reads_back(self, c: dict) -> bool:
        """Every Parquet file of a done unit has a readable footer and the rows recorded for it
        (``file_rows``; records made before it existed only need the footer)."""
        expected = c.get("file_rows", {})
        for f in c.get("files", []):
            if not f.endswith(".parquet"):
                continue
            n = parquet_rows(Path(self.path.parent, f))
            if n is None or (f in expected and n != expected[f]):
                got = "does not read back" if n is None else f"has {n} rows"
                want = f", expected {expected[f]}" if n is not None else ""
                print(f"[manifest] {c['name']}: {f} {got}{want}; redoing the unit", file=sys.stderr, flush=True)
                return False
        return True

    def record(self, key: str, stage: str, name: str, status: str, attempts: int = 1, error: str | None = None,
               files: list[str] = (), **extra) -> None:
        with self._lock:
            if self.present is not None:  # recorded only once published
                self.present.update(files)
            self.data["cells"][key] = {"stage": stage, "name": name, "status": status, "attempts": attempts,
                                       "error": error, "files": list(files), **extra}
            self._flush()

    def forget_from(self, stage: str) -> int:
        """--force STAGE: drop that stage's records and every later stage's."""
        later = set(STAGES[STAGES.index(stage):])
        with self._lock:
            drop = [k for k, c in self.data["cells"].items() if c["stage"] in later]
            for k in drop:
                del self.data["cells"][k]
            self._flush()
        return len(drop)

    def cells(self, stage: str | None = None) -> dict:
        return {k: c for k, c in self.data["cells"].items() if stage is None or c["stage"] == stage}

    def _flush(self) -> None:
        write_text_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True))
