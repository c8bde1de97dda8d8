"""The project's own claims: the study's proposed next experiments, the third backbone and the online router.

The study's proposed next experiments (docs/decoding.md), as this project's strategies run them:
acceptance-history switching and depth-adaptive composition. Both start from the study's text's
router (``BASE``: once per prompt, mean node confidence c(v)), so "beats confidence routing"
compares with that router on the same prompts. Every interval is a paired bootstrap over prompts;
the study gives no numbers for these, so every row is exploratory.

The third backbone against the study's (issue #40): does EAGLE-3 draft longer than EAGLE-2 when
both are trained on the same data? The EAGLE-3 paper's claim, checked per run: each benchmark's
matched specialist (the math drafter on math benchmarks, the chat drafter on MT-Bench) of each
backbone on the same prompts, tau paired by prompt, averaged over benchmarks. Not a claim of the
study (arXiv 2603.27027), so its rows are in the exploratory Holm family.

Checks of ``hedge``, the project's online router (decoding/project.py; issues 57, 64): does it find the
home drafter, and does it hold up against the study's post hoc router, merged trees, the bandit and
the hindsight oracle? Every
interval is a paired bootstrap over prompts, in the exploratory family (the study has no such claim).

``hedge-home``: hedge minus the matched specialist (math on the math benchmarks, chat on MT-Bench),
per benchmark: an online router that finds the home drafter is not below it. ``hedge-posthoc``:
hedge minus TAPS's post hoc router (labels.POSTHOC, not deployable), average. ``hedge-merged``:
hedge minus merged trees, average (merged trees verify the union of both trees: a larger budget).
``hedge-speed``: hedge minus merged trees in tokens per second, average. ``hedge-bandit``: each
full-information hedge cell minus the bandit's (``hedge(ucb, ...)``, MetaSD's baseline), average.
``hedge-oracle``: hedge minus the per-prompt hindsight oracle (labels.ORACLE: the better specialist per
prompt, a ceiling; not deployable, and at T>0 not lossless: its rows carry ‡), average."""
from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import polars as pl

from orchestrator.report.claims import study
from orchestrator.report.claims.claim import EXPLORATORY, NAN, TIMED_APART, Cell, Claim, Row
from orchestrator.report.labels import ORACLE, POSTHOC, PROMPT_NODE
from orchestrator.report.stats import corr_ci, paired_avg_diff_ci
from orchestrator.report.tables import MATH_BENCH, aligned

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


PROPOSED_CLAIMS = (
    _proposed("switching", "acceptance-history switching beats confidence routing (proposed next experiment)",
              f"switching and {BASE}", _switching),
    _proposed("switching-early", "early acceptance (first 3 steps) predicts whole-generation acceptance "
                                 "(switching's premise)", f"switching and the step traces of {BASE}",
              _early_acceptance),
    _proposed("switching-speed", "switching's acceptance gain survives its wall-clock cost: faster than "
                                 "confidence routing", f"switching and {BASE} with wall-clock times",
                                 _switching_speed),
    _proposed("depth-adaptive-merged",
              "depth-adaptive composition beats budget-matched merged trees (proposed "
                                       "next experiment)",
              "depth_adaptive and budget-matched merged trees (merged@total_tokens)",
              partial(_depth_adaptive, rival_of=lambda cell: budget_merged(cell.methods))),
    _proposed("depth-adaptive-routing",
              "depth-adaptive composition beats confidence routing at equal node budget "
                                        "(proposed next experiment)", f"depth_adaptive and {BASE}",
              partial(_depth_adaptive, rival_of=lambda cell: BASE if BASE in cell.methods else None)),
)


PAIR = ("eagle3", "eagle2")
PAPER = {(0.0, "gsm8k"): (6.23, 4.24), (0.0, "mt_bench"): (6.13, 4.05)}  # arXiv 2503.01840, Table 1


def _relabelled(pp: pl.DataFrame) -> pl.DataFrame:
    """Both backbones' rows as one backbone whose methods are "<backbone>:<method>", so that
    ``aligned`` pairs a method of one backbone with a method of the other by prompt."""
    return (pp.filter(pl.col("backbone").is_in(list(PAIR)))
            .with_columns((pl.col("backbone") + ":" + pl.col("method")).alias("method"),
                          pl.lit("x").alias("backbone")))


def _eagle3(claim: Claim, cell: Cell) -> list[Row]:
    """One row per temperature where both backbones ran their specialists."""
    present = set(cell.prompts["backbone"].unique().to_list())
    if not set(PAIR) <= present:
        return []
    temp, sub = cell.temp, _relabelled(cell.prompts)
    groups = []
    used = []
    ratios = []
    for bn in cell.benches:
        m = "math" if bn in MATH_BENCH else "chat"
        g = aligned(sub, "x", temp, bn, f"{PAIR[0]}:{m}", f"{PAIR[1]}:{m}")
        if len(g[0]) and g[1].sum() and g[3].sum():
            groups.append(g)
            used.append(bn)
            ratios.append(f"{bn} {(g[0].sum() / g[1].sum()) / (g[2].sum() / g[3].sum()):.2f}x")
    if not groups:
        return []
    n = min(len(g[0]) for g in groups)
    what = (f"eagle3 - eagle2 matched specialist (math on math benchmarks, chat on mt_bench), average over "
            f"{', '.join(used)} (tau); ratios {', '.join(ratios)}")
    paper = [f"{bn} {a} vs {b}" for (t, bn), (a, b) in PAPER.items() if t == temp]
    ev = study.evidence(f"EAGLE-3 paper, {', '.join(paper)}" if paper
                        else "the EAGLE-3 paper gives no number "
                        f"at T={temp:g} for this model", True if paper else None)
    return [claim.tested("+".join(PAIR), temp, what, paired_avg_diff_ci(groups, p=True), n, ev)]


def _where_both_ran(backbones: list[str], temps: list[float]) -> list[tuple[str, float]]:
    return [("+".join(PAIR), t) for t in temps] if set(PAIR) <= set(backbones) else []


EAGLE3_CLAIMS = (
    Claim("eagle3",
          "EAGLE-3 drafts longer than EAGLE-2 (EAGLE-3 paper, Llama-3.1-8B-Instruct, T=0: tau 6.23 vs "
                    "4.24 on GSM8K, 6.13 vs 4.05 on MT-Bench)",
          "eagle3 and eagle2 math and chat specialists on the same prompts", EXPLORATORY, _eagle3,
          keys=_where_both_ran, across_backbones=True),
)


NOTE = "the project's own online router (issue 57): the study has no number for it"


def hedge_methods(methods) -> list[str]:
    """The report's names of the hedge cells (tables.method_expr: ``hedge(step)``, ``hedge(<options>)``)."""
    return sorted(m for m in methods if m == "hedge" or m.startswith("hedge("))


def bandit_methods(methods) -> list[str]:
    """The hedge cells whose learner is the bandit (decoding/project.py BANDITS: ``hedge(ucb, ...)``)."""
    return [m for m in hedge_methods(methods) if m.startswith("hedge(ucb")]


def _home(claim: Claim, cell: Cell) -> list[Row]:
    if not {"math", "chat"} <= cell.methods:
        return []
    out = []
    for h in hedge_methods(cell.methods):
        for bn in cell.benches:
            home = "math" if bn in MATH_BENCH else "chat"
            out.append(claim.tested(cell.backbone, cell.temp,
                                    f"{h} - {home} (matched specialist) on {bn} (tau)",
                                    *cell.on_bench(h, home, bn), study.evidence(NOTE), bench=bn))
    return out


def _against(claim: Claim, cell: Cell, rival: str, speed: bool = False) -> list[Row]:
    """Each hedge cell against ``rival``, average over benchmarks: tau, or (``speed``) tokens per
    second where both were timed."""
    if rival not in cell.methods:
        return []
    out = []
    for h in hedge_methods(cell.methods):
        if speed and not cell.timed(h, rival):
            continue
        what = f"{h} - {rival}, tokens/s, average" if speed else f"{h} - {rival}, average (tau)"
        out.append(claim.tested(cell.backbone, cell.temp, what, *(cell.speed if speed else cell.average)(h,
                rival),
                                study.evidence(NOTE)))
    return out


def _bandit(claim: Claim, cell: Cell) -> list[Row]:
    """Each full-information hedge cell against each bandit cell, average tau."""
    bandits = bandit_methods(cell.methods)
    return [claim.tested(cell.backbone, cell.temp, f"{h} - {u}, average (tau)", *cell.average(h, u),
                         study.evidence(NOTE))
            for h in hedge_methods(cell.methods) if h not in bandits for u in bandits]


def _hedge(name: str, wording: str, needs: str, check) -> Claim:
    return Claim(name, wording, needs, EXPLORATORY, check)


HEDGE_CLAIMS = (
    _hedge("hedge-home", "hedge finds the home drafter: its tau is above the matched specialist's on each "
                         "benchmark (level with it, inside the interval, is issue 57's target)",
           "hedge and the math and chat specialists", _home),
    _hedge("hedge-posthoc",
           "hedge (online, lossless) beats TAPS's post hoc router (after the fact, not deployable)",
           f"hedge and {POSTHOC}", partial(_against, rival=POSTHOC)),
    _hedge("hedge-merged", "hedge beats merged trees on acceptance length (average)", "hedge and merged",
           partial(_against, rival="merged")),
    _hedge("hedge-speed", "hedge is at least as fast as merged trees (tokens/s, average)",
           "hedge and merged with wall-clock times", partial(_against, rival="merged", speed=True)),
    _hedge("hedge-bandit", "full-information hedge beats the bandit that sees only the chosen drafter's "
                           "acceptance (UCB, as MetaSD) on acceptance length (average)",
           "a full-information hedge learner and hedge_learners ucb", _bandit),
    _hedge("hedge-oracle",
           "hedge reaches the per-prompt hindsight oracle (the better specialist per prompt; a "
                           "ceiling, not deployable; ‡ at T>0) on acceptance length (average)",
           f"hedge and the math and chat specialists ({ORACLE})", partial(_against, rival=ORACLE)),
)
