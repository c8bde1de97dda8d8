"""Check every claim on a run: holds / does not hold / inconclusive (95% CI), then the family-wise view.

Every interval is a bootstrap whose unit is the prompt (paired: methods compared on the same
prompts); a verdict needs at least MIN_PROMPTS prompts (the project's rule, not the study's) on every
benchmark it uses, and a benchmark the profile asks for without rows has 0. Every row carries the
claim as it is worded, the study's own numbers for the row's cell and whether they agree with that
wording (study.py), a bootstrap p-value (never below 1/(B+1)), its Holm family (``study``: the
study's claims, a family fixed by the profile's grid; ``exploratory``: the rest, see family.py) and
``verdict_holm``: the verdict after Holm-Bonferroni within its family (family-wise 5%). A claim the
run has no cells for gets one inconclusive row per backbone and temperature saying what it needs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from ..steps import as_summary
from .claim import MIN_PROMPTS, NAN, Cell, Row, frame
from .family import family_size, holm_by_family
from .grid import Grid
from .proposed import BASE, EARLY_STEPS
from .registry import CLAIMS, family_of
from .weighting import STUDY_W

ALPHA = 0.05


def add_holm(cl: pl.DataFrame, alpha: float = ALPHA, study_size: int | None = None) -> pl.DataFrame:
    """``p_holm`` and ``verdict_holm``: Holm-Bonferroni within each family (family.py): the study
    family over ``study_size`` hypotheses (family.family_size; untested ones count as p = 1;
    None: the family's rows), the exploratory family over its tests. A test is a row with a bootstrap
    p-value that passed the prompt rule. A raw conclusive verdict stays when p_holm <= alpha, else it
    reads inconclusive; Holm never makes an inconclusive verdict conclusive."""
    if cl.is_empty():
        return cl
    if "family" not in cl.columns:
        bbs = cl["backbone"] if "backbone" in cl.columns else [None] * cl.height
        fams = [family_of(c, b) for c, b in zip(cl["claim"], bbs)]
        cl = cl.with_columns(pl.Series("family", fams, dtype=pl.String))
    tested = np.array([np.isfinite(p) and (n is None or n >= MIN_PROMPTS)
                       for p, n in zip(cl["p_value"], cl["prompts"])], bool)
    p_holm, sizes = holm_by_family(cl["p_value"].to_numpy().astype(float), tested, cl["family"].to_list(),
                                   study_size)
    conclusive = ("holds", "does not hold")
    vh = [v if v not in conclusive or (np.isfinite(ph) and ph <= alpha) else "inconclusive (Holm)"
          for v, ph in zip(cl["verdict"], p_holm)]
    return cl.with_columns(pl.Series("p_holm", p_holm), pl.Series("verdict_holm", vh),
                           pl.col("family").replace_strict(sizes, default=0, return_dtype=pl.Int64)
                           .alias("family_size"))


def _no_rows(rows: list[Row], missing: list[str]) -> list[Row]:
    """The prompt rule for benchmarks the profile asks for without rows: a row on such a benchmark,
    or spanning benchmarks, had 0 prompts there (its test does not count)."""
    if not missing:
        return rows
    out = []
    for r in rows:
        gone = [r.benchmark] if r.benchmark in missing else ([] if r.benchmark else missing)
        if gone and "not in this run" not in r.verdict:
            r = replace(r, prompts=0, p_value=NAN,
                        verdict=f"inconclusive (n=0 < {MIN_PROMPTS} prompts: no rows on {', '.join(gone)})")
        out.append(r)
    return out


def _missing(rows: list[Row], backbones: list[str], temps: list[float]) -> list[Row]:
    """One inconclusive row for each claim, backbone and temperature the run has no cells for."""
    if not backbones:
        return []
    have = {(r.claim, r.backbone, r.temperature) for r in rows}
    return [claim.not_run(bb, t) for claim in CLAIMS.values() for bb, t in claim.keys(backbones, temps)
            if (claim.name, bb, t) not in have]


def _cells(pp: pl.DataFrame, steps, backbones: list[str], temps: list[float], benches: list[str],
           route_pair: tuple, weighting: str) -> tuple[list[Cell], list[Cell]]:
    """(one Cell per backbone and temperature the run has, one per temperature across backbones)."""
    def methods(backbone, temp):
        return set(pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))["method"])

    per_cell = [Cell(pp, steps, bb, t, benches, methods(bb, t), backbones, route_pair, weighting)
                for bb in backbones for t in temps]
    across = [Cell(pp, steps, None, t, benches, set(), backbones, route_pair, weighting) for t in temps]
    return per_cell, across


def check_claims(pp: pl.DataFrame, steps, depth: pl.DataFrame | None,
                 route_pair: tuple = ("math", "chat"), grid: Grid | None = None,
                 weighting: str = STUDY_W) -> pl.DataFrame:
    """Each claim compares what the study compared: RQ3a/RQ3b use ``ROUTED``, RQ4 maps routing
    choices to drafters by the profile's ``route_pair``, the entropy claim uses the math drafter on
    GSM8K where present; then rows for claims without cells and the family-wise view (add_holm).
    ``grid``: what the profile asks for (Grid.from_profile; default: what the traces hold); it fixes
    the study family and names the benchmarks the prompt rule counts. ``steps``: the step frame, or
    its StepSummary (steps.py: the report reads the step table once, in passes). ``depth`` is not
    read (Tables 5-8 as the claims need them come from ``steps``). ``weighting``: how an average over
    benchmarks weights them (weighting.py; default the study's 1 chat : 3 math)."""
    steps = as_summary(steps, BASE, EARLY_STEPS)
    present = sorted(pp["benchmark"].unique().to_list())
    backbones = sorted(set(pp["backbone"].unique().to_list()) - {"none"})
    temps = sorted(pp["temperature"].unique().to_list())
    if grid is None:
        grid = Grid(tuple(backbones) or ("none",), tuple(temps), tuple(present))
    benches = list(grid.benchmarks) + [b for b in present if b not in grid.benchmarks]
    per_cell, across = _cells(pp, steps, backbones, temps, benches, route_pair, weighting)
    rows = [r for claim in CLAIMS.values() for cell in (across if claim.across_backbones else per_cell)
            for r in claim.rows(cell)]
    rows = _no_rows(rows, [b for b in grid.benchmarks if b not in present])
    rows += _missing(rows, sorted(set(grid.backbones) | set(backbones)), sorted(set(grid.temperatures) | set(temps)))
    if not rows:
        return pl.DataFrame()
    order = {name: i for i, name in enumerate(CLAIMS)}
    cl = frame(rows)
    cl = cl.with_columns(pl.col("claim").replace_strict(order, default=99).alias("_o")) \
        .sort("_o", "backbone", "temperature", maintain_order=True).drop("_o")
    return add_holm(cl, study_size=family_size(grid, cl))
