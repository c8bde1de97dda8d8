"""python experiments/report.py --run DIR -> DIR/report/{report.md, report.html, *.png, tables/*}."""
from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path

import polars as pl

from . import figures
from .claims import check_claims, study_comparison
from .tables import depth_table, entropy_table, per_prompt, routing, scan, speed, table1, table1_wide, trace_files


def _md(df: pl.DataFrame, digits: int = 3) -> str:
    if df.is_empty():
        return "_no data_\n"
    df = df.with_columns([pl.col(c).round(digits) for c, t in df.schema.items() if t in (pl.Float64, pl.Float32)])
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.iter_rows():
        lines.append("| " + " | ".join("—" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _save_table(df: pl.DataFrame, out: Path, name: str) -> None:
    (out / "tables").mkdir(parents=True, exist_ok=True)
    if df.is_empty():
        return
    flat = df.select([c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct))])
    for ext, fn in (("csv", flat.write_csv), ("parquet", df.write_parquet)):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out / "tables")
        os.close(fd)
        fn(tmp)
        os.replace(tmp, out / "tables" / f"{name}.{ext}")


def missing_section(run: Path, pp: pl.DataFrame | None) -> list[str]:
    lines = []
    man = run / "manifest.json"
    if man.is_file():
        cells = json.loads(man.read_text())["cells"]
        failed = [(c["stage"], c["name"], (c.get("error") or "")[:160]) for c in cells.values() if c["status"] != "done"]
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


def recorded_traces(run: Path) -> set[str] | None:
    """Trace files the manifest records for finished eval units (None without a manifest)."""
    man = run / "manifest.json"
    if not man.is_file():
        return None
    cells = json.loads(man.read_text())["cells"].values()
    return {f for c in cells if c["stage"] == "eval" and c["status"] == "done" for f in c.get("files", [])}


def build_report(run_dir) -> Path:
    run = Path(run_dir)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    recorded = recorded_traces(run)
    prompts, steps = scan(run, "prompts", recorded), scan(run, "steps", recorded)
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
        _write_text(p, "\n".join(md))
        _write_text(out / "report.html", f"<pre>{html.escape(chr(10).join(md))}</pre>")
        return p
    t1 = table1(pp)
    sp = speed(pp)
    rt = routing(pp, steps)
    ent = entropy_table(steps) if steps is not None else pl.DataFrame()
    dep = depth_table(steps) if steps is not None else pl.DataFrame()
    prof = json.loads((run / "profile.json").read_text()) if (run / "profile.json").is_file() else {}
    pair = tuple(prof.get("eval", {}).get("route_pair", ("math", "chat")))
    cl = check_claims(pp, steps.collect() if steps is not None else None, dep if not dep.is_empty() else None, pair)
    study = study_comparison(t1)
    for name, df in (("table1_acceptance", t1), ("speed", sp), ("table2_routing", rt), ("table3_4_entropy", ent),
                     ("table5_8_depth", dep), ("claims", cl), ("study_vs_ours", study)):
        _save_table(df, out, name)
    backbones = sorted(set(pp["backbone"].unique().to_list()) - {"none"})
    temps = sorted(pp["temperature"].unique().to_list())
    md.append("τ = tokens committed by tree-verification passes / number of passes (prefill excluded); "
              "95% CIs are percentile bootstraps over prompts (2,000 resamples). Raw per-prompt rows: "
              "`traces/prompts`, per-call rows: `traces/steps`.\n")
    if miss:
        md += ["## Missing or failed\n"] + miss + [""]
    md.append("## Claims of the study, checked on this run\n")
    md.append(_md(cl.select("claim", "backbone", "temperature", "comparison", "prompts", "estimate", "ci_lo", "ci_hi", "verdict", "study")
                  if not cl.is_empty() else cl))
    md.append("## The study's numbers beside ours (acceptance length)\n")
    md.append("The study's verifier is Llama-3-8B-Instruct with 70k examples per domain; `our_tau` is this run's "
              "(mean over the benchmarks present for `average`). Source: arXiv 2603.27027.\n")
    md.append(_md(study.filter(pl.col("our_tau").is_not_null()) if study.filter(pl.col("our_tau").is_not_null()).height
                  else study.head(0)))
    figs = []
    for b in backbones:
        for t in temps:
            md.append(f"## Table 1 — {b}, T={t:g}: acceptance length [95% CI]\n")
            md.append(_md(table1_wide(t1, b, t)))
            f = figures.fig_tau(t1, b, t, out / f"fig1_tau_{b}_T{t:g}.png")
            if f:
                md.append(f"![acceptance length]({f.name})\n")
                figs.append(f)
        f = figures.fig_lambda(t1, b, temps[0], out / f"fig6_lambda_{b}.png")
        if f:
            md += ["### Figure 6 — weight averaging along λ\n", f"![lambda sweep]({f.name})\n"]
        f = figures.fig_entropy(ent, b, temps[0], out / f"fig7_entropy_{b}.png") if not ent.is_empty() else None
        if f:
            md += ["### Figure 7 — draft entropy, accepted vs rejected\n", f"![entropy]({f.name})\n"]
        f = figures.fig_depth(dep, b, temps[0], out / f"fig8_depth_{b}.png") if not dep.is_empty() else None
        if f:
            md += ["### Figure 8 — acceptance rate by depth\n", f"![depth]({f.name})\n"]
    md.append("## Table 2 — routing decisions (drafter 0 = first of the pair, e.g. math)\n")
    md.append(_md(rt))
    md.append("## Tables 3–4 — entropy (nats) of accepted vs first-rejected tokens\n")
    md.append(_md(ent))
    md.append("## Tables 5–8 — acceptance rate by depth\n")
    md.append(_md(dep))
    md.append("## Wall-clock speed (same run, same machine)\n")
    md.append("`speedup` is tokens/s over transformers' `generate` (greedy at T=0, sampling at T>0), timed by each "
              "autoregressive cell on the same inputs in the same actor; `vs_autoregressive` is over the project's own "
              "autoregressive loop.\n")
    md.append(_md(sp.select("backbone", "method", "benchmark", "temperature", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi",
                            "speedup", "vs_autoregressive", "calls_per_token", "mean_tree_size", "draft_share", "verify_share", "tokens_per_verified_node")))
    for t in temps:
        f = figures.fig_speed(sp, t, out / f"fig_speed_T{t:g}.png")
        if f:
            md.append(f"![speedup]({f.name})\n")
    text = "\n".join(md)
    p = out / "report.md"
    _write_text(p, text)
    _write_text(out / "report.html", _html(text))
    return p


def _html(md_text: str) -> str:
    """A small markdown subset -> HTML (headings, tables, images, paragraphs)."""
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
    return "\n".join(out + ["</body></html>"])
