"""Every claim in the report's order, its Holm family, and the check of them all on a run.

Check every claim on a run: holds / does not hold / inconclusive (95% CI), then the family-wise view.

Every interval is a bootstrap whose unit is the prompt (paired: methods compared on the same
prompts); a verdict needs at least MIN_PROMPTS prompts (the project's rule, not the study's) on every
benchmark it uses, and a benchmark the profile asks for without rows has 0. Every row carries the
claim as it is worded, the study's own numbers for the row's cell and whether they agree with that
wording (study.py), a bootstrap p-value (never below 1/(B+1)), its Holm family (``study``: the
study's claims, a family fixed by the profile's grid; ``exploratory``: the rest, see check.py) and
``verdict_holm``: the verdict after Holm-Bonferroni within its family (family-wise 5%). A claim the
run has no cells for gets one inconclusive row per backbone and temperature saying what it needs.

The two Holm families of the claims table.

``study``: the study's claims (registry.STUDY_CLAIMS), one family whose size the profile's grid
decides before any trace is read: for each claim, backbone and temperature of the grid, as many
hypotheses as the study's design gives that claim (its ``slots``: one per benchmark for a
per-benchmark claim, one per variant for "every variant", one per λ of the sweep, else one). A
hypothesis whose data is missing (a failed cell, a benchmark without rows, too few prompts) stays in
the family as untested (p = 1), so the family never shrinks with what a run produced.
``exploratory``: the study's proposed next experiments and the project's own router pairs, Holm over
their own tests.

Every claim the report checks, by name, in the report's order: the study's claims (RQ1-RQ5, the
ordering across backbones, the Table 1 and Tables 4-8 statements issue 64 added, the speed estimate),
then its proposed next experiments, the third backbone and the project's online router. One record per
claim (claim.Claim), each defined in the module of its research question."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from orchestrator.report.claims.claim import (
    EXPLORATORY,
    MIN_PROMPTS,
    NAN,
    STUDY,
    STUDY_W,
    Cell,
    Claim,
    Grid,
    Row,
    frame,
)
from orchestrator.report.claims.composition import ORDERING_CLAIMS, RQ3_CLAIMS, RQ4_CLAIMS, SPEED_CLAIMS
from orchestrator.report.claims.depth import ENTROPY_CLAIMS, RQ5_CLAIMS, SEED_DEPTH_CLAIMS
from orchestrator.report.claims.project import BASE, EAGLE3_CLAIMS, EARLY_STEPS, HEDGE_CLAIMS, PROPOSED_CLAIMS
from orchestrator.report.claims.specialisation import RQ1_CLAIMS, RQ2_CLAIMS, SEED_TABLE1_CLAIMS
from orchestrator.report.stats import holm
from orchestrator.report.steps import as_summary

ORDERED = (RQ1_CLAIMS, RQ2_CLAIMS, RQ3_CLAIMS, ORDERING_CLAIMS, SEED_TABLE1_CLAIMS, RQ4_CLAIMS,
           ENTROPY_CLAIMS, RQ5_CLAIMS, SEED_DEPTH_CLAIMS, SPEED_CLAIMS, PROPOSED_CLAIMS, EAGLE3_CLAIMS,
           HEDGE_CLAIMS)
CLAIMS: dict[str, Claim] = {c.name: c for group in ORDERED for c in group}
STUDY_CLAIMS = tuple(name for name, c in CLAIMS.items() if c.family == STUDY)


def family_of(claim: str, backbone: str | None = None) -> str:
    """The Holm family of a claim's row on ``backbone`` (Claim.family_on; a name not listed: exploratory)."""
    return CLAIMS[claim].family_on(backbone) if claim in CLAIMS else EXPLORATORY


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
            rows[(k[0], k[1],
                  float(k[2]))] = g.filter(~pl.col("verdict").str.contains("not in this run")).height
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


ALPHA = 0.05


def add_holm(cl: pl.DataFrame, alpha: float = ALPHA, study_size: int | None = None) -> pl.DataFrame:
    """``p_holm`` and ``verdict_holm``: Holm-Bonferroni within each family (check.py): the study
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
    benchmarks weights them (claim.py; default the study's 1 chat : 3 math)."""
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
    rows += _missing(rows, sorted(set(grid.backbones) | set(backbones)),
                     sorted(set(grid.temperatures) | set(temps)))
    if not rows:
        return pl.DataFrame()
    order = {name: i for i, name in enumerate(CLAIMS)}
    cl = frame(rows)
    cl = cl.with_columns(pl.col("claim").replace_strict(order, default=99).alias("_o")) \
        .sort("_o", "backbone", "temperature", maintain_order=True).drop("_o")
    return add_holm(cl, study_size=family_size(grid, cl))
