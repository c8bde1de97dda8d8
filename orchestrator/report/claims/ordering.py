"""The methods keep the same ordering on both backbones (Table 1, average): Kendall tau_b between the
two backbones' orderings of the methods both ran (mean tau over benchmarks, weighted as the study's
average: weighting.py), with a bootstrap over prompts, the same resampled prompts for every cell of a
benchmark. The study's pair is HASS and EAGLE-2; a run without it compares EAGLE-3 with EAGLE-2 (or any
two backbones), exploratory."""
from __future__ import annotations

import numpy as np
import polars as pl

from ..labels import ORACLE
from ..stats import B_TEST, data_rng, kendall_tau_b
from . import study
from .claim import STUDY, Cell, Claim, Row
from .weighting import STUDY_W, weights

CHUNK = 1000  # bootstrap draws per block (memory: 2 x methods x CHUNK x prompts)


def same_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Whether the rows of x and y, both (R, M), order their M entries identically (ties included)."""
    i, j = np.triu_indices(x.shape[1], k=1)
    return (np.sign(x[:, i] - x[:, j]) == np.sign(y[:, i] - y[:, j])).all(1)


def _per_benchmark(sub: pl.DataFrame, pair: tuple, methods: list[str], weighting: str = STUDY_W):
    """Per benchmark: (2, M, n) arrays of tokens and of verifier calls on the prompts every cell has,
    and the benchmarks' weights in the average (weighting.py)."""
    nums, dens, names = [], [], []
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
        names.append(bn)
    return nums, dens, np.array(weights(names, weighting))


def _resampled(nums: list, dens: list, n_methods: int, rng: np.random.Generator,
               w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Kendall tau_b, same order) of B_TEST resamples of the prompts, in blocks of CHUNK; the
    benchmarks' taus averaged with weights ``w``."""
    taus, same = [], []
    for size in [CHUNK] * (B_TEST // CHUNK) + ([B_TEST % CHUNK] if B_TEST % CHUNK else []):
        boot = np.zeros((2, n_methods, size))
        for wi, nu, de in zip(w, nums, dens):
            idx = rng.integers(0, nu.shape[-1], size=(size, nu.shape[-1]))  # (size, n)
            boot += wi * nu[:, :, idx].sum(-1) / np.maximum(de[:, :, idx].sum(-1), 1e-12)  # (2, M, size)
        taus.append(kendall_tau_b(boot[0].T, boot[1].T))
        same.append(same_order(boot[0].T, boot[1].T))
    return np.concatenate(taus), np.concatenate(same)  # (B_TEST,)


def _ordering(claim: Claim, cell: Cell, seed: int = 0) -> list[Row]:
    backbones, temp = cell.backbones, cell.temp
    on_study = {"hass", "eagle2"} <= set(backbones)  # the study's pair; else EAGLE-3 against EAGLE-2 (or any two)
    pair = ("hass", "eagle2") if on_study else ("eagle3", "eagle2") if {"eagle3", "eagle2"} <= set(backbones) \
        else tuple(backbones[:2])
    if len(pair) < 2:
        return []
    sub = cell.prompts.filter((pl.col("temperature") == temp) & pl.col("backbone").is_in(list(pair))
                              & (pl.col("verifier_calls") > 0))
    per_bb = [set(sub.filter(pl.col("backbone") == bb)["method"].to_list()) for bb in pair]
    methods = sorted(m for m in per_bb[0] & per_bb[1] if "@" not in m and "[" not in m
                     and m not in ("autoregressive", ORACLE))
    if len(methods) < 3:
        return []
    nums, dens, w = _per_benchmark(sub, pair, methods, cell.weighting)
    if not nums:
        return []
    rng = data_rng(seed, *nums, *dens)  # prompts in prompt_id order: the draws depend on the data alone
    taus = np.array([nu.sum(-1) / de.sum(-1) for nu, de in zip(nums, dens)])  # (benchmarks, 2, M)
    point = np.einsum("b,bij->ij", w, taus)  # (2, M)
    n = min(nu.shape[-1] for nu in nums)
    draws, same = _resampled(nums, dens, len(methods), rng, w)
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
    ev = study.backbones(temp, methods) if on_study else study.none_for("+".join(pair), temp)
    return [claim.row("+".join(pair), temp, what, est, float(lo), float(hi), v, n, p, ev)]


CLAIMS = (
    Claim("backbones", "the methods keep the same ordering on both backbones (Table 1, average): the same order",
          "both backbones with >= 3 methods in common", STUDY, _ordering,
          study=lambda bb, t: study.backbones(t), keys=lambda backbones, temps: [("hass+eagle2", t) for t in temps],
          across_backbones=True),
)
