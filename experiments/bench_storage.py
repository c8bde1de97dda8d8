"""Cost of moving artifacts through an output URI (common.storage), against a plain local
copy of the same tree in the same run.

    python experiments/bench_storage.py [--mb 256] [--files 8] [--uri file:///tmp/bench-uri]

Prints seconds and MB/s for: shutil.copytree (baseline), publish (first upload), publish again
(nothing changed: the incremental check only), one file rewritten then publish, and fetch to
the node cache. With the default file:// URI this measures the code's own overhead; pass an
s3:// or gs:// URI to measure a real object store.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import storage  # noqa: E402


def _timed(label: str, fn, mb: float) -> None:
    t = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t
    extra = f", {n} file(s) copied" if isinstance(n, int) else ""
    print(f"{label:<34} {dt:7.3f} s  {mb / dt if dt > 0 else float('inf'):9.1f} MB/s{extra}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=256, help="total size of the tree (MB)")
    ap.add_argument("--files", type=int, default=8, help="number of files (like ZeRO shards + weights)")
    ap.add_argument("--uri", default=None, help="destination URI (default: a fresh file:// dir)")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    os.environ["TASKSPEC_STAGING"] = str(work / "staging")
    try:
        src = work / "epoch-1"
        src.mkdir()
        per = int(a.mb * 1e6 / a.files)
        for i in range(a.files):
            (src / f"shard-{i:02d}.bin").write_bytes(os.urandom(per))
        (src / "state.json").write_text("{}")
        uri = a.uri or f"file://{work / 'remote'}"
        dest = storage.join(uri, "checkpoints/x/epoch-1")
        print(f"tree: {a.files} files, {a.mb:.0f} MB; destination {dest}")
        _timed("shutil.copytree (baseline)", lambda: shutil.copytree(src, work / "copy") and None, a.mb)
        _timed("publish (first upload)", lambda: storage.sync(str(src), dest), a.mb)
        _timed("publish again (unchanged)", lambda: storage.sync(str(src), dest), a.mb)
        time.sleep(0.01)
        (src / "shard-00.bin").write_bytes(os.urandom(per))
        _timed("publish after one file rewritten", lambda: storage.sync(str(src), dest), a.mb / a.files)
        _timed("fetch to the node cache", lambda: storage.sync(dest, str(storage.node_cache(dest))), a.mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
