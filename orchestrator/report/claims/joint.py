"""A joint bootstrap for claims that combine more than two cells: several (backbone, temperature,
method) cells on the same prompts of each benchmark, resampled together (one draw of prompt ids per
benchmark serves every cell), a statistic of their taus, and the verdicts of a statistic with a
direction (``tested``) or a range the study states (``in_range``)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl

from ..stats import B_TEST, _ci, data_rng, verdict

Key = tuple  # (backbone, temperature, method)


def aligned(pp: pl.DataFrame, keys: list[Key], bench: str) -> dict[Key, tuple[np.ndarray, np.ndarray]]:
    """{key: (new tokens, verifier calls)} per prompt of ``bench`` that every key's cell has, in
    prompt_id order; {} where a cell has no rows."""
    frames = []
    for i, (bb, t, m) in enumerate(keys):
        g = pp.filter((pl.col("backbone") == bb) & (pl.col("temperature") == t) & (pl.col("method") == m)
                      & (pl.col("benchmark") == bench))
        if g.is_empty():
            return {}
        frames.append(g.select("prompt_id", pl.col("new_tokens").alias(f"n{i}"),
                               pl.col("verifier_calls").alias(f"d{i}")))
    j = frames[0]
    for f in frames[1:]:
        j = j.join(f, on="prompt_id")
    j = j.sort("prompt_id")
    return {k: (j[f"n{i}"].to_numpy().astype(float), j[f"d{i}"].to_numpy().astype(float))
            for i, k in enumerate(keys)} if j.height else {}


Stat = Callable[[dict], np.ndarray]  # {key: tau, each (R,) or scalar} -> statistic (R,)


def draws(groups: list[dict], stat: Stat, weights: list[float], seed: int = 0,
          b: int = B_TEST) -> tuple[float, np.ndarray | None, int]:
    """(point, draws, fewest prompts) of the weighted mean over benchmarks of ``stat`` of the cells'
    taus; each benchmark's prompts resampled jointly for all its cells; draws None below 2 prompts."""
    keep = [(g, w) for g, w in zip(groups, weights) if g and all(d.sum() > 0 for _, d in g.values())]
    if not keep:
        return float("nan"), None, 0
    wsum = sum(w for _, w in keep)
    n = min(len(next(iter(g.values()))[0]) for g, _ in keep)
    point = sum(w * float(stat({k: nu.sum() / de.sum() for k, (nu, de) in g.items()})) for g, w in keep)
    point /= wsum
    if n < 2:
        return point, None, n
    rng = data_rng(seed, *(np.stack([x for nd in g.values() for x in nd]) for g, _ in keep))
    acc = np.zeros(b)
    for g, w in keep:
        m = len(next(iter(g.values()))[0])
        idx = rng.integers(0, m, size=(b, m))
        taus = {k: nu[idx].sum(1) / np.maximum(de[idx].sum(1), 1e-12) for k, (nu, de) in g.items()}
        acc += w * stat(taus)
    return point, acc / wsum, n


def tested(point: float, d: np.ndarray | None, expected_positive: bool = True) -> tuple[tuple, str]:
    """((estimate, lo, hi, p), verdict) of a statistic claimed above 0 (below 0: not expected_positive)."""
    if d is None or not np.isfinite(point):
        return (point, np.nan, np.nan, np.nan), "inconclusive"
    est, lo, hi, p = _ci(point, d, True)
    return (est, lo, hi, p), verdict(lo, hi, expected_positive)


def in_range(point: float, d: np.ndarray | None, low: float, high: float) -> tuple[tuple, str]:
    """((estimate, lo, hi, p), verdict) of a statistic the study puts in [low, high]: holds when the 95%
    interval lies inside it (p: the larger one-sided share of draws beyond a bound, doubled: two
    one-sided tests), does not hold when the interval misses it (p: the share of draws on the range's
    side of its nearer bound, doubled), else inconclusive (p of whichever is smaller)."""
    if d is None or not np.isfinite(point):
        return (point, np.nan, np.nan, np.nan), "inconclusive"
    lo, hi = np.percentile(d, [2.5, 97.5])
    floor = 1 / (len(d) + 1)
    p_in = max(floor, min(1.0, 2 * max((d <= low).mean(), (d >= high).mean())))
    p_out = max(floor, min(1.0, 2 * min((d >= low).mean(), (d <= high).mean())))
    v = "holds" if low <= lo and hi <= high else "does not hold" if hi < low or lo > high else "inconclusive"
    p = p_in if v == "holds" else p_out if v == "does not hold" else min(p_in, p_out)
    return (float(point), float(lo), float(hi), float(p)), v


__all__ = ["aligned", "draws", "in_range", "tested"]
