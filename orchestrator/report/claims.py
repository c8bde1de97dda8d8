"""Check each of the study's claims on this run: holds / does not hold / inconclusive (95% CI).

Every interval is a bootstrap whose unit is the prompt (paired: methods compared on the same
prompts); a verdict needs at least MIN_PROMPTS prompts (the project's rule, not the study's) on every
benchmark it uses, and a benchmark the profile asks for without rows has 0. Every row carries the
claim as the study words it, the study's own numbers for the row's cell and whether they agree with
that wording (claims_study), a bootstrap p-value (never below 1/(B+1)), its Holm family (``study``:
the study's claims, a family fixed by the profile's grid; ``exploratory``: the rest, see
claims_family) and ``verdict_holm``: the verdict after Holm-Bonferroni within its family
(family-wise 5%). A claim the run has no cells for gets one inconclusive row per backbone and
temperature saying what it needs."""
from __future__ import annotations

import re

import numpy as np
import polars as pl

from . import claims_study as cs
from .claims_family import EXPLORATORY, Grid, family_of, family_size, holm_by_family
from .claims_depth import depth_claims, ordering_claim
from .claims_eagle3 import CLAIM as E3_CLAIM
from .claims_eagle3 import NEEDS as E3_NEEDS
from .claims_eagle3 import PAIR as E3_PAIR
from .claims_eagle3 import eagle3_claim
from .claims_hedge import NEEDS as HEDGE_NEEDS
from .claims_hedge import hedge_claims
from .claims_next import BASE as NEXT_BASE
from .claims_next import EARLY_STEPS
from .claims_next import next_claims
from .claims_study import STUDY_NUMBERS, WORDING, study_comparison  # noqa: F401 - re-exported
from .routers import HEADS, HEADS_LAST, POSTHOC, PROMPT_NODE, chosen_name, last_turn_rows, matched_expr
from .stats import mean_diff_ci, paired_avg_diff_ci, paired_diff_ci, verdict
from .steps import as_summary
from .tables import MATH_BENCH, aligned

# The headline routing (RQ3a, RQ3b, RQ4): the study's Table 1 "confidence routed" numbers are its code's
# post hoc router's (routers.py), so these claims use it; it is not deployable (it sees both whole
# generations), so the speed claim times the study's text's deployable per-prompt router instead.
ROUTED = POSTHOC
SPEED_ROUTED = PROMPT_NODE
MIN_PROMPTS = 10  # the project's rule: a bootstrap over fewer prompts per benchmark is too narrow to trust
ALPHA = 0.05
SINGLES = ("math", "chat", "mixed_half", "mixed_full")

NEEDS = {  # what a claim needs from the run; shown when it is missing
    "RQ1-math": "math and chat specialists on a math benchmark",
    "RQ1-chat": "math and chat specialists on mt_bench",
    "RQ2": "a mixed drafter and both specialists", "RQ2-home": "a mixed drafter and both specialists",
    "RQ2-reversal": "mixed_half and mixed_full at this temperature (T=0 and T=1 for the reversal)",
    "RQ3a": f"merged and {ROUTED}", "RQ3b": f"{ROUTED} and a single drafter",
    "RQ3c": "avg0.5 and a single drafter", "RQ3c-cells": "avg0.5 and another Table 1 variant",
    "Fig6": "a lambda sweep (>= 2 averaged checkpoints, 0 < lambda < 1) and both specialists",
    "merged-best": "merged and another method", "backbones": "both backbones with >= 3 methods in common",
    "RQ4": f"{ROUTED} and {HEADS} with each turn's head (or confidence and entropy routing at one granularity)",
    "entropy": "step traces of single drafters", "verifier-entropy": "step traces of single drafters",
    "RQ5": "step traces of single drafters reaching two depths",
    "depth-slope": "step traces of both specialists",
    "depth-shallow": "step traces of a mixed drafter and a specialist",
    "depth-deep": "step traces of a mixed drafter and a specialist reaching depth 4",
    "speed": f"{SPEED_ROUTED} and merged with wall-clock times",
    "switching": f"switching and {NEXT_BASE}", "switching-early": f"switching and the step traces of {NEXT_BASE}",
    "switching-speed": f"switching and {NEXT_BASE} with wall-clock times",
    "depth-adaptive-merged": "depth_adaptive and budget-matched merged trees (merged@total_tokens)",
    "depth-adaptive-routing": f"depth_adaptive and {NEXT_BASE}",
    E3_CLAIM: E3_NEEDS,
    **HEDGE_NEEDS,
}
ORDER = list(WORDING)


def _row(claim, backbone, temp, what, est, lo, hi, v, n=None, p=None, ev=None, bench=None, family=None):
    if n is not None and n < MIN_PROMPTS and v != "inconclusive" and not v.startswith("inconclusive ("):
        v = f"inconclusive (n={n} < {MIN_PROMPTS} prompts)"
    ev = ev or cs.evidence(claim)
    return {"claim": claim, "family": family or family_of(claim, backbone), "backbone": backbone, "temperature": temp,
            "benchmark": bench, "comparison": what, "prompts": n,
            "estimate": est, "ci_lo": lo, "ci_hi": hi, "p_value": float("nan") if p is None else p, "verdict": v,
            "wording": ev["wording"], "study": ev["study"], "study_consistent": ev["study_consistent"],
            "study_note": ev["study_note"]}


def _test(claim, bb, temp, what, res, n, ev, expected_positive=True, bench=None, family=None):
    est, lo, hi, p = res
    return _row(claim, bb, temp, what, est, lo, hi, verdict(lo, hi, expected_positive), n, p, ev, bench, family)


def add_holm(cl: pl.DataFrame, alpha: float = ALPHA, study_size: int | None = None) -> pl.DataFrame:
    """``p_holm`` and ``verdict_holm``: Holm-Bonferroni within each family (claims_family): the study
    family over ``study_size`` hypotheses (claims_family.family_size; untested ones count as p = 1;
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


def _no_rows(rows: list[dict], missing: list[str]) -> list[dict]:
    """The prompt rule for benchmarks the profile asks for without rows: a row on such a benchmark,
    or spanning benchmarks, had 0 prompts there (its test does not count)."""
    if not missing:
        return rows
    out = []
    for r in rows:
        gone = [r["benchmark"]] if r["benchmark"] in missing else ([] if r["benchmark"] else missing)
        if gone and "not in this run" not in r["verdict"]:
            r = r | {"prompts": 0, "p_value": float("nan"),
                     "verdict": f"inconclusive (n=0 < {MIN_PROMPTS} prompts: no rows on {', '.join(gone)})"}
        out.append(r)
    return out


def _mean_tau(pp, bb, temp, m, benches) -> float:
    vals = []
    for bn in benches:
        g = pp.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp) & (pl.col("method") == m)
                      & (pl.col("benchmark") == bn))
        if g.height and g["verifier_calls"].sum() > 0:
            vals.append(g["new_tokens"].sum() / g["verifier_calls"].sum())
    return float(np.mean(vals)) if vals else float("-inf")


def check_claims(pp: pl.DataFrame, steps, depth: pl.DataFrame | None,
                 route_pair: tuple = ("math", "chat"), grid: Grid | None = None) -> pl.DataFrame:
    """Each claim compares what the study compared: RQ3a/RQ3b use ``ROUTED``, RQ4 maps routing
    choices to drafters by the profile's ``route_pair``, the entropy claim uses the math drafter on
    GSM8K where present; then rows for claims without cells and the family-wise view (add_holm).
    ``grid``: what the profile asks for (claims_family.Grid.from_profile; default: what the traces
    hold); it fixes the study family and names the benchmarks the prompt rule counts. ``steps``: the
    step frame, or its StepSummary (steps.py: the report reads the step table once, in passes)."""
    rows = []
    steps = as_summary(steps, NEXT_BASE, EARLY_STEPS)
    present = sorted(pp["benchmark"].unique().to_list())
    backbones = sorted(set(pp["backbone"].unique().to_list()) - {"none"})
    temps = sorted(pp["temperature"].unique().to_list())
    if grid is None:
        grid = Grid(tuple(backbones) or ("none",), tuple(temps), tuple(present))
    benches = list(grid.benchmarks) + [b for b in present if b not in grid.benchmarks]
    for backbone in backbones:
        methods = set(pp.filter(pl.col("backbone") == backbone)["method"].unique().to_list())
        for temp in temps:
            have = set(pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))["method"])
            rows += _tau_claims(pp, backbone, temp, benches, methods & have)
            rows += _rq4(pp, backbone, temp, route_pair)
            if steps is not None:
                rows += _entropy_claim(steps, backbone, temp)
                rows += _entropy_claim(steps, backbone, temp, "verifier")
                rows += depth_claims(steps, backbone, temp, _row)
            rows += _speed_claim(pp, backbone, temp, benches, methods & have)
            rows += next_claims(pp, steps, backbone, temp, benches, methods & have, _row)
            rows += hedge_claims(pp, backbone, temp, benches, methods & have, _row)
    for temp in temps:
        rows += ordering_claim(pp, temp, backbones, _row)
        rows += eagle3_claim(pp, temp, benches, _test, cs.evidence)
    rows = _no_rows(rows, [b for b in grid.benchmarks if b not in present])
    rows += _missing(rows, sorted(set(grid.backbones) | set(backbones)),
                     sorted(set(grid.temperatures) | set(temps)))
    if not rows:
        return pl.DataFrame()
    cl = pl.DataFrame(rows, infer_schema_length=None)
    cl = cl.with_columns(pl.col("claim").replace_strict({c: i for i, c in enumerate(ORDER)}, default=99)
                         .alias("_o")).sort("_o", "backbone", "temperature", maintain_order=True).drop("_o")
    return add_holm(cl, study_size=family_size(grid, cl))


def _tau_claims(pp, backbone, temp, benches, methods) -> list[dict]:
    rows = []

    def avg(a, b):
        return paired_avg_diff_ci([aligned(pp, backbone, temp, bn, a, b) for bn in benches], p=True)

    def n_min(a, b):
        return min(len(aligned(pp, backbone, temp, bn, a, b)[0]) for bn in benches)

    def per_bench(claim, a, b, bn, ev=None, expected_positive=True):
        arrays = aligned(pp, backbone, temp, bn, a, b)
        return _test(claim, backbone, temp, f"{a} - {b} on {bn} (tau)", paired_diff_ci(*arrays, p=True),
                     len(arrays[0]), ev or cs.pair(claim, backbone, temp, a, b, bn), expected_positive, bn)

    if {"math", "chat"} <= methods:
        for bn in benches:
            home_math = bn in MATH_BENCH
            a, b = ("math", "chat") if home_math else ("chat", "math")
            r = per_bench("RQ1-math" if home_math else "RQ1-chat", a, b, bn)
            rows.append(r | {"comparison": f"{a} - {b} specialist on {bn} (tau)"})
        for mixed in ("mixed_half", "mixed_full"):
            if mixed not in methods:
                continue
            for bn in benches:  # RQ2 as the study states it: robustness, per benchmark
                matched, mismatched = ("math", "chat") if bn in MATH_BENCH else ("chat", "math")
                rows.append(per_bench("RQ2", mixed, mismatched, bn))
                rows.append(per_bench("RQ2-home", matched, mixed, bn))
    if {"mixed_half", "mixed_full"} <= methods and temp in (0.0, 1.0):
        a, b = ("mixed_full", "mixed_half") if temp == 0 else ("mixed_half", "mixed_full")
        rows.append(_test("RQ2-reversal", backbone, temp, f"{a} - {b}, average over benchmarks", avg(a, b),
                          n_min(a, b), cs.reversal(backbone, temp)))
    singles = [m for m in SINGLES if m in methods]
    routing_note = (f"this row's routing is {ROUTED}, the study's code's router behind its Table 1 numbers; "
                    "not deployable (sees both whole generations)")
    if "merged" in methods and ROUTED in methods:
        ev = cs.pair("RQ3a", backbone, temp, "merged", ROUTED, "average", note=routing_note)
        rows.append(_test("RQ3a", backbone, temp, f"merged - {ROUTED}, average", avg("merged", ROUTED),
                          n_min("merged", ROUTED), ev))
    if ROUTED in methods and singles:
        best = max(singles, key=lambda m: _mean_tau(pp, backbone, temp, m, benches))
        ev = cs.rq3b(backbone, temp, ROUTED)
        ev["study_note"] = "; ".join(x for x in (ev["study_note"], routing_note) if x)
        rows.append(_test("RQ3b", backbone, temp, f"{ROUTED} - best single ({best}), average", avg(ROUTED, best),
                          n_min(ROUTED, best), ev))
    if "avg0.5" in methods and singles:
        worst = min(singles, key=lambda m: _mean_tau(pp, backbone, temp, m, benches))
        rows.append(_test("RQ3c", backbone, temp, f"averaged - worst specialist ({worst}), average",
                          avg("avg0.5", worst), n_min("avg0.5", worst), cs.rq3c(backbone, temp), False))
    rivals = [m for m in (*SINGLES, ROUTED, "merged") if m in methods and m != "avg0.5"]
    if "avg0.5" in methods and rivals:  # "worst in every cell": each benchmark, against its lowest rival
        for bn in benches:
            worst = min(rivals, key=lambda m: _mean_tau(pp, backbone, temp, m, [bn]))
            r = per_bench("RQ3c-cells", "avg0.5", worst, bn, cs.rq3c_cell(backbone, temp, bn, rivals), False)
            rows.append(r | {"comparison": f"averaged - lowest other variant ({worst}) on {bn} (tau)"})
    lams = sorted((float(m[3:]), m) for m in methods if re.fullmatch(r"avg[0-9.]+", m) and 0 < float(m[3:]) < 1)
    if len(lams) >= 2 and {"math", "chat"} <= methods:
        spec = max(("math", "chat"), key=lambda m: _mean_tau(pp, backbone, temp, m, benches))
        for _, m in lams:
            rows.append(_test("Fig6", backbone, temp, f"{m} - best specialist ({spec}), average", avg(m, spec),
                              n_min(m, spec), cs.fig6(backbone, temp), False))
    others = [m for m in methods if not m.startswith("merged") and "@" not in m and "[" not in m
              and m != "autoregressive"]
    if "merged" in methods and others:
        best = max(sorted(others), key=lambda m: _mean_tau(pp, backbone, temp, m, benches))
        rows.append(_test("merged-best", backbone, temp, f"merged - best other method ({best}), average",
                          avg("merged", best), n_min("merged", best), cs.merged_best(backbone, temp)))
    return rows


def _speed_claim(pp, backbone, temp, benches, methods) -> list[dict]:
    """Tokens per second of confidence routing (SPEED_ROUTED: the post hoc router has no deployable
    wall clock) minus merged trees (ratio of sums over the same prompts, mean over benchmarks),
    where the traces carry wall-clock times."""
    routed = SPEED_ROUTED
    if not {routed, "merged"} <= methods or "wall_time_s" not in pp.columns:
        return []
    cells = pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                      & pl.col("method").is_in([routed, "merged"]))
    if cells["wall_time_s"].fill_null(0).min() <= 0 or "out_tokens" not in pp.columns:
        return []
    groups = [aligned(pp, backbone, temp, bn, routed, "merged", "out_tokens", "wall_time_s") for bn in benches]
    n = min(len(g[0]) for g in groups)
    ev = cs.speed()
    ev["study_note"] = (f"{ev['study_note']}; this row times {routed}, the study's text's deployable router "
                        f"({ROUTED} decodes both whole generations)")
    r = _test("speed", backbone, temp, f"{routed} - merged, tokens/s, average over benchmarks",
              paired_avg_diff_ci(groups, p=True), n, ev)
    inv = cells.group_by("method").agg(pl.col("invocation").drop_nulls().unique().sort()) \
        if "invocation" in cells.columns else None
    if inv is not None and inv.height == 2 and all(len(x) for x in inv["invocation"]) \
            and inv["invocation"][0].to_list() != inv["invocation"][1].to_list():
        r |= {"verdict": "inconclusive (timed in different grid invocations)", "p_value": float("nan")}
    return [r]


def _rq4(pp, backbone, temp, route_pair=("math", "chat")):
    """Domain separation = share of math choices on math benchmarks + share of chat choices on
    MT-Bench, averaged; confidence minus entropy routing, paired over prompts: first the study's
    pair as its code counts it (ROUTED vs HEADS_LAST, a prompt's head its last turn's: its Table 2;
    the study family), then ROUTED vs HEADS (the majority of turns) and the project's own pairs at
    each granularity (exploratory). A choice is read by name from the row's ``drafter``
    ("math+chat+..."); rows without one read drafter i as route_pair[i] (the profile decides the order)."""
    out = []
    if "math" not in route_pair or "chat" not in route_pair:
        return out
    if "drafter" not in pp.columns:
        pp = pp.with_columns(pl.lit("+".join(route_pair)).alias("drafter"))
    heads = pp.filter(pl.col("method") == HEADS)
    if heads.height and "routing_choice_last" in heads.columns:  # HEADS_LAST rows: each prompt's last turn
        pp = pl.concat([pp, last_turn_rows(heads)], how="diagonal_relaxed")
    pairs = [(ROUTED, HEADS_LAST, "prompt")]  # the study's two routers as its code ran them (its Table 2)
    pairs += [(ROUTED, HEADS, "prompt")]  # the majority over turns: exploratory, beside it
    pairs += [(f"confidence({g})", f"entropy({g})", g) for g in ("step", "turn", "prompt")]
    for c, e, gran in pairs:
        sub = pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                        & pl.col("method").is_in([c, e]))
        if sub["method"].n_unique() < 2:
            continue
        correct = sub.with_columns(chosen_name().alias("chosen")).with_columns(
            matched_expr().cast(pl.Float64).alias("ok"))
        w = (correct.pivot(on="method", index=["benchmark", "prompt_id"], values="ok").drop_nulls()
             .sort("benchmark", "prompt_id"))
        if w.is_empty():
            continue
        n = int(w.group_by("benchmark").len()["len"].min())
        ev = cs.rq4(backbone, temp, gran)
        if e == HEADS:
            ev["study_note"] = "; ".join(x for x in (ev["study_note"], "a prompt's head is its turns' majority "
                                                     "(the study's code records the last turn's)") if x)
        out.append(_test("RQ4", backbone, temp, f"{c} - {e}: share routed to the matched specialist",
                         mean_diff_ci((w[c] - w[e]).to_numpy(), p=True), n, ev,
                         family=None if (c, e) == (ROUTED, HEADS_LAST) else EXPLORATORY))
    return out


def _entropy_claim(steps, backbone, temp, kind: str = "draft"):
    """Rejected minus accepted ``kind`` (draft or verifier) entropy, one value per prompt, for the
    study's cell (the math drafter on GSM8K) where present, else the mean over single drafters per
    (benchmark, prompt) (labelled as such). Prompts without both numbers are dropped before they are
    counted. ``steps``: a step frame or its StepSummary (its per-prompt means, steps.entropy)."""
    claim = "entropy" if kind == "draft" else "verifier-entropy"
    per_prompt = as_summary(steps, NEXT_BASE, EARLY_STEPS).entropy.get(kind)
    if per_prompt is None:
        return []
    s = per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
    cell = s.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k"))
    what, bench = f"rejected - accepted {kind} entropy (nats), math drafter on gsm8k", "gsm8k"
    ev = cs.entropy(backbone, temp, "math", "gsm8k") if kind == "draft" else cs.verifier_entropy(backbone, temp)
    if cell.is_empty():
        cell, bench = s, None
        what = f"rejected - accepted {kind} entropy (nats), mean over single drafters per prompt"
        ev = (cs.none_for(claim, backbone, temp, "pooled single drafters") if kind == "draft"
              else cs.verifier_entropy(backbone, temp))
    if cell.is_empty():
        return []
    per = (cell.with_columns((pl.col("rej") - pl.col("acc")).alias("diff")).drop_nulls("diff")
           .group_by("benchmark", "prompt_id").agg(pl.col("diff").mean()).sort("benchmark", "prompt_id"))
    if per.is_empty():
        return []
    n = int(per.group_by("benchmark").len()["len"].min())
    return [_test(claim, backbone, temp, what, mean_diff_ci(per["diff"].to_numpy(), p=True), n, ev, bench=bench)]


def _depth_claim(steps, backbone, temp, min_reached: int = 20):
    """RQ5 alone (acceptance at depth 1 minus at the deepest depth reached), see claims_depth."""
    return [r for r in depth_claims(steps, backbone, temp, _row, min_reached) if r["claim"] == "RQ5"]


def _default_ev(claim, bb, temp) -> dict:
    f = {"RQ1-math": lambda: cs.pair(claim, bb, temp, "math", "chat", "gsm8k"),
         "RQ1-chat": lambda: cs.pair(claim, bb, temp, "chat", "math", "mt_bench"),
         "RQ2": lambda: cs.pair(claim, bb, temp, "mixed_full", "math", "mt_bench"),
         "RQ2-home": lambda: cs.pair(claim, bb, temp, "chat", "mixed_full", "mt_bench"),
         "RQ2-reversal": lambda: cs.reversal(bb, temp),
         "RQ3a": lambda: cs.pair(claim, bb, temp, "merged", ROUTED, "average"),
         "RQ3b": lambda: cs.rq3b(bb, temp, ROUTED), "RQ3c": lambda: cs.rq3c(bb, temp),
         "Fig6": lambda: cs.fig6(bb, temp), "merged-best": lambda: cs.merged_best(bb, temp),
         "RQ4": lambda: cs.rq4(bb, temp, "prompt"), "entropy": lambda: cs.entropy(bb, temp, "math", "gsm8k"),
         "verifier-entropy": lambda: cs.verifier_entropy(bb, temp),
         "RQ3c-cells": lambda: cs.rq3c_all(bb, temp),
         "depth-deep": lambda: cs.depth(claim, bb, temp),
         **{c: (lambda c=c: cs.proposed(c)) for c in cs.NEXT},
         "RQ5": lambda: cs.depth(claim, bb, temp), "depth-slope": lambda: cs.depth(claim, bb, temp),
         "depth-shallow": lambda: cs.depth(claim, bb, temp), "speed": cs.speed,
         "backbones": lambda: cs.backbones(temp)}.get(claim)
    return f() if f else cs.evidence(claim)


def _missing(rows, backbones, temps) -> list[dict]:
    """One inconclusive row for each claim, backbone and temperature the run has no cells for."""
    if not backbones:
        return []
    have = {(r["claim"], r["backbone"], r["temperature"]) for r in rows}
    out = []
    for claim in ORDER:
        bbs = ["hass+eagle2"] if claim == "backbones" else backbones
        if claim == E3_CLAIM:  # only where the run has both backbones
            bbs = ["+".join(E3_PAIR)] if set(E3_PAIR) <= set(backbones) else []
        ts = sorted(set(temps) | {0.0, 1.0}) if claim == "RQ2-reversal" else temps
        for bb in bbs:
            for t in ts:
                if (claim, bb, t) not in have:
                    out.append(_row(claim, bb, t, "not in this run", None, None, None,
                                    f"inconclusive (not in this run: needs {NEEDS[claim]})", None, None,
                                    _default_ev(claim, bb, t)))
    return out
