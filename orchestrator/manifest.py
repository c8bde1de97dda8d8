"""manifest.json: every unit of work (key, stage, status, attempts, error, output files), atomic."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from drafters.atomic import write_text_atomic

STAGES = ("features", "train", "merge", "eval", "report")


class Manifest:
    """``present``: for a run whose artifacts live at a URI, the files known to exist there (one
    listing at start, plus every file recorded since); None checks the manifest's own directory."""

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
        return bool(c and c["status"] == "done" and all(self._exists(f) for f in c.get("files", [])))

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
