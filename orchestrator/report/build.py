"""python experiments/report.py --run DIR -> DIR/report/{report.md, report.html, *.png, tables/*}.

The wiring: read the traces the manifest records, compute the tables and the claim checks, save
each table, then write the Markdown (summary.py, sections.py) and its HTML (markdown.py)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from common.atomic import atomic_file, write_text_atomic
from orchestrator.report.claims import Grid, check_claims
from orchestrator.report.claims.project import BASE, EARLY_STEPS
from orchestrator.report.duplicates import check_unique, refuse
from orchestrator.report.markdown import to_html
from orchestrator.report.prose import INTRO, TAU_NOTE
from orchestrator.report.routers import table2, with_posthoc
from orchestrator.report.run_records import problems as run_problems
from orchestrator.report.run_records import recorded_traces
from orchestrator.report.sections import appendix, figures_section, routers_section, table1_section
from orchestrator.report.steps import PASS_ROWS, StepSummary, entropy_table, read_steps
from orchestrator.report.study_tables import study_comparison
from orchestrator.report.summary import claims_section, summary_section
from orchestrator.report.tables import (
    depth_table,
    depth_table_deeper,
    per_prompt,
    scan,
    speed,
    table1,
    trace_files,
)
from orchestrator.report.verdicts import headline as verdict_headline
from orchestrator.report.verdicts import verdict_table


def _save_table(df: pl.DataFrame, out: Path, name: str) -> None:
    """tables/<name>.csv (the columns CSV can hold) and tables/<name>.parquet; nothing for an empty frame."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    if df.is_empty():
        return
    flat = df.select([c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct))])
    for ext, fn in (("csv", flat.write_csv), ("parquet", df.write_parquet)):
        with atomic_file(out / "tables" / f"{name}.{ext}") as tmp:
            fn(tmp)


def _tables(by_prompt: pl.DataFrame, summary: StepSummary | None, steps: pl.LazyFrame | None,
            route_pair: tuple,
            grid: Grid) -> dict[str, pl.DataFrame]:
    """Every table of the report by its file name under tables/ (the claims checked on ``grid``)."""
    t1 = table1(by_prompt)
    depth = depth_table(steps) if steps is not None else pl.DataFrame()
    claims = check_claims(by_prompt, summary, depth if not depth.is_empty() else None, route_pair, grid)
    return {"table1_acceptance": t1, "speed": speed(by_prompt), "table2_routing": table2(by_prompt, steps),
            "table3_4_entropy": entropy_table(summary) if summary is not None else pl.DataFrame(),
            "table5_8_depth": depth,
            "table5_8_depth_deeper": depth_table_deeper(steps) if steps is not None else pl.DataFrame(),
            "claims": claims, "study_vs_ours": study_comparison(t1)}


def _write(out: Path, text: str, appendix_text: str = "") -> Path:
    if appendix_text:
        write_text_atomic(out / "report_appendix.md", appendix_text)
    write_text_atomic(out / "report.md", text)
    write_text_atomic(out / "report.html", to_html(text, appendix_text))
    return out / "report.md"


def build_report(run_dir, pass_rows: int = PASS_ROWS) -> Path:
    """The report of a run. The step table is never held whole: its per-prompt reductions are read
    in passes of at most about ``pass_rows`` rows (steps.py), its per-cell tables are lazy queries."""
    run = Path(run_dir)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    recorded = recorded_traces(run)
    prompts, steps = scan(run, "prompts", recorded), scan(run, "steps", recorded)
    check_unique(prompts, "prompts", str(run / "traces" / "prompts"))  # (DuplicateRows) before any sum
    summary = read_steps(run, trace_files(run, "steps", recorded)[0], BASE, EARLY_STEPS, pass_rows)
    refuse(summary.duplicates if summary else pl.DataFrame(), str(run / "traces" / "steps"), "steps")
    title = f"# Task-aware speculative decoding — report for `{run.name}`\n"
    by_prompt = per_prompt(prompts) if prompts is not None else None
    problems = run_problems(run, by_prompt, recorded)
    if by_prompt is None or by_prompt.is_empty():
        return _write(out, "\n".join([title,
                                      "No prompt traces found under traces/prompts: nothing to report.\n",
                                      "## Missing\n", *problems]))
    profile = json.loads((run / "profile.json").read_text()) if (run / "profile.json").is_file() else {}
    ev = profile.get("eval", {})
    pair = tuple(ev.get("route_pair", ("math", "chat")))
    by_prompt = with_posthoc(by_prompt, summary, pair[:2], ev.get("mixed_variant", "mixed_full"))
    tables = _tables(by_prompt, summary, steps, pair, Grid.from_profile(profile, by_prompt))
    for name, df in tables.items():
        _save_table(df, out, name)
    t1, claims = tables["table1_acceptance"], tables["claims"]
    # the verdict table (experiments/verdicts.py prints the same from tables/claims.csv)
    if not claims.is_empty():
        write_text_atomic(out / "tables" / "verdicts.md",
                          f"{verdict_headline(claims)}\n\n{verdict_table(claims)}")
    backbones = sorted(set(by_prompt["backbone"].unique().to_list()) - {"none"})
    temps = sorted(by_prompt["temperature"].unique().to_list())
    first = summary_section(t1, tables["speed"], claims, problems, by_prompt, profile.get("report") or {})
    md = [title, *first]
    md += ["## How to read the numbers\n", TAU_NOTE + INTRO]  # after the summary: the first screen is its
    md += claims_section(claims)
    md += routers_section(by_prompt)
    md += figures_section(t1, tables["speed"], tables["table3_4_entropy"], tables["table5_8_depth"],
                          backbones,
                          temps, out, lambda df, name: _save_table(df, out, name))
    md += table1_section(t1, backbones, temps)
    return _write(out, "\n".join(md), "\n".join(appendix(run.name, t1, tables)))
