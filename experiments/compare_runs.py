"""Compare one evaluation cell across grid runs (an ablation: same eval settings, different drafters).

    python experiments/compare_runs.py --run base=runs/abl-base --run distill=runs/abl-distill \
        [--method math] [--backbone eagle2] [--temperature 0]

Prints a markdown table per benchmark: tau with its 95% CI per run, and the prompt-level paired
bootstrap difference against the first run on the prompts both ran (only trace files the run's
manifest records are read, as in the report); then each run's drafter: held-out top-1 agreement at
depths 1-3 after the last epoch, training examples, tokens/s and seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.report.run_records import recorded_traces
from orchestrator.report.stats import paired_diff_ci, ratio_ci
from orchestrator.report.tables import per_prompt, scan


def cell(run: Path, method: str, backbone: str, temperature: float) -> pl.DataFrame:
    lf = scan(run, "prompts", recorded_traces(run))
    if lf is None:
        raise SystemExit(f"{run}: no recorded prompt traces")
    lf = lf.filter((pl.col("method") == method) & (pl.col("backbone") == backbone)
                   & (pl.col("temperature") == temperature))
    pp = per_prompt(lf)
    if pp.is_empty():
        raise SystemExit(f"{run}: no {method} cell for backbone {backbone} at T={temperature}")
    return pp.filter(pl.col("verifier_calls") > 0)


def drafter_line(run: Path, backbone: str, drafter: str) -> str:
    cfg = run / "checkpoints" / f"{backbone}-{drafter}" / "final" / "config.json"
    if not cfg.is_file():
        return f"{run}: no checkpoint {cfg}"
    t = json.loads(cfg.read_text())["training"]
    last = t["history"][-1]
    secs = sum(h.get("epoch_seconds", 0.0) for h in t["history"])
    top = " / ".join(f"{last.get(f'top1_depth{d}', float('nan')):.3f}" for d in (1, 2, 3))
    return (f"held-out top-1 (depth 1/2/3) {top}; {t['history'][-1]['steps'] * t['batch_size']} "
            "examples/epoch "
            f"x {t['epoch']} epochs; {last.get('train_tokens_per_s', float('nan')):.0f} loss tok/s; "
            f"{secs:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=DIR (the first is the baseline)")
    ap.add_argument("--method", default="math",
                    help="a method as the report names it: math, chat, avg0.5, merged, ...")
    ap.add_argument("--backbone", default="eagle2")
    ap.add_argument("--temperature", type=float, default=0.0)
    a = ap.parse_args(argv)
    runs = []
    for r in a.run:
        if "=" not in r:
            ap.error(f"--run expects LABEL=DIR, got {r!r}")
        label, d = r.split("=", 1)
        runs.append((label, Path(d)))
    cells = {label: cell(d, a.method, a.backbone, a.temperature) for label, d in runs}
    base_label = runs[0][0]
    for bench in sorted(set().union(*(c["benchmark"].unique().to_list() for c in cells.values()))):
        print(f"\n{a.method} {a.backbone} T={a.temperature:g}, {bench}\n")
        print(f"| run | prompts | tau [95% CI] | vs {base_label} (paired, shared prompts) |")
        print("| --- | ---: | --- | --- |")
        base = cells[base_label].filter(pl.col("benchmark") == bench)
        for label, _ in runs:
            g = cells[label].filter(pl.col("benchmark") == bench)
            if g.is_empty():
                print(f"| {label} | 0 | - | - |")
                continue
            t, lo, hi = ratio_ci(g["new_tokens"].to_numpy(), g["verifier_calls"].to_numpy())
            diff = "-"
            if label != base_label:
                j = base.join(g, on="prompt_id", suffix="_b")
                if j.height >= 2:
                    d, dlo, dhi = paired_diff_ci(j["new_tokens_b"].to_numpy(),
                                                 j["verifier_calls_b"].to_numpy(),
                                                 j["new_tokens"].to_numpy(), j["verifier_calls"].to_numpy())
                    diff = f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] (n={j.height})"
            print(f"| {label} | {g.height} | {t:.3f} [{lo:.3f}, {hi:.3f}] | {diff} |")
    print()
    for label, d in runs:
        print(f"- {label}: {drafter_line(d, a.backbone, a.method)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
