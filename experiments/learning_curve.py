"""Held-out agreement against training tokens, across runs: what budget a target needs.

``python experiments/learning_curve.py --runs runs/demo runs/cpu-study --out runs/learning_curve``
reads every trained drafter's per-epoch history (``checkpoints/<backbone>-<variant>/final/state.json``:
loss tokens = tokens/s x seconds per epoch, held-out top-1 agreement at depth 1 after the epoch),
plots agreement against cumulative loss tokens (log x) per backbone and variant, fits
agreement = a + b log10(tokens) to each backbone's math drafters, and prints the tokens the fit
needs for ``--target`` (an extrapolation: it says the order of magnitude, not a promise).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def points(run: Path) -> list[dict]:
    out = []
    for state in sorted(run.glob("checkpoints/*/final/state.json")):
        s = json.loads(state.read_text())
        cfg, tokens = s.get("config", {}), 0.0
        for h in s.get("history", []):
            if not h.get("steps"):
                continue
            tokens += h.get("train_tokens_per_s", 0.0) * h.get("epoch_seconds", 0.0)
            out.append({"run": run.name, "drafter": state.parent.parent.name, "backbone": cfg.get("backbone"),
                        "variant": cfg.get("variant"), "epoch": h["epoch"], "tokens": tokens,
                        "top1": h.get("top1_depth1", float("nan"))})
    return out


def fit(pts: list[dict]) -> tuple[float, float] | None:
    xs = [math.log10(p["tokens"]) for p in pts if p["tokens"] > 0 and p["top1"] == p["top1"]]
    ys = [p["top1"] for p in pts if p["tokens"] > 0 and p["top1"] == p["top1"]]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main(argv=None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--out", default="runs/learning_curve")
    ap.add_argument("--target", type=float, default=0.4)
    args = ap.parse_args(argv)
    pts = [p for r in args.runs for p in points(Path(r))]
    if not pts:
        print("error: no checkpoints/*/final/state.json under the given runs", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = sorted({(p["run"], p["drafter"]) for p in pts})
    for run, drafter in series:
        s = [p for p in pts if (p["run"], p["drafter"]) == (run, drafter)]
        ax.plot([p["tokens"] for p in s], [p["top1"] for p in s], marker="o",
                ls="-" if "math" in drafter else "--", label=f"{run}: {drafter}")
    lines = ["| backbone | math-drafter points | fit: top-1 = a + b log10(tokens) | tokens for "
             f"{args.target} |", "|---|---|---|---|"]
    for bb in sorted({p["backbone"] for p in pts}):
        m = [p for p in pts if p["backbone"] == bb and p["variant"] == "math"]
        f = fit(m)
        if f is None:
            continue
        a, b = f
        need = 10 ** ((args.target - a) / b) if b > 0 else float("inf")
        xs = sorted(p["tokens"] for p in m)
        ax.plot([xs[0], max(xs[-1], min(need, xs[-1] * 1e3))], [a + b * math.log10(xs[0]),
                a + b * math.log10(max(xs[-1], min(need, xs[-1] * 1e3)))], ":", color="gray")
        lines.append(f"| {bb} | {len(m)} | {a:.3f} + {b:.3f} log10(t) | {need:.2e} |")
    ax.axhline(args.target, color="red", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative loss tokens seen")
    ax.set_ylabel("held-out top-1 agreement, depth 1")
    ax.set_title("Drafter agreement vs training tokens (dotted: log-linear fit, math drafters)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=120)
    table = ["| run | drafter | epoch | loss tokens | top-1 depth 1 |", "|---|---|---|---|---|"]
    table += [f"| {p['run']} | {p['drafter']} | {p['epoch']} | {p['tokens']:.0f} | {p['top1']:.3f} |"
              for p in pts]
    text = "\n".join(["# Learning curve", "", *lines, "", *table, ""])
    (out / "learning_curve.md").write_text(text)
    print(text)
    print(f"wrote {out / 'learning_curve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
