"""RQ5: acceptance by depth (Tables 5-8). Acceptance falls with depth for every variant (RQ5: one row
per variant and benchmark, the universal claim cell by cell); the matched specialist declines more
slowly than the mismatched (depth-slope); the mixed drafter leads the matched specialist at depths 1-2
(depth-shallow) and the matched specialist beats it at depths 4-5 (depth-deep). Each check takes one
value per prompt (a prompt is a (benchmark, prompt_id) pair) and bootstraps prompts; steps within a
prompt are not independent."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import polars as pl

from ..labels import MIXED
from ..stats import mean_diff_ci
from ..tables import MATH_BENCH
from . import study
from .claim import STUDY, Cell, Claim, Row

STUDY_DEPTH = 5  # the study's tables stop at depth 5
SHALLOW = (1, 2)  # "competitive at depths 1-2"
DEEP = (4, 5)  # "the matched specialist dominates at depths 4-5"
MIN_REACHED = 20  # a depth counts for a drafter where it was reached at least this often
VARIANTS = ("math", "chat", "mixed_half", "mixed_full", "avg0.5")  # RQ5: "every variant" (single checkpoints)


def _rates(cell: Cell) -> pl.DataFrame:
    """Acceptance rate at each depth per (method, benchmark, prompt) of the cell: accepted at d /
    reached d (steps.rates); empty without step traces."""
    r = cell.steps.rates if cell.steps is not None else None
    if r is None:
        return pl.DataFrame()
    r = r.filter((pl.col("backbone") == cell.backbone) & (pl.col("temperature") == cell.temp))
    return r.drop("backbone", "temperature")


def _per_prompt(frames: list[pl.DataFrame]):
    """(values, n): per-prompt values pooled over benchmarks, n = fewest prompts of any benchmark."""
    per = pl.concat(frames).sort("benchmark", "prompt_id") if frames else pl.DataFrame()
    if per.is_empty():
        return np.array([]), 0
    return per["diff"].to_numpy(), int(per.group_by("benchmark").len()["len"].min())


def _tested(claim: Claim, cell: Cell, what: str, values, n: int, ev: dict) -> Row:
    return claim.tested(cell.backbone, cell.temp, what, mean_diff_ci(values, p=True), n, ev)


def _deepest(rm: pl.DataFrame, min_reached: int) -> int | None:
    """The deepest depth (<= STUDY_DEPTH) reached >= min_reached times, when depth 1 is one of two or more."""
    reached = rm.group_by("depth").agg(pl.col("reached").sum()).filter(
        (pl.col("reached") >= min_reached) & (pl.col("depth") <= STUDY_DEPTH))
    if reached.height < 2 or 1 not in reached["depth"].to_list():
        return None
    return int(reached["depth"].max())


def _rq5(claim: Claim, cell: Cell, min_reached: int = MIN_REACHED) -> list[Row]:
    """RQ5 for every variant on every benchmark (the universal claim cell by cell, each row a hypothesis
    of the study family): per prompt, the acceptance rate at depth 1 minus at the deepest depth (<= 5)
    that variant reached >= min_reached times on that benchmark."""
    r, out = _rates(cell), []
    if r.is_empty():
        return []
    for (method, bench), rm in sorted(r.group_by("method", "benchmark"), key=lambda kv: kv[0]):
        deep = _deepest(rm, min_reached)
        if deep is None:
            continue
        per = (rm.filter(pl.col("depth").is_in([1, deep]))
               .pivot(on="depth", index=["benchmark", "prompt_id"], values="rate").drop_nulls()
               .select("benchmark", "prompt_id", (pl.col("1") - pl.col(str(deep))).alias("diff")))
        vals, n = _per_prompt([per])
        if n:
            what = f"{method}: accept rate depth 1 - depth {deep} on {bench}, per prompt"
            row = _tested(claim, cell, what, vals, n, study.rq5(cell.backbone, cell.temp, method))
            out.append(replace(row, benchmark=bench))
    return out


def _at(r: pl.DataFrame, method: str, bench: str, d: int, name: str) -> pl.DataFrame:
    return (r.filter((pl.col("method") == method) & (pl.col("benchmark") == bench) & (pl.col("depth") == d))
            .select("prompt_id", pl.col("rate").alias(name)))


def common_deep(r: pl.DataFrame, methods: tuple, bench: str, min_reached: int) -> int | None:
    """The deepest depth (<= 5) every one of ``methods`` reached >= min_reached times on ``bench``
    (None below depth 2, or with fewer than two such depths)."""
    tot = (r.filter((pl.col("benchmark") == bench) & pl.col("method").is_in(list(methods)))
           .group_by("method", "depth").agg(pl.col("reached").sum())
           .filter((pl.col("reached") >= min_reached) & (pl.col("depth") <= STUDY_DEPTH))
           .group_by("depth").len().filter(pl.col("len") == len(methods)))
    return int(tot["depth"].max()) if tot.height >= 2 and int(tot["depth"].max()) >= 2 else None


def fall_gap(r: pl.DataFrame, matched: str, other: str, bench: str, k: int) -> pl.DataFrame:
    """Per prompt of ``bench`` (benchmark, prompt_id, diff): how much more ``other``'s acceptance rate
    falls from depth 1 to depth ``k`` than ``matched``'s."""
    j = (_at(r, matched, bench, 1, "m1").join(_at(r, matched, bench, k, "mk"), on="prompt_id")
         .join(_at(r, other, bench, 1, "o1"), on="prompt_id")
         .join(_at(r, other, bench, k, "ok"), on="prompt_id"))
    return (j.select(pl.lit(bench).alias("benchmark"), "prompt_id",
                     ((pl.col("o1") - pl.col("ok")) - (pl.col("m1") - pl.col("mk"))).alias("diff"))
            .drop_nulls("diff"))


def _slope(claim: Claim, cell: Cell, min_reached: int = MIN_REACHED) -> list[Row]:
    """Per prompt: (fall of the mismatched specialist) - (fall of the matched one) from depth 1 to
    the deepest depth (<= 5) both reach >= min_reached times on that benchmark; > 0 = matched
    declines more slowly."""
    r = _rates(cell)
    if r.is_empty() or not {"math", "chat"} <= set(r["method"].unique().to_list()):
        return []
    frames, depths = [], []
    for bn in sorted(r["benchmark"].unique().to_list()):
        match, mis = ("math", "chat") if bn in MATH_BENCH else ("chat", "math")
        k = common_deep(r, (match, mis), bn, min_reached)
        if k is None:
            continue
        frames.append(fall_gap(r, match, mis, bn, k))
        depths.append(f"{bn}:{k}")
    vals, n = _per_prompt(frames)
    if not n:
        return []
    what = f"fall from depth 1, mismatched - matched specialist (deepest depth {', '.join(depths)})"
    return [_tested(claim, cell, what, vals, n, study.depth_slope(cell.backbone, cell.temp))]


def _mixed_drafters(r: pl.DataFrame) -> list[str]:
    """The mixed drafters with rates in ``r`` beside at least one specialist."""
    methods = set(r["method"].unique().to_list()) if not r.is_empty() else set()
    return [m for m in MIXED if m in methods and ({"math", "chat"} & methods)]


def _mixed_gap(r: pl.DataFrame, mixed: str, depths: tuple[int, ...], mixed_ahead: bool):
    """(values, n): per prompt, the mean over ``depths`` of the mixed drafter's acceptance rate minus
    the matched specialist's (``mixed_ahead``), or of the matched specialist's minus the mixed one's."""
    frames = []
    for bn in sorted(r["benchmark"].unique().to_list()):
        match = "math" if bn in MATH_BENCH else "chat"
        ahead, behind = (mixed, match) if mixed_ahead else (match, mixed)
        a = r.filter((pl.col("method") == ahead) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(depths))
        b = r.filter((pl.col("method") == behind) & (pl.col("benchmark") == bn) & pl.col("depth").is_in(depths))
        j = a.join(b, on=["prompt_id", "depth"], suffix="_b")
        if j.is_empty():
            continue
        frames.append(j.group_by("prompt_id").agg((pl.col("rate") - pl.col("rate_b")).mean().alias("diff"))
                      .select(pl.lit(bn).alias("benchmark"), "prompt_id", "diff").drop_nulls("diff"))
    return _per_prompt(frames)


def _depth_gap(claim: Claim, cell: Cell, depths, mixed_ahead: bool, what: str, study_of) -> list[Row]:
    """Per prompt, per mixed drafter: the acceptance-rate gap to the matched specialist over
    ``depths`` (mixed minus specialist if ``mixed_ahead``, else the reverse); ``what`` names the
    comparison with ``{mixed}`` for the drafter."""
    r, out = _rates(cell), []
    for mixed in _mixed_drafters(r):
        vals, n = _mixed_gap(r, mixed, depths, mixed_ahead=mixed_ahead)
        if n:
            evidence = study_of(cell.backbone, cell.temp)
            out.append(_tested(claim, cell, what.format(mixed=mixed), vals, n, evidence))
    return out


# mixed minus matched specialist over depths 1-2;
# matched specialist minus mixed over the depths 4-5 both reached
_shallow = partial(_depth_gap, depths=SHALLOW, mixed_ahead=True, study_of=study.depth_shallow,
                   what="{mixed} - matched specialist, accept rate at depths 1-2, per prompt")
_deep = partial(_depth_gap, depths=DEEP, mixed_ahead=False, study_of=study.depth_deep,
                what="matched specialist - {mixed}, accept rate at depths 4-5, per prompt")


CLAIMS = (
    Claim("RQ5", "acceptance rate falls with depth for every variant (Tables 5-8)",
          "step traces of single drafters reaching two depths", STUDY, _rq5, study=study.rq5,
          slots=lambda grid, backbone=None: len(VARIANTS) * len(grid.benchmarks)),
    Claim("depth-slope", "the matched specialist declines more slowly with depth than the mismatched (Tables 5-8)",
          "step traces of both specialists", STUDY, _slope, study=study.depth_slope),
    Claim("depth-shallow", "the mixed drafter leads the matched specialist at shallow depth 1-2 (Tables 5-8)",
          "step traces of a mixed drafter and a specialist", STUDY, _shallow, study=study.depth_shallow,
          slots=lambda grid, backbone=None: len(MIXED)),
    Claim("depth-deep", "the matched specialist beats the mixed drafter at depths 4-5 (Tables 5-8)",
          "step traces of a mixed drafter and a specialist reaching depth 4", STUDY, _deep, study=study.depth_deep,
          slots=lambda grid, backbone=None: len(MIXED)),
)
