"""The two Holm families of the claims table.

``study``: the study's claims (registry.STUDY_CLAIMS), one family whose size the profile's grid
decides before any trace is read: for each claim, backbone and temperature of the grid, as many
hypotheses as the study's design gives that claim (its ``slots``: one per benchmark for a
per-benchmark claim, one per variant for "every variant", one per λ of the sweep, else one). A
hypothesis whose data is missing (a failed cell, a benchmark without rows, too few prompts) stays in
the family as untested (p = 1), so the family never shrinks with what a run produced.
``exploratory``: the study's proposed next experiments and the project's own router pairs, Holm over
their own tests."""
from __future__ import annotations

import numpy as np
import polars as pl

from ..stats import holm
from .claim import EXPLORATORY, STUDY
from .grid import Grid
from .registry import CLAIMS


def keys(grid: Grid) -> list[tuple[str, str, float]]:
    """(claim, backbone, temperature) of every study-family cell of this grid (each claim's ``keys``,
    as check.py lists the missing ones: the backbone comparison once per temperature, the reversal at
    T=0 and T=1)."""
    return [(c.name, bb, float(t)) for c in CLAIMS.values() if c.family == STUDY
            for bb, t in c.keys(list(grid.backbones), list(grid.temperatures)) if c.family_on(bb) == STUDY]


def family_size(grid: Grid, cl: pl.DataFrame | None = None) -> int:
    """Size of the study family: per cell the grid's slots, or the rows the run has there if more
    (e.g. more lambdas than the profile lists); rows outside the grid's cells count one each."""
    rows = {}
    if cl is not None and not cl.is_empty():
        study = cl.filter(pl.col("family") == STUDY)
        for k, g in study.group_by("claim", "backbone", "temperature"):
            rows[(k[0], k[1], float(k[2]))] = g.filter(~pl.col("verdict").str.contains("not in this run")).height
    grid_keys = keys(grid)
    size = sum(max(CLAIMS[c].slots(grid, bb), rows.get((c, bb, t), 0)) for c, bb, t in grid_keys)
    return size + sum(n for k, n in rows.items() if k not in set(grid_keys))


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
