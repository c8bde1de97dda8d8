"""Claims on acceptance by depth (Tables 5-8) and on the ordering of methods across backbones.

Each check takes one value per prompt (a prompt is a (benchmark, prompt_id) pair) and bootstraps
prompts; steps within a prompt are not independent. ``row`` is claims._row (passed in to keep
this module free of an import cycle)."""
from __future__ import annotations

import numpy as np
import polars as pl

from . import claims_study as cs
from .stats import B_TEST, data_rng, kendall_tau_b, mean_diff_ci, verdict
from .steps import as_summary
from .tables import MATH_BENCH

STUDY_DEPTH = 5  # the study's tables stop at depth 5
SHALLOW = (1, 2)  # "competitive at depths 1-2"
DEEP = (4, 5)  # "the matched specialist dominates at depths 4-5"
CHUNK = 1000  # bootstrap draws per block in ordering_claim (memory: 2 x methods x CHUNK x prompts)


def _rates(steps, backbone: str, temp: float) -> pl.DataFrame:
    """Acceptance rate at each depth per (method, benchmark, prompt): accepted at d / reached d
    (``steps``: a step frame or its StepSummary, steps.rates)."""
    r = as_summary(steps).rates
    if r is None:
        return pl.DataFrame()
    r = r.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
    return r.drop("backbone", "temperature")


def _per_prompt(frames: list[pl.DataFrame]):
    """(values, n): per-prompt values pooled over benchmarks, n = fewest prompts of any benchmark."""
    per = pl.concat(frames).sort("benchmark", "prompt_id") if frames else pl.DataFrame()
    if per.is_empty():
        return np.array([]), 0
    return per["diff"].to_numpy(), int(per.group_by("benchmark").len()["len"].min())


def _test(row, claim, bb, temp, what, values, n, ev):
    est, lo, hi, p = mean_diff_ci(values, p=True)
    return row(claim, bb, temp, what, est, lo, hi, verdict(lo, hi), n, p, ev)


def _rq5(r, backbone, temp, row, min_reached) -> list[dict]:
    """RQ5 for every variant: per prompt, its acceptance rate at depth 1 minus at the deepest depth
    (<= 5) that variant reached >= min_reached times."""
    out = []
    for method in sorted(r["method"].unique().to_list()):
        rm = r.filter(pl.col("method") == method)
        reached = rm.group_by("depth").agg(pl.col("reached").sum()).filter(
            (pl.col("reached") >= min_reached) & (pl.col("depth") <= STUDY_DEPTH))
        if reached.height < 2 or 1 not in reached["depth"].to_list():
            continue
        deep = int(reached["depth"].max())
        per = (rm.filter(pl.col("depth").is_in([1, deep]))
               .pivot(on="depth", index=["benchmark", "prompt_id"], values="rate").drop_nulls()
               .select("benchmark", "prompt_id", (pl.col("1") - pl.col(str(deep))).alias("diff")))
        vals, n = _per_prompt([per])
        if n:
            what = f"{method}: accept rate depth 1 - depth {deep}, per prompt"
            out.append(_test(row, "RQ5", backbone, temp, what, vals, n, cs.depth("RQ5", backbone, temp, method)))
    return out


def _at(r: pl.DataFrame, method: str, bench: str, d: int, name: str) -> pl.DataFrame:
    return (r.filter((pl.col("method") == method) & (pl.col("benchmark") == bench) & (pl.col("depth") == d))
            .select("prompt_id", pl.col("rate").alias(name)))


def depth_claims(steps, backbone, temp, row, min_reached: int = 20) -> list[dict]:
    r = _rates(steps, backbone, temp)
    if r.is_empty():
        return []
    out = _rq5(r, backbone, temp, row, min_reached)
    methods = set(r["method"].unique().to_list())
    benches = sorted(r["benchmark"].unique().to_list())
    if {"math", "chat"} <= methods:
        out += _slope(r, backbone, temp, benches, row, min_reached)
    for mixed in ("mixed_half", "mixed_full"):
        if mixed in methods and ({"math", "chat"} & methods):
            out += _shallow(r, backbone, temp, benches, mixed, row)
            out += _deep(r, backbone, temp, benches, mixed, row)
    return out


def _slope(r, backbone, temp, benches, row, min_reached) -> list[dict]:
    """Per prompt: (fall of the mismatched specialist) - (fall of the matched one) from depth 1 to
    the deepest depth (<= 5) both reach >= min_reached times on that benchmark; > 0 = matched
    declines more slowly."""
    frames, depths = [], []
    for bn in benches:
        match, mis = ("math", "chat") if bn in MATH_BENCH else ("chat", "math")
        tot = (r.filter((pl.col("benchmark") == bn) & pl.col("method").is_in([match, mis]))
               .group_by("method", "depth").agg(pl.col("reached").sum())
               .filter((pl.col("reached") >= min_reached) & (pl.col("depth") <= STUDY_DEPTH))
               .group_by("depth").len().filter(pl.col("len") == 2))
        if tot.height < 2 or int(tot["depth"].max()) < 2:
            continue
        k = int(tot["depth"].max())
        j = (_at(r, match, bn, 1, "m1").join(_at(r, match, bn, k, "mk"), on="prompt_id")
             .join(_at(r, mis, bn, 1, "x1"), on="prompt_id").join(_at(r, mis, bn, k, "xk"), on="prompt_id"))
        frames.append(j.select(pl.lit(bn).alias("benchmark"), "prompt_id",
                               ((pl.col("x1") - pl.col("xk")) - (pl.col("m1") - pl.col("mk"))).alias("diff"))
                      .drop_nulls("diff"))
        depths.append(f"{bn}:{k}")
    vals, n = _per_prompt(frames)
    if not n:
        return []
    what = f"fall from depth 1, mismatched - matched specialist (deepest depth {', '.join(depths)})"
    return [_test(row, "depth-slope", backbone, temp, what, vals, n, cs.depth("depth-slope", backbone, temp))]


def _shallow(r, backbone, temp, benches, mixed, row) -> list[dict]:
    """Per prompt: mixed minus matched specialist's acceptance rate, mean over depths 1-2."""
    frames = []
    for bn in benches:
        match = "math" if bn in MATH_BENCH else "chat"
        a = r.filter((pl.col("method") == mixed) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(SHALLOW))
        b = r.filter((pl.col("method") == match) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(SHALLOW))
        j = a.join(b, on=["prompt_id", "depth"], suffix="_m")
        if j.is_empty():
            continue
        frames.append(j.group_by("prompt_id").agg((pl.col("rate") - pl.col("rate_m")).mean().alias("diff"))
                      .select(pl.lit(bn).alias("benchmark"), "prompt_id", "diff").drop_nulls("diff"))
    vals, n = _per_prompt(frames)
    if not n:
        return []
    what = f"{mixed} - matched specialist, accept rate at depths 1-2, per prompt"
    return [_test(row, "depth-shallow", backbone, temp, what, vals, n, cs.depth("depth-shallow", backbone, temp))]


def _deep(r, backbone, temp, benches, mixed, row) -> list[dict]:
    """Per prompt: matched specialist minus mixed acceptance rate, mean over the depths 4-5 both reached."""
    frames = []
    for bn in benches:
        match = "math" if bn in MATH_BENCH else "chat"
        a = r.filter((pl.col("method") == match) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(DEEP))
        b = r.filter((pl.col("method") == mixed) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(DEEP))
        j = a.join(b, on=["prompt_id", "depth"], suffix="_x")
        if j.is_empty():
            continue
        frames.append(j.group_by("prompt_id").agg((pl.col("rate") - pl.col("rate_x")).mean().alias("diff"))
                      .select(pl.lit(bn).alias("benchmark"), "prompt_id", "diff").drop_nulls("diff"))
    vals, n = _per_prompt(frames)
    if not n:
        return []
    what = f"matched specialist - {mixed}, accept rate at depths 4-5, per prompt"
    return [_test(row, "depth-deep", backbone, temp, what, vals, n, cs.depth("depth-deep", backbone, temp))]


def ordering_claim(pp: pl.DataFrame, temp: float, backbones: list[str], row, seed: int = 0) -> list[dict]:
    """Kendall tau_b between the two backbones' orderings of the methods both ran (mean tau over
    benchmarks); bootstrap over prompts, the same resampled prompts for every cell of a benchmark."""
    study = {"hass", "eagle2"} <= set(backbones)  # the study's pair; else EAGLE-3 against EAGLE-2 (or any two)
    pair = ("hass", "eagle2") if study else ("eagle3", "eagle2") if {"eagle3", "eagle2"} <= set(backbones) \
        else tuple(backbones[:2])
    if len(pair) < 2:
        return []
    sub = pp.filter((pl.col("temperature") == temp) & pl.col("backbone").is_in(list(pair))
                    & (pl.col("verifier_calls") > 0))
    per_bb = [set(sub.filter(pl.col("backbone") == bb)["method"].to_list()) for bb in pair]
    methods = sorted(m for m in per_bb[0] & per_bb[1] if "@" not in m and "[" not in m and m != "autoregressive")
    if len(methods) < 3:
        return []
    nums, dens = [], []  # per benchmark: (2, M, n) arrays on the prompts every cell has
    for bn in sorted(sub["benchmark"].unique().to_list()):
        cells = [sub.filter((pl.col("backbone") == bb) & (pl.col("method") == m) & (pl.col("benchmark") == bn))
                 for bb in pair for m in methods]
        ids = set.intersection(*(set(c["prompt_id"].to_list()) for c in cells))
        if not ids:
            continue
        ids = sorted(ids)
        cells = [c.filter(pl.col("prompt_id").is_in(ids)).sort("prompt_id") for c in cells]
        nums.append(np.array([c["new_tokens"].to_numpy() for c in cells], float).reshape(2, len(methods), -1))
        dens.append(np.array([c["verifier_calls"].to_numpy() for c in cells], float).reshape(2, len(methods), -1))
    if not nums:
        return []
    rng = data_rng(seed, *nums, *dens)  # prompts in prompt_id order: the draws depend on the data alone
    point = np.mean([nu.sum(-1) / de.sum(-1) for nu, de in zip(nums, dens)], axis=0)  # (2, M)
    n = min(nu.shape[-1] for nu in nums)
    taus, same = [], []
    for size in [CHUNK] * (B_TEST // CHUNK) + ([B_TEST % CHUNK] if B_TEST % CHUNK else []):
        boot = np.zeros((2, len(methods), size))
        for nu, de in zip(nums, dens):
            idx = rng.integers(0, nu.shape[-1], size=(size, nu.shape[-1]))  # (size, n)
            boot += nu[:, :, idx].sum(-1) / np.maximum(de[:, :, idx].sum(-1), 1e-12)  # (2, M, size)
        boot /= len(nums)
        taus.append(kendall_tau_b(boot[0].T, boot[1].T))
        same.append(same_order(boot[0].T, boot[1].T))
    draws, same = np.concatenate(taus), np.concatenate(same)  # (B_TEST,)
    est = float(kendall_tau_b(point[0][None], point[1][None])[0])
    point_same = bool(same_order(point[0][None], point[1][None])[0])
    share = float(same.mean())
    lo, hi = (np.percentile(draws[np.isfinite(draws)], [2.5, 97.5]) if n > 1 and np.isfinite(draws).any()
              else (np.nan, np.nan))
    p = max(1 / (len(same) + 1), min(1.0, 2 * min(share, 1 - share))) if n > 1 else float("nan")
    v = ("inconclusive" if n < 2 else "holds" if point_same and share >= 0.975
         else "does not hold" if not point_same and share <= 0.025 else "inconclusive")
    what = (f"the same order of {len(methods)} methods' mean tau, {pair[0]} vs {pair[1]}: "
            f"{'the same' if point_same else 'a different'} order here, in {share:.1%} of resamples; "
            "estimate = Kendall tau_b (1 = same order)")
    # the study's numbers (hass, eagle2) over the same methods as the run's side
    ev = cs.backbones(temp, methods) if study else cs.none_for("backbones", "+".join(pair), temp)
    return [row("backbones", "+".join(pair), temp, what, est, float(lo), float(hi), v, n, p, ev)]


def same_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Whether the rows of x and y, both (R, M), order their M entries identically (ties included)."""
    i, j = np.triu_indices(x.shape[1], k=1)
    return (np.sign(x[:, i] - x[:, j]) == np.sign(y[:, i] - y[:, j])).all(1)
