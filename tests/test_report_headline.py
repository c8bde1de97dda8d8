"""The report's first lines (orchestrator/report/headline.py): the speedup of the strategy the profile
named before the run, the home specialists' τ and the claims that concluded, on the synthetic traces of
tests/test_report.py, whose every number is known in advance; and the profile key that names it."""
from __future__ import annotations

import json

import polars as pl
import pytest

from orchestrator.plan.sizing import load_profile
from orchestrator.profile import ProfileError
from orchestrator.report.build import build_report
from orchestrator.report.headline import headline_rows, speedup_ci
from orchestrator.report.tables import per_prompt, scan
from tests.test_report import _make_run


def _run(tmp_path, report: dict | None):
    run = _make_run(tmp_path / "run")
    prof = json.loads((run / "profile.json").read_text())
    if report is not None:
        prof["report"] = report
    (run / "profile.json").write_text(json.dumps(prof))
    build_report(run)
    md = (run / "report/report.md").read_text()
    return run, md[md.index("## Summary"): md.index("## Claims of the study: every verdict")]


def test_the_first_screen_names_the_profiles_strategy_against_generate(tmp_path):
    # home specialists: math on gsm8k commits 60 tokens + 1 prompt token in 2 s (30.5 tok/s), chat on
    # mt_bench 50 + 1 in 2 s (25.5 tok/s); generate 21 tok/s on every prompt
    run, summary = _run(tmp_path, {"headline_strategy": "single", "headline_tree": "fixed"})
    assert "`single` (each benchmark's home specialist), tree fixed, named in the profile before the run" \
        in summary
    # (0.75 x 30.5 / 21 + 0.25 x 25.5 / 21): 1 chat : 3 math; every prompt alike: no spread
    assert ("**1.39x [1.39, 1.39]** as fast as `generate` on the same machine and prompts "
            "(mean over benchmarks, 1 chat : 3 math") in summary
    assert "gsm8k 1.45x [1.45, 1.45] (10 prompts), mt_bench 1.21x [1.21, 1.21] (10 prompts)" in summary
    assert "math on gsm8k 3.00 [3.00, 3.00] (10 prompts); chat on mt_bench 2.50 [2.50, 2.50]" in summary
    claims = pl.read_csv(run / "report/tables/claims.csv")
    ran = claims.filter(~pl.col("verdict").str.contains("not in this run"))
    done = ran.filter(pl.col("verdict_holm").str.starts_with("holds")
                      | pl.col("verdict_holm").str.starts_with("does not hold"))
    assert 4 <= done.height < ran.height
    assert (f"- **Claims that concluded under Holm**: {done.height} of the {ran.height} "
            "comparisons run:") in summary
    assert ("  - RQ1-chat (hass, T=0): chat - math specialist on mt_bench (tau): +1.00 [+1.00, +1.00], "
            "**holds**") in summary
    assert "inconclusive" not in summary and "| RQ5 |" not in summary  # the rest is in the claims section


def test_a_strategy_the_run_did_not_time_is_said_and_none_named_says_nothing(tmp_path):
    _, summary = _run(tmp_path, {"headline_strategy": "merged", "headline_tree": "auto"})
    assert "named strategy `merged`, tree auto has no cells timed against `generate`" in summary
    _, summary = _run(tmp_path / "none", None)
    assert "**Speed**" not in summary and "**Home specialists' τ**" in summary


def _rows(tmp_path):
    run = _make_run(tmp_path / "run")
    return per_prompt(scan(run, "prompts"))


def test_the_speedup_interval_resamples_prompts_with_their_generate_runs(tmp_path):
    pp = _rows(tmp_path)
    rows = headline_rows(pp, "hass", "single", "fixed")
    assert sorted(set(zip(rows["benchmark"], rows["drafter"]))) == [("gsm8k", "math"), ("mt_bench", "chat")]
    # one slow prompt on gsm8k: the point is the ratio of sums, the interval spans the prompts' spread
    first = (pl.col("benchmark") == "gsm8k") & (pl.col("prompt_id") == "gsm8k/0")
    slow = rows.with_columns(pl.when(first).then(pl.col("wall_time_s") * 4).otherwise(pl.col("wall_time_s"))
                             .alias("wall_time_s"))
    s = speedup_ci(slow)
    g = s["per_benchmark"]["gsm8k"]
    assert g["speedup"] == pytest.approx((610 / 26) / 21)  # 10 prompts x 61 tokens in 9 x 2 s + 8 s
    assert g["lo"] < g["speedup"] < g["hi"] <= 30.5 / 21
    assert s["per_benchmark"]["mt_bench"]["lo"] == pytest.approx(25.5 / 21)
    # the mean weighs benchmarks as the tau averages do: 1 chat : 3 math
    assert s["speedup"] == pytest.approx(0.75 * g["speedup"] + 0.25 * 25.5 / 21)
    assert s["lo"] < s["speedup"] < s["hi"]
    math_only = speedup_ci(slow.filter(pl.col("benchmark") == "gsm8k"))
    assert math_only["speedup"] == pytest.approx(g["speedup"]) and math_only["lo"] == pytest.approx(g["lo"])
    assert speedup_ci(slow) == s  # a function of the data alone (the report's bytes do not change)


def test_a_cell_that_timed_generate_itself_is_divided_by_its_own_runs(tmp_path):
    math = pl.col("method") == "math"
    pp = _rows(tmp_path).with_columns(
        pl.when(math).then(42).otherwise(pl.col("generate_tokens")).alias("generate_tokens"),
        pl.when(math).then(1.0).otherwise(pl.col("generate_wall_time_s")).alias("generate_wall_time_s"))
    s = speedup_ci(headline_rows(pp, "hass", "single", "fixed"))
    assert s["per_benchmark"]["gsm8k"]["speedup"] == pytest.approx(30.5 / 42)  # its own 42 tok/s
    assert s["per_benchmark"]["mt_bench"]["speedup"] == pytest.approx(25.5 / 21)  # the autoregressive cell's


def test_the_profile_names_a_strategy_the_grid_runs_at_t0():
    p = load_profile("demo", ["report.headline_strategy=single", "report.headline_tree=fixed"])
    assert (p.report.headline_strategy, p.report.headline_tree) == ("single", "fixed")
    for bad, why in ((["report.headline_strategy=oracle"], "must be null, single"),
                     (["report.headline_strategy=entropy",
                       "eval.strategies=[autoregressive, single, merged]"],
                      "needs 'entropy' in eval.strategies"),
                     (["report.headline_strategy=merged", "report.headline_tree=auto",
                       "eval.tree_auto=[single]"],
                      "needs 'merged' in eval.tree_auto")):
        with pytest.raises(ProfileError, match=why):
            load_profile("demo", bad)
