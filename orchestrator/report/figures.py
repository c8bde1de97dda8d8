"""Figures for people: one message each, titles, labelled axes with units, legends."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from orchestrator.report.labels import AFTER_THE_FACT
from orchestrator.report.routers import LOSSY_MARK, NOT_DEPLOYABLE, lossless
from orchestrator.report.tables import STUDY_W, bench_weight, lambda_of, weighted_mean


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11, "axes.titlesize": 13, "figure.dpi": 110})
    return plt


def fig_tau(t1: pl.DataFrame, backbone: str, temp: float, path: Path) -> Path | None:
    t = t1.filter(pl.col("backbone").is_in([backbone, "none"]) & (pl.col("temperature") == temp))
    if t.is_empty():
        return None
    plt = _plt()
    methods = (t.group_by("method").agg(weighted_mean("tau", bench_weight(t["benchmark"].to_list())))
               .sort(["tau", "method"], descending=[True, False])["method"].to_list())  # ties by name
    benches = sorted(t["benchmark"].unique().to_list())
    # ~0.25 inch per bar, capped at 18 inches (why: docs/report.md, "The code")
    fig, ax = plt.subplots(figsize=(min(18, max(8, 0.25 * len(methods) * len(benches) + 2)), 6))
    w = 0.8 / len(benches)
    for j, b in enumerate(benches):
        sub = {r["method"]: r for r in t.filter(pl.col("benchmark") == b).iter_rows(named=True)}
        xs = [i + j * w for i in range(len(methods))]
        ys = [sub[m]["tau"] if m in sub else float("nan") for m in methods]
        lo = [sub[m]["tau"] - sub[m]["tau_lo"] if m in sub and sub[m]["tau_lo"] == sub[m]["tau_lo"] else 0
              for m in methods]
        hi = [sub[m]["tau_hi"] - sub[m]["tau"] if m in sub and sub[m]["tau_hi"] == sub[m]["tau_hi"] else 0
              for m in methods]
        ax.bar(xs, ys, w, yerr=[lo, hi], capsize=2, label=b)
    names = [m if lossless(m, temp) else f"{m} {LOSSY_MARK}" for m in methods]
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(methods))], names, rotation=35, ha="right")
    ax.set_ylabel("acceptance length τ (tokens per verifier call)")
    lossy = f"; {LOSSY_MARK} not lossless at T>0 (picks between finished samples)" if names != methods else ""
    ax.set_title(f"{backbone}: acceptance length by drafter / composition (T={temp:g}, 95% CI{lossy})",
                 fontsize=10 if lossy else None)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.legend(title="benchmark")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def fig_lambda(t1: pl.DataFrame, backbone: str, temp: float, path: Path) -> Path | None:
    """Figure 6: τ against λ (the math drafter's weight in the average), one panel per benchmark, with
    95% CIs; both specialists and the mixed drafter as reference lines. None with < 2 averaged drafters."""
    t = t1.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
    t = t.with_columns(pl.col("method").map_elements(lambda_of, return_dtype=pl.Float64).alias("lam"))
    lam = t.filter(pl.col("lam").is_not_null()).sort("lam")
    if lam["method"].n_unique() < 2:
        return None
    plt = _plt()
    benches = sorted(t["benchmark"].unique().to_list())
    fig, axes = plt.subplots(1, len(benches), figsize=(4.2 * len(benches) + 1, 4.4), squeeze=False,
                             sharey=True)
    styles = {"math": "tab:blue", "chat": "tab:orange", "mixed_half": "tab:green", "mixed_full": "tab:olive"}
    for ax, b in zip(axes[0], benches):
        lb = lam.filter(pl.col("benchmark") == b)
        err = [(lb["tau"] - lb["tau_lo"]).fill_nan(0).to_list(),
               (lb["tau_hi"] - lb["tau"]).fill_nan(0).to_list()]
        ax.errorbar(lb["lam"].to_list(), lb["tau"].to_list(), yerr=err, fmt="o-", color="black", capsize=3,
                    label="averaged λ·math + (1-λ)·chat")
        ref = {r["method"]: r["tau"] for r in t.filter(pl.col("benchmark") == b).iter_rows(named=True)}
        for m, c in styles.items():
            if m in ref:
                ax.axhline(ref[m], color=c, ls="--", label=f"{m} ({ref[m]:.2f})")
        ax.set_title(b)
        ax.set_xlabel("λ (weight of the math drafter)")
        ax.set_xlim(-0.05, 1.05)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("acceptance length τ (tokens per verifier call)")
    fig.suptitle(f"{backbone}: weight averaging along λ vs the specialists and the mixed drafter "
                 f"(T={temp:g}, 95% CI)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def fig_entropy(ent: pl.DataFrame, backbone: str, temp: float, path: Path) -> Path | None:
    e = ent.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)).group_by("method").agg(
        pl.col("draft_accepted").mean(), pl.col("draft_rejected").mean()).sort("method").drop_nulls()
    if e.is_empty():
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7, 0.8 * e.height), 4.5))
    x = range(e.height)
    ax.bar([i - 0.2 for i in x], e["draft_accepted"], 0.4, label="accepted tokens")
    ax.bar([i + 0.2 for i in x], e["draft_rejected"], 0.4, label="first rejected token")
    ax.set_xticks(list(x), e["method"].to_list(), rotation=30, ha="right")
    ax.set_ylabel("draft entropy (nats)")
    ax.set_title(f"{backbone}: rejected draft tokens carry higher draft entropy (T={temp:g})")
    top = max(e["draft_accepted"].max(), e["draft_rejected"].max())
    ax.set_ylim(0, 1.3 * top)  # headroom: the legend sits above the bars
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


MIN_REACHED = 20  # a depth reached fewer times (pooled over benchmarks) is left off the depth figure


def depth_points(depth: pl.DataFrame, backbone: str, temp: float) -> tuple[pl.DataFrame, int]:
    """(method, depth, rate, reached) pooled over benchmarks, the points reached fewer than
    MIN_REACHED times left out (the table keeps them, with their counts), and how many those were."""
    d = depth.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)).group_by(["method",
            "depth"]).agg(
        ((pl.col("accept_rate") * pl.col("reached")).sum() / pl.col("reached").sum()).alias("rate"),
        pl.col("reached").sum()).sort(["method", "depth"])
    keep = pl.col("reached") >= MIN_REACHED
    return d.filter(keep), d.filter(~keep).height


def fig_depth(depth: pl.DataFrame, backbone: str, temp: float, path: Path) -> Path | None:
    """Acceptance rate given the depth was reached (depth_points)."""
    d, dropped = depth_points(depth, backbone, temp)
    if d.is_empty():
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, m in enumerate(d["method"].unique().sort().to_list()):  # past the 10 colours: dashed, square marks
        s = d.filter(pl.col("method") == m)
        ax.plot(s["depth"], 100 * s["rate"], "o-" if i < 10 else "s--", label=m)
    ax.set_xlabel("draft depth")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("acceptance rate given depth reached (%)")
    note = f"; {dropped} point(s) reached < {MIN_REACHED} times left out" if dropped else ""
    ax.set_title(f"{backbone}: acceptance rate by depth (T={temp:g}{note})", fontsize=10 if note else None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def speed_bars(s: pl.DataFrame, temp: float = 0.0) -> list[tuple[str, float, str, str]]:
    """(label, speedup, colour, hatch) per bar: green at or above the baseline, red below, and the
    post hoc router (and the hindsight oracle) hatched grey with a † (it decodes with both specialists
    to choose one afterwards, so its time is not a deployable method's), and a ‡ at T>0 (not lossless)."""
    out = []
    for b, m, v in zip(s["backbone"], s["method"], s["speedup"]):
        if m in AFTER_THE_FACT:
            out.append((f"{b}:{m} †" + ("" if lossless(m, temp) else f" {LOSSY_MARK}"), v, "lightgrey", "//"))
        else:
            out.append((f"{b}:{m}", v, "tab:green" if v >= 1 else "tab:red", ""))
    return out


def speed_means(sp: pl.DataFrame, temp: float, base: str) -> pl.DataFrame:
    """(backbone, method, speedup) at ``temp``, each method's mean over benchmarks weighted as every τ
    average (1 chat : 3 math), fastest first; methods never timed against ``base`` left out."""
    s = sp.filter((pl.col("temperature") == temp) & (pl.col("method") != base))
    w = bench_weight(s["benchmark"].to_list())
    return (s.group_by(["backbone", "method"]).agg(weighted_mean("speedup", w))
            .drop_nulls("speedup").filter(pl.col("speedup").is_not_nan())
            .sort(["speedup", "backbone", "method"], descending=[True, False, False]))


def fig_speed(sp: pl.DataFrame, temp: float, path: Path) -> Path | None:
    base = sp["baseline"][0] if "baseline" in sp.columns and sp.height else "autoregressive"
    s = speed_means(sp, temp, base)
    if s.is_empty():  # nothing timed against a baseline (e.g. a grid without the autoregressive cell)
        return None
    plt = _plt()
    bars = speed_bars(s, temp)
    fig, ax = plt.subplots(figsize=(max(7, 0.5 * s.height), 4.8))
    for i, (_, v, colour, hatch) in enumerate(bars):
        ax.bar(i, v, color=colour, hatch=hatch, edgecolor="dimgrey" if hatch else colour)
    line = ax.axhline(1.0, color="black", lw=1, label=f"{base} (same run, same machine)")
    handles = [line]
    if any(h for *_, h in bars):
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="lightgrey", hatch="//", edgecolor="dimgrey",
                             label=f"† post hoc router: {NOT_DEPLOYABLE}"
                             + (f"; {LOSSY_MARK} not lossless at T>0" if temp > 0 else "")))
    ax.set_xticks(range(s.height), [b[0] for b in bars], rotation=40, ha="right")
    ax.set_ylabel(f"speedup over {base.split(' ')[0]} (×)")  # short: the legend names the baseline in full
    ax.set_title(f"Measured speedup, mean over benchmarks {STUDY_W} (T={temp:g})")
    ax.set_ylim(0, 1.3 * max(1.0, max(v for _, v, *_ in bars)))  # headroom: the legend sits above the bars
    ax.legend(handles=handles, fontsize=9, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
