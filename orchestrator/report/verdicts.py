"""The verdict table: one row per checked comparison of a run's claims (tables/claims.csv), with
the study's statement, the encoded comparison, the estimate and its 95% interval, the raw and the
Holm verdict with its reason, and the family; then the claims the run could not check, with what
each needs. Generated from the claims frame alone, so a table in the docs can be rebuilt from the
run it names (``python experiments/verdicts.py --run DIR``)."""
from __future__ import annotations

import math

import polars as pl

COLUMNS = ("claim", "family", "backbone", "temperature", "benchmark", "comparison", "prompts", "estimate",
           "ci_lo", "ci_hi", "verdict", "verdict_holm", "wording")


def _num(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.2f}"


def _interval(r: dict) -> str:
    if r["estimate"] is None or (isinstance(r["estimate"], float) and math.isnan(r["estimate"])):
        return "no estimate"
    if any(r[k] is None or (isinstance(r[k], float) and math.isnan(r[k])) for k in ("ci_lo", "ci_hi")):
        return f"{_num(r['estimate'])} [no interval: fewer than 2 prompts]"
    return f"{_num(r['estimate'])} [{_num(r['ci_lo'])}, {_num(r['ci_hi'])}]"


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
    head = ("| claim | family | backbone | T | benchmark | comparison | prompts | estimate [95% CI] | verdict "
            "| Holm | the study's statement |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in ran.iter_rows(named=True):
        holm = r["verdict_holm"] if r["verdict_holm"] != r["verdict"] else "same"
        lines.append("| " + " | ".join(_cell(x) for x in (
            r["claim"], r["family"], r["backbone"], f"{r['temperature']:g}", r["benchmark"] or "average",
            r["comparison"], r["prompts"], _interval(r), r["verdict"], holm, r["wording"])) + " |")
    out = "\n".join(lines) + "\n"
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
        words = [v.split(" (")[0] for v in g["verdict"]]
        holm = [v.split(" (")[0] for v in g["verdict_holm"]]
        parts.append(f"{fam[0]}: {g.height} comparisons; raw holds {words.count('holds')}, does not hold "
                     f"{words.count('does not hold')}; after Holm holds {holm.count('holds')}, does not hold "
                     f"{holm.count('does not hold')}")
    return "; ".join(parts)
