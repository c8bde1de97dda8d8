"""The verdict table: one row per checked comparison of a run's claims (tables/claims.csv), with
the study's statement, the encoded comparison, the estimate and its 95% interval, the raw and the
Holm verdict with its reason, and the family; then the claims the run could not check, with what
each needs. Generated from the claims frame alone, so a table in the docs can be rebuilt from the
run it names (``python experiments/verdicts.py --run DIR``)."""
from __future__ import annotations

import re

import polars as pl

from orchestrator.report.routers import LOSSY_MARK, NOT_LOSSLESS

COLUMNS = ("claim", "family", "backbone", "temperature", "benchmark", "comparison", "prompts", "estimate",
           "ci_lo", "ci_hi", "verdict", "verdict_holm", "wording")


def verdict_word(v: str) -> str:
    """holds / does not hold / inconclusive, without the reason in brackets."""
    return v.split(" (")[0]


def estimate_text(est, lo, hi) -> str:
    """"+0.12 [+0.05, +0.20]"; an interval that cannot be computed (one prompt) is said, not printed as
    nan."""
    if est is None or est != est:
        return "no estimate"
    if lo is None or hi is None or lo != lo or hi != hi:
        return f"{est:+.2f} [no interval: fewer than 2 prompts]"
    return f"{est:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def _excludes_zero(r: dict) -> bool:
    lo, hi = r.get("ci_lo"), r.get("ci_hi")
    return lo is not None and hi is not None and lo == lo and hi == hi and (lo > 0 or hi < 0)


def verdict_shown(r: dict) -> str:
    """The verdict's word, with its reason where the interval alone would suggest otherwise (an
    inconclusive row whose interval excludes 0: too few prompts, timed apart)."""
    v = r["verdict"]
    return v if verdict_word(v) == "inconclusive" and _excludes_zero(r) else verdict_word(v)


def hidden_reasons(g: pl.DataFrame) -> str:
    """For a multi-row cell: how many inconclusive rows have an interval excluding 0, and why."""
    why = [r["verdict"].split(" (", 1)[1].rstrip(")") for r in g.iter_rows(named=True)
           if verdict_word(r["verdict"]) == "inconclusive" and " (" in r["verdict"] and _excludes_zero(r)]
    if not why:
        return ""
    reasons = sorted(set(re.sub(r"n=\d+", "n", w) for w in why))
    return f"; {len(why)} inconclusive with an interval excluding 0 ({'; '.join(reasons)})"


def _cell(v) -> str:
    return "—" if v is None else str(v).replace("|", "\\|")


def verdict_table(cl: pl.DataFrame) -> str:
    """Markdown: the checked rows (one per comparison, in the claims frame's order), then one line
    per claim that has no cells in the run. ``cl``: check_claims' frame or tables/claims.csv."""
    missing = [c for c in COLUMNS if c not in cl.columns]
    if missing:
        raise ValueError(f"claims table lacks the columns {missing} (is it tables/claims.csv of a report?)")
    if cl.is_empty():
        return "_no claims in this run_\n"
    idle = pl.col("verdict").str.contains("not in this run", literal=True)
    ran, not_run = cl.filter(~idle), cl.filter(idle)
    head = ("| claim | family | backbone | T | benchmark | comparison | prompts | estimate [95% CI] | "
            "verdict "
            "| Holm | the study's statement |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in ran.iter_rows(named=True):
        holm = r["verdict_holm"] if r["verdict_holm"] != r["verdict"] else "same"
        lines.append("| " + " | ".join(_cell(x) for x in (
            r["claim"], r["family"], r["backbone"], f"{r['temperature']:g}", r["benchmark"] or "average",
            r["comparison"], r["prompts"], estimate_text(r["estimate"], r["ci_lo"], r["ci_hi"]), r["verdict"],
            holm,
            r["wording"])) + " |")
    out = "\n".join(lines) + "\n"
    if any(LOSSY_MARK in str(c) for c in ran["comparison"].to_list()):
        out += f"\n{NOT_LOSSLESS}\n"
    if not_run.height:
        out += "\nNot checked in this run (what each needs):\n\n"
        for claim, g in not_run.group_by("claim", maintain_order=True):
            why = g["verdict"][0].split("needs ", 1)[-1].rstrip(")")
            where = ", ".join(sorted({f"{b} T={t:g}" for b, t in zip(g["backbone"], g["temperature"])}))
            out += f"- `{claim[0]}` ({where}): needs {why}\n"
    return out


def headline(cl: pl.DataFrame) -> str:
    """One line per family: verdicts counted, raw and after Holm."""
    idle = pl.col("verdict").str.contains("not in this run", literal=True)
    parts = []
    for fam, g in cl.filter(~idle).group_by("family", maintain_order=True):
        words = [verdict_word(v) for v in g["verdict"]]
        holm = [verdict_word(v) for v in g["verdict_holm"]]
        parts.append(f"{fam[0]}: {g.height} comparisons; raw holds {words.count('holds')}, does not hold "
                     f"{words.count('does not hold')}; after Holm holds {holm.count('holds')}, does not hold "
                     f"{holm.count('does not hold')}")
    return "; ".join(parts)
