"""Profiles are validated before any work; the dry run of every shipped profile loads no model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.grid import eval_cells, plan_summary
from orchestrator.profile import PROFILE_DIR, ProfileError, load_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")))
def test_shipped_profiles_validate_and_dry_run(name):
    p = load_profile(name)
    assert plan_summary(p)["eval_cells"] > 0
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", name, "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "DAG:" in r.stdout and "GPU-h" in r.stdout and "eval" in r.stdout


def test_dry_run_imports_no_model_code():
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'experiments')!r}]; import full_grid; "
            "rc = full_grid.main(['--profile', 'paper', '--dry-run', '--output-dir', 's3://bucket/run']); "
            "print('MODULES', rc, 'torch' in sys.modules, 'transformers' in sys.modules, 'ray' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MODULES 0 False False False" in r.stdout, r.stdout + r.stderr
    assert "output: s3://bucket/run -- a URI" in r.stdout  # where artifacts go, and how


@pytest.mark.parametrize("sets,match", [
    (["bogus=1"], "unknown key"),
    (["train.epochz=3"], "unknown key"),
    (["train.epochs=three"], "train.epochs must be an integer"),
    (["merge.lambdas=[0.5, 1.5]"], "lambda must be in \\[0, 1\\]"),
    (["eval.benchmarks={}"], "eval.benchmarks must not be empty"),
    (["eval.benchmarks={gsm9k: 2}"], "unknown benchmark 'gsm9k'"),
    (["train.variants=[math]", "merge.kinds=[]"], "need two drafters"),
    (["eval.temperatures=[-1]"], "eval.temperatures"),
    (["train.loss_mask=shifted"], "train.loss_mask must be next or reference"),
    (["data.self_distill=beam"], "data.self_distill must be null, greedy or sample"),
    (["data.self_distill=greedy", "data.feature_mode=online"], "data.self_distill needs data.feature_mode: cached"),
    (["eval.paired_baseline=maybe"], "eval.paired_baseline must be true or false"),
])
def test_bad_profiles_are_refused_with_one_clear_error(sets, match):
    with pytest.raises(ProfileError, match=match):
        load_profile("smoke", sets)


def test_unwritable_output_dir_is_refused_before_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke", "--output-dir", str(blocker / "sub")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not writable" in r.stderr


def test_grid_includes_budget_matched_singles_and_both_granularities():
    p = load_profile("demo")
    cells = eval_cells(p)
    bm = [c for c in cells if c.budget_matched and c.strategy == "single"]
    assert bm and all(c.total_tokens == 2 * (p.eval.tree.total_tokens - 1) + 1 for c in bm)
    mb = [c for c in cells if c.budget_matched and c.strategy == "merged"]  # the union reranked to one tree's budget
    assert mb and all(c.total_tokens == p.eval.tree.total_tokens for c in mb)
    assert {c.routing_granularity for c in cells if c.strategy == "confidence"} == {"step", "prompt"}
    assert len({c.key for c in cells}) == len(cells)


def test_paper_dry_run_counts_match_an_independent_count():
    """Every benchmark counts (null = all its prompts), corpora follow the variants, and an
    unknown verifier gets no invented cost constants."""
    from orchestrator.dryrun import estimate
    from orchestrator.grid import corpora

    p = load_profile("paper")
    cells = eval_cells(p)
    full = {"mt_bench": 80, "gsm8k": 1319, "math500": 500, "svamp": 300}  # paper: svamp capped at 300, the rest null
    expected = 0
    for c in cells:
        expected += full[c.benchmark]
    s = plan_summary(p)
    assert s["eval_prompt_runs"] == expected and s["prompts_total"] == sum(full.values())
    assert {c.benchmark for c in cells} == set(full)
    one = ["merge.kinds=[ties]", "eval.strategies=[autoregressive,single]"]
    assert corpora(load_profile("paper", ["train.variants=[math]", *one])) == ["mathinstruct"]
    assert plan_summary(load_profile("paper", ["train.variants=[chat]", *one]))["features"] == ["sharegpt"]
    assert estimate(load_profile("smoke", ["verifier=Qwen/Qwen2.5-0.5B-Instruct"])) == {"unknown_verifier": True}
