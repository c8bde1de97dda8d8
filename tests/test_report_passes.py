"""The report reads the step table in passes (orchestrator/report/steps.py), never whole: on
synthetic traces with every column the eval workers write, its per-prompt reductions equal those of
the whole table collected at once (what the report computed before it read passes) to the bit, and
a report built in many small passes (hive partitions packed, split by prompt hash) has the same
bytes, every file, as one built in a single pass."""
from __future__ import annotations

import filecmp
import importlib.util
import shutil
from pathlib import Path

import polars as pl

from orchestrator.report.build import build_report
from orchestrator.report.claims.project import BASE, EARLY_STEPS
from orchestrator.report.run_records import recorded_traces
from orchestrator.report.steps import plan_passes, read_steps, summarize
from orchestrator.report.tables import scan, trace_files

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_report", ROOT / "experiments/bench_report.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

STRATEGIES = {"autoregressive", "single", "confidence", "switching"}


def _cells(c) -> bool:
    """eagle2 and the autoregressive cells at T=0 on GSM8K and MT-Bench: single drafters (entropy,
    depth and post hoc router claims), the routers and switching (early acceptance)."""
    return (c.backbone in ("eagle2", "none") and c.temperature == 0.0 and c.benchmark in ("gsm8k", "mt_bench")
            and c.strategy in STRATEGIES and c.tree_mode == "fixed"
            and not c.drafter.startswith(("avg", "ties", "task"))
            and c.decode.switch_after in (1, 2))


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    # 2 MT-Bench and 14 GSM8K prompts a cell
    shape = bench.make_run(run, 600_000, shard_size=5, select=_cells)
    assert shape["step_rows"] > 20_000 and shape["units"] > 50, shape
    return run


def test_passes_give_the_whole_tables_reductions_and_the_same_report(tmp_path):
    run = _run(tmp_path)
    files = trace_files(run, "steps", recorded_traces(run))[0]
    root = run / "traces" / "steps"
    passes = plan_passes(files, root, pass_rows=3_000)
    assert len(passes) > 4 and any(k > 1 for _, k, _ in passes)  # packed partitions and hash-split ones
    whole = summarize(scan(run, "steps", recorded_traces(run)).collect(), BASE, EARLY_STEPS)
    cut = read_steps(run, files, BASE, EARLY_STEPS, pass_rows=3_000)
    assert cut.passes == len(passes) and cut.rows == whole.rows
    for name in ("rates", "early"):
        assert getattr(whole, name).height and getattr(cut, name).equals(getattr(whole, name)), name
    for kind in ("path", "node"):
        assert cut.confidence[kind].height and cut.confidence[kind].equals(whole.confidence[kind]), kind
    assert cut.entropy_sums.height and cut.entropy_sums.equals(whole.entropy_sums)
    for kind in ("draft", "verifier"):
        assert cut.entropy[kind].height and cut.entropy[kind].equals(whole.entropy[kind]), kind
    reports = []
    for rows in (10**9, 3_000):
        build_report(run, pass_rows=rows)
        reports.append(shutil.move(run / "report", tmp_path / f"report-{rows}"))
    names = sorted(p.relative_to(reports[0]) for p in Path(reports[0]).rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(reports[1]) for p in Path(reports[1]).rglob("*") if p.is_file())
    assert len(names) > 20 and (Path(reports[0]) / "tables/claims.csv").is_file()
    a, b = Path(reports[0]), Path(reports[1])
    differ = [str(n) for n in names if not filecmp.cmp(a / n, b / n, shallow=False)]
    assert not differ
    claims = pl.read_csv(Path(reports[0]) / "tables/claims.csv")
    assert {"entropy", "RQ5", "switching-early"} <= set(claims["claim"])  # the step-table claims ran
