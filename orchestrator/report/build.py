"""Placeholder until the report lands: writes report/README.md naming what exists."""
from __future__ import annotations

from pathlib import Path


def build_report(run_dir) -> Path:
    out = Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    p = out / "report.md"
    p.write_text("# Report\n\n(report generation not implemented yet)\n")
    return p
