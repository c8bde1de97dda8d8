"""The report's first screen (``summary_section``): what the run shows (headline.py), the headline τ
table, the speed against ``generate`` and what failed; then every claim's verdict (``claims_section``)."""
from __future__ import annotations

import polars as pl

from orchestrator.report.claims import MIN_PROMPTS, STUDY
from orchestrator.report.headline import headline_section
from orchestrator.report.labels import AFTER_THE_FACT
from orchestrator.report.markdown import md_table
from orchestrator.report.prose import AVERAGE_W, CLAIMS_SUMMARY, RQ3C_SCALE, routing_headline
from orchestrator.report.routers import LOSSY_MARK, NOT_LOSSLESS, is_router
from orchestrator.report.tables import GENERATE, STUDY_W, bench_weight, weighted_mean
from orchestrator.report.verdicts import estimate_text, hidden_reasons, verdict_shown, verdict_word

HEADLINE_ROWS = 12


def _counts(verdicts: list[str]) -> str:
    words = [verdict_word(v) for v in verdicts]
    order = ("holds", "does not hold", "inconclusive")
    return ", ".join(f"{w} {words.count(w)}/{len(words)}" for w in sorted(set(words),
            key=(order + tuple(words)).index))


def claims_grid(cl: pl.DataFrame) -> pl.DataFrame:
    """One row per claim, one column per backbone and temperature (the summary's claim table);
    "Holm: ..." where the Holm-adjusted verdict differs, "†" where the study's own numbers
    contradict the claim's wording in that cell, "not run" where the run has no cells for it."""
    cols, rows = [], {}
    has_holm, has_study = "verdict_holm" in cl.columns, "study_consistent" in cl.columns
    for (claim, bb, t), g in cl.group_by("claim", "backbone", "temperature", maintain_order=True):
        col = f"{bb} T={t:g}"
        cols += [col] if col not in cols else []
        raw = g["verdict"].to_list()
        holm = g["verdict_holm"].to_list() if has_holm else raw
        if all("not in this run" in v for v in raw):
            cell = "not run"
        elif g.height == 1:
            r = g.row(0, named=True)
            cell = f"{estimate_text(r['estimate'], r['ci_lo'], r['ci_hi'])} {verdict_shown(r)}"
            cell += (f" (Holm: {verdict_word(holm[0])})"
                     if verdict_word(holm[0]) != verdict_word(raw[0]) else "")
        else:
            cell = _counts(raw)
            cell += f" (Holm: {_counts(holm)})" if _counts(holm) != cell else ""
            cell += hidden_reasons(g)
        if has_study and (g["study_consistent"].fill_null(True) == False).any():  # noqa: E712
            cell += " †"
        if "comparison" in g.columns and any(LOSSY_MARK in str(c) for c in g["comparison"].to_list()):
            cell += f" {LOSSY_MARK}"  # compared with a method not lossless at this temperature
        rows.setdefault(claim, {"claim": claim})[col] = cell
    return pl.DataFrame([{c: r.get(c, "—") for c in ["claim", *cols]} for r in rows.values()])


def _claims_footer(cl: pl.DataFrame) -> list[str]:
    """The family-wise line and, per claim the study's own numbers contradict, one line saying where."""
    out = []
    if "verdict_holm" in cl.columns:
        fam = cl["family"] if "family" in cl.columns else pl.Series([STUDY] * cl.height)
        for name in dict.fromkeys(fam.to_list()):
            g = cl.filter(fam == name)
            tests = int(g["p_holm"].is_not_nan().sum())
            if name != STUDY and not tests:
                continue
            raw = sum(verdict_word(v) in ("holds", "does not hold") for v in g["verdict"])
            kept = sum(verdict_word(v) in ("holds", "does not hold") for v in g["verdict_holm"])
            size = (f" in a family of {g['family_size'][0]} (fixed by the profile's grid; the untested "
                    "count as "
                    "p = 1)") if name == STUDY and "family_size" in g.columns else ""
            out.append(f"Holm-Bonferroni, {name} family: {tests} tests{size}, family-wise 5%: {kept} of "
                       f"{raw} "
                       "conclusive verdicts stay conclusive (`verdict_holm` in `tables/claims.csv`).\n")
    if "study_consistent" in cl.columns:
        bad = cl.filter(pl.col("study_consistent") == False)  # noqa: E712 - polars expression
        for claim, g in bad.group_by("claim", maintain_order=True):
            out.append(f"† {claim[0]}: the study's own numbers contradict its wording in at least one cell: "
                       f"{g['study'][0]}.")
        out += [""] if bad.height else []
    return out


def _tau_by_column(t1: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """(methods x backbone/temperature, "τ (tau_taps)" mean over benchmarks, best first; the columns
    at T>0). The autoregressive row (backbone "none") is shown under every backbone."""
    real = sorted(set(t1["backbone"].to_list()) - {"none"}) or ["none"]
    shared = t1.filter(pl.col("backbone") == "none")  # autoregressive: one row for every backbone's column
    t1b = pl.concat([t1.filter(pl.col("backbone") != "none")]
                    + [shared.with_columns(pl.lit(b).alias("backbone")) for b in real])
    temp = {t: f"T={t:g}" for t in t1b["temperature"].unique().to_list()}
    w = bench_weight(t1b["benchmark"].to_list())  # over benchmarks as Table 1's average: 1 chat : 3 math
    if "tau_taps" not in t1b.columns:
        t1b = t1b.with_columns(pl.lit(None, dtype=pl.Float64).alias("tau_taps"))
    head = (t1b.with_columns(pl.format("{} {}", pl.col("backbone"),
                                       pl.col("temperature").replace_strict(temp,
                                               return_dtype=pl.String)).alias("col"))
            .group_by("method", "col").agg(weighted_mean("tau", w), weighted_mean("tau_taps", w)))
    wide = head.pivot(on="col", index="method", values="tau")
    cols = sorted(c for c in wide.columns if c != "method")
    both = pl.format("{} ({})", pl.col("tau").round(2), pl.col("tau_taps").round(2))
    cells = head.with_columns(both.alias("v")).pivot(on="col", index="method", values="v")
    order = wide.with_columns(pl.mean_horizontal(*cols).alias("_mean")).select("method", "_mean")
    wide = (cells.join(order, on="method").sort(["_mean", "method"], descending=[True, False])
            .select("method", *cols)
            .with_columns(pl.col(c).fill_null("—") for c in cols))
    hot = [c for c in cols if any(c.endswith(f" {temp[t]}") for t in temp if t > 0)]
    return wide, hot


def _tau_section(t1: pl.DataFrame) -> list[str]:
    """The headline τ table, the post hoc router's T>0 cells marked not lossless."""
    wide, hot = _tau_by_column(t1)
    wide = wide.with_columns(pl.when(pl.col("method").is_in(list(AFTER_THE_FACT)) & (pl.col(c) != "—"))
                             .then(pl.col(c) + f" {LOSSY_MARK}").otherwise(pl.col(c)).alias(c) for c in hot)
    more = max(0, wide.height - HEADLINE_ROWS)
    md = ["**Acceptance length τ**: ours (in brackets `tau_taps`, τ as the study's code computes the numbers "
          f"of its tables); mean over benchmarks, {AVERAGE_W}; per benchmark with CIs in Table 1"
          + (f"; {more} more method(s) there" if more else "") + "\n", md_table(wide.head(HEADLINE_ROWS), 2)]
    if any(LOSSY_MARK in str(v) for c in hot for v in wide.head(HEADLINE_ROWS)[c]):
        md.append(NOT_LOSSLESS + "\n")
    return md


def _claims_section(cl: pl.DataFrame) -> list[str]:
    """The claim grid, the claims without cells, the family-wise lines and the prompt-rule count."""
    md = [CLAIMS_SUMMARY]
    ran = cl.filter(~pl.col("verdict").str.contains("not in this run", literal=True))
    md.append(md_table(claims_grid(ran)) if ran.height else "_no claim has cells in this run_\n")
    if "comparison" in ran.columns and any(LOSSY_MARK in str(c) for c in ran["comparison"].to_list()):
        md.append(f"{LOSSY_MARK} in a verdict cell: a comparison there is with a method not lossless at that "
                  f"temperature. {NOT_LOSSLESS}\n")
    idle = [c for c in dict.fromkeys(cl["claim"].to_list()) if c not in set(ran["claim"].to_list())]
    if idle:
        md.append(f"Not checked (no cells in this run; `tables/claims.csv` says what each needs): "
                  f"{', '.join(idle)}.\n")
    md += _claims_footer(cl)
    if ran.filter(pl.col("claim").is_in(["RQ3c", "RQ3c-cells"])).height:
        md.append(RQ3C_SCALE)
    few = sum(f"< {MIN_PROMPTS} prompts" in v for v in cl["verdict"].to_list())
    if few:
        md.append(f"{few} of {cl.height} comparisons are inconclusive because fewer than {MIN_PROMPTS} "
                  "prompts "
                  "were paired on a benchmark (the project's rule, not the study's; a benchmark without rows "
                  "has 0), whatever their interval says.\n")
    return md


def _speed_section(speed: pl.DataFrame) -> list[str]:
    """The 3 fastest methods per backbone and temperature against the baseline, if anything was timed."""
    own = speed.filter(pl.col("method") != GENERATE)
    if own.is_empty() or own["speedup"].null_count() >= own.height:
        return []
    base = speed["baseline"][0]
    w = bench_weight(own["benchmark"].to_list())  # as every tau average: 1 chat : 3 math
    mean = weighted_mean("speedup", w).fill_nan(None).round(2)
    per = (own.group_by("backbone", "temperature", "method").agg(mean)
           .sort(["speedup", "method"], descending=[True, False], nulls_last=True)
           .group_by("backbone", "temperature", maintain_order=True).head(3)
           .sort(["backbone", "temperature", "speedup", "method"], descending=[False, False, True, False],
                 nulls_last=True))
    md = [f"**Speed against `{base}`** (same run, same prompts; the 3 fastest methods per backbone and "
          f"temperature, mean over benchmarks, {STUDY_W}; every cell in the appendix)\n",
          md_table(per.rename({"speedup": f"speedup vs {base}"}), 2)]
    mixed = own.filter(pl.col("same_invocation") == False)  # noqa: E712 - polars expression
    if mixed.height:
        md.append(f"{mixed.height} of {own.height} speed cells were timed in another grid invocation than "
                  "their "
                  "`generate` baseline (a resumed run): the machine's load may differ, so those ratios are "
                  "not speed measurements (`same_invocation` in the speed table).\n")
    return md


def summary_section(t1: pl.DataFrame, speed: pl.DataFrame, cl: pl.DataFrame, problems: list[str],
                    by_prompt: pl.DataFrame, report_cfg: dict | None = None) -> list[str]:
    """One screen: what the run shows (the named strategy's speed, the home specialists' τ, the claims
    that concluded: headline.py), the headline τ table, the speed against generate, what failed. Every
    claim's verdict follows in ``claims_section``, below the first screen."""
    n_prompts = by_prompt.select("benchmark", "prompt_id").n_unique()
    backbones = sorted(set(t1["backbone"].to_list()) - {"none"}) if "backbone" in t1.columns else []
    md = ["## Summary\n", *headline_section(by_prompt, t1, cl, report_cfg or {}, backbones),
          f"{t1.height} cells over {n_prompts} prompts; {len(problems)} problem line(s) (under *What "
          "failed*).\n"]
    md += _tau_section(t1)
    if "strategy" in by_prompt.columns and by_prompt.filter(is_router()).height:
        md.append(routing_headline())
    md += _speed_section(speed)
    md.append("**What failed**\n")
    md += (problems[:8] + ([f"- ... {len(problems) - 8} more"] if len(problems) > 8 else [])) if problems \
        else ["- nothing"]
    md.append("")
    return md


def claims_section(cl: pl.DataFrame) -> list[str]:
    """Every claim's verdict (conclusive or not), below the summary."""
    return ["## Claims of the study: every verdict\n", *_claims_section(cl)] if not cl.is_empty() else []
