"""Profiles are validated before any work; the dry run of every shipped profile loads no model."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.grid import eval_cells, plan_summary
from orchestrator.plan.sizing import load_profile
from orchestrator.profile import PROFILE_DIR, ProfileError
from tests.hub_stub import paper_hub_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")))
def test_shipped_profiles_validate_and_dry_run(name, tmp_path):
    p = load_profile(name)
    assert plan_summary(p)["eval_cells"] > 0
    # paper's 70,512 a corpus: from a stubbed Hub (no network)
    env = {**os.environ, **paper_hub_env(tmp_path)}
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", name,
                        "--dry-run"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "DAG:" in r.stdout and "GPU-h" in r.stdout and "eval" in r.stdout


def test_dry_run_imports_no_model_code(tmp_path):
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'experiments')!r}]; import full_grid; "
            "rc = full_grid.main(['--profile', 'paper', '--dry-run', '--output-dir', 's3://bucket/run']); "
            "print('MODULES', rc, 'torch' in sys.modules, 'transformers' in sys.modules, 'ray' in "
            "sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **paper_hub_env(tmp_path)})
    assert "MODULES 0 False False False" in r.stdout, r.stdout + r.stderr
    assert "output: s3://bucket/run -- a URI" in r.stdout  # where artifacts go, and how


@pytest.mark.parametrize("sets,match", [
    (["bogus=1"], "unknown key"),
    (["train.epochz=3"], "unknown key"),
    (["train.epochs=three"], "train.epochs must be an integer"),
    (["merge.lambdas=[0.5, 1.5]"], "must be a number in \\[0, 1\\], got 1.5"),
    (["eval.benchmarks={}"], "eval.benchmarks must not be empty"),
    (["eval.benchmarks={gsm9k: 2}"], "unknown benchmark 'gsm9k'"),
    (["train.variants=[math]", "merge.kinds=[]"], "need two drafters"),
    (["eval.temperatures=[-1]"], "eval.temperatures"),
    (["train.loss_mask=shifted"], "train.loss_mask must be next or reference"),
    (["data.self_distill=beam"], "data.self_distill must be null, greedy or sample"),
    (["data.self_distill=greedy", "data.feature_mode=online"],
     "data.self_distill needs data.feature_mode: cached"),
    (["data.self_distill_corpora=[mathinstruct]"],
     "data.self_distill_corpora names .* data.self_distill is null"),
    (["data.self_distill=greedy", "data.self_distill_corpora=[math]"],
     "data.self_distill_corpora must be null or a non-empty list of distinct values from \\[mathinstruct"),
    (["eval.paired_baseline=maybe"], "eval.paired_baseline must be true or false"),
])
def test_bad_profiles_are_refused_with_one_clear_error(sets, match):
    with pytest.raises(ProfileError, match=match):
        load_profile("smoke", sets)


def test_unwritable_output_dir_is_refused_before_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke",
                        "--output-dir", str(blocker / "sub")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not writable" in r.stderr


def test_grid_includes_budget_matched_singles_and_both_granularities():
    p = load_profile("demo", ["eval.budget_matched=true",
                              "eval.strategies=[autoregressive, single, confidence, merged]"])
    cells = eval_cells(p)
    bm = [c for c in cells if c.budget_matched and c.strategy == "single"]
    assert bm and all(c.total_tokens == 2 * (p.eval.tree.total_tokens - 1) + 1 for c in bm)
    # the union reranked to one tree's budget
    mb = [c for c in cells if c.budget_matched and c.strategy == "merged"]
    assert mb and all(c.total_tokens == p.eval.tree.total_tokens for c in mb)
    assert {c.routing_granularity for c in cells if c.strategy == "confidence"} == {"step", "prompt"}
    assert len({c.key for c in cells}) == len(cells)


def test_paper_dry_run_counts_match_an_independent_count():
    """Every benchmark counts (null = all its prompts), corpora follow the variants, and an
    unknown verifier gets no invented cost constants."""
    from orchestrator.grid import corpora
    from orchestrator.plan.dryrun import estimate

    p = load_profile("paper")
    cells = eval_cells(p)
    # paper: svamp capped at 300, the rest null
    full = {"mt_bench": 80, "gsm8k": 1319, "math500": 500, "svamp": 300}
    expected = 0
    for c in cells:
        expected += full[c.benchmark]
    s = plan_summary(p)
    assert s["eval_prompt_runs"] == expected and s["prompts_total"] == sum(full.values())
    assert {c.benchmark for c in cells} == set(full)
    one = ["merge.kinds=[ties]", "eval.strategies=[autoregressive,single]", "eval.routers=[]"]
    assert corpora(load_profile("paper", ["train.variants=[math]", *one])) == ["mathinstruct"]
    assert plan_summary(load_profile("paper", ["train.variants=[chat]", *one]))["features"] == ["sharegpt"]
    assert estimate(load_profile("smoke",
                                 ["verifier=Qwen/Qwen2.5-0.5B-Instruct"])) == {"unknown_verifier": True}


@pytest.mark.parametrize("sets,match", [
    (["eval.routers=[oracle]"], r"eval.routers must be a list of distinct values from \[posthoc_confidence"),
    (["eval.switch_after=[0, 2]"],
     r"eval.switch_after must be a non-empty list of distinct integers in \[1, 5\]"),
    (["eval.switch_after=[6]"], "eval.switch_after must be"),
    (["eval.switch_to=[other]"], "eval.switch_to must be a non-empty list of distinct values from"),
    (["eval.switch_depth=0"], "eval.switch_depth must be an integer >= 1"),
    (["eval.mixed_variant=math"], "eval.mixed_variant must be mixed_half or mixed_full"),
    (["eval.heads=[math, chat]"], "eval.heads must be a list of >= 3 distinct drafter names"),
    (["eval.routers=[entropy_heads]", "eval.heads=[math, chat, bogus]"],
     r"eval.heads \['bogus'\] are not drafters"),
    (["eval.strategies=[single, depth_adaptive]", "eval.mixed_variant=mixed_full"],
     "use eval.mixed_variant 'mixed_full', which train.variants"),
    (["eval.strategies=[single, depth_adaptive]", "train.variants=[math, chat, mixed_full]",
      "eval.switch_depth=3"],
     r"eval.switch_depth must be an int in 1..tree.depth - 1 \(tree depth 3\)"),
    (["eval.routers=[posthoc_confidence]", "train.variants=[math, chat, mixed_full]",
      "eval.strategies=[merged]"],
     "posthoc_confidence reads the single-drafter traces"),
    (["eval.rq1_prompts=10", "eval.temperatures=[1.0]"],
     "eval.rq1_prompts sizes the single math and chat cells"),
    (["eval.rq1_prompts=10", "eval.rq1_backbone=hass"],
     r"eval.rq1_backbone 'hass' is not in train.backbones"),
    (["eval.strategies=[switching]", "train.variants=[math]", "merge.kinds=[]"],
     r"\['switching'\] need two drafters"),
    (["eval.system_prompt=3"], "eval.system_prompt must be null or a non-empty string"),
    (["eval.system_prompt=' '"], "eval.system_prompt must be null or a non-empty string"),
])
def test_bad_eval_keys_of_the_new_routers_and_strategies_are_refused_in_one_line(sets, match):
    with pytest.raises(ProfileError, match=match) as e:
        load_profile("smoke", sets)
    assert "\n" not in str(e.value)


def test_the_studys_routers_and_the_new_strategies_as_cells():
    """paper: the study's routers by name, switching for each k (and to merged), depth_adaptive with
    (mixed, math, chat); cells at the defaults keep the keys they had before the new fields."""
    from orchestrator.grid import KEY_DEFAULTS
    from orchestrator.keys import key_of

    p = load_profile("paper")
    cells = [c for c in eval_cells(p) if c.backbone == "hass" and c.benchmark == "gsm8k"
             and c.temperature == 0.0]
    heads = [c for c in cells if c.strategy == "entropy" and c.routing_granularity == "turn"]
    assert [(c.drafters, c.decide_steps) for c in heads] == [
        (("hass-math", "hass-chat", "hass-mixed_full", "hass-avg0.5"), 1)]
    text = [c for c in cells if c.strategy == "confidence" and c.decode.route_score == "node"]
    assert [(c.routing_granularity, c.decide_steps, c.drafters) for c in text] == [
        ("prompt", 1, ("hass-math", "hass-chat"))]
    sw = [(c.decode.switch_after, c.decode.switch_to) for c in cells if c.strategy == "switching"]
    assert sorted(sw) == [(k, to) for k in range(1, 6) for to in ("merged", "specialist")]
    (da,) = [c for c in cells if c.strategy == "depth_adaptive"]
    assert da.drafters == ("hass-mixed_full", "hass-math", "hass-chat") and da.decode.switch_depth == 2
    assert da.total_tokens == p.eval.tree.total_tokens == 60 and (p.eval.tree.top_k,
                                                                  p.eval.tree.depth) == (10, 6)
    old = [c for c in cells if all(c.record[k] == v for k, v in KEY_DEFAULTS.items())]
    assert old and all(c.key == key_of({k: v for k, v in c.record.items() if k not in KEY_DEFAULTS})
                       for c in old)
    assert KEY_DEFAULTS == {  # the values runs had before each field existed
        "tree": "fixed", "route_score": "path", "switch_after": 2, "switch_to": "specialist",
        "switch_depth": 2, "decide_steps": None, "prompts": None, "hedge_learner": "ftl",
        "hedge_feedback": "agreement", "hedge_reset": "turn", "hedge_ties": "lower", "hedge_eta": 0.5}
    ar = next(c for c in eval_cells(p) if c.strategy == "autoregressive")  # verifies the root alone: budget 1
    assert (ar.total_tokens, ar.record["total_tokens"], ar.decode.tree.total_tokens) == (1, 1, 2)
    assert len({c.key for c in eval_cells(p)}) == len(eval_cells(p))
    # keys written by runs before these fields existed (smoke, as computed by the grid of that commit)
    smoke = {c.label: c.key for c in eval_cells(load_profile("smoke"))}
    assert (smoke["eagle2:single:math|gsm8k|T=0"], smoke["eagle2:confidence/step:math+chat|gsm8k|T=0"],
            smoke["eagle2:single:math[auto]|gsm8k|T=0"]) == ("82f277a7510c", "ccc925b6d3d8", "3a001d060af7")


def test_cpu_profiles_add_the_budget_matched_rival_of_depth_adaptive():
    # cpu-study and the demo leave switching and depth_adaptive out (their headers say why)
    p = load_profile("demo", ["eval.strategies=[autoregressive, single, confidence, merged, switching, "
                              "depth_adaptive]"])
    cells = eval_cells(p)
    assert not p.eval.budget_matched
    bm = [c for c in cells if c.strategy == "merged" and c.budget_matched]
    assert len(bm) == len([c for c in cells if c.strategy == "depth_adaptive"]) > 0
    assert {c.strategy for c in cells} >= {"switching", "depth_adaptive", "confidence", "entropy"}


def test_rq1_cells_read_more_prompts_and_the_others_a_subset_of_them():
    from drafters.data.sources import subsample
    from orchestrator.grid import cell_prompts, pool_sizes

    p = load_profile("demo", ["train.backbones=[eagle2]", "eval.rq1_prompts=12", "eval.rq1_backbone=eagle2",
                              "eval.benchmarks={gsm8k: 2, math500: 2, svamp: 2, mt_bench: 2}"])
    cells = eval_cells(p)
    rq1 = [c for c in cells if c.prompts is not None]
    assert {(c.backbone, c.drafter, c.temperature, c.strategy, c.tree_mode) for c in rq1} == {
        ("eagle2", d, 0.0, "single", "fixed") for d in ("math", "chat")}
    assert len(rq1) == 8 and all(c.prompts == 12 and "[n=12]" in c.label for c in rq1)
    assert pool_sizes(p) == {b: 12 for b in ("gsm8k", "math500", "svamp", "mt_bench")}
    other = next(c for c in cells if c.prompts is None and c.strategy == "single"
                 and c.benchmark == "mt_bench")
    assert cell_prompts(p, other) == 2
    pool = subsample(list(range(80)), 12, p.eval.seed)  # the driver's draw, then each cell's from the pool
    assert set(subsample(pool, cell_prompts(p, other), p.eval.seed)) <= set(pool)
    assert plan_summary(p)["eval_prompt_runs"] == sum(cell_prompts(p, c) for c in cells)


def test_a_cells_decode_config_carries_what_it_sets_and_the_defaults_otherwise():
    """The DecodeConfig the driver sends an eval actor (grid.eval_job): a plain merged cell keeps the
    strategy options at their defaults; a switching cell carries its own; the trace columns name them."""
    from decoding.config import DecodeConfig
    from orchestrator.grid import eval_job

    p = load_profile("paper")
    cells = eval_cells(p)
    plain = eval_job(p, next(c for c in cells if c.strategy == "merged")).decode
    defaults = DecodeConfig()
    assert (plain.route_score, plain.switch_after, plain.switch_to, plain.switch_depth) == (
        defaults.route_score, defaults.switch_after, defaults.switch_to, defaults.switch_depth)
    assert plain.tree == p.eval.tree and plain.max_new_tokens == p.eval.max_new_tokens
    sw = eval_job(p, next(c for c in cells if c.strategy == "switching" and c.decode.switch_after == 4
                          and c.decode.switch_to == "merged")).decode
    assert (sw.route_score, sw.switch_after, sw.switch_to, sw.routing_decide_steps) == ("node", 4, "merged",
            1)
    assert plain.columns() == {"route_score": "path", "switch_after": 2, "switch_to": "specialist",
                                     "switch_depth": 2, "hedge_spec": ""}


def test_cpu_study_runs_the_lambda_sweep_hass_and_t1_in_one_invocation():
    """cpu-study's grid: averaged EAGLE-2 drafters at three lambdas strictly between 0 and 1 (Fig6 needs two;
    lambda 0 and 1 would repeat the specialists), each evaluated as a single drafter on every benchmark and
    temperature, three backbones (EAGLE-3's and HASS's specialists with their average and compositions: RQ1
    and RQ3a for each), T=0 and T=1; EAGLE-2's both mixed drafters (RQ2-reversal) and depth-5 trees
    (depth-deep's depths 4-5: issue 64 item 4)."""
    p = load_profile("cpu-study")
    assert len(p.merge.lambdas) >= 3 and all(0 < lam < 1 for lam in p.merge.lambdas)
    assert set(p.train.backbones) == {"eagle2", "hass", "eagle3"} and p.eval.tree.depth >= 5
    assert set(p.eval.temperatures) == {0.0, 1.0}
    cells = eval_cells(p)
    avg = {(c.drafter, c.benchmark, c.temperature) for c in cells if c.strategy == "single"
           and c.backbone == "eagle2" and c.drafter.startswith("avg")}
    assert avg == {(f"avg{lam:g}", b, t) for lam in p.merge.lambdas for b in p.eval.benchmarks
                   for t in p.eval.temperatures}
    assert {c.backbone for c in cells if c.strategy == "single" and c.temperature == 1.0} == {"eagle2",
            "hass", "eagle3"}
    mixed = {(c.drafter, c.temperature) for c in cells if c.strategy == "single" and c.backbone == "eagle2"}
    assert {(m, t) for m in ("mixed_half", "mixed_full") for t in (0.0, 1.0)} <= mixed
    for b in ("hass", "eagle3"):
        mine = {(c.strategy, c.drafter) for c in cells if c.backbone == b}
        assert {("single", "math"), ("single", "chat"), ("single", "avg0.5"), ("merged", "math+chat")} <= mine


@pytest.mark.parametrize("sets,match", [
    (["resources.node.object_store_gb_s=0"],
     r"resources.node.object_store_gb_s must be a number in \(0, 100\], got 0"),
    (["resources.node.object_store_gb_s=2500"],
     r"object_store_gb_s must be a number in \(0, 100\], got 2500"),
    (["resources.node.object_store_gb_s=fast"], "resources.node.object_store_gb_s must be a number"),
    (["resources.node.disk_gb=-1"], r"resources.node.disk_gb must be a number in \[0, 1e\+06\], got -1"),
    (["resources.node.disk_gb_s=0"], r"resources.node.disk_gb_s must be a number in \(0, 200\], got 0"),
    (["resources.node.disk=8000"],
     r"unknown key 'resources.node.disk' \(did you mean 'resources.node.disk_gb'\?\)"),
    (["resources.node=4"], "resources.node must be a mapping"),
    (["resources.eval.packing=max"], "resources.eval.packing must be fixed or auto, got 'max'"),
    (["resources.eval.verify_batch=0"],
     r"resources.eval.verify_batch must be an integer in \[1, 256\], got 0"),
    (["resources.eval.verify_batch=2.5"], "resources.eval.verify_batch must be an integer"),
])
def test_bad_node_io_and_packing_settings_are_refused_in_one_line(sets, match):
    """The node's I/O figures (the dry run's cost model) and the eval packing: each bad value one line,
    naming the key, what is allowed and what was given (a GB/s figure in MB/s is out of range)."""
    with pytest.raises(ProfileError, match=match) as e:
        load_profile("paper", sets)
    assert "\n" not in str(e.value)


def test_the_node_defaults_are_the_deploy_files_node_type():
    """resources.node defaults to a p4de.24xlarge (deploy/ray-cluster.yaml's GPU worker): 8 x 1,000 GB of
    NVMe at about 16 GB/s in RAID 0, and S3 at 2.5 GB/s a node (a stated read-ahead client's figure)."""
    import yaml

    from tests.test_deploy import LAUNCHER

    launcher = yaml.safe_load(LAUNCHER.read_text())["available_node_types"]["gpu_worker"]["node_config"]
    assert launcher["InstanceType"] == "p4de.24xlarge"
    node = load_profile("smoke").resources.node
    assert (node.disk_gb, node.disk_gb_s, node.object_store_gb_s) == (8000.0, 16.0, 2.5)
    assert load_profile("paper").resources.node == node
