"""Tables 4-8 statements of the study that the RQ claims did not check (issue 64 item 4): the averaged
drafter's collapse with depth (avg-collapse: it falls faster from depth 1 than the matched
specialist; Table 5's EAGLE-2 MATH-500 rates 89.3% -> 63.1% -> 30.1% at depths 1-3) and Table 4's
negative draft-entropy gaps of HASS's averaged checkpoint (entropy-averaged: its rejected tokens carry
LOWER draft entropy than its accepted ones, the exception to "every functioning checkpoint"). One
value per prompt, bootstrapped over prompts (rq5.py, entropy.py)."""
from __future__ import annotations

import polars as pl

from ..stats import mean_diff_ci
from ..study_tables import other_of
from ..tables import MATH_BENCH
from . import study
from .claim import STUDY, Cell, Claim, Row
from .rq5 import MIN_REACHED, _per_prompt, _rates, common_deep, fall_gap

AVG = "avg0.5"
TABLE4 = (-0.5364, -0.6110)  # the study's negative gaps (HASS, Averaged); the benchmark of each is not stated


def _collapse_ev(backbone: str, temp: float) -> dict:
    r = {(m, d): other_of(f"accept_rate_d{d}", backbone, temp, m, "math500") for m in ("math", AVG)
         for d in (1, 3, 5)}
    if None in (r[AVG, 1], r[AVG, 3], r["math", 1], r["math", 5]):
        return study.none_for(backbone, temp, "acceptance by depth of the averaged drafter")
    return study.evidence(f"Tables 5-8 ({backbone}, T={temp:g}, math500): Averaged {r[AVG, 1]:.1%} -> "
                          f"{r[AVG, 3]:.1%} at depth 3; MathInstruct {r['math', 1]:.1%} -> "
                          f"{r['math', 5]:.1%} at depth 5",
                          r[AVG, 1] - r[AVG, 3] > r["math", 1] - r["math", 5])


def _collapse(claim: Claim, cell: Cell, min_reached: int = MIN_REACHED) -> list[Row]:
    """Per prompt: (fall of the averaged drafter) - (fall of the matched specialist) from depth 1 to the
    deepest depth both reach on that benchmark; > 0: the averaged drafter collapses faster."""
    r = _rates(cell)
    if r.is_empty() or AVG not in set(r["method"].unique().to_list()):
        return []
    frames, depths = [], []
    for bn in sorted(r["benchmark"].unique().to_list()):
        match = "math" if bn in MATH_BENCH else "chat"
        k = common_deep(r, (match, AVG), bn, min_reached)
        if k is None:
            continue
        frames.append(fall_gap(r, match, AVG, bn, k))
        depths.append(f"{bn}:{k}")
    vals, n = _per_prompt(frames)
    if not n:
        return []
    what = f"fall from depth 1, averaged - matched specialist (deepest depth {', '.join(depths)})"
    return [claim.tested(cell.backbone, cell.temp, what, mean_diff_ci(vals, p=True), n,
                         _collapse_ev(cell.backbone, cell.temp))]


def _negative_ev(backbone: str, temp: float) -> dict:
    return study.evidence(f"Table 4 (HASS, Averaged): rejected - accepted draft entropy {TABLE4[0]} and "
                          f"{TABLE4[1]} nats (the benchmark and temperature of each are not in "
                          "../shared/STUDY.md)",
                          True if backbone == "hass" else None)


def _negative(claim: Claim, cell: Cell) -> list[Row]:
    """Per benchmark: the averaged checkpoint's rejected - accepted draft entropy, claimed below 0."""
    per_prompt = cell.steps.entropy.get("draft") if cell.steps is not None else None
    if per_prompt is None or cell.backbone != "hass":  # the study's negatives are HASS's
        return []
    s = per_prompt.filter((pl.col("backbone") == cell.backbone) & (pl.col("temperature") == cell.temp)
                          & (pl.col("method") == AVG))
    out = []
    for (bench,), rows in sorted(s.group_by("benchmark"), key=lambda kv: kv[0]):
        per = (rows.with_columns((pl.col("rej") - pl.col("acc")).alias("diff")).drop_nulls("diff")
               .group_by("prompt_id").agg(pl.col("diff").mean()).sort("prompt_id"))
        if per.height:
            what = f"rejected - accepted draft entropy (nats), averaged drafter on {bench}"
            res = mean_diff_ci(per["diff"].to_numpy(), p=True)
            out.append(claim.tested(cell.backbone, cell.temp, what, res, per.height,
                                    _negative_ev(cell.backbone, cell.temp), expected_positive=False,
                                    bench=bench))
    return out


CLAIMS = (
    Claim("avg-collapse", "the averaged drafter collapses with depth: it falls faster than the matched "
          "specialist (Tables 5-8)", "step traces of avg0.5 and a specialist reaching two depths", STUDY,
          _collapse, study=_collapse_ev),
    Claim("entropy-averaged", "HASS's averaged checkpoint is the exception: its rejected tokens carry lower "
          "draft entropy (Table 4's negative gaps)", "step traces of HASS's avg0.5", STUDY, _negative,
          study=_negative_ev, keys=lambda bbs, temps: [(bb, t) for bb in bbs if bb == "hass" for t in temps],
          slots=lambda grid, backbone=None: len(grid.benchmarks)),
)
