"""Checks of the study's proposed next experiments: acceptance-history switching and depth-adaptive
composition (docs/decoding.md). Both start from the study's text's router (``BASE``: once per
prompt, mean node confidence c(v)), so "beats confidence routing" compares with that router on the
same prompts. Every interval is a paired bootstrap over prompts; ``row`` is claims._row (passed in,
as in claims_depth, to keep this module free of an import cycle)."""
from __future__ import annotations

import re

import polars as pl

from . import claims_study as cs
from .routers import PROMPT_NODE
from .stats import corr_ci, paired_avg_diff_ci, verdict
from .steps import as_summary
from .tables import aligned, timed

BASE = PROMPT_NODE
EARLY_STEPS = 3  # "early": the first 3 verifier calls of a prompt's first turn


def _avg(pp, bb, temp, benches, a, b, num="new_tokens", den="verifier_calls"):
    groups = [aligned(pp, bb, temp, bn, a, b, num, den) for bn in benches]
    return paired_avg_diff_ci(groups, p=True), min(len(g[0]) for g in groups)


def _test(row, claim, bb, temp, what, res_n, ev=None):
    (est, lo, hi, p), n = res_n
    return row(claim, bb, temp, what, est, lo, hi, verdict(lo, hi), n, p, ev or cs.proposed(claim))


def _invocations_differ(pp, bb, temp, a, b) -> bool:
    if "invocation" not in pp.columns:
        return False
    sets = []
    for m in (a, b):
        inv = pp.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp) & (pl.col("method") == m))
        sets.append(sorted(set(inv["invocation"].drop_nulls().to_list())))
    return all(sets) and sets[0] != sets[1]


def budget_merged(methods) -> str | None:
    """The budget-matched merged trees (the union reranked to one tree's budget), e.g. merged@16."""
    hits = sorted(m for m in methods if re.fullmatch(r"merged@\d+", m))
    return hits[0] if hits else None


def next_claims(pp, steps, backbone, temp, benches, methods, row) -> list[dict]:
    out = []
    switching = sorted(m for m in methods if m.startswith("switching("))
    depth = sorted(m for m in methods if m.startswith("depth_adaptive("))
    rival = budget_merged(methods)
    if BASE in methods:
        for m in switching:
            out.append(_test(row, "switching", backbone, temp, f"{m} - {BASE}, tau gain, average",
                             _avg(pp, backbone, temp, benches, m, BASE)))
            if timed(pp, backbone, temp, [m, BASE]):
                r = _test(row, "switching-speed", backbone, temp, f"{m} - {BASE}, tokens/s, average",
                          _avg(pp, backbone, temp, benches, m, BASE, "out_tokens", "wall_time_s"))
                if _invocations_differ(pp, backbone, temp, m, BASE):
                    r |= {"verdict": "inconclusive (timed in different grid invocations)", "p_value": float("nan")}
                out.append(r)
        if switching and steps is not None:
            out += early_acceptance(pp, steps, backbone, temp, row)
        for m in depth:
            out.append(_test(row, "depth-adaptive-routing", backbone, temp, f"{m} - {BASE}, average",
                             _avg(pp, backbone, temp, benches, m, BASE)))
    if rival:
        for m in depth:
            out.append(_test(row, "depth-adaptive-merged", backbone, temp, f"{m} - {rival}, average",
                             _avg(pp, backbone, temp, benches, m, rival)))
    return out


def early_acceptance(pp, steps, backbone, temp, row) -> list[dict]:
    """Pearson r, within each benchmark, between a prompt's early acceptance (tokens committed per
    call over the first EARLY_STEPS calls of its first turn) and its whole-generation tau, on the
    BASE router's traces (the generation switching would revise); mean over benchmarks. The early
    calls are part of the whole; prompts with <= EARLY_STEPS calls are left out."""
    cell = (pl.col("backbone") == backbone) & (pl.col("temperature") == temp) & (pl.col("method") == BASE)
    per_prompt = as_summary(steps, BASE, EARLY_STEPS).early  # (steps.early)
    if per_prompt is None:
        return []
    k = ["benchmark", "prompt_id"]
    early = (per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
             .select(*k, "early"))
    if early.is_empty():
        return []
    whole = (pp.filter(cell & (pl.col("verifier_calls") > EARLY_STEPS))
             .select(*k, (pl.col("new_tokens") / pl.col("verifier_calls")).alias("whole")))
    j = early.join(whole, on=k).sort(k)
    if j.is_empty():
        return []
    groups = [(g["early"].to_numpy(), g["whole"].to_numpy())
              for _, g in j.group_by("benchmark", maintain_order=True)]
    n = int(j.group_by("benchmark").len()["len"].min())
    est, lo, hi, p = corr_ci(groups, p=True)
    what = (f"Pearson r of early (first {EARLY_STEPS} calls) and whole-generation acceptance, {BASE} traces, "
            "mean over benchmarks")
    return [row("switching-early", backbone, temp, what, est, lo, hi, verdict(lo, hi), n, p,
                cs.proposed("switching-early"))]
