"""Benchmark: aggregate N synthetic step rows (default 10 million) with the report's polars code.

python experiments/bench_report.py [--rows 10000000]   (prints seconds per table; target < 30 s)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import numpy as np
    import polars as pl

    from orchestrator.report.tables import depth_table, entropy_table

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    args = ap.parse_args(argv)
    n = args.rows
    rng = np.random.default_rng(0)
    t = time.time()
    depth = rng.integers(0, 5, n)
    acc_ent = pl.Series(rng.random(n)).to_frame("e")
    df = pl.DataFrame({
        "prompt_id": rng.integers(0, 2000, n).astype(str), "turn": rng.integers(0, 2, n), "step": rng.integers(0, 200, n),
        "drafter": rng.choice(["math", "chat", "mixed_half", "mixed_full"], n), "strategy": rng.choice(["single", "merged"], n),
        "routing_granularity": "step", "merge_dedup": False, "budget_matched": False, "total_tokens": 16,
        "rejected_draft_entropy": rng.random(n) * 2, "rejected_verifier_entropy": rng.random(n),
    }).with_columns(
        pl.concat_list([acc_ent["e"]] * 2).alias("accepted_draft_entropy"),
        pl.concat_list([acc_ent["e"] * 0.5] * 2).alias("accepted_verifier_entropy"),
        pl.Series("d", depth).alias("d"),
    ).with_columns(
        pl.concat_list([pl.lit(True), pl.col("d") > 0, pl.col("d") > 2]).alias("depth_accept"),
    ).drop("d")
    with tempfile.TemporaryDirectory() as tmp:
        for b in ("gsm8k", "mt_bench"):
            part = Path(tmp) / f"backbone=hass/benchmark={b}/temperature=0"
            part.mkdir(parents=True)
            df.slice(0 if b == "gsm8k" else n // 2, n // 2).write_parquet(part / "steps.parquet")
        print(f"generated and wrote {n:,} step rows in {time.time() - t:.1f}s")
        from orchestrator.report.tables import method_expr

        scan = pl.scan_parquet(f"{tmp}/**/*.parquet", hive_partitioning=True).with_columns(
            pl.col("temperature").cast(pl.Float64), method_expr().alias("method"))
        for name, fn in (("entropy (Tables 3-4)", entropy_table), ("depth (Tables 5-8)", depth_table)):
            t = time.time()
            out = fn(scan)
            print(f"{name}: {time.time() - t:.2f}s -> {out.height} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
