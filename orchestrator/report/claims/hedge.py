"""Checks of ``hedge``, the project's online router (decoding/hedge.py; issues 57, 64): does it find the
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

from functools import partial

from ..labels import ORACLE, POSTHOC
from ..tables import MATH_BENCH
from . import study
from .claim import EXPLORATORY, Cell, Claim, Row

NOTE = "the project's own online router (issue 57): the study has no number for it"


def hedge_methods(methods) -> list[str]:
    """The report's names of the hedge cells (tables.method_expr: ``hedge(step)``, ``hedge(<options>)``)."""
    return sorted(m for m in methods if m == "hedge" or m.startswith("hedge("))


def bandit_methods(methods) -> list[str]:
    """The hedge cells whose learner is the bandit (decoding/hedge.py BANDITS: ``hedge(ucb, ...)``)."""
    return [m for m in hedge_methods(methods) if m.startswith("hedge(ucb")]


def _home(claim: Claim, cell: Cell) -> list[Row]:
    if not {"math", "chat"} <= cell.methods:
        return []
    out = []
    for h in hedge_methods(cell.methods):
        for bn in cell.benches:
            home = "math" if bn in MATH_BENCH else "chat"
            out.append(claim.tested(cell.backbone, cell.temp, f"{h} - {home} (matched specialist) on {bn} (tau)",
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
        out.append(claim.tested(cell.backbone, cell.temp, what, *(cell.speed if speed else cell.average)(h, rival),
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


CLAIMS = (
    _hedge("hedge-home", "hedge finds the home drafter: its tau is above the matched specialist's on each "
                         "benchmark (level with it, inside the interval, is issue 57's target)",
           "hedge and the math and chat specialists", _home),
    _hedge("hedge-posthoc", "hedge (online, lossless) beats TAPS's post hoc router (after the fact, not deployable)",
           f"hedge and {POSTHOC}", partial(_against, rival=POSTHOC)),
    _hedge("hedge-merged", "hedge beats merged trees on acceptance length (average)", "hedge and merged",
           partial(_against, rival="merged")),
    _hedge("hedge-speed", "hedge is at least as fast as merged trees (tokens/s, average)",
           "hedge and merged with wall-clock times", partial(_against, rival="merged", speed=True)),
    _hedge("hedge-bandit", "full-information hedge beats the bandit that sees only the chosen drafter's "
                           "acceptance (UCB, as MetaSD) on acceptance length (average)",
           "a full-information hedge learner and hedge_learners ucb", _bandit),
    _hedge("hedge-oracle", "hedge reaches the per-prompt hindsight oracle (the better specialist per prompt; a "
                           "ceiling, not deployable; ‡ at T>0) on acceptance length (average)",
           f"hedge and the math and chat specialists ({ORACLE})", partial(_against, rival=ORACLE)),
)
