"""What a finished run says last: the summary lines on screen, and the summary run in the tracker."""
from __future__ import annotations

import polars as pl

from orchestrator.profile import profile_dict
from orchestrator.report.run_records import current_failures
from orchestrator.report.tables import KEYS as TABLE_KEYS


def print_summary(manifest, out) -> None:
    """The last lines on screen: failures, the headline numbers, where the report is."""
    failed = current_failures(manifest.cells(), manifest.data.get("plan"))
    listed = "".join(f"\n  FAILED {c['stage']}: {c['name']}" for c in failed[:5])
    print(f"summary: {len(failed)} failed unit(s)" + listed + ("\n  ..." if len(failed) > 5 else ""))
    tables = out / "report" / "tables"
    try:
        acceptance = pl.read_parquet(tables / "table1_acceptance.parquet")
        speed = pl.read_parquet(tables / "speed.parquet")
    except (OSError, pl.exceptions.PolarsError):
        return
    drafted = acceptance.filter(pl.col("method") != "autoregressive").group_by(["backbone", "temperature"])
    for (backbone, t), group in sorted(drafted, key=lambda kv: (str(kv[0][0]), kv[0][1])):
        best = (group.group_by("method").agg(pl.col("tau").mean())
                .sort(["tau", "method"], descending=[True, False]).head(3))  # ties: by name, not hash order
        fast = (speed.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == t))
                .group_by("method").agg(pl.col("speedup").mean()).drop_nulls("speedup")
                .sort("speedup", descending=True).head(1))
        baseline = speed["baseline"][0]
        fastest = "" if fast.is_empty() else f"; fastest {fast[0, 0]} {fast[0, 1]:.2f}x {baseline}"
        ranked = ", ".join(f"{m} {v:.2f}" for m, v in best.iter_rows())
        print(f"  {backbone} T={t:g}: best tau {ranked}{fastest}")


def track_summary(tracker, p, out, stage_seconds: dict) -> None:
    """The summary run in the tracker: the profile, tau and speedup per eval cell, the report."""
    if tracker.backend == "none":
        return
    tables, cells = out / "report" / "tables", []
    try:
        acceptance = pl.read_parquet(tables / "table1_acceptance.parquet")
        speed = pl.read_parquet(tables / "speed.parquet").select(*TABLE_KEYS, "speedup")
        rows = acceptance.join(speed, on=TABLE_KEYS, how="left").iter_rows(named=True)
    except (OSError, pl.exceptions.PolarsError):
        rows = []
    for r in rows:
        cells.append({"name": f"{r['backbone']}.{r['method']}.{r['benchmark']}.T{r['temperature']:g}",
                      "tau": r["tau"], "speedup": r.get("speedup")})
    try:
        tracker.log_run(profile_dict(p), cells, stage_seconds, out / "report")
        tracker.publish()
        where = f"{tracker.uri} (and {tracker.remote})" if tracker.remote else tracker.uri
        print(f"tracking: {tracker.backend} run '{p.name}-summary' in {where}")
    except Exception as e:  # noqa: BLE001 - the results on disk stand; say the tracker did not get them
        print(f"tracking: {tracker.backend} failed ({type(e).__name__}: {e}); results are on disk")
