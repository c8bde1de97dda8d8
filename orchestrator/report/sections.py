"""The report's sections after the summary: the routers of the run, the figures (with Figure 6's
tables), Table 1 per backbone and temperature, and the appendix."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from orchestrator.report import figures
from orchestrator.report.labels import ROUTED, SPEED_ROUTED
from orchestrator.report.markdown import md_table, p_text
from orchestrator.report.prose import AVERAGE_W, CLAIMS_NOTE, LAMBDA_NOTE, SPEED_NOTE, STUDY_NOTE, TABLE2_NOTE
from orchestrator.report.routers import (
    LOSSY_MARK,
    NOT_DEPLOYABLE,
    NOT_LOSSLESS,
    POSTHOC,
    POSTHOCS,
    describe,
    is_router,
    lossless,
    mark_lossy,
)
from orchestrator.report.study_tables import comparison_note
from orchestrator.report.tables import lambda_table, table1_wide

SaveTable = Callable[[pl.DataFrame, str], None]


def routers_section(by_prompt: pl.DataFrame) -> list[str]:
    """What each router and composition of the run is, by name (the post hoc one marked not deployable)."""
    if "strategy" not in by_prompt.columns:
        return []
    names = sorted(set(by_prompt.filter(is_router() | pl.col("strategy").is_in(
        ["switching", "depth_adaptive", "hedge", "oracle"]))["method"].to_list()))
    if not names:
        return []
    rows = pl.DataFrame({"method": names, "what it is": [describe(m) for m in names],
                         "headline": [("RQ3a/RQ3b/RQ4" if m == ROUTED else "speed" if m == SPEED_ROUTED
                                       else "")
                                      for m in names]})
    out = ["## Routers and compositions in this run\n", md_table(rows)]
    for m in POSTHOCS:
        if m in names and "posthoc_tie_fallback" in by_prompt.columns:
            n = int(by_prompt.filter(pl.col("method") == m)["posthoc_tie_fallback"].fill_null(False).sum())
            if n:
                out.append(f"{n} near-tie prompt(s) of `{m}` had no mixed-checkpoint run and took the higher "
                           "specialist.\n")
    return out


def _backbone_figures(t1: pl.DataFrame, entropy: pl.DataFrame, depth: pl.DataFrame, backbone: str,
                      temps: list[float], out: Path, save_table: SaveTable) -> list[str]:
    """Figure 1 per temperature, Figure 6 with its table per temperature (every λ of the sweep,
    tables/fig6_lambda_*), Figures 7 and 8."""
    md = []
    for t in temps:
        f = figures.fig_tau(t1, backbone, t, out / f"fig1_tau_{backbone}_T{t:g}.png")
        if f:
            md.append(f"![acceptance length, {backbone}, T={t:g}]({f.name})\n")
    for t in temps:
        f, lt = figures.fig_lambda(t1, backbone, t, out / f"fig6_lambda_{backbone}_T{t:g}.png"), \
            lambda_table(t1, backbone, t)
        if f and not lt.is_empty():
            save_table(lt, f"fig6_lambda_{backbone}_T{t:g}")
            md += [f"### Figure 6 — weight averaging along λ ({backbone}, T={t:g})\n", LAMBDA_NOTE,
                   f"![Figure 6, {backbone}, T={t:g}]({f.name})\n", md_table(lt)]
    extra = (("Figure 7 — draft entropy, accepted vs rejected",
              figures.fig_entropy(entropy, backbone, temps[0], out / f"fig7_entropy_{backbone}.png")
              if not entropy.is_empty() else None),
             ("Figure 8 — acceptance rate by depth",
              figures.fig_depth(depth, backbone, temps[0], out / f"fig8_depth_{backbone}.png")
              if not depth.is_empty() else None))
    for title, f in extra:
        if f:
            md += [f"### {title} ({backbone})\n", f"![{title}]({f.name})\n"]
    return md


def figures_section(t1: pl.DataFrame, speed: pl.DataFrame, entropy: pl.DataFrame, depth: pl.DataFrame,
                    backbones: list[str], temps: list[float], out: Path, save_table: SaveTable) -> list[str]:
    """Every figure, drawn into ``out``: per backbone (_backbone_figures), then the speedups."""
    md = ["## Figures\n"]
    for b in backbones:
        md += _backbone_figures(t1, entropy, depth, b, temps, out, save_table)
    for t in temps:
        f = figures.fig_speed(speed, t, out / f"fig_speed_T{t:g}.png")
        if f:
            md.append(f"![speedup over generate, T={t:g}]({f.name})\n")
    return md


def marked_method(temperature: float) -> pl.Expr:
    """The method column with LOSSY_MARK on the methods not lossless at ``temperature``."""
    return mark_lossy(temperature)


def marked(df: pl.DataFrame) -> pl.DataFrame:
    """A table for people: its ``method`` marked per row's ``temperature`` (mark_lossy); as it is without
    them."""
    return df.with_columns(mark_lossy()) if {"method", "temperature"} <= set(df.columns) else df


def table1_section(t1: pl.DataFrame, backbones: list[str], temps: list[float]) -> list[str]:
    """Table 1 per backbone and temperature: τ [95% CI] per benchmark, the lossy methods marked."""
    md = []
    for b in backbones:
        for t in temps:
            md.append(f"## Table 1 — {b}, T={t:g}: acceptance length [95% CI]\n")
            tw = table1_wide(t1, b, t)
            md.append(md_table(tw.with_columns(marked_method(t))))
            md.append(f"`average`: over the benchmarks, {AVERAGE_W}.\n")
            if not all(lossless(m, t) for m in tw["method"]):
                md.append(NOT_LOSSLESS + "\n")
            if t1.filter((pl.col("method") == POSTHOC) & (pl.col("backbone") == b)).height:
                md.append(f"`{POSTHOC}`: {NOT_DEPLOYABLE}; the study's Table 1 routing numbers are this "
                          "router's.\n")
    return md


CLAIM_COLUMNS = ("claim", "family", "backbone", "temperature", "comparison", "prompts", "estimate", "ci_lo",
                 "ci_hi",
                 "p_value", "verdict", "p_holm", "verdict_holm", "study", "study_consistent", "study_note")
SPEED_COLUMNS = ("backbone", "method", "benchmark", "temperature", "tokens_per_s", "tokens_per_s_lo",
                 "tokens_per_s_hi", "speedup", "vs_autoregressive", "calls_per_token", "mean_tree_size",
                 "draft_share", "verify_share", "tokens_per_verified_node", "paired_baseline",
                 "outputs_equal_generate")


def appendix(run_name: str, t1: pl.DataFrame, tables: dict[str, pl.DataFrame]) -> list[str]:
    """Every claim comparison, the wordings, the study's numbers beside ours, Tables 2-8 and the speed of
    every cell. ``tables``: the report's tables by their file name (build.py)."""
    claims, study = tables["claims"], tables["study_vs_ours"]
    ours = marked(study.filter(pl.col("our_tau").is_not_null()))
    shown = [marked(tables[k]) for k in ("table2_routing", "speed")]
    lossy = any(LOSSY_MARK in str(v) for t in (ours, *shown) if "method" in t.columns
                for v in t["method"]) or \
        any(LOSSY_MARK in str(v) for v in (claims["comparison"] if "comparison" in claims.columns else []))
    return [f"# Appendix to the report for `{run_name}`\n", *([NOT_LOSSLESS + "\n"] if lossy else []),
            "## Claims of the study, checked on this run (every comparison)\n",
            CLAIMS_NOTE,
            md_table(p_text(claims.select(*CLAIM_COLUMNS)) if not claims.is_empty() else claims),
            "## Each claim as the study words it\n",
            md_table(claims.select("claim", "wording").unique("claim", maintain_order=True)
                     if not claims.is_empty() else claims),
            "## The study's numbers beside ours (acceptance length)\n",
            STUDY_NOTE + comparison_note(t1) + "\n",
            md_table(ours if ours.height else study.head(0)),
            "## Table 2 — routing decisions per prompt, every router by name\n", TABLE2_NOTE,
            md_table(shown[0]),
            "## Tables 3–4 — entropy (nats) of accepted vs first-rejected tokens\n",
            md_table(tables["table3_4_entropy"]),
            "## Tables 5–8 — acceptance rate by depth\n", md_table(tables["table5_8_depth"]),
            "## Tables 5–8, deeper levels (depth > 5; the study's tables stop at 5)\n",
            md_table(tables["table5_8_depth_deeper"]),
            "## Wall-clock speed, every cell (same run, same machine)\n", SPEED_NOTE,
            md_table(shown[1].select(*SPEED_COLUMNS))]
