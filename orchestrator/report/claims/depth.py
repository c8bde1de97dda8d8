"""RQ5 and Tables 3-8: acceptance by depth, and draft and verifier entropy.

RQ5: acceptance by depth (Tables 5-8). Acceptance falls with depth for every variant (RQ5: one row
per variant and benchmark, the universal claim cell by cell); the matched specialist declines more
slowly than the mismatched (depth-slope); the mixed drafter leads the matched specialist at depths 1-2
(depth-shallow) and the matched specialist beats it at depths 4-5 (depth-deep). Each check takes one
value per prompt (a prompt is a (benchmark, prompt_id) pair) and bootstraps prompts; steps within a
prompt are not independent.

Tables 4-8 statements of the study that the RQ claims did not check (issue 64 item 4): the averaged
drafter's collapse with depth (avg-collapse: it falls faster from depth 1 than the matched
specialist; Table 5's EAGLE-2 MATH-500 rates 89.3% -> 63.1% -> 30.1% at depths 1-3) and Table 4's
negative draft-entropy gaps of HASS's averaged checkpoint (entropy-averaged: its rejected tokens carry
LOWER draft entropy than its accepted ones, the exception to "every functioning checkpoint"). One
value per prompt, bootstrapped over prompts (this module).

Tables 3-4: rejected draft tokens carry higher draft entropy than accepted ones, and verifier
entropy shows the same direction, in every functioning checkpoint. One row per checkpoint and benchmark
(issue 64: the universal claim checked cell by cell inside the study's Holm family), one value per
prompt (rejected minus accepted entropy, from the step summary's per-prompt means, steps.entropy),
bootstrapped over prompts."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import polars as pl

from orchestrator.report.claims import study
from orchestrator.report.claims.claim import STUDY, Cell, Claim, Row
from orchestrator.report.labels import MIXED, SINGLES
from orchestrator.report.stats import mean_diff_ci
from orchestrator.report.study_tables import other_of
from orchestrator.report.tables import MATH_BENCH

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


def _fall_gaps(r: pl.DataFrame, other_of, min_reached: int) -> tuple[list[pl.DataFrame], list[str]]:
    """Per benchmark: (fall of ``other_of(benchmark)``) - (fall of the matched specialist) per prompt from
    depth 1 to the deepest depth both reach >= min_reached times (benchmarks with none are left out), and
    "benchmark:depth" for each benchmark kept."""
    frames, depths = [], []
    for bn in sorted(r["benchmark"].unique().to_list()):
        match, other = ("math" if bn in MATH_BENCH else "chat"), other_of(bn)
        k = common_deep(r, (match, other), bn, min_reached)
        if k is None:
            continue
        frames.append(fall_gap(r, match, other, bn, k))
        depths.append(f"{bn}:{k}")
    return frames, depths


def _slope(claim: Claim, cell: Cell, min_reached: int = MIN_REACHED) -> list[Row]:
    """Per prompt: (fall of the mismatched specialist) - (fall of the matched one) from depth 1 to
    the deepest depth (<= 5) both reach >= min_reached times on that benchmark; > 0 = matched
    declines more slowly."""
    r = _rates(cell)
    if r.is_empty() or not {"math", "chat"} <= set(r["method"].unique().to_list()):
        return []
    frames, depths = _fall_gaps(r, lambda bn: "chat" if bn in MATH_BENCH else "math", min_reached)
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
        a = r.filter((pl.col("method") == ahead) & (pl.col("benchmark") == bn)
                     & pl.col("depth").is_in(depths))
        b = r.filter((pl.col("method") == behind) & (pl.col("benchmark") == bn)
                     & pl.col("depth").is_in(depths))
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


RQ5_CLAIMS = (
    Claim("RQ5", "acceptance rate falls with depth for every variant (Tables 5-8)",
          "step traces of single drafters reaching two depths", STUDY, _rq5, study=study.rq5,
          slots=lambda grid, backbone=None: len(VARIANTS) * len(grid.benchmarks)),
    Claim("depth-slope",
          "the matched specialist declines more slowly with depth than the mismatched (Tables 5-8)",
          "step traces of both specialists", STUDY, _slope, study=study.depth_slope),
    Claim("depth-shallow", "the mixed drafter leads the matched specialist at shallow depth 1-2 (Tables 5-8)",
          "step traces of a mixed drafter and a specialist", STUDY, _shallow, study=study.depth_shallow,
          slots=lambda grid, backbone=None: len(MIXED)),
    Claim("depth-deep", "the matched specialist beats the mixed drafter at depths 4-5 (Tables 5-8)",
          "step traces of a mixed drafter and a specialist reaching depth 4", STUDY, _deep,
          study=study.depth_deep,
          slots=lambda grid, backbone=None: len(MIXED)),
)


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
    frames, depths = _fall_gaps(r, lambda bn: AVG, min_reached)
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


SEED_DEPTH_CLAIMS = (
    Claim("avg-collapse", "the averaged drafter collapses with depth: it falls faster than the matched "
          "specialist (Tables 5-8)", "step traces of avg0.5 and a specialist reaching two depths", STUDY,
          _collapse, study=_collapse_ev),
    Claim("entropy-averaged", "HASS's averaged checkpoint is the exception: its rejected tokens carry lower "
          "draft entropy (Table 4's negative gaps)", "step traces of HASS's avg0.5", STUDY, _negative,
          study=_negative_ev, keys=lambda bbs, temps: [(bb, t) for bb in bbs if bb == "hass" for t in temps],
          slots=lambda grid, backbone=None: len(grid.benchmarks)),
)


def _entropy(claim: Claim, cell: Cell, kind: str) -> list[Row]:
    """Rejected minus accepted ``kind`` (draft or verifier) entropy, one value per prompt, one row per
    checkpoint (SINGLES: the study's "every functioning checkpoint", the averaged one left out, see
    rq5_more.py's entropy-averaged) and benchmark: the universal
    claim checked cell by cell, each row a hypothesis of the study family (slots). Prompts without
    both numbers are dropped before they are counted."""
    per_prompt = cell.steps.entropy.get(kind) if cell.steps is not None else None
    if per_prompt is None:
        return []
    backbone, temp = cell.backbone, cell.temp
    s = per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                          & pl.col("method").is_in(SINGLES))
    out = []
    for (method, bench), rows in sorted(s.group_by("method", "benchmark"), key=lambda kv: kv[0]):
        per = (rows.with_columns((pl.col("rej") - pl.col("acc")).alias("diff")).drop_nulls("diff")
               .filter(pl.col("diff").is_not_nan()).group_by("prompt_id").agg(pl.col("diff").mean())
               .sort("prompt_id"))
        if per.is_empty():
            continue
        ev = (study.entropy(backbone, temp, method, bench) if kind == "draft"
              else study.verifier_entropy(backbone, temp))
        what = f"rejected - accepted {kind} entropy (nats), {method} drafter on {bench}"
        res = mean_diff_ci(per["diff"].to_numpy(), p=True)
        out.append(claim.tested(backbone, temp, what, res, per.height, ev, bench=bench))
    return out


def _slots(grid, backbone=None) -> int:
    """One hypothesis per checkpoint and benchmark."""
    return len(SINGLES) * len(grid.benchmarks)


ENTROPY_CLAIMS = (
    Claim("entropy", "rejected draft tokens carry higher draft entropy than accepted ones (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="draft"),
          study=lambda bb, t: study.entropy(bb, t, "math", "gsm8k"), slots=_slots),
    Claim("verifier-entropy",
          "verifier entropy shows the same direction: higher at rejected tokens (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="verifier"),
          study=study.verifier_entropy, slots=_slots),
)
