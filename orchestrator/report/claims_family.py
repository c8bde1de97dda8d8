"""The two Holm families of the claims table, and the profile's grid that fixes the first.

``study``: the study's claims (claims_study.STUDY_CLAIMS), one family whose size the profile's grid
decides before any trace is read: for each claim, backbone and temperature of the grid, as many
hypotheses as the study's design gives that claim (one per benchmark for a per-benchmark claim, one
per variant for "every variant", one per λ of the sweep, else one). A hypothesis whose data is
missing (a failed cell, a benchmark without rows, too few prompts) stays in the family as untested
(p = 1), so the family never shrinks with what a run produced. ``exploratory``: the study's
proposed next experiments and the project's own router pairs, Holm over their own tests."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from .claims_study import STUDY_CLAIMS
from .stats import holm
from .tables import MATH_BENCH

STUDY, EXPLORATORY = "study", "exploratory"
STUDY_BACKBONES = ("eagle2", "hass")  # the backbones the study's claims are about
VARIANTS = ("math", "chat", "mixed_half", "mixed_full", "avg0.5")  # RQ5: "every variant" (single checkpoints)
MIXED = ("mixed_half", "mixed_full")


@dataclass(frozen=True)
class Grid:
    """What a profile asks for: backbones, temperatures, benchmarks, the averaging sweep's lambdas."""
    backbones: tuple[str, ...]
    temperatures: tuple[float, ...]
    benchmarks: tuple[str, ...]
    lambdas: tuple[float, ...] = ()
    sweep_backbones: tuple[str, ...] | None = None  # where the lambda list runs (merge.sweep_backbones); None: all

    def __post_init__(self):
        for name in ("backbones", "temperatures", "benchmarks"):
            if not getattr(self, name):
                raise ValueError(f"claims grid: {name} is empty")
        if any(not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 for t in self.temperatures):
            raise ValueError(f"claims grid: temperatures must be finite numbers >= 0, got {self.temperatures}")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError(f"claims grid: benchmarks repeat: {self.benchmarks}")

    @classmethod
    def from_profile(cls, prof: dict, pp: pl.DataFrame) -> Grid:
        """The grid of profile.json's ``train.backbones``, ``eval.temperatures``, ``eval.benchmarks``
        and ``merge.lambdas`` (on ``merge.sweep_backbones``); a key the profile lacks falls back to what the
        traces hold."""
        ev, tr, mg = prof.get("eval", {}), prof.get("train", {}), prof.get("merge", {})
        benches = ev.get("benchmarks") or sorted(pp["benchmark"].unique().to_list())
        backbones = tr.get("backbones") or sorted(set(pp["backbone"].unique().to_list()) - {"none"}) or ["none"]
        temps = ev.get("temperatures") or sorted(pp["temperature"].unique().to_list())
        sweep = mg.get("sweep_backbones")
        return cls(tuple(backbones), tuple(float(t) for t in temps), tuple(benches),
                   tuple(float(x) for x in mg.get("lambdas", ())), None if sweep is None else tuple(sweep))


def slots(claim: str, grid: Grid, backbone: str | None = None) -> int:
    """Hypotheses one (claim, backbone, temperature) of the study family holds under this grid (Figure 6:
    one per averaged drafter strictly between the specialists, on the backbones the sweep runs on)."""
    n_math = sum(b in MATH_BENCH for b in grid.benchmarks)
    swept = grid.sweep_backbones is None or backbone is None or backbone in grid.sweep_backbones
    sweep = sum(0 < lam < 1 for lam in grid.lambdas) if swept else 0
    return {"RQ1-math": n_math, "RQ1-chat": len(grid.benchmarks) - n_math,
            "RQ2": len(MIXED) * len(grid.benchmarks), "RQ2-home": len(MIXED) * len(grid.benchmarks),
            "RQ3c-cells": len(grid.benchmarks), "Fig6": sweep if sweep >= 2 else 1, "RQ5": len(VARIANTS),
            "depth-shallow": len(MIXED), "depth-deep": len(MIXED)}.get(claim, 1)


def keys(grid: Grid) -> list[tuple[str, str, float]]:
    """(claim, backbone, temperature) of every study-family cell of this grid (as claims._missing
    lists them: the backbone comparison once per temperature, the reversal at T=0 and T=1)."""
    out = []
    for claim in STUDY_CLAIMS:
        bbs = ["hass+eagle2"] if claim == "backbones" else [b for b in grid.backbones if family_of(claim, b) == STUDY]
        ts = sorted(set(grid.temperatures) | {0.0, 1.0}) if claim == "RQ2-reversal" else list(grid.temperatures)
        out += [(claim, bb, float(t)) for bb in bbs for t in ts]
    return out


def family_size(grid: Grid, cl: pl.DataFrame | None = None) -> int:
    """Size of the study family: per cell the grid's slots, or the rows the run has there if more
    (e.g. more lambdas than the profile lists); rows outside the grid's cells count one each."""
    rows = {}
    if cl is not None and not cl.is_empty():
        study = cl.filter(pl.col("family") == STUDY)
        for k, g in study.group_by("claim", "backbone", "temperature"):
            rows[(k[0], k[1], float(k[2]))] = g.filter(~pl.col("verdict").str.contains("not in this run")).height
    grid_keys = keys(grid)
    size = sum(max(slots(c, grid, bb), rows.get((c, bb, t), 0)) for c, bb, t in grid_keys)
    return size + sum(n for k, n in rows.items() if k not in set(grid_keys))


def family_of(claim: str, backbone: str | None = None) -> str:
    """The study's claims on the study's backbones (EAGLE-2, HASS) are the study family; the same claims
    on another backbone (EAGLE-3) extend the study, and are exploratory like the project's own."""
    if claim not in STUDY_CLAIMS:
        return EXPLORATORY
    return STUDY if backbone is None or set(backbone.split("+")) <= set(STUDY_BACKBONES) | {"none"} else EXPLORATORY


def holm_by_family(p: np.ndarray, tested: np.ndarray, family: list[str],
                   study_size: int | None) -> tuple[np.ndarray, dict[str, int]]:
    """Holm-adjusted p per row and each family's size: the study family over ``study_size``
    hypotheses (untested ones count, p = 1; None: the family's rows), the exploratory family over
    its tests."""
    out, sizes = np.full(len(p), np.nan), {}
    for fam in (STUDY, EXPLORATORY):
        idx = np.flatnonzero([f == fam for f in family])
        if not len(idx):
            continue
        vals = np.where(tested[idx], p[idx], np.nan)
        n_tests = int(np.isfinite(vals).sum())
        m = max(study_size if study_size is not None else len(idx), n_tests) if fam == STUDY else n_tests
        out[idx], sizes[fam] = holm(vals, m=m), m
    return out, sizes
