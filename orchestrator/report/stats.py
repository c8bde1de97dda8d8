"""Bootstrap statistics over prompts (vectorised with numpy; no Python loop over rows).

Every CI is a 95% percentile bootstrap; with ``p=True`` a function also returns the bootstrap
p-value of "the difference is 0": p = min(1, 2 * min(share of draws <= 0, share of draws >= 0)),
the smallest two-sided level at which the percentile interval excludes 0, floored at 1/(B+1)
(``holm`` adjusts them).

Every bootstrap is a function of its data alone: the rows (prompts, paired arrays kept together)
are put in a canonical order and the generator is seeded from a hash of those values (and the
``seed`` argument), so a report built twice from the same traces, in whatever row order a frame
came, has the same bytes."""
from __future__ import annotations

import hashlib

import numpy as np

B = 2000  # bootstrap resamples of an interval
# resamples of a test (p=True): p >= 1/(B_TEST+1) must stay below alpha/m for the study's Holm family of
# m ~ 200 hypotheses (claims/check.py), which 1/(B+1) = 5e-4 is not
B_TEST = 10_000


def _draws(b: int | None, p: bool) -> int:
    return b if b is not None else (B_TEST if p else B)
NAN3 = (float("nan"),) * 3


def canonical(*arrays) -> np.ndarray:
    """Aligned 1-D arrays (k of length n) as one (k, n) float array, the columns (prompts) sorted by
    their values: the same data in any row order gives the same array."""
    a = np.stack([np.asarray(x, float).reshape(-1) for x in arrays])  # (k, n)
    return a[:, np.lexsort(a[::-1])]


def data_rng(seed: int, *arrays) -> np.random.Generator:
    """A generator seeded by ``seed`` and the bytes of ``arrays`` (their shapes and values) alone."""
    h = hashlib.blake2b(str(int(seed)).encode(), digest_size=8)
    for x in arrays:
        x = np.ascontiguousarray(np.asarray(x, float))
        h.update(str(x.shape).encode() + x.tobytes())
    return np.random.default_rng(int.from_bytes(h.digest(), "little"))


def _canonical_groups(groups) -> list[np.ndarray]:
    """Each group canonical (see canonical), the groups in the order of their bytes."""
    out = [canonical(*g) for g in groups]
    return sorted(out, key=lambda a: (a.shape, a.tobytes()))


def boot_p(draws: np.ndarray) -> float:
    """Two-sided percentile-bootstrap p-value of 0 (see the module docstring), never below
    1/(B+1) for B finite draws: a bootstrap cannot tell a p smaller than that (never printed as 0)."""
    d = np.asarray(draws, float)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return float("nan")
    return float(max(1.0 / (len(d) + 1), min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean()))))


def _out(point, lo, hi, draws, p: bool):
    res = (float(point), float(lo), float(hi))
    if not p:
        return res
    return res + (boot_p(draws) if draws is not None else float("nan"),)


def _ci(point, draws, p: bool):
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return _out(point, lo, hi, draws, p)


def ratio_ci(num: np.ndarray, den: np.ndarray, seed: int = 0, b: int = B) -> tuple[float, float, float]:
    """Ratio of sums (e.g. tokens / verifier calls over prompts) with a 95% percentile CI."""
    num, den = canonical(num, den)
    n = len(num)
    if n == 0 or den.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    point = num.sum() / den.sum()
    if n == 1:
        return point, float("nan"), float("nan")
    idx = data_rng(seed, num, den).integers(0, n, size=(b, n))  # (b, n)
    r = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-12)
    lo, hi = np.percentile(r, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def paired_diff_ci(num_a, den_a, num_b, den_b, seed: int = 0, b: int | None = None, p: bool = False):
    """Difference of two ratios over the SAME prompts (paired resampling), with a 95% CI."""
    b = _draws(b, p)
    num_a, den_a, num_b, den_b = data = canonical(num_a, den_a, num_b, den_b)
    n = len(num_a)
    if n == 0 or den_a.sum() == 0 or den_b.sum() == 0:
        return _out(*NAN3, None, p)
    point = num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum()
    if n == 1:
        return _out(point, np.nan, np.nan, None, p)
    idx = data_rng(seed, data).integers(0, n, size=(b, n))
    d = num_a[idx].sum(1) / np.maximum(den_a[idx].sum(1),
                                       1e-12) - num_b[idx].sum(1) / np.maximum(den_b[idx].sum(1), 1e-12)
    return _ci(point, d, p)


def verdict(lo: float, hi: float, expected_positive: bool = True) -> str:
    """holds / does not hold / inconclusive from a CI of (claimed-better minus other)."""
    if not np.isfinite(lo) or not np.isfinite(hi):
        return "inconclusive"
    if lo > 0:
        return "holds" if expected_positive else "does not hold"
    if hi < 0:
        return "does not hold" if expected_positive else "holds"
    return "inconclusive"


def avg_diff_draws(groups: list[tuple], seed: int = 0, b: int = B, weights=None):
    """(point, draws) of the weighted mean over benchmarks of (ratio_a - ratio_b), each benchmark
    resampled over its own prompts; draws None below 2 prompts on a benchmark, point NaN without data.
    groups: [(num_a, den_a, num_b, den_b), ...] one per benchmark, arrays aligned by prompt; weights:
    one per group (normalised here; None or all equal: the plain mean, drawn exactly as before)."""
    groups = [tuple(np.asarray(x, float) for x in g) for g in groups]
    w = None if weights is None else [float(x) for x in weights]
    if w is not None and len(w) != len(groups):
        raise ValueError(f"avg_diff_draws: {len(w)} weights for {len(groups)} benchmarks")
    keep = [i for i, g in enumerate(groups) if len(g[0]) and g[1].sum() and g[3].sum()]
    if w is not None and len({w[i] for i in keep}) > 1:  # the weight travels with its group as a constant row
        groups = [groups[i] + (np.full(len(groups[i][0]), w[i]),) for i in keep]
    else:
        groups = [groups[i] for i in keep]
    groups = [tuple(g) for g in _canonical_groups(groups)]
    if not groups:
        return float("nan"), None
    rng = data_rng(seed, *(np.stack(g) for g in groups))
    wt = np.array([g[4][0] if len(g) == 5 else 1.0 for g in groups])
    diffs = np.array([g[0].sum() / g[1].sum() - g[2].sum() / g[3].sum() for g in groups])
    point = float(np.mean(diffs) if (wt == 1).all() else (wt * diffs).sum() / wt.sum())
    if min(len(g[0]) for g in groups) < 2:
        return point, None
    acc = np.zeros(b)
    for wi, (na, da, nb, db, *_) in zip(wt, groups):
        idx = rng.integers(0, len(na), size=(b, len(na)))
        acc += wi * (na[idx].sum(1) / np.maximum(da[idx].sum(1), 1e-12)
                     - nb[idx].sum(1) / np.maximum(db[idx].sum(1), 1e-12))
    return point, acc / wt.sum()


def paired_avg_diff_ci(groups: list[tuple], seed: int = 0, b: int | None = None, p: bool = False,
                       weights=None):
    """Mean over benchmarks of (ratio_a - ratio_b), each benchmark resampled over its own prompts,
    weighted by ``weights`` (one per benchmark; None: equal) with a 95% CI (avg_diff_draws).

    groups: [(num_a, den_a, num_b, den_b), ...] one per benchmark, arrays aligned by prompt."""
    point, draws = avg_diff_draws(groups, seed, _draws(b, p), weights)
    if not np.isfinite(point):
        return _out(*NAN3, None, p)
    if draws is None:
        return _out(point, np.nan, np.nan, None, p)
    return _ci(point, draws, p)


def mean_diff_ci(a: np.ndarray, seed: int = 0, b: int | None = None, p: bool = False):
    """Mean of per-prompt differences with a bootstrap 95% CI (non-finite values dropped)."""
    b = _draws(b, p)
    a = np.asarray(a, float).reshape(-1)
    a = np.sort(a[np.isfinite(a)])
    if len(a) == 0:
        return _out(*NAN3, None, p)
    if len(a) == 1:
        return _out(a[0], np.nan, np.nan, None, p)
    idx = data_rng(seed, a).integers(0, len(a), size=(b, len(a)))
    return _ci(a.mean(), a[idx].mean(1), p)


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between the rows of x and y, both (R, M): one coefficient per row (R,)."""
    x, y = np.atleast_2d(np.asarray(x, float)), np.atleast_2d(np.asarray(y, float))
    i, j = np.triu_indices(x.shape[1], k=1)
    sx, sy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])  # (R, pairs)
    den = np.sqrt((sx != 0).sum(1) * (sy != 0).sum(1))
    return np.where(den > 0, (sx * sy).sum(1) / np.maximum(den, 1), np.nan)


def holm(pvals, m: int | None = None) -> np.ndarray:
    """Holm-Bonferroni step-down adjusted p-values; NaN entries are not tests (left NaN). ``m``: the
    family's size when it holds untested hypotheses too (each counts as p = 1); default the tests."""
    p = np.asarray(pvals, float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok) if m is None else m
    if m < len(ok):
        raise ValueError(f"holm: a family of {m} cannot hold {len(ok)} tests")
    if len(ok) == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(len(ok))) * p[order]))
    out[order] = adj
    return out


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis of x and y, both (..., n); NaN where either has no variance."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    return np.where(den > 0, (xc * yc).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def corr_ci(groups: list[tuple], seed: int = 0, b: int | None = None, p: bool = False):
    """Mean over groups (benchmarks) of the within-group Pearson r of (x, y), each group's prompts
    resampled jointly (the prompt is the unit); a draw where a group has no variance is left out."""
    b = _draws(b, p)
    groups = [tuple(g) for g in _canonical_groups((x, y) for x, y in groups if len(x) >= 3)]
    if not groups:
        return _out(*NAN3, None, p)
    point = np.nanmean([_pearson(x, y) for x, y in groups]) if any(np.isfinite(_pearson(x, y))
                                                                   for x, y in groups) else np.nan
    if not np.isfinite(point):
        return _out(*NAN3, None, p)
    rng = data_rng(seed, *(np.stack(g) for g in groups))
    draws = np.zeros((len(groups), b))
    for i, (x, y) in enumerate(groups):
        idx = rng.integers(0, len(x), size=(b, len(x)))  # (b, n)
        draws[i] = _pearson(x[idx], y[idx])
    ok = np.isfinite(draws).all(0)
    if ok.sum() < b // 2:
        return _out(point, np.nan, np.nan, None, p)
    return _ci(point, draws[:, ok].mean(0), p)
