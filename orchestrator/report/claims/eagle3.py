"""The third backbone against the study's (issue #40): does EAGLE-3 draft longer than EAGLE-2 when
both are trained on the same data? The EAGLE-3 paper's claim, checked per run: each benchmark's
matched specialist (the math drafter on math benchmarks, the chat drafter on MT-Bench) of each
backbone on the same prompts, tau paired by prompt, averaged over benchmarks. Not a claim of the
study (arXiv 2603.27027), so its rows are in the exploratory Holm family."""
from __future__ import annotations

import polars as pl

from ..stats import paired_avg_diff_ci
from ..tables import MATH_BENCH, aligned
from . import study
from .claim import EXPLORATORY, Cell, Claim, Row

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
    groups, used, ratios = [], [], []
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
    ev = study.evidence(f"EAGLE-3 paper, {', '.join(paper)}" if paper else "the EAGLE-3 paper gives no number "
                        f"at T={temp:g} for this model", True if paper else None)
    return [claim.tested("+".join(PAIR), temp, what, paired_avg_diff_ci(groups, p=True), n, ev)]


def _where_both_ran(backbones: list[str], temps: list[float]) -> list[tuple[str, float]]:
    return [("+".join(PAIR), t) for t in temps] if set(PAIR) <= set(backbones) else []


CLAIMS = (
    Claim("eagle3", "EAGLE-3 drafts longer than EAGLE-2 (EAGLE-3 paper, Llama-3.1-8B-Instruct, T=0: tau 6.23 vs "
                    "4.24 on GSM8K, 6.13 vs 4.05 on MT-Bench)",
          "eagle3 and eagle2 math and chat specialists on the same prompts", EXPLORATORY, _eagle3,
          keys=_where_both_ran, across_backbones=True),
)
