"""python experiments/report.py --run DIR -> DIR/report/{report.md, report.html, *.png, tables/*}."""
from __future__ import annotations

import html
import json
from pathlib import Path

import polars as pl

from common.atomic import atomic_file, write_text_atomic

from ..manifest import read_manifest

from . import figures
from .claims import MIN_PROMPTS, ROUTED, SPEED_ROUTED, check_claims, study_comparison
from .claims_next import BASE as NEXT_BASE
from .claims_next import EARLY_STEPS
from .duplicates import check_unique, refuse
from .claims_family import STUDY, Grid
from .claims_study import comparison_note
from .routers import (HEADS_LAST, LOSSY_MARK, NOT_DEPLOYABLE, NOT_LOSSLESS, POSTHOC, POSTHOCS, describe, is_router,
                      lossless, table2, with_posthoc)
from .steps import PASS_ROWS, read_steps
from .tables import (GENERATE, depth_table, depth_table_deeper, entropy_table, lambda_table, per_prompt, scan,
                     speed, table1, table1_wide, trace_files)
from .verdicts import estimate_text as _estimate_text
from .verdicts import headline as verdict_headline
from .verdicts import hidden_reasons as _hidden_reasons
from .verdicts import verdict_shown as _verdict_shown
from .verdicts import verdict_table
from .verdicts import verdict_word as _verdict_word


def _md(df: pl.DataFrame, digits: int = 3) -> str:
    if df.is_empty():
        return "_no data_\n"
    df = df.with_columns([pl.col(c).round(digits) for c, t in df.schema.items() if t in (pl.Float64, pl.Float32)])
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.iter_rows():
        lines.append("| " + " | ".join("—" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def _save_table(df: pl.DataFrame, out: Path, name: str) -> None:
    (out / "tables").mkdir(parents=True, exist_ok=True)
    if df.is_empty():
        return
    flat = df.select([c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct))])
    for ext, fn in (("csv", flat.write_csv), ("parquet", df.write_parquet)):
        with atomic_file(out / "tables" / f"{name}.{ext}") as tmp:
            fn(tmp)


def missing_section(run: Path, pp: pl.DataFrame | None) -> list[str]:
    lines = []
    data = read_manifest(run / "manifest.json")
    if data is not None:
        failed = [(c["stage"], c["name"], (c.get("error") or "")[:160])
                  for c in current_failures(data["cells"], data.get("plan"))]
        for stage, name, err in sorted(failed):
            lines.append(f"- FAILED {stage}: `{name}` — {err}")
        prof = run / "profile.json"
        if prof.is_file() and pp is not None:
            expected = json.loads(prof.read_text())["eval"]["benchmarks"]
            present = set(pp["benchmark"].unique().to_list())
            for b in expected:
                if b not in present:
                    lines.append(f"- benchmark `{b}` has no rows in traces/ (every cell failed or was not run)")
    else:
        lines.append("- manifest.json is missing: failures cannot be listed")
    return lines


def planned(cells: dict, plan: dict | None) -> dict:
    """The records of ``cells`` that belong to the last configuration run: a stage with a plan in
    the manifest (``Manifest.set_plan``) keeps only its planned keys; a stage without one (and a
    manifest from before plans) keeps every record."""
    keep = {stage: set(keys) for stage, keys in (plan or {}).items()}
    return {k: c for k, c in cells.items() if c["stage"] not in keep or k in keep[c["stage"]]}


def current_failures(cells: dict, plan: dict | None = None) -> list[dict]:
    """Failed records of the planned units (see ``planned``) not superseded: a unit that failed and
    was later done under the same stage and name (e.g. a cell skipped for a missing drafter, then
    run once the drafter was trained)."""
    cells = planned(cells, plan)
    done = {(c["stage"], c["name"]) for c in cells.values() if c["status"] == "done"}
    return [c for c in cells.values() if c["status"] != "done" and (c["stage"], c["name"]) not in done]


def recorded_traces(run: Path) -> set[str] | None:
    """Trace files the manifest records for the finished eval units of the last configuration run
    (None without a manifest). A rerun that retrains a drafter gives its cells new keys; the old
    units' records and files stay, and are not read (the report lists their files as ignored)."""
    data = read_manifest(run / "manifest.json")
    if data is None:
        return None
    cells = planned(data["cells"], data.get("plan")).values()
    return {f for c in cells if c["stage"] == "eval" and c["status"] == "done" for f in c.get("files", [])}


def build_report(run_dir, pass_rows: int = PASS_ROWS) -> Path:
    """The report of a run. The step table is never held whole: its per-prompt reductions are read
    in passes of at most about ``pass_rows`` rows (steps.py), its per-cell tables are lazy queries."""
    run = Path(run_dir)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    recorded = recorded_traces(run)
    prompts, steps = scan(run, "prompts", recorded), scan(run, "steps", recorded)
    check_unique(prompts, "prompts", str(run / "traces" / "prompts"))  # (DuplicateRows) before any sum
    summary = read_steps(run, trace_files(run, "steps", recorded)[0], NEXT_BASE, EARLY_STEPS, pass_rows)
    refuse(summary.duplicates if summary else pl.DataFrame(), str(run / "traces" / "steps"), "steps")
    md = [f"# Task-aware speculative decoding — report for `{run.name}`\n"]
    pp = per_prompt(prompts) if prompts is not None else None
    miss = missing_section(run, pp)
    stale = trace_files(run, "prompts", recorded)[1] + trace_files(run, "steps", recorded)[1]
    if stale:
        miss.append(f"- {len(stale)} trace file(s) under traces/ are not recorded by the manifest (an earlier "
                    f"configuration, or a unit that failed when redone) and were ignored:")
        miss += [f"  - `{f.relative_to(run)}`" for f in stale[:20]] + (["  - ..."] if len(stale) > 20 else [])
    if pp is None or pp.is_empty():
        md.append("No prompt traces found under traces/prompts: nothing to report.\n")
        md += ["## Missing\n"] + miss
        p = out / "report.md"
        write_text_atomic(p, "\n".join(md))
        write_text_atomic(out / "report.html", f"<pre>{html.escape(chr(10).join(md))}</pre>")
        return p
    prof = json.loads((run / "profile.json").read_text()) if (run / "profile.json").is_file() else {}
    pair = tuple(prof.get("eval", {}).get("route_pair", ("math", "chat")))
    pp = with_posthoc(pp, summary, pair[:2], prof.get("eval", {}).get("mixed_variant", "mixed_full"))
    t1 = table1(pp)
    sp = speed(pp)
    rt = table2(pp, steps)
    ent = entropy_table(summary) if summary is not None else pl.DataFrame()
    dep = depth_table(steps) if steps is not None else pl.DataFrame()
    dep_deep = depth_table_deeper(steps) if steps is not None else pl.DataFrame()
    cl = check_claims(pp, summary, dep if not dep.is_empty() else None, pair, Grid.from_profile(prof, pp))
    study = study_comparison(t1)
    for name, df in (("table1_acceptance", t1), ("speed", sp), ("table2_routing", rt), ("table3_4_entropy", ent),
                     ("table5_8_depth", dep), ("table5_8_depth_deeper", dep_deep), ("claims", cl),
                     ("study_vs_ours", study)):
        _save_table(df, out, name)
    if not cl.is_empty():  # the verdict table (experiments/verdicts.py prints the same from tables/claims.csv)
        write_text_atomic(out / "tables" / "verdicts.md", f"{verdict_headline(cl)}\n\n{verdict_table(cl)}")
    backbones = sorted(set(pp["backbone"].unique().to_list()) - {"none"})
    temps = sorted(pp["temperature"].unique().to_list())
    md.append(TAU_NOTE + " 95% CIs are percentile bootstraps over prompts (2,000 resamples). Raw per-prompt rows: "
              "`traces/prompts`, per-call rows: `traces/steps`; every table below is also in `tables/` "
              "(CSV and Parquet); the long ones are in `report_appendix.md`.\n")
    md += summary_section(t1, sp, cl, miss, pp)
    md += routers_section(pp)
    md.append("## Figures\n")
    for b in backbones:
        for t in temps:
            f = figures.fig_tau(t1, b, t, out / f"fig1_tau_{b}_T{t:g}.png")
            if f:
                md.append(f"![acceptance length, {b}, T={t:g}]({f.name})\n")
        for t in temps:  # Figure 6 and its table, every λ of the sweep (tables/fig6_lambda_*)
            f, lt = figures.fig_lambda(t1, b, t, out / f"fig6_lambda_{b}_T{t:g}.png"), lambda_table(t1, b, t)
            if f and not lt.is_empty():
                _save_table(lt, out, f"fig6_lambda_{b}_T{t:g}")
                md += [f"### Figure 6 — weight averaging along λ ({b}, T={t:g})\n", LAMBDA_NOTE,
                       f"![Figure 6, {b}, T={t:g}]({f.name})\n", _md(lt)]
        extra = (("Figure 7 — draft entropy, accepted vs rejected",
                  figures.fig_entropy(ent, b, temps[0], out / f"fig7_entropy_{b}.png") if not ent.is_empty() else None),
                 ("Figure 8 — acceptance rate by depth",
                  figures.fig_depth(dep, b, temps[0], out / f"fig8_depth_{b}.png") if not dep.is_empty() else None))
        for title, f in extra:
            if f:
                md += [f"### {title} ({b})\n", f"![{title}]({f.name})\n"]
    for t in temps:
        f = figures.fig_speed(sp, t, out / f"fig_speed_T{t:g}.png")
        if f:
            md.append(f"![speedup over generate, T={t:g}]({f.name})\n")
    for b in backbones:
        for t in temps:
            md.append(f"## Table 1 — {b}, T={t:g}: acceptance length [95% CI]\n")
            tw = table1_wide(t1, b, t)
            md.append(_md(tw.with_columns(_marked_method(t))))
            if not all(lossless(m, t) for m in tw["method"]):
                md.append(NOT_LOSSLESS + "\n")
            if t1.filter((pl.col("method") == POSTHOC) & (pl.col("backbone") == b)).height:
                md.append(f"`{POSTHOC}`: {NOT_DEPLOYABLE}; the study's Table 1 routing numbers are this router's.\n")
    app = [f"# Appendix to the report for `{run.name}`\n",
           "## Claims of the study, checked on this run (every comparison)\n",
           CLAIMS_NOTE,
           _md(_p_text(cl.select("claim", "family", "backbone", "temperature", "comparison", "prompts", "estimate",
                                 "ci_lo", "ci_hi", "p_value", "verdict", "p_holm", "verdict_holm", "study",
                                 "study_consistent", "study_note"))
               if not cl.is_empty() else cl),
           "## Each claim as the study words it\n",
           _md(cl.select("claim", "wording").unique("claim", maintain_order=True) if not cl.is_empty() else cl),
           "## The study's numbers beside ours (acceptance length)\n",
           "The study's verifier is Llama-3-8B-Instruct with 70k examples per domain; `our_tau` is this run's "
           "(mean over the benchmarks present for `average`). Source: arXiv 2603.27027 and TAPS's README, every "
           "cell in `orchestrator/report/study_tables.csv` (where the two disagree, one row per source; "
           "docs/study.md lists them); all of them in `tables/study_vs_ours.csv`. "
           + comparison_note(t1) + "\n",
           _md(study.filter(pl.col("our_tau").is_not_null()) if study.filter(pl.col("our_tau").is_not_null()).height
               else study.head(0)),
           "## Table 2 — routing decisions per prompt, every router by name\n", TABLE2_NOTE, _md(rt),
           "## Tables 3–4 — entropy (nats) of accepted vs first-rejected tokens\n", _md(ent),
           "## Tables 5–8 — acceptance rate by depth\n", _md(dep),
           "## Tables 5–8, deeper levels (depth > 5; the study's tables stop at 5)\n", _md(dep_deep),
           "## Wall-clock speed, every cell (same run, same machine)\n", SPEED_NOTE,
           _md(sp.select("backbone", "method", "benchmark", "temperature", "tokens_per_s", "tokens_per_s_lo",
                         "tokens_per_s_hi", "speedup", "vs_autoregressive", "calls_per_token", "mean_tree_size",
                         "draft_share", "verify_share", "tokens_per_verified_node", "paired_baseline",
                         "outputs_equal_generate"))]
    text, appendix = "\n".join(md), "\n".join(app)
    p = out / "report.md"
    write_text_atomic(out / "report_appendix.md", appendix)
    write_text_atomic(p, text)
    write_text_atomic(out / "report.html", _html(text, appendix))
    return p


TAU_NOTE = ("τ (ours, the headline) = tokens committed by tree-verification passes (accepted draft tokens + the "
            "verifier's bonus token) / number of passes, prefill excluded, a ratio of sums over a cell's prompts. "
            "`tau_taps` is τ as the study's code computes its tables (TAPS `scripts/compute_tau.py`): the same "
            "tokens over the sum of each turn's decode-loop index at exit, counted from 0, i.e. passes - 1 per "
            "turn, so tau_taps = τ · P / (P - T) over a cell's P passes and T turns (slightly above τ: "
            "+0.2 at τ 3 with 16 passes a turn); every comparison with the study's numbers uses it. "
            "`tau_study` is the study's text's wording (accepted draft tokens per pass, bonus excluded, "
            "mean over prompts): about τ - 1, so about one token below the numbers the study's tables print. "
            "The headline table gives τ and, in brackets, tau_taps.")
LAMBDA_NOTE = ("Weight averaging θ = λ·θ_math + (1-λ)·θ_chat (`drafters/merge.py`; λ = 0 is the chat "
               "drafter's weights, λ = 1 the math drafter's, each evaluated as a drafter of its own), one "
               "point per λ of `merge.lambdas`; dashed: both specialists and the mixed drafter. The table has "
               "every λ (τ [95% CI] per benchmark; `tables/fig6_lambda_*`).\n")
RQ3C_SCALE = ("**RQ3c at scale**: this verdict is this run's (its verifier and data sizes are in `profile.json`). "
              "At the study's scale (Llama-3-8B with the study's data, the `paper` profile) this project would "
              "call averaging the weakest if the averaged drafter's τ were below every specialist and the mixed "
              "drafter on every benchmark, each paired 95% CI excluding 0 (`RQ3c-cells` holding in every cell), "
              "with no λ of the sweep reaching the better specialist (Figure 6). That test is the project's: the "
              "study reports no intervals, and its own Table 1 has a cell where averaging is not the worst "
              "(HASS, T=1, SVAMP: 2.69 above MathInstruct's 2.46).\n")
CLAIMS_NOTE = ("`p_value`: two-sided percentile-bootstrap p of a zero difference (min(1, 2 x the smaller share "
               "of 10,000 resamples on either side of 0), never below 1/(B+1)). `p_holm` / `verdict_holm`: "
               "Holm-Bonferroni step-down within the row's `family`: `study` (the study's claims; its size is fixed "
               "by the profile's grid, and a hypothesis without data counts as untested, p = 1) or `exploratory` "
               "(the proposed next experiments and the project's own routers), family-wise 5%; a conclusive "
               "verdict whose p_holm is above 0.05 reads `inconclusive (Holm)`. `study`: the study's own numbers "
               "for the row's backbone, temperature and benchmark (`orchestrator/report/study_tables.csv`); "
               "`study_consistent`: whether they agree with the claim's wording (false: the study contradicts its own claim there; empty: no "
               "number for that cell).\n")
SPEED_NOTE = ("`speedup` is tokens/s over transformers' `generate` (greedy at T=0, sampling at T>0) on the same "
              "inputs in the same actor: timed by the cell itself next to each of its inputs where `paired_baseline` "
              "(profile key `eval.paired_baseline`), else by the autoregressive cell of its benchmark and temperature. "
              "`vs_autoregressive` is over the project's own autoregressive loop. `outputs_equal_generate`: the share "
              "of prompts whose T=0 output equals generate's token for token.\n")
TABLE2_NOTE = ("One row per router, benchmark and drafter chosen: `prompts` routed to it of `of` (a prompt's "
               "choice: its turns' majority, ties to the first drafter; the study's Table 2 counts prompts; a "
               "per-turn router's `..., last turn)` row takes each prompt's last turn's choice, as the study's "
               "code records its entropy router's head), "
               "`step_share` the share of verifier calls for routers that choose per call or per turn, "
               "`matched` whether it is the matched specialist, `study_matched_share` the study's Table 2 share "
               f"(EAGLE-2, T=0) beside its two routers as its code ran them (`{POSTHOC}`, `{HEADS_LAST}`).\n")
HEADLINE_ROWS = 12


def routing_headline() -> str:
    return (f"**Routing**: the headline routing row (RQ3a, RQ3b, RQ4) is `{ROUTED}`, the router behind the study's "
            f"Table 1 \"confidence routed\" numbers (its code's post hoc router): {NOT_DEPLOYABLE}. The speed claim "
            f"times `{SPEED_ROUTED}`, the study's text's deployable router. Every router is in Tables 1 and 2 by "
            "name (the routers section below says what each is).\n")


def routers_section(pp: pl.DataFrame) -> list[str]:
    """What each router and composition of the run is, by name (the post hoc one marked not deployable)."""
    if "strategy" not in pp.columns:
        return []
    names = sorted(set(pp.filter(is_router() | pl.col("strategy").is_in(["switching", "depth_adaptive"]))
                       ["method"].to_list()))
    if not names:
        return []
    rows = pl.DataFrame({"method": names, "what it is": [describe(m) for m in names],
                         "headline": [("RQ3a/RQ3b/RQ4" if m == ROUTED else "speed" if m == SPEED_ROUTED else "")
                                      for m in names]})
    out = ["## Routers and compositions in this run\n", _md(rows)]
    for m in POSTHOCS:
        if m in names and "posthoc_tie_fallback" in pp.columns:
            n = int(pp.filter(pl.col("method") == m)["posthoc_tie_fallback"].fill_null(False).sum())
            if n:
                out.append(f"{n} near-tie prompt(s) of `{m}` had no mixed-checkpoint run and took the higher "
                           "specialist.\n")
    return out


def _p_text(df: pl.DataFrame) -> pl.DataFrame:
    """p-values as text with two significant digits, so that a small one never rounds to 0."""
    return df.with_columns(pl.col(c).map_elements(lambda p: "" if p != p else f"{p:.2g}", return_dtype=pl.String)
                           for c in ("p_value", "p_holm") if c in df.columns)


def _marked_method(temperature: float) -> pl.Expr:
    """The method column with LOSSY_MARK on the methods not lossless at ``temperature``."""
    lossy = [m for m in POSTHOCS if not lossless(m, temperature)]
    return (pl.when(pl.col("method").is_in(lossy)).then(pl.col("method") + f" {LOSSY_MARK}")
            .otherwise(pl.col("method")).alias("method"))


def _counts(verdicts: list[str]) -> str:
    words = [_verdict_word(v) for v in verdicts]
    order = ("holds", "does not hold", "inconclusive")
    return ", ".join(f"{w} {words.count(w)}/{len(words)}" for w in sorted(set(words), key=(order + tuple(words)).index))


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
            cell = f"{_estimate_text(r['estimate'], r['ci_lo'], r['ci_hi'])} {_verdict_shown(r)}"
            cell += f" (Holm: {_verdict_word(holm[0])})" if _verdict_word(holm[0]) != _verdict_word(raw[0]) else ""
        else:
            cell = _counts(raw)
            cell += f" (Holm: {_counts(holm)})" if _counts(holm) != cell else ""
            cell += _hidden_reasons(g)
        if has_study and (g["study_consistent"].fill_null(True) == False).any():  # noqa: E712
            cell += " †"
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
            raw = sum(_verdict_word(v) in ("holds", "does not hold") for v in g["verdict"])
            kept = sum(_verdict_word(v) in ("holds", "does not hold") for v in g["verdict_holm"])
            size = (f" in a family of {g['family_size'][0]} (fixed by the profile's grid; the untested count as "
                    "p = 1)") if name == STUDY and "family_size" in g.columns else ""
            out.append(f"Holm-Bonferroni, {name} family: {tests} tests{size}, family-wise 5%: {kept} of {raw} "
                       "conclusive verdicts stay conclusive (`verdict_holm` in `tables/claims.csv`).\n")
    if "study_consistent" in cl.columns:
        bad = cl.filter(pl.col("study_consistent") == False)  # noqa: E712 - polars expression
        for claim, g in bad.group_by("claim", maintain_order=True):
            out.append(f"† {claim[0]}: the study's own numbers contradict its wording in at least one cell: "
                       f"{g['study'][0]}.")
        out += [""] if bad.height else []
    return out


def summary_section(t1: pl.DataFrame, sp: pl.DataFrame, cl: pl.DataFrame, miss: list[str],
                    pp: pl.DataFrame) -> list[str]:
    """One screen: the headline τ table, the claim verdicts, the speed against generate, what failed."""
    md = ["## Summary\n"]
    n_prompts = pp.select("benchmark", "prompt_id").n_unique()
    md.append(f"{t1.height} cells over {n_prompts} prompts; {len(miss)} problem line(s) (under *What failed*).\n")
    real = sorted(set(t1["backbone"].to_list()) - {"none"}) or ["none"]
    shared = t1.filter(pl.col("backbone") == "none")  # autoregressive: one row for every backbone's column
    t1b = pl.concat([t1.filter(pl.col("backbone") != "none")]
                    + [shared.with_columns(pl.lit(b).alias("backbone")) for b in real])
    temp = {t: f"T={t:g}" for t in t1b["temperature"].unique().to_list()}
    if "tau_taps" not in t1b.columns:
        t1b = t1b.with_columns(pl.lit(None, dtype=pl.Float64).alias("tau_taps"))
    head = (t1b.with_columns(pl.format("{} {}", pl.col("backbone"),
                                       pl.col("temperature").replace_strict(temp, return_dtype=pl.String)).alias("col"))
            .group_by("method", "col").agg(pl.col("tau").mean(), pl.col("tau_taps").mean()))
    wide = head.pivot(on="col", index="method", values="tau")
    cols = sorted(c for c in wide.columns if c != "method")
    both = pl.format("{} ({})", pl.col("tau").round(2), pl.col("tau_taps").round(2))
    cells = head.with_columns(both.alias("v")).pivot(on="col", index="method", values="v")
    order = wide.with_columns(pl.mean_horizontal(*cols).alias("_mean")).select("method", "_mean")
    wide = (cells.join(order, on="method").sort(["_mean", "method"], descending=[True, False])
            .select("method", *cols)
            .with_columns(pl.col(c).fill_null("—") for c in cols))
    hot = [c for c in cols if any(c.endswith(f" {temp[t]}") for t in temp if t > 0)]  # T>0: mark the lossy
    wide = wide.with_columns(pl.when(pl.col("method").is_in(list(POSTHOCS)) & (pl.col(c) != "—"))
                             .then(pl.col(c) + f" {LOSSY_MARK}").otherwise(pl.col(c)).alias(c) for c in hot)
    more = max(0, wide.height - HEADLINE_ROWS)
    md.append("**Acceptance length τ**: ours (in brackets `tau_taps`, τ as the study's code computes the numbers "
              "of its tables); mean over benchmarks; per benchmark with CIs in Table 1"
              + (f"; {more} more method(s) there" if more else "") + "\n")
    md.append(_md(wide.head(HEADLINE_ROWS), 2))
    if any(LOSSY_MARK in str(v) for c in hot for v in wide.head(HEADLINE_ROWS)[c]):
        md.append(NOT_LOSSLESS + "\n")
    if "strategy" in pp.columns and pp.filter(is_router()).height:
        md.append(routing_headline())
    if not cl.is_empty():
        md.append("**Claims of the study** (prompt-level paired bootstrap; one comparison: estimate [95% CI] "
                  "and verdict; several (per benchmark or per drafter pair): verdict counts; every comparison "
                  "with its CI in the appendix)\n")
        ran = cl.filter(~pl.col("verdict").str.contains("not in this run", literal=True))
        md.append(_md(claims_grid(ran)) if ran.height else "_no claim has cells in this run_\n")
        idle = [c for c in dict.fromkeys(cl["claim"].to_list()) if c not in set(ran["claim"].to_list())]
        if idle:
            md.append(f"Not checked (no cells in this run; `tables/claims.csv` says what each needs): "
                      f"{', '.join(idle)}.\n")
        md += _claims_footer(cl)
        if ran.filter(pl.col("claim").is_in(["RQ3c", "RQ3c-cells"])).height:
            md.append(RQ3C_SCALE)
        few = sum(f"< {MIN_PROMPTS} prompts" in v for v in cl["verdict"].to_list())
        if few:
            md.append(f"{few} of {cl.height} comparisons are inconclusive because fewer than {MIN_PROMPTS} prompts "
                      "were paired on a benchmark (the project's rule, not the study's; a benchmark without rows "
                      "has 0), whatever their interval says.\n")
    own = sp.filter(pl.col("method") != GENERATE)
    if not own.is_empty() and own["speedup"].null_count() < own.height:
        base = sp["baseline"][0]
        per = (own.group_by("backbone", "temperature", "method").agg(pl.col("speedup").mean().round(2))
               .sort(["speedup", "method"], descending=[True, False], nulls_last=True)
               .group_by("backbone", "temperature", maintain_order=True).head(3)
               .sort(["backbone", "temperature", "speedup", "method"], descending=[False, False, True, False],
                     nulls_last=True))
        md.append(f"**Speed against `{base}`** (same run, same prompts; the 3 fastest methods per backbone and "
                  "temperature, mean over benchmarks; every cell in the appendix)\n")
        md.append(_md(per.rename({"speedup": f"speedup vs {base}"}), 2))
        mixed = own.filter(pl.col("same_invocation") == False)  # noqa: E712 - polars expression
        if mixed.height:
            md.append(f"{mixed.height} of {own.height} speed cells were timed in another grid invocation than their "
                      "`generate` baseline (a resumed run): the machine's load may differ, so those ratios are "
                      "not speed measurements (`same_invocation` in the speed table).\n")
    md.append("**What failed**\n")
    md += (miss[:8] + ([f"- ... {len(miss) - 8} more"] if len(miss) > 8 else [])) if miss else ["- nothing"]
    md.append("")
    return md


def _html(md_text: str, appendix: str = "") -> str:
    """A small markdown subset -> HTML (headings, tables, images, paragraphs); the appendix folded."""
    out, in_table = ["<html><head><meta charset='utf-8'><style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
                     "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}</style></head><body>"], False
    for line in md_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("!["):
            src = line[line.index("(") + 1 : line.rindex(")")]
            out.append(f"<img src='{html.escape(src)}' style='max-width:100%'>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    if appendix:
        body = _html(appendix)
        body = body[body.index("<body>") + 6 : body.rindex("</body>")]
        out.append(f"<details><summary>Appendix: every comparison and the long tables</summary>{body}</details>")
    return "\n".join(out + ["</body></html>"])
