"""Check each of the study's claims on this run: holds / does not hold / inconclusive (95% CI)."""
from __future__ import annotations

import polars as pl

from .stats import mean_diff_ci, paired_avg_diff_ci, paired_diff_ci, verdict
from .tables import MATH_BENCH, aligned

STUDY = {
    "RQ1-math": "MathInstruct drafter 5.02 vs ShareGPT 4.09 on GSM8K (HASS, T=0)",
    "RQ1-chat": "ShareGPT drafter 3.98 vs MathInstruct 2.90 on MT-Bench (HASS, T=0)",
    "RQ2": "Mixed 70k+70k average 5.18 vs specialists (HASS, T=0)",
    "RQ3a": "merged trees 5.11 > confidence routing 4.80 (HASS, T=0 average)",
    "RQ3b": "confidence routing 4.80 > best single checkpoint (average)",
    "RQ3c": "averaged checkpoint 2.59, the weakest everywhere",
    "RQ4": "confidence routing: 90.8% math on GSM8K vs entropy 54.6% (EAGLE-2)",
    "entropy": "rejected 1.076 vs accepted 0.528 draft entropy (EAGLE-2, MathInstruct, GSM8K)",
    "RQ5": "acceptance falls with depth (MathInstruct 97.9% at depth 1 to 81.5% at depth 5)",
}


MIN_PROMPTS = 10  # a bootstrap over fewer prompts per benchmark gives intervals too narrow to trust


def _row(claim, backbone, temp, what, est, lo, hi, v, n=None):
    if n is not None and n < MIN_PROMPTS and v != "inconclusive":
        v = f"inconclusive (n={n} < {MIN_PROMPTS} prompts)"
    return {"claim": claim, "backbone": backbone, "temperature": temp, "comparison": what, "prompts": n,
            "estimate": est, "ci_lo": lo, "ci_hi": hi, "verdict": v, "study": STUDY.get(claim.split(" ")[0], "")}


def check_claims(pp: pl.DataFrame, steps: pl.DataFrame | None, depth: pl.DataFrame | None) -> pl.DataFrame:
    rows = []
    benches = sorted(pp["benchmark"].unique().to_list())
    for backbone in sorted(set(pp["backbone"].unique().to_list()) - {"none"}):
        methods = set(pp.filter(pl.col("backbone") == backbone)["method"].unique().to_list())
        for temp in sorted(pp["temperature"].unique().to_list()):
            def avg(a, b):
                return paired_avg_diff_ci([aligned(pp, backbone, temp, bn, a, b) for bn in benches])

            def n_min(a, b):
                return min(len(aligned(pp, backbone, temp, bn, a, b)[0]) for bn in benches)

            if {"math", "chat"} <= methods:
                for bn in benches:
                    home_math = bn in MATH_BENCH
                    a, b = ("math", "chat") if home_math else ("chat", "math")
                    arrays = aligned(pp, backbone, temp, bn, a, b)
                    est, lo, hi = paired_diff_ci(*arrays)
                    rows.append(_row("RQ1-math" if home_math else "RQ1-chat", backbone, temp,
                                     f"{a} - {b} specialist on {bn} (tau)", est, lo, hi, verdict(lo, hi), len(arrays[0])))
                for mixed in ("mixed_half", "mixed_full"):
                    if mixed in methods:
                        for spec in ("math", "chat"):
                            est, lo, hi = avg(mixed, spec)
                            rows.append(_row("RQ2", backbone, temp, f"{mixed} - {spec}, average over benchmarks", est, lo, hi, verdict(lo, hi),
                                             n_min(mixed, spec)))
            routed = sorted(m for m in methods if m.startswith("confidence"))
            singles = [m for m in ("math", "chat", "mixed_half", "mixed_full") if m in methods]
            if "merged" in methods and routed:
                est, lo, hi = avg("merged", routed[0])
                rows.append(_row("RQ3a", backbone, temp, f"merged - {routed[0]}, average", est, lo, hi, verdict(lo, hi), n_min("merged", routed[0])))
            if routed and singles:
                best = max(singles, key=lambda m: avg(m, singles[0])[0] if m != singles[0] else 0.0)
                est, lo, hi = avg(routed[0], best)
                rows.append(_row("RQ3b", backbone, temp, f"{routed[0]} - best single ({best}), average", est, lo, hi, verdict(lo, hi),
                                 n_min(routed[0], best)))
            avgname = "avg0.5" if "avg0.5" in methods else None
            if avgname and singles:
                worst = min(singles, key=lambda m: avg(m, singles[0])[0] if m != singles[0] else 0.0)
                est, lo, hi = avg(avgname, worst)
                rows.append(_row("RQ3c", backbone, temp, f"averaged - worst specialist ({worst}), average", est, lo, hi,
                                 verdict(lo, hi, expected_positive=False), n_min(avgname, worst)))
            rows += _rq4(pp, backbone, temp)
            if steps is not None:
                rows += _entropy_claim(steps, backbone, temp)
            if depth is not None:
                rows += _depth_claim(depth, backbone, temp)
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _rq4(pp, backbone, temp):
    """Domain separation = share of math choices on math benchmarks + share of chat choices on
    MT-Bench, averaged; confidence minus entropy routing, paired over prompts."""
    out = []
    for gran in ("step", "prompt"):
        c, e = f"confidence({gran})", f"entropy({gran})"
        sub = pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp) & pl.col("method").is_in([c, e]))
        if sub["method"].n_unique() < 2:
            continue
        correct = sub.with_columns(
            pl.when(pl.col("benchmark").is_in(list(MATH_BENCH))).then(pl.col("routing_choice") == 0)
            .otherwise(pl.col("routing_choice") == 1).cast(pl.Float64).alias("ok"))
        w = correct.pivot(on="method", index=["benchmark", "prompt_id"], values="ok").drop_nulls()
        if w.is_empty():
            continue
        est, lo, hi = mean_diff_ci((w[c] - w[e]).to_numpy())
        n = int(w.group_by("benchmark").len()["len"].min())
        out.append(_row("RQ4", backbone, temp, f"{c} - {e}: share routed to the matched specialist", est, lo, hi, verdict(lo, hi), n))
    return out


def _entropy_claim(steps, backbone, temp):
    out = []
    s = steps.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp) & (pl.col("strategy") == "single"))
    if s.is_empty():
        return out
    per = (s.with_columns(pl.col("accepted_draft_entropy").list.mean().alias("acc"))
           .group_by(["method", "benchmark", "prompt_id"]).agg(pl.col("acc").mean(), pl.col("rejected_draft_entropy").mean().alias("rej")))
    diff = (per["rej"] - per["acc"]).to_numpy()
    est, lo, hi = mean_diff_ci(diff)
    n = int(per.group_by("method", "benchmark").len()["len"].min())
    out.append(_row("entropy", backbone, temp, "rejected - accepted draft entropy (nats), single drafters", est, lo, hi, verdict(lo, hi), n))
    return out


def _depth_claim(depth, backbone, temp):
    d = depth.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)).group_by("depth").agg(
        (pl.col("accept_rate") * pl.col("reached")).sum() / pl.col("reached").sum(), pl.col("reached").sum()).sort("depth")
    if d.height < 2:
        return []
    first, last = d.row(0, named=True), d.filter(pl.col("reached") >= 20).row(-1, named=True) if d.filter(pl.col("reached") >= 20).height else d.row(-1, named=True)
    import math

    est = first["accept_rate"] - last["accept_rate"]
    se = math.sqrt(first["accept_rate"] * (1 - first["accept_rate"]) / first["reached"] + last["accept_rate"] * (1 - last["accept_rate"]) / max(last["reached"], 1))
    lo, hi = est - 1.96 * se, est + 1.96 * se
    return [_row("RQ5", backbone, temp, f"accept rate depth 1 - depth {last['depth']} (normal approx.)", est, lo, hi,
                 verdict(lo, hi) if last["depth"] > 1 else "inconclusive")]
