"""The paper profile runs the study's protocol: its SVAMP problems in its order, its global batch
whatever the worker count, and its depth tables stop at the study's 5 levels (deeper ones apart)."""
from __future__ import annotations

import dataclasses
import json
import warnings
from types import SimpleNamespace

import polars as pl
import pytest

from drafters.data.sources import (
    SVAMP_STUDY_IDS,
    DataSourceNotFound,
    SourceOptions,
    default_data_root,
    load_benchmark,
)
from orchestrator.plan.sizing import load_profile
from orchestrator.profile import ProfileError, batch_plan
from orchestrator.report.tables import STUDY_DEPTHS, depth_table, depth_table_deeper

ROOT = default_data_root()
needs_data = pytest.mark.skipif(ROOT is None or not (ROOT / SVAMP_STUDY_IDS).is_file(),
                                reason="needs shared/data with benchmarks/svamp/study_ids.json")


def _study_ids() -> list[str]:
    return json.loads((ROOT / SVAMP_STUDY_IDS).read_text())


def _local_svamp() -> dict:
    return {r["ID"]: r for r in json.loads((ROOT / "benchmarks/svamp/SVAMP.json").read_text())}


def _grid_prompts(profile_name: str, sets: tuple = ()) -> dict:
    """The prompts the grid evaluates, through the driver's own selection (load + seeded subsample)."""
    from orchestrator.run.driver import Driver

    return Driver._prompts(SimpleNamespace(p=load_profile(profile_name, list(sets))))


# ---------------------------------------------------------------- SVAMP: the study's 300, in its order
@needs_data
def test_paper_svamp_prompts_are_the_studys_ids_in_order_with_the_local_answers():
    ids, local = _study_ids(), _local_svamp()
    assert len(ids) == 300 and len(set(ids)) == 300
    prompts = _grid_prompts("paper")["svamp"]
    assert [p.id for p in prompts] == ids
    for p in prompts:
        rec = local[p.id]
        assert float(p.reference) == float(rec["Answer"]) and p.reference == str(rec["Answer"])
        # the study's text, word for word
        assert p.turns == (rec["Body"].strip() + " " + rec["Question"].strip(),)


@needs_data
@pytest.mark.parametrize("name", ["demo"])  # the CPU profiles read gsm8k and mt_bench: svamp added
def test_cpu_profiles_draw_svamp_from_the_study_set_in_its_order(name):
    from orchestrator.grid import pool_sizes

    ids = _study_ids()
    sets = ("eval.benchmarks={gsm8k: 2, svamp: 2, mt_bench: 2}", "eval.rq1_prompts=12")
    n = pool_sizes(load_profile(name, list(sets)))["svamp"]  # the most any cell reads (RQ1's cells read more)
    got = [p.id for p in _grid_prompts(name, sets)["svamp"]]
    assert len(got) == n and set(got) <= set(ids)
    assert got == sorted(got, key=ids.index)  # a seeded draw, kept in the study's order


@needs_data
def test_svamp_all_rows_on_request_and_the_study_set_by_default():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study, report = load_benchmark("svamp")
        everything, _ = load_benchmark("svamp", SourceOptions(svamp_set="all"))
    assert len(study) == 300 and len(everything) == 1000 and "the study's 300 problems" in report.origin
    with pytest.raises(ValueError, match="svamp_set must be one of"):
        SourceOptions(svamp_set="test")


@needs_data
def test_svamp_study_ids_missing_from_the_source_are_refused_and_an_absent_list_is_said(tmp_path):
    (tmp_path / "benchmarks/svamp").mkdir(parents=True)
    (tmp_path / "benchmarks/svamp/SVAMP.json").symlink_to(ROOT / "benchmarks/svamp/SVAMP.json")
    opts = SourceOptions(data_root=tmp_path, allow_hub=False)
    with pytest.warns(UserWarning, match="study_ids.json not found"):
        assert len(load_benchmark("svamp", opts)[0]) == 1000  # no list: every row, and a warning says so
    (tmp_path / SVAMP_STUDY_IDS).write_text(json.dumps(["chal-1", "chal-99999"]))
    with pytest.raises(DataSourceNotFound, match="1 of the study's 2 SVAMP IDs.*chal-99999"):
        load_benchmark("svamp", opts)
    (tmp_path / SVAMP_STUDY_IDS).write_text(json.dumps(["chal-2", "chal-1"]))
    assert [p.id for p in load_benchmark("svamp", opts)[0]] == ["chal-2", "chal-1"]


# ---------------------------------------------------------------- global batch 8 whatever the worker count
@pytest.mark.parametrize("workers,per_worker,accum", [(1, 8, 1), (2, 4, 1), (4, 2, 1), (8, 1, 1)])
def test_paper_global_batch_is_8_on_any_worker_count(workers, per_worker, accum):
    p = load_profile("paper", [f"resources.train.num_workers={workers}"])
    plan = batch_plan(p)
    assert (plan.workers, plan.per_worker, plan.grad_accum, plan.global_batch) == (workers, per_worker, accum,
            8)
    assert plan.describe() == (f"train batch: global 8 = {workers} worker(s) x per-worker batch "
                               f"{per_worker} x "
                               f"gradient accumulation {accum} (from train.global_batch)")


def test_per_worker_batch_is_capped_and_accumulation_fills_the_rest():
    plan = batch_plan(load_profile("paper", ["resources.train.num_workers=2", "train.batch_size=2"]))
    assert (plan.per_worker, plan.grad_accum, plan.global_batch) == (2, 2, 8)
    assert batch_plan(load_profile("paper")).global_batch == 8  # the shipped profile: 4 workers x 2 x 1


def test_without_global_batch_the_batch_is_per_worker_as_before():
    plan = batch_plan(load_profile("demo", ["resources.train.num_workers=2", "train.grad_accum=3"]))
    p = load_profile("demo")
    assert (plan.per_worker, plan.grad_accum, plan.global_batch) == (p.train.batch_size, 3,
                                                                     2 * p.train.batch_size * 3)
    assert "no train.global_batch" in plan.describe()


@pytest.mark.parametrize("sets,match", [
    (["resources.train.num_workers=3"],
     r"^experiments/profiles/paper.yaml: train.global_batch 8 is not divisible by "
     r"resources.train.num_workers 3 x "
     r"per-worker batch 2 \(= 6"),
    (["resources.train.num_workers=2", "train.batch_size=3"], "not divisible by .* 2 x per-worker batch 3"),
    (["resources.train.num_workers=16"], "global_batch 8 is smaller than resources.train.num_workers 16"),
    (["train.grad_accum=2"], "train.grad_accum is derived from train.global_batch"),
    (["train.global_batch=0"], "train.global_batch must be null or an integer >= 1"),
])
def test_a_global_batch_the_workers_cannot_split_is_refused_in_one_line(sets, match, monkeypatch):
    from orchestrator import profile as prof

    monkeypatch.chdir(prof.PROFILE_DIR.parents[1])  # the message names the file relative to the checkout
    with pytest.raises(ProfileError, match=match) as e:
        load_profile("paper", sets)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- depth tables: the study's 5 levels
def _steps(depth_levels: int) -> pl.LazyFrame:
    rows = [{"backbone": "hass", "method": "math", "benchmark": "gsm8k", "temperature": 0.0,
             "strategy": "single",
             "depth_accept": [True] * (depth_levels - 1) + [i % 2 == 0]} for i in range(4)]
    rows.append({**rows[0], "method": "autoregressive", "strategy": "autoregressive", "depth_accept": []})
    return pl.LazyFrame(rows)


def test_depth_tables_stop_at_the_studys_5_levels_and_the_deeper_ones_go_apart():
    steps = _steps(7)  # a deep tree: 7 levels reached
    main, deeper = depth_table(steps), depth_table_deeper(steps)
    assert STUDY_DEPTHS == 5 and main["depth"].to_list() == [1, 2, 3, 4, 5]
    assert main["accept_rate"].to_list() == [1.0] * 5 and main["reached"].to_list() == [4] * 5
    assert deeper["depth"].to_list() == [6, 7] and deeper["accept_rate"].to_list() == [1.0, 0.5]
    assert depth_table(steps, max_depth=None)["depth"].to_list() == list(range(1, 8))
    assert depth_table_deeper(_steps(3)).is_empty() and depth_table(_steps(3))["depth"].to_list() == [1, 2, 3]


def test_per_backbone_train_settings_reach_only_their_backbones_drafters(tmp_path, monkeypatch):
    """train.per_backbone: the paper profile warms HASS up as the study's code does (1% of its steps),
    EAGLE-2 for 2,000 steps; each drafter's TrainConfig and unit key carry its own backbone's values,
    and a profile without per_backbone keeps the keys runs had before."""
    from orchestrator.grid import train_cells
    from orchestrator.keys import train_key_settings as _train_key_settings
    from orchestrator.run.driver import Driver

    p = load_profile("paper")
    assert p.train.for_backbone("hass").warmup_steps == 1660
    assert p.train.for_backbone("eagle2").warmup_steps == 2000
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    d = Driver(p, str(tmp_path / "run"))
    d.verifier_name, d.vocab = "v", None
    try:
        caches = {c: {"train": "k", "heldout": "h", "train_ids": list(range(8)), "heldout_ids": []}
                  for c in ("sharegpt", "mathinstruct")}
        cfgs = {c.backbone: d._train_config(c, caches) for c in train_cells(p)}
    finally:
        d.lease.release()
    assert {b: c.warmup_steps for b, c in cfgs.items()} == {"eagle2": 2000, "hass": 1660, "eagle3": 2000}
    for b, c in cfgs.items():  # every setting as the profile has it for b, the batch split by the plan
        t = p.train.for_backbone(b)
        bp = batch_plan(p, t)
        assert c.settings == dataclasses.replace(t.settings, batch_size=bp.per_worker,
                                                 grad_accum=bp.grad_accum)
    # EAGLE-3 with SpecForge's recipe (lr 1e-4, 10 epochs), the others with the study's
    assert {b: (c.lr, c.epochs) for b, c in cfgs.items()} == {"eagle2": (3e-5, 20), "hass": (3e-5, 20),
                                                              "eagle3": (1e-4, 10)}
    assert _train_key_settings(p, "hass")["warmup_steps"] == 1660
    assert _train_key_settings(p, "eagle2") == _train_key_settings(load_profile("paper",
            ["train.per_backbone={}"]),
                                                                     "eagle2")
    assert "per_backbone" not in _train_key_settings(p, "hass")


def test_a_backbone_may_train_fewer_variants_and_gets_only_the_cells_they_allow():
    """The demo: EAGLE-3 trains math and chat (one epoch) beside EAGLE-2's four variants; EAGLE-3 gets
    its singles, average and compositions, not the cells that need a mixed drafter (the entropy
    router's heads, depth_adaptive); EAGLE-2 keeps every cell it had."""
    from orchestrator.grid import corpora, eval_cells, merge_cells, train_cells

    # the demo of 2026-12-03 to 2026-12-06 in the keys this test reads
    demo = ["train.variants=[math, chat, mixed_half, mixed_full]", "train.epochs=2",
            "train.per_backbone={eagle3: {variants: [math, chat], epochs: 1}}",
            "eval.strategies=[autoregressive, single, confidence, merged, switching, depth_adaptive]",
            "eval.heads=[math, chat, mixed_full, avg0.5]"]
    p, alone = load_profile("demo", [*demo, "train.backbones=[eagle2, eagle3]"]), \
        load_profile("demo", [*demo, "train.backbones=[eagle2]"])
    assert [c.name for c in train_cells(p) if c.backbone == "eagle3"] == ["eagle3-math", "eagle3-chat"]
    assert p.train.for_backbone("eagle3").epochs == 1 and p.train.for_backbone("eagle2").epochs == 2
    assert [m.name for m in merge_cells(p)] == ["eagle2-avg0.5", "eagle3-avg0.5"]
    cells = eval_cells(p)
    assert [c for c in cells if c.backbone != "eagle3"] == eval_cells(alone)
    e3 = {(c.strategy, c.drafter) for c in cells if c.backbone == "eagle3"}
    assert {d for s_, d in e3 if s_ == "single"} == {"math", "chat", "avg0.5"}
    assert {s_ for s_, _ in e3} == {"single", "confidence", "merged", "switching"}
    assert not any(s_ == "entropy" or "mixed" in d for s_, d in e3)
    assert corpora(p) == corpora(alone)


@pytest.mark.parametrize("value,match", [
    ("{eagle3: {variants: [math, mixed_full]}}",
     r"train.per_backbone.eagle3.variants \['math', 'mixed_full'\] must"),
    ("{eagle3: {variants: [chat, medusa]}}", "train.per_backbone must be a mapping of backbone"),
    ("{medusa: {lr: 1.0e-4}}", "train.per_backbone must be a mapping of backbone"),
    ("{hass: {zero_stage: 3}}", "train.per_backbone must be a mapping of backbone"),
    ("{hass: {warmup_steps: -1}}", "train.per_backbone must be a mapping of backbone"),
])
def test_bad_per_backbone_settings_are_refused_in_one_line(value, match):
    with pytest.raises(ProfileError, match=match) as e:
        load_profile("paper", [f"train.per_backbone={value}"])
    assert "\n" not in str(e.value)
