"""Benchmark: record N eval units in a manifest (default 48,000, the paper grid's records), old vs new.

python experiments/bench_manifest.py [--units 48000] [--old-units 4000] [--dir DIR]

New: orchestrator.manifest.Manifest (an fsync'd journal line per record, compaction when the journal
is as long as the snapshot, and once at the end, as the driver's last publication does). Old: the
manifest before the journal, which rewrote the whole JSON on every record (its _flush: json.dumps
of the state, indent=1, sorted keys, through a temp file and a rename; no fsync); it is quadratic,
so it runs ``--old-units`` records and a fit a + b*n + c*n^2 over its cumulative times extrapolates
it to ``--units`` (printed as an extrapolation). Each record is shaped like the driver's eval record
("running", then "done" with two files, their rows and the cell).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CELL = {"backbone": "eagle2", "drafter": "math", "strategy": "single", "routing_granularity": "step",
        "merge_dedup": False, "benchmark": "gsm8k", "temperature": 0.0, "total_tokens": 60,
        "drafters": ["eagle2-math"], "budget_matched": False, "tree": "fixed", "route_score": "path",
        "switch_after": 2, "switch_to": "specialist", "switch_depth": 2, "decide_steps": None,
        "prompts": None}


def _records(i: int):
    """The driver's two records of eval unit ``i``: running, then done."""
    key = f"eval-{i:032x}"
    part = "backbone=eagle2/benchmark=gsm8k/temperature=0"
    files = [f"traces/prompts/{part}/{key}.parquet", f"traces/steps/{part}/{key}.parquet"]
    yield key, "running", {}
    yield key, "done", {"files": files, "cell": CELL, "prompts": 20, "rows": 20,
                        "file_rows": {files[0]: 20, files[1]: 2400}}


class OldManifest:
    """The manifest's record() before the journal: the state rewritten whole on every record."""

    def __init__(self, path: Path):
        self.path, self.data = path, {"cells": {}}

    def record(self, key, stage, name, status, attempts=1, error=None, files=(), **extra):
        from common.atomic import write_text_atomic

        self.data["cells"][key] = {"stage": stage, "name": name, "status": status, "attempts": attempts,
                                   "error": error, "files": list(files), **extra}
        write_text_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True))


def run(m, units: int, marks=()) -> tuple[float, list[tuple[int, float]]]:
    """Seconds to record ``units`` units in ``m``; the cumulative seconds at each unit count in ``marks``."""
    t, seen = time.perf_counter(), []
    for i in range(units):
        for key, status, extra in _records(i):
            m.record(key, "eval", "eagle2:single:math|gsm8k|T=0", status, **extra)
        if i + 1 in marks:
            seen.append((i + 1, time.perf_counter() - t))
    if hasattr(m, "close"):
        m.close()
    return time.perf_counter() - t, seen


def main(argv=None) -> int:
    import numpy as np

    from orchestrator.manifest import Manifest

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=48_000)
    ap.add_argument("--old-units", type=int, default=4_000, help="units the old manifest records (quadratic)")
    ap.add_argument("--dir", type=Path, default=None, help="where the manifests go (default: a temp dir)")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-manifest-", dir=args.dir))
    try:
        new, _ = run(Manifest(base / "new" / "manifest.json"), args.units)
        size = (base / "new" / "manifest.json").stat().st_size / 1e6
        print(f"new: {args.units:,} units ({2 * args.units:,} records) in {new:.1f} s "
              f"({new / (2 * args.units) * 1e6:.0f} us a record); manifest.json {size:.1f} MB", flush=True)
        (base / "old").mkdir()
        marks = sorted({int(args.old_units * f) for f in (0.25, 0.5, 0.75, 1.0)})
        old, seen = run(OldManifest(base / "old" / "manifest.json"), args.old_units, marks)
        last = f"the last {marks[-1] - marks[-2]} units in {seen[-1][1] - seen[-2][1]:.1f} s"
        print(f"old: {args.old_units:,} units in {old:.1f} s ({old / (2 * args.old_units) * 1e3:.1f} ms a "
              "record "
              f"on average; {last})", flush=True)
        c = np.polyfit([n for n, _ in seen], [s for _, s in seen], 2)
        est = float(np.polyval(c, args.units))
        print(f"old, extrapolated to {args.units:,} units (quadratic fit over {len(seen)} points, not run): "
              f"{est:.0f} s ({est / 3600:.1f} h), {est / new:.0f}x the new manifest")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
