"""What a run's manifest says the report should read and list: the units of the last configuration
run (``planned``), their failures not since redone (``current_failures``), the trace files of its
finished eval units (``recorded_traces``), and the report's *What failed* lines (``problems``)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from orchestrator.manifest import read_manifest
from orchestrator.report.tables import trace_files


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


def _missing(run: Path, by_prompt: pl.DataFrame | None) -> list[str]:
    """Failed units, and benchmarks the profile asks for without rows."""
    lines = []
    data = read_manifest(run / "manifest.json")
    if data is None:
        return ["- manifest.json is missing: failures cannot be listed"]
    failed = [(c["stage"], c["name"], (c.get("error") or "")[:160])
              for c in current_failures(data["cells"], data.get("plan"))]
    for stage, name, err in sorted(failed):
        lines.append(f"- FAILED {stage}: `{name}` — {err}")
    prof = run / "profile.json"
    if prof.is_file() and by_prompt is not None:
        expected = json.loads(prof.read_text())["eval"]["benchmarks"]
        present = set(by_prompt["benchmark"].unique().to_list())
        for b in expected:
            if b not in present:
                lines.append(f"- benchmark `{b}` has no rows in traces/ (every cell failed or was not run)")
    return lines


def problems(run: Path, by_prompt: pl.DataFrame | None, recorded: set[str] | None) -> list[str]:
    """The report's *What failed* lines: failed units, empty benchmarks, and trace files the manifest
    does not record (ignored; the first 20 named)."""
    lines = _missing(run, by_prompt)
    stale = trace_files(run, "prompts", recorded)[1] + trace_files(run, "steps", recorded)[1]
    if stale:
        lines.append(f"- {len(stale)} trace file(s) under traces/ are not recorded by the manifest (an "
                     "earlier "
                     f"configuration, or a unit that failed when redone) and were ignored:")
        lines += [f"  - `{f.relative_to(run)}`" for f in stale[:20]] + (["  - ..."] if len(stale) > 20
                else [])
    return lines
