"""Bootstrap statistics over prompts (vectorised with numpy; no Python loop over rows)."""
from __future__ import annotations

import numpy as np

B = 2000  # bootstrap resamples


def ratio_ci(num: np.ndarray, den: np.ndarray, seed: int = 0, b: int = B) -> tuple[float, float, float]:
    """Ratio of sums (e.g. tokens / verifier calls over prompts) with a 95% percentile CI."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    n = len(num)
    if n == 0 or den.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    point = num.sum() / den.sum()
    if n == 1:
        return point, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, n, size=(b, n))  # (b, n)
    r = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-12)
    lo, hi = np.percentile(r, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def paired_diff_ci(num_a, den_a, num_b, den_b, seed: int = 0, b: int = B) -> tuple[float, float, float]:
    """Difference of two ratios over the SAME prompts (paired resampling), with a 95% CI."""
    num_a, den_a, num_b, den_b = (np.asarray(x, float) for x in (num_a, den_a, num_b, den_b))
    n = len(num_a)
    if n == 0 or den_a.sum() == 0 or den_b.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    point = num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum()
    if n == 1:
        return point, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, n, size=(b, n))
    d = num_a[idx].sum(1) / np.maximum(den_a[idx].sum(1), 1e-12) - num_b[idx].sum(1) / np.maximum(den_b[idx].sum(1), 1e-12)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def verdict(lo: float, hi: float, expected_positive: bool = True) -> str:
    """holds / does not hold / inconclusive from a CI of (claimed-better minus other)."""
    if not np.isfinite(lo) or not np.isfinite(hi):
        return "inconclusive"
    if lo > 0:
        return "holds" if expected_positive else "does not hold"
    if hi < 0:
        return "does not hold" if expected_positive else "holds"
    return "inconclusive"


def paired_avg_diff_ci(groups: list[tuple], seed: int = 0, b: int = B) -> tuple[float, float, float]:
    """Mean over benchmarks of (ratio_a - ratio_b), each benchmark resampled over its own prompts.

    groups: [(num_a, den_a, num_b, den_b), ...] one per benchmark, arrays aligned by prompt."""
    groups = [tuple(np.asarray(x, float) for x in g) for g in groups if len(g[0]) and g[1].sum() and g[3].sum()]
    if not groups:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    point = np.mean([na.sum() / da.sum() - nb.sum() / db.sum() for na, da, nb, db in groups])
    if min(len(g[0]) for g in groups) < 2:
        return float(point), float("nan"), float("nan")
    acc = np.zeros(b)
    for na, da, nb, db in groups:
        idx = rng.integers(0, len(na), size=(b, len(na)))
        acc += na[idx].sum(1) / np.maximum(da[idx].sum(1), 1e-12) - nb[idx].sum(1) / np.maximum(db[idx].sum(1), 1e-12)
    acc /= len(groups)
    lo, hi = np.percentile(acc, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def mean_diff_ci(a: np.ndarray, seed: int = 0, b: int = B) -> tuple[float, float, float]:
    """Mean of per-prompt differences with a bootstrap 95% CI."""
    a = np.asarray(a, float)
    a = a[np.isfinite(a)]
    if len(a) == 0:
        return float("nan"), float("nan"), float("nan")
    if len(a) == 1:
        return float(a[0]), float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(a), size=(b, len(a)))
    m = a[idx].mean(1)
    lo, hi = np.percentile(m, [2.5, 97.5])
    return float(a.mean()), float(lo), float(hi)
