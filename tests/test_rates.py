"""The makespan from stage rates: the list scheduler on graphs worked out by hand, the grid's task
graph, and the dry run's table (a measured run's rates are checked in tests/test_grid.py)."""
from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.grid import cell_prompts, eval_cells, merge_cells, train_cells
from orchestrator.plan import billing, costs, rates
from orchestrator.plan.makespan import Task, schedule
from orchestrator.plan.rates import overheads
from orchestrator.plan.rates.measured import _fit_overhead
from orchestrator.plan.rates.taskgraph import _for, _tokens_per_turn
from orchestrator.plan.sizing import load_profile

ROOT = Path(__file__).resolve().parents[1]


def test_independent_tasks_share_the_devices():
    ts = [Task("a", "eval", 3.0), Task("b", "eval", 5.0)]
    assert schedule(ts, 1)["makespan"] == 8.0
    assert schedule(ts, 2)["makespan"] == 5.0
    assert schedule(ts, 2, caps={"g": 1})["makespan"] == 5.0  # no group: no cap
    grouped = [dataclasses.replace(t, group="g") for t in ts]
    assert schedule(grouped, 2, caps={"g": 1})["makespan"] == 8.0


def test_stage_barriers_against_the_bare_graph():
    """Features A (10 s) feeds trial B (5 s); features C (1 s) feeds trial D (20 s), on 2 devices:
    with the driver's barriers D waits for A too (10 + 20); without, D starts at 1 (1 + 20)."""
    ts = [Task("A", "features", 10.0), Task("C", "features", 1.0),
          Task("B", "train", 5.0, deps=("A",)), Task("D", "train", 20.0, deps=("C",))]
    with_b = schedule(ts, 2, barriers=True)
    assert with_b["makespan"] == 30.0 and with_b["stages"]["train"] == (10.0, 30.0)
    assert schedule(ts, 2, barriers=False)["makespan"] == 21.0


def test_the_critical_path_goes_first():
    """A 3+3 chain and three 2 s tasks on 2 devices: starting the chain at once gives 6 s; a
    scheduler that ran the short tasks first would need 8."""
    ts = [Task("L1", "eval", 3.0), Task("L2", "eval", 3.0, deps=("L1",))] + [Task(f"S{i}", "eval", 2.0)
            for i in range(3)]
    assert schedule(ts, 2, barriers=False)["makespan"] == 6.0


def test_wide_tasks_wait_for_devices_and_narrow_ones_backfill():
    ts = [Task("wide", "train", 4.0, need=2), Task("n1", "eval", 1.0), Task("n2", "eval", 1.0, deps=("n1",))]
    s = schedule(ts, 3, barriers=False)
    assert s["makespan"] == 4.0 and s["busy"] == 10.0  # n1, n2 ran beside the wide task


@pytest.mark.parametrize("tasks,devices,match", [
    ([Task("a", "eval", 1.0, need=4)], 2, "needs 4 devices"),
    ([Task("a", "eval", 1.0, deps=("b",)), Task("b", "eval", 1.0, deps=("a",))], 1, "cycle"),
    ([Task("a", "eval", 1.0, deps=("zz",))], 1, "unknown task"),
    ([Task("a", "eval", 1.0), Task("a", "train", 1.0)], 1, "unique"),
])
def test_bad_graphs_are_refused(tasks, devices, match):
    with pytest.raises(ValueError, match=match):
        schedule(tasks, devices, barriers=False)


def _rates(**kw) -> rates.Rates:
    base = dict(hardware="test", verifier="smollm2-135m-instruct", device="cpu", measured=True, source="test",
                features_tokens_per_s=1000.0, features_devices=2, train_tokens_per_s={"eagle2": 500.0,
                        "hass": 250.0,
                                                                                             "eagle3": 70.0},
                train_devices=1, train_overhead_s=30.0, merge_s=1.0, eval_steps_per_s={"single": 10.0,
                        "merged": 5.0},
                eval_tau={"single": 2.0, "merged": 3.0}, generate_tokens_per_s=20.0, eval_devices=1,
                eval_overhead_s=2.0, tokens_per_example={"mathinstruct": 100.0, "sharegpt": 200.0},
                tokens_per_turn={"gsm8k": 32.0, "mt_bench": 32.0, "math500": 32.0, "svamp": 32.0},
                max_new_tokens=32)
    return rates.Rates(**{**base, **kw})


def test_the_task_graph_follows_the_grid():
    p = load_profile("demo", ["train.backbones=[eagle2, hass]",
                              "train.variants=[math, chat, mixed_half, mixed_full]",
                              "eval.strategies=[autoregressive, single, merged, switching]"])
    r = _rates()
    ts = rates.tasks(p, r)
    by = {t.name: t for t in ts}
    shards = sum(-(-cell_prompts(p, c) // p.eval.shard_size) for c in eval_cells(p))
    assert sum(t.stage == "eval" for t in ts) == shards
    assert sum(t.stage == "train" for t in ts) == len(train_cells(p))
    assert sum(t.stage == "merge" for t in ts) == len(merge_cells(p))
    # a trial: its overhead plus its tokens at its backbone's rate; a mixed one waits for both corpora
    t = by["train:hass-math"]
    assert t.seconds == pytest.approx(30.0 + p.data.n * 100.0 * p.train.epochs / 250.0)
    assert set(by["train:eagle2-mixed_full"].deps) == {"features:mathinstruct", "features:sharegpt"}
    # an eval shard of a strategy the rates did not measure takes the measured strategies' mean
    cell = next(c for c in eval_cells(p) if c.strategy == "switching" and c.benchmark == "gsm8k")
    m = min(p.eval.shard_size, cell_prompts(p, cell))
    want = 2.0 + m * 32.0 / 2.5 / 7.5 + (m * 32.0 / 20.0 if p.eval.paired_baseline else 0.0)
    assert by[f"eval:{cell.key}:0"].seconds == pytest.approx(want)
    assert set(by[f"eval:{cell.key}:0"].deps) == {f"train:{d}" for d in cell.drafters}
    with pytest.raises(ValueError, match="measured with verifier"):
        rates.tasks(p, _rates(verifier="llama3-8b-instruct"))


def test_unmeasured_strategies_take_the_mean_and_unknown_lengths_the_assumption():
    r = _rates()
    assert _for(r.eval_tau, "switching") == pytest.approx(2.5)
    assert _tokens_per_turn(r, "gsm8k", 32) == 32.0
    assert _tokens_per_turn(r, "gsm8k", 1024) == 400  # a longer budget: the stated assumption


def test_more_gpus_never_take_longer_and_the_estimate_says_so():
    from orchestrator.plan.concurrency import parse_cluster

    p = load_profile("paper")
    r = rates.estimated(p)
    assert not r.measured and "estimate" in r.hardware
    rows = [billing.on_cluster(p, r, parse_cluster(c)) for c in billing.DEFAULT_CLUSTERS]
    assert [m["devices"] for m in rows] == [8, 16, 32, 64]
    totals = [m["total"] for m in rows]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]
    assert all(m["pipelined"] <= m["total"] + 1e-6 for m in rows)
    # 8 GPUs, one 8-GPU trial at a time: the training compute is the GPU-h estimate's own figure (busy,
    # with the held-out passes' one GPU in eight); the overheads come on top of it (allocated)
    from orchestrator.plan.dryrun import estimate

    train = estimate(p)["train_gpu_h"]
    assert rows[0]["busy"]["train"] == pytest.approx(train, rel=0.02)
    # (the paper profile runs as a task graph: no per-stage bill; the span's devices bound what it held)
    assert train < rows[0]["used"]["train"] <= rows[0]["devices"] * rows[0]["stages"]["train"] / 3600 + 1e-6


def _dry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--dry-run", *args],
                          capture_output=True, text=True, timeout=300)


def test_dry_run_times_a_cpu_profile_with_saved_rates(tmp_path):
    f = tmp_path / "rates.json"
    f.write_text(_rates().to_json())
    r = _dry("--profile", "demo", "--rates", str(f))
    assert r.returncode == 0, r.stderr
    assert "makespan from rates (measured: test" in r.stdout and "(as configured)" in r.stdout
    assert rates.load(f) == _rates()


def test_an_unmeasured_backbone_is_scaled_from_a_measured_one_by_flops_and_said_so():
    """A run without EAGLE-3 times a profile with it: EAGLE-2's rate x its FLOPs per token over EAGLE-3's
    (orchestrator/plan/costs.py), named in the notes; a profile with every rate measured is left alone."""
    from orchestrator.plan.costs import VERIFIERS, train_flops_per_token

    p = load_profile("demo", ["train.backbones=[eagle2, eagle3]"])
    r = _rates(train_tokens_per_s={"eagle2": 500.0})
    with pytest.raises(ValueError, match=r"no training rate for backbone\(s\) \['eagle3'\]"):
        rates.tasks(p, r)
    s = rates.with_scaled_backbones(p, r)
    v = VERIFIERS[p.verifier]
    ratio = train_flops_per_token(v, "eagle2", 1) / train_flops_per_token(v, "eagle3", 1)
    assert 0.1 < ratio < 0.2 and s.train_tokens_per_s["eagle3"] == pytest.approx(500.0 * ratio)
    assert any(n.startswith("eagle3: training rate not measured") for n in s.notes) and r.notes == []
    assert rates.tasks(p, s)
    assert rates.with_scaled_backbones(p, _rates()) == _rates()


@pytest.mark.parametrize("content,match", [(None, "no such file"), ("[1, 2]", "not a rates file"),
                                           ('{"hardware": "x"}', "not a rates file")])
def test_bad_rates_get_one_line(tmp_path, content, match):
    f = tmp_path / "r.json"
    if content is not None:
        f.write_text(content)
    r = _dry("--profile", "demo", "--rates", str(f))
    assert r.returncode == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_rates_of_another_verifier_are_refused(tmp_path):
    f = tmp_path / "rates.json"
    f.write_text(json.dumps({**json.loads(_rates().to_json()), "verifier": "llama3-8b-instruct"}))
    r = _dry("--profile", "demo", "--rates", str(f))
    assert r.returncode == 2 and "measured with verifier 'llama3-8b-instruct'" in r.stderr


ONE_TRIAL = ["resources.train.max_concurrent_trials=1"]  # the fits below assume trials one at a time


def _write_run(root: Path, workers: int = 1) -> Path:
    """A finished run's files, laid out as the driver, the feature store and the trainer write
    them (traces partitioned and recorded by the manifest; one stale file it does not record)."""
    import polars as pl

    from orchestrator.profile import profile_dict

    p = load_profile("smoke", [f"resources.train.num_workers={workers}", *ONE_TRIAL])
    (root / "profile.json").write_text(json.dumps(profile_dict(p), default=str))
    cell = dict(drafter="math", routing_granularity="step", merge_dedup=False, total_tokens=8,
                budget_matched=False,
                prompt_id="p", turn=0)
    ar = dict(cell, strategy="autoregressive", drafter="-", verifier_calls=8, new_tokens=8, wall_time_s=1.0,
              generate_tokens=8, generate_wall_time_s=2.0)
    sp = dict(cell, strategy="single", verifier_calls=4, new_tokens=8, wall_time_s=2.0, generate_tokens=None,
              generate_wall_time_s=None)
    part = "traces/prompts/backbone=eagle2/benchmark=gsm8k/temperature=0"
    (root / part).mkdir(parents=True)
    files = {"e0": [ar], "e1": [sp], "e2": [sp], "e3": [sp], "stale": [dict(sp, wall_time_s=1000.0)]}
    for name, rows in files.items():
        pl.DataFrame(rows).write_parquet(root / part / f"{name}.parquet")
    cells = {f"t{i}": {"stage": "train", "status": "done"} for i in range(2)}
    cells |= {"m": {"stage": "merge", "status": "done"}}
    cells |= {k: {"stage": "eval", "status": "done", "files": [f"{part}/{k}.parquet"]} for k in files
              if k != "stale"}
    stages = {"features": {"seconds": 50.0, "units_run": 3}, "train": {"seconds": 100.0, "units_run": 2},
              "merge": {"seconds": 2.0, "units_run": 1}, "eval": {"seconds": 400.0, "units_run": 4},
              "report": {"seconds": 3.0, "units_run": 1}}
    for v in stages.values():
        v["machine"] = "box (2 CPUs)"
    (root / "manifest.json").write_text(json.dumps({"cells": cells, "stages": stages}))
    for corpus, tokens, ex in (("mathinstruct", 640, 8), ("sharegpt", 720, 8)):  # (under max_length 96)
        d = root / "features" / f"{corpus}-train-x"
        d.mkdir(parents=True)
        d.joinpath("manifest.json").write_text(json.dumps(
            {"corpus": corpus, "part": "train", "tokens": tokens, "examples": ex, "seconds": 10.0}))
    for v in ("math", "chat"):
        d = root / "checkpoints" / f"eagle2-{v}" / "final"
        d.mkdir(parents=True)
        hist = [{"epoch": 0, "steps": 0}, {"epoch": 1, "epoch_seconds": 20.0, "train_tokens_per_s": 5.0}]
        d.joinpath("config.json").write_text(json.dumps(
            {"backbone": "eagle2", "training": {"variant": v, "history": hist}}))
    return root


def test_measure_reads_a_run_by_hand(tmp_path):
    """Smoke profile: n=8, 1 epoch, one trial at a time, 2 eval actors of 1 CPU, features on 2 CPUs."""
    r = rates.measure(_write_run(tmp_path))
    assert r.measured and r.hardware == "box (2 CPUs)" and r.device == "cpu" and not r.notes
    assert r.features_tokens_per_s == pytest.approx(1360 / 20.0)  # the caches' own seconds
    assert r.tokens_per_example == {"mathinstruct": 80.0, "sharegpt": 90.0}
    # every token of both trials (8 x 80 + 8 x 90, one epoch) over their loops' 40 s: not the
    # trainer's loss-token figure (5/s)
    assert r.train_tokens_per_s == {"eagle2": pytest.approx(1360 / 40.0)}
    # one trial at a time: the overhead is the stage's time less the loops, per trial
    assert r.train_overhead_s == pytest.approx((100.0 - 40.0) / 2, rel=1e-6)
    assert r.eval_steps_per_s["single"] == pytest.approx(12 / 6.0)
    assert r.eval_tau["single"] == pytest.approx(2.0)
    assert r.eval_steps_per_s["autoregressive"] == pytest.approx(8.0)
    assert r.generate_tokens_per_s == pytest.approx(4.0)
    assert r.tokens_per_turn == {"gsm8k": 8.0} and r.max_new_tokens == 8
    assert r.merge_s == pytest.approx(2.0) and r.report_s == pytest.approx(3.0)
    # the fitted overheads give back each stage's wall time through the scheduler, for the
    # profile's own cells (the stale trace file, 1000 s of decoding, is not read)
    p = load_profile("smoke", ONE_TRIAL)
    ts = rates.tasks(p, r)
    for stage, want in (("train", 100.0), ("eval", 400.0), ("features", 50.0)):
        sub = [dataclasses.replace(t, deps=()) for t in ts if t.stage == stage]
        got = schedule(sub, rates.profile_devices(p), rates.caps(p), barriers=False)["makespan"]
        assert got == pytest.approx(want, rel=1e-3), stage


def test_a_stage_faster_than_its_modelled_decoding_gets_no_overhead_and_a_note(tmp_path):
    run = _write_run(tmp_path)
    man = json.loads((run / "manifest.json").read_text())
    man["stages"]["eval"]["seconds"] = 1.0
    (run / "manifest.json").write_text(json.dumps(man))
    r = rates.measure(run)
    assert r.eval_overhead_s == 0.0 and any("eval" in n and "exceeds" in n for n in r.notes), r.notes


def test_the_overhead_fit_leaves_idle_slots_to_the_schedule(tmp_path):
    """Three trials two at a time, each 8 s of loop (640 tokens at 80/s) and 7 s of overhead, take
    30 s: the fit gives 7 s (stage x concurrency - loops, over trials, would say 12 and predict 40)."""
    p = load_profile("smoke", ["train.variants=[math, chat, mixed_half]",
                               "resources.train.max_concurrent_trials=2"])
    r = _rates(train_overhead_s=0.0, tokens_per_example={"mathinstruct": 80.0, "sharegpt": 80.0},
               train_tokens_per_s={"eagle2": 80.0}, tokens_per_turn={}, max_new_tokens=None)
    assert _fit_overhead(p, r, "train", 30.0, "train_overhead_s") == pytest.approx(7.0, rel=1e-6)


def test_measure_counts_every_worker_and_refuses_what_is_not_a_run(tmp_path):
    (tmp_path / "two").mkdir()
    r = rates.measure(_write_run(tmp_path / "two", workers=2))
    assert r.train_tokens_per_s == {"eagle2": pytest.approx(1360 / 40.0)}  # the trial's tokens, both workers
    assert r.train_devices == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        rates.measure(tmp_path / "empty")


@pytest.mark.parametrize("change,match", [
    (dict(device="gpu"), "are GPU rates"),
    (dict(train_tokens_per_s={"hass": 1.0}), "no training rate for backbone"),
    (dict(features_tokens_per_s=None), "no features rate"),
    (dict(generate_tokens_per_s=float("nan")), "no generate rate"),
    (dict(eval_steps_per_s={"autoregressive": 1.0}, eval_tau={}), "no speculative strategy"),
])
def test_rates_that_cannot_time_a_profile_say_why(change, match):
    with pytest.raises(ValueError, match=match):
        rates.tasks(load_profile("demo"), _rates(**change))


# ---------------------------------------------------------------- the paper plan, grounded (issue 62)
@functools.cache  # (each row schedules ~24k eval shards twice: a second or two)
def _paper_rows(clusters=("4x8", "8x8")):
    """The paper profile's dry-run rows stage after stage (cluster.schedule stages: a bill per
    stage; the task graph's own figures: tests/test_graph.py)."""
    from orchestrator.plan.concurrency import parse_cluster

    p = load_profile("paper", ["cluster.schedule=stages"])
    runs = [rates.estimated(p, end) for end in rates.estimates.ENDS]
    return p, runs, [billing.on_cluster(p, r, parse_cluster(c)) for c in clusters for r in runs]


def test_every_printed_rate_and_overhead_names_its_source(capsys):
    """Without --rates the eval step is the project's GPU measurement at both ends (file and date), every
    other rate says it is assumed, and every modelled overhead line says where its figure comes from."""
    p, runs, _ = _paper_rows(())
    billing.print_makespan(p, runs, ["4x8"])
    out = capsys.readouterr().out.splitlines()
    rate_lines = [x.strip() for x in out if x.strip().startswith("rate of ")]
    assert len(rate_lines) >= 7
    for line in rate_lines:
        src = line.split(": ", 1)[1]
        assert src.startswith(("assumed", "project measurement (", "measured")), line
    steps = [x for x in rate_lines if x.startswith("rate of eval steps")]
    assert len(steps) == 2 and all("docs/gpu-check.md" in x and "2026-12-04" in x for x in steps)
    assert any("40 ms per speculative step, the fast end" in x for x in steps)
    assert any("83 ms per speculative step, the slow end" in x for x in steps)
    over = [x.strip() for x in out if x.strip().startswith("overhead: ")]
    assert len(over) == len(overheads.sources(p)) >= 6
    assert all(("assumed" in x or "measured" in x or "resources.node" in x or "FLOP rate" in x) for x in over)
    table = [x for x in out if x.startswith("  4x8 (")]
    assert [("40 ms (fast end)" in x, "83 ms (slow end)" in x) for x in table] == [(True, False), (False,
            True)]


def test_the_slow_end_of_the_measured_step_takes_longer():
    _, runs, rows = _paper_rows()
    fast, slow = rows[:2]  # 4x8 at either end
    assert fast["cluster"] == slow["cluster"] and fast["devices"] == 32
    assert 1 / runs[0].eval_steps_per_s["*"] == pytest.approx(0.040)
    assert 1 / runs[1].eval_steps_per_s["*"] == pytest.approx(0.083)
    assert slow["stages"]["eval"] > 1.5 * fast["stages"]["eval"] and slow["total"] > fast["total"]
    # the devices compute the same steps either way: the slower end holds them longer, not busier
    assert slow["busy"]["eval"] == pytest.approx(fast["busy"]["eval"], rel=0.01)
    assert slow["used"]["eval"] > fast["used"]["eval"]
    # and where the measurement is not of the profile's verifier, the assumption stands, said so
    other = rates.estimated(load_profile("smoke", ["resources.eval.num_gpus=1"]))
    assert other.sources["eval steps"].startswith("assumed: 30 ms")


def test_overheads_are_costed_and_named():
    """Every overhead issue 62 lists costs more than nothing for the paper grid, under its own name."""
    p = load_profile("paper")
    r = rates.estimated(p)
    tpe = {"mathinstruct": 350, "sharegpt": 900}
    for backbone in p.train.backbones:
        parts = {x.name: x for x in overheads.train_parts(p, r, backbone, "mixed_full", 88.1e6, 8, tpe)}
        assert set(parts) == {"compute", "start-up", "verifier load", "checkpoint uploads", "held-out",
                              "waits for shards"}
        assert all(x.seconds > 0 for x in parts.values()), parts
        # held-out: each set once, shared by the 8 ranks (all of them busy meanwhile)
        assert parts["compute"].busy == 1.0 and parts["held-out"].busy == 1.0
        t = p.train.for_backbone(backbone)
        heldout = overheads.heldout_seconds(p, backbone, tpe)
        assert parts["held-out"].seconds == pytest.approx((t.epochs + 1) * heldout / 8)
        assert all(parts[k].busy == 0.0 for k in ("start-up", "verifier load", "checkpoint uploads"))
        # uploads overlap the compute to the next checkpoint: at least the last one's whole upload, far
        # less than all of them one after another (what a synchronous loop waited)
        one = costs.checkpoint_bytes(costs.VERIFIERS[p.verifier], backbone, t.precision, t.draft_vocab) / \
            costs.ASSUMPTIONS["checkpoint_upload_bytes_per_s"]
        n = overheads.checkpoints(p, backbone, "mixed_full")
        assert one <= parts["checkpoint uploads"].seconds < 0.5 * n * one
        assert len(overheads.checkpoint_gaps(p, backbone, "mixed_full")) == n
    assert overheads.checkpoints(p, "eagle3", "math") == 70_000 // 8 * 10 // 1000 + 10
    feats = {x.name: x.seconds for x in overheads.features_parts(p, r, 1e6, 1)}
    assert feats["start-up"] > 0 and feats["verifier load"] > 0
    assert overheads.eval_shard_overhead(p, r, 96, 24_000) > overheads.eval_shard_overhead(p, r, 1,
            24_000) > 0
    assert overheads.merge_seconds(p, r, "eagle3") > overheads.merge_seconds(p, r, "eagle2") > 0
    assert overheads.report_seconds(r, 5.0e6) == pytest.approx(443.0)
    # a measured run's own overheads are kept as measured, not modelled on top
    m = _rates(device="gpu", verifier="llama3-8b-instruct")
    assert [x.name for x in overheads.train_parts(p, m, "eagle2", "math", 1e6, 8, tpe)] == \
        ["compute", "overhead (measured)"]


def test_busy_within_allocated_within_billed_per_stage():
    _, _, rows = _paper_rows()
    for m in rows:
        for st in ("features", "train", "merge", "eval", "report"):
            assert -1e-9 <= m["busy"][st] <= m["used"][st] + 1e-6 <= m["billed"][st] + 2e-6, (st,
                    m["cluster"])
        assert m["busy_total"] <= m["used_total"] <= m["billed_total"]
        assert m["busy"]["eval"] < 0.8 * m["used"]["eval"]  # batch-1 actors: the GPU waits on the host
        assert m["busy"]["merge"] == m["busy"]["report"] == 0.0  # on the driver's CPU


def test_extraction_runs_in_parts_over_every_gpu():
    """On a cluster the features stage is one task per GPU, each corpus in parts by its share of the
    tokens; without one (a CPU profile, or as configured) one task per corpus, as the driver runs now."""
    p = load_profile("paper")
    r = rates.estimated(p)
    for gpus in (8, 32, 64):
        feats = [t for t in rates.tasks(p, r, gpus=gpus) if t.stage == "features"]
        assert len(feats) == gpus and all(t.need == 1 for t in feats)
        chat = [t for t in feats if t.name.startswith("features:sharegpt")]
        assert len(chat) > len(feats) / 2  # ShareGPT holds 72% of the tokens
        trial = next(t for t in rates.tasks(p, r, gpus=gpus) if t.name == "train:eagle2-mixed_full")
        assert set(trial.deps) == {t.name for t in feats}
    assert len([t for t in rates.tasks(p, r) if t.stage == "features"]) == 2
    from orchestrator.plan.rates.taskgraph import split_parts

    assert split_parts({"a": 900, "b": 350}, 32) == {"a": 23, "b": 9}
    assert split_parts({"a": 1, "b": 1}, 1) == {"a": 1, "b": 1}  # at least one each


def test_checkpoint_gaps_follow_the_loop():
    """A step checkpoint every ``checkpoint_every`` steps of the run and an epoch one at each epoch's end
    (both where they meet, as drafters/train/loop.py writes them); an upload costs only what outlasts the
    compute to the next, the last one whole."""
    p = load_profile("paper", ["train.epochs=2", "train.checkpoint_every=4", "data.n=40",
                               "train.global_batch=8", "train.per_backbone={}"])
    assert overheads.epoch_steps(p, "eagle2", "math") == 5  # 40 examples / 8
    # written at steps 4, 5 (epoch 1), 8 and 10 (epoch 2)
    assert overheads.checkpoint_gaps(p, "eagle2", "math") == [1, 3, 2, 0]
    assert overheads.checkpoints(p, "eagle2", "math") == 4
    assert overheads.upload_wait_s(p, "eagle2", "math", upload_s=2.0, step_s=1.0) == 1.0 + 0 + 0 + 2.0
    # every 5: a step checkpoint and the epoch's at the same step, the second waits for the first's upload
    p = dataclasses.replace(p, train=dataclasses.replace(p.train, checkpoint_every=5))
    assert overheads.checkpoint_gaps(p, "eagle2", "math") == [0, 5, 0, 0]
    assert overheads.upload_wait_s(p, "eagle2", "math", upload_s=2.0, step_s=1.0) == 2.0 + 0 + 2.0 + 2.0
