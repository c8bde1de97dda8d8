"""The study's proposed next experiments (docs/decoding.md), as this project's strategies run them:
acceptance-history switching and depth-adaptive composition. Both start from the study's text's
router (``BASE``: once per prompt, mean node confidence c(v)), so "beats confidence routing"
compares with that router on the same prompts. Every interval is a paired bootstrap over prompts;
the study gives no numbers for these, so every row is exploratory."""
from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import polars as pl

from ..labels import PROMPT_NODE
from ..stats import corr_ci
from . import study
from .claim import EXPLORATORY, NAN, TIMED_APART, Cell, Claim, Row

BASE = PROMPT_NODE
EARLY_STEPS = 3  # "early": the first 3 verifier calls of a prompt's first turn


def budget_merged(methods) -> str | None:
    """The budget-matched merged trees (the union reranked to one tree's budget), e.g. merged@16."""
    hits = sorted(m for m in methods if re.fullmatch(r"merged@\d+", m))
    return hits[0] if hits else None


def _strategy(cell: Cell, prefix: str) -> list[str]:
    return sorted(m for m in cell.methods if m.startswith(prefix))


def _switching(claim: Claim, cell: Cell) -> list[Row]:
    if BASE not in cell.methods:
        return []
    return [claim.tested(cell.backbone, cell.temp, f"{m} - {BASE}, tau gain, average", *cell.average(m, BASE),
                         study.proposed()) for m in _strategy(cell, "switching(")]


def _switching_speed(claim: Claim, cell: Cell) -> list[Row]:
    """Tokens per second of each switching cell against BASE, where both were timed."""
    out = []
    for m in _strategy(cell, "switching(") if BASE in cell.methods else []:
        if not cell.timed(m, BASE):
            continue
        r = claim.tested(cell.backbone, cell.temp, f"{m} - {BASE}, tokens/s, average", *cell.speed(m, BASE),
                         study.proposed())
        out.append(replace(r, verdict=TIMED_APART, p_value=NAN) if cell.timed_apart(m, BASE) else r)
    return out


def _depth_adaptive(claim: Claim, cell: Cell, rival_of) -> list[Row]:
    """Each depth-adaptive cell against ``rival_of(cell)`` (None: no rows)."""
    rival = rival_of(cell)
    if rival is None:
        return []
    return [claim.tested(cell.backbone, cell.temp, f"{m} - {rival}, average", *cell.average(m, rival),
                         study.proposed()) for m in _strategy(cell, "depth_adaptive(")]


def _early_acceptance(claim: Claim, cell: Cell) -> list[Row]:
    """Pearson r, within each benchmark, between a prompt's early acceptance (tokens committed per
    call over the first EARLY_STEPS calls of its first turn) and its whole-generation tau, on the
    BASE router's traces (the generation switching would revise); mean over benchmarks. The early
    calls are part of the whole; prompts with <= EARLY_STEPS calls are left out."""
    if BASE not in cell.methods or not _strategy(cell, "switching(") or cell.steps is None:
        return []
    backbone, temp = cell.backbone, cell.temp
    per_prompt = cell.steps.early  # (steps.early, summarized for BASE)
    if per_prompt is None:
        return []
    k = ["benchmark", "prompt_id"]
    early = (per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
             .select(*k, "early"))
    if early.is_empty():
        return []
    at_base = (pl.col("backbone") == backbone) & (pl.col("temperature") == temp) & (pl.col("method") == BASE)
    whole = (cell.prompts.filter(at_base & (pl.col("verifier_calls") > EARLY_STEPS))
             .select(*k, (pl.col("new_tokens") / pl.col("verifier_calls")).alias("whole")))
    j = early.join(whole, on=k).sort(k)
    if j.is_empty():
        return []
    groups = [(g["early"].to_numpy(), g["whole"].to_numpy())
              for _, g in j.group_by("benchmark", maintain_order=True)]
    n = int(j.group_by("benchmark").len()["len"].min())
    what = (f"Pearson r of early (first {EARLY_STEPS} calls) and whole-generation acceptance, {BASE} traces, "
            "mean over benchmarks")
    return [claim.tested(backbone, temp, what, corr_ci(groups, p=True), n, study.proposed())]


def _proposed(name: str, wording: str, needs: str, check) -> Claim:
    return Claim(name, wording, needs, EXPLORATORY, check, study=study.proposed)


CLAIMS = (
    _proposed("switching", "acceptance-history switching beats confidence routing (proposed next experiment)",
              f"switching and {BASE}", _switching),
    _proposed("switching-early", "early acceptance (first 3 steps) predicts whole-generation acceptance "
                                 "(switching's premise)", f"switching and the step traces of {BASE}",
              _early_acceptance),
    _proposed("switching-speed", "switching's acceptance gain survives its wall-clock cost: faster than "
                                 "confidence routing", f"switching and {BASE} with wall-clock times", _switching_speed),
    _proposed("depth-adaptive-merged", "depth-adaptive composition beats budget-matched merged trees (proposed "
                                       "next experiment)",
              "depth_adaptive and budget-matched merged trees (merged@total_tokens)",
              partial(_depth_adaptive, rival_of=lambda cell: budget_merged(cell.methods))),
    _proposed("depth-adaptive-routing", "depth-adaptive composition beats confidence routing at equal node budget "
                                        "(proposed next experiment)", f"depth_adaptive and {BASE}",
              partial(_depth_adaptive, rival_of=lambda cell: BASE if BASE in cell.methods else None)),
)
