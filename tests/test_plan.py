"""The plan that fills a cluster (orchestrator/plan/concurrency.py) and the packing model of evaluation actors
(orchestrator/plan/packing.py), worked out by hand on given node lists and step times; the GPU check's
packing file through --rates; the dry run's --cluster table. Fast: no Ray, no model."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.plan import billing, packing, rates
from orchestrator.plan.concurrency import actors_per_gpu, derive, eval_cpu_problem, max_nodes, parse_cluster
from orchestrator.plan.makespan import Task, schedule
from orchestrator.plan.sizing import load_profile

ROOT = Path(__file__).resolve().parents[1]
P4DE = {"CPU": 96.0, "GPU": 8.0, "accelerator_type:A100": 1.0}
HEAD = {"CPU": 0.0}
PACKING = {"kind": "gpu-check-packing", "date": "2026-12-05", "device": "NVIDIA H100 80GB HBM3",
           "verifier": "llama3-8b (32 layers, random weights)", "dtype": "bfloat16", "strategy": "single",
           "tree": [4, 4, 16],
           "packing": [{"processes": 1, "tokens_per_s": 41.0, "step_s": 0.055, "tau": 2.3},
                       {"processes": 2, "tokens_per_s": 80.0, "step_s": 0.056, "tau": 2.3},
                       {"processes": 4, "tokens_per_s": 150.0, "step_s": 0.060, "tau": 2.3}]}


def test_the_paper_plan_fills_four_p4de_nodes_and_says_so():
    p = load_profile("paper")
    plan = derive(p, [HEAD] + [P4DE] * 4, trials=12, eval_units=24_000)
    assert (plan.train.units, plan.eval.units) == (4, 96)  # 8-GPU trials; 3 actors per GPU (packing auto)
    assert plan.line().startswith("plan: training 4 trials x 8 GPUs = 32/32 GPUs (the cluster holds 4); "
                                  "eval 96 actors x 1/3 GPU = 32/32 GPUs")
    fixed = derive(load_profile("paper", ["resources.eval.packing=fixed"]), [HEAD] + [P4DE] * 4, 12, 24_000)
    assert fixed.eval.units == 64 and "eval 64 actors x 0.5 GPU = 32/32 GPUs" in fixed.line()
    # the profile's numbers are caps, and so is the work there is
    capped = derive(load_profile("paper", ["resources.eval_actors=10"]), [P4DE] * 4, trials=2)
    assert (capped.train.units, capped.train.limit) == (2, "2 drafters to train")
    assert (capped.eval.units, capped.eval.limit) == (10, "capped by resources.eval_actors 10")


def test_a_node_type_whose_cpus_cannot_feed_its_gpus_is_named():
    """deploy/rayjob.yaml's pods have 64 CPUs for 8 GPUs: 6 CPUs per half-GPU actor fit 10 of 16."""
    p = load_profile("paper", ["resources.eval.num_cpus=6"])
    pod = {"CPU": 64.0, "GPU": 8.0}
    assert derive(p, [pod] * 4).eval.units == 40
    line = eval_cpu_problem(p, pod)
    assert "16 actors x 6 CPUs = 96 > 64" in line and "num_cpus <= 4" in line and "\n" not in line
    assert eval_cpu_problem(load_profile("paper"), pod) is None  # 4 CPUs each: 16 x 4 = 64 fits


def test_fractional_gpus_pack_per_gpu_and_cpu_profiles_plan_in_cpus():
    assert [actors_per_gpu(g) for g in (0, 1, 2, 0.5, 0.25, 1 / 3)] == [0, 1, 1, 2, 4, 3]
    smoke = load_profile("smoke", ["resources.eval.num_cpus=0.5", "resources.eval_actors=8"])
    plan = derive(smoke, [{"CPU": 2.0}])  # a 2-CPU machine: two 1-CPU trials, four half-CPU actors
    assert (plan.train.units, plan.eval.units, plan.device) == (2, 4, "CPU")
    assert "eval 4 actors x 0.5 CPU = 2/2 CPUs" in plan.line()
    none = derive(load_profile("paper"), [HEAD])  # nothing fits yet (no autoscaler): one, waiting
    assert none.train.units == 1 and "holds none" in none.train.limit


def test_the_autoscalers_maximum_adds_what_each_group_can_still_add():
    alive = [HEAD, dict(P4DE)]
    nodes, notes = max_nodes(alive, [({"CPU": 0}, 0), ({"CPU": 96, "GPU": 8}, 4)])
    assert sum(n.get("GPU", 0) for n in nodes) == 32 and len(nodes) == 5 and notes == []
    nodes, notes = max_nodes(alive, [({"CPU": 96, "GPU": 8}, -1)])
    assert nodes == alive and "no max_count" in notes[0]


def test_the_driver_reads_the_autoscalers_groups(monkeypatch):
    import ray
    from ray._private.state import state

    from orchestrator.run.cluster import cluster_nodes

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": HEAD},
                                               {"Alive": False, "Resources": P4DE}])
    monkeypatch.setattr(state, "get_cluster_config", lambda: SimpleNamespace(node_group_configs=[
        SimpleNamespace(resources={"CPU": 96, "GPU": 8}, max_count=4)]))
    nodes, source = cluster_nodes()
    assert sum(n.get("GPU", 0) for n in nodes) == 32 and "autoscaler's maximum (5 node(s))" in source
    monkeypatch.setattr(state, "get_cluster_config", lambda: None)
    nodes, source = cluster_nodes()
    assert nodes == [HEAD] and "as it is now" in source


@pytest.mark.parametrize("spec,want", [("4x8", (4, 8, 96, True)), ("8x8x64", (8, 8, 64, False)),
                                       (" 1 x 4 ", (1, 4, 48, True))])
def test_cluster_specs(spec, want):
    c = parse_cluster(spec)
    assert (c.nodes, c.gpus, c.cpus, c.cpus_assumed) == want


@pytest.mark.parametrize("spec", ["4", "4x", "0x8", "4x0", "4*8", "4x8x0", "axb"])
def test_bad_cluster_specs_get_one_line(spec):
    with pytest.raises(ValueError, match="NODESxGPUS"):
        parse_cluster(spec)


def test_the_packing_model_keeps_an_actors_speed_until_the_gpu_saturates():
    t, d = 0.040, 0.004  # host-bound: k* = 10
    assert packing.step_time(t, d, 1) == pytest.approx(t)
    assert packing.saturation(t, d) == pytest.approx(10.0)
    steps = [packing.step_time(t, d, k) for k in range(1, 41)]
    assert steps == sorted(steps)
    rate = [k / s for k, s in zip(range(1, 41), steps)]  # the GPU's aggregate steps/s
    assert all(r <= min(k / t, 1 / d) * (1 + 1e-9) for k, r in zip(range(1, 41), rate))  # both asymptotes
    assert rate[1] / rate[0] > 1.95 and rate[3] / rate[0] > 3.7  # far below k*: ~k times one actor
    assert rate[39] == pytest.approx(1 / d, rel=0.01)  # far past k*: the device's rate
    assert packing.step_time(t, t, 3) == pytest.approx(3 * t)  # all device time: fully serialised
    with pytest.raises(ValueError, match="t_dev <= t_step"):
        packing.step_time(t, 2 * t, 2)


def test_the_device_time_is_recovered_from_packing_rows():
    t, d = 0.055, 0.0074
    rows = [(k, packing.step_time(t, d, k)) for k in (2, 4, 8)]
    assert packing.fit_device_time(t, rows) == pytest.approx([d] * 3, rel=1e-6)
    assert packing.fit_device_time(t, [(2, t)]) == []  # no slowdown: nothing to fit


def test_the_gpu_checks_packing_file_times_the_eval_and_says_where_each_rate_came_from(tmp_path):
    p = load_profile("paper")
    f = tmp_path / "gpu_rates.json"
    f.write_text(json.dumps(PACKING))
    for where in (f, tmp_path):  # the file, or a directory holding it
        r = dataclasses.replace(rates.load(where, p), modelled_overheads=False)  # (shards: decoding alone)
        assert r.eval_steps_per_s == {"*": pytest.approx(1 / 0.055)}
        assert "measured" in r.sources["eval steps"] and "assumed" in r.sources["train"]
        assert r.eval_tau == {"*": 3.5} and any("not 'llama3-8b-instruct'" in n for n in r.notes)
    pk = r.packing
    assert pk["t_step_s"] == 0.055 and "fitted to the slowdown of 2 packing row(s)" in pk["dev_source"]
    fits = packing.fit_device_time(0.055, [(2, 0.056), (4, 0.060)])  # 7.4 and 8.5 ms: the rows' own
    assert pk["t_dev_s"] == pytest.approx(sum(fits) / 2) and min(fits) < pk["t_dev_s"] < max(fits)
    for k, s, _ in pk["rows"]:  # and the median gives the rows back within 2%
        assert packing.step_time(0.055, pk["t_dev_s"], k) == pytest.approx(s, rel=0.02)
    # at 2 actors per GPU an eval shard takes the packed step, not half the GPU's rate
    whole = load_profile("paper", ["resources.eval.num_gpus=1"])
    one = [t for t in rates.tasks(whole, r) if t.stage == "eval"]
    two = [t for t in rates.tasks(p, r) if t.stage == "eval"]
    ratio = packing.step_time(0.055, pk["t_dev_s"], 2) / 0.055
    assert two[5].seconds == pytest.approx(one[5].seconds * ratio, rel=1e-6) and 1.0 < ratio < 1.05
    assert two[5].need == 0.5


@pytest.mark.parametrize("change,match", [
    ({"packing": []}, "non-empty list"), ({"packing": [{"processes": 2, "step_s": 0.05}]}, "processes 1"),
    ({"packing": [{"processes": 1, "step_s": -1}]}, "step_s"),
    ({"packing": [{"processes": 1, "step_s": 0.05}, {"processes": 1, "step_s": 0.05}]}, "repeat"),
])
def test_a_bad_packing_file_gets_one_line(tmp_path, change, match):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(PACKING | change))
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke",
                        "--dry-run", "--set", "resources.eval.num_gpus=1", "--rates", str(f)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_fractional_tasks_share_a_device_and_stages_count_what_they_held():
    ts = [Task(f"e{i}", "eval", 4.0, need=0.5, group="eval") for i in range(4)]
    ts.append(Task("t", "train", 2.0, need=1))
    s = schedule(ts, 1.0, {"eval": 4})
    assert s["makespan"] == pytest.approx(10.0)  # train 2, then two pairs of half-GPU actors
    assert s["stage_busy"] == {"train": 2.0, "eval": 8.0}


def test_the_dry_runs_cluster_rows_bill_every_gpu_and_count_what_is_held():
    # a bill per stage (the graph's: tests/test_graph.py)
    p = load_profile("paper", ["cluster.schedule=stages"])
    r = rates.estimated(p)
    m = billing.on_cluster(p, r, parse_cluster("4x8"))
    report = m["stages"]["report"]  # on the driver's CPU: the GPU nodes go back after the idle timeout
    assert report > 600 and m["billed"]["report"] == pytest.approx(32 * 600 / 3600)
    assert m["billed_total"] == pytest.approx(32 * (m["total"] - report + 600) / 3600)
    assert sum(m["billed"].values()) == pytest.approx(m["billed_total"])
    assert sum(m["used"].values()) == pytest.approx(m["used_total"]) and m["used_total"] <= m["billed_total"]
    assert m["caps"]["train"] == 4 and m["caps"]["eval"] == 96
    # the eval stage holds 32 GPUs (64 half-GPU actors) for its whole span
    assert m["used"]["eval"] == pytest.approx(m["billed"]["eval"], rel=0.01)


def test_trials_are_submitted_longest_first():
    p = load_profile("paper")
    order = rates.trial_order(p, ["eagle2-math", "hass-mixed_full", "eagle2-chat", "hass-math"])
    assert order[0] == "hass-mixed_full" and order[-1] == "eagle2-math"


def test_packing_auto_packs_what_memory_and_cpus_hold_and_says_why():
    """resources.eval.packing auto: the fewest actors per GPU that place the most on a node, within one
    GPU's memory (gpu_memory_gib over packing.actor_memory_gb) and the node's CPUs; the profile's share
    where nothing says (no memory given, a verifier of unknown size)."""
    from orchestrator.plan.concurrency import pack_per_gpu

    p = load_profile("paper")
    k, why = pack_per_gpu(p, [HEAD, P4DE])
    assert k == 3 and "memory holds 3" in why and "96 CPUs feed 24" in why and "\n" not in why
    assert pack_per_gpu(p, [{"CPU": 64.0, "GPU": 8.0}])[0] == 2  # deploy/rayjob.yaml's pods: CPUs stop it
    small = load_profile("paper", ["resources.eval.drafter_cache_gb=1"])  # 19.1 GB an actor: 4 fit
    assert pack_per_gpu(small, [{"CPU": 192.0, "GPU": 8.0}])[0] == 4
    assert pack_per_gpu(small, [{"CPU": 40.0, "GPU": 8.0}])[0] == 2  # 10 actors: the fewest per GPU for them
    assert pack_per_gpu(load_profile("paper", ["resources.gpu_memory_gib=null"]), [P4DE]) is None
    assert pack_per_gpu(load_profile("paper", ["resources.eval.packing=fixed"]), [P4DE]) is None
    assert pack_per_gpu(p, [HEAD]) is None  # no GPU node to size it on
    # the dry run times the eval shards with the share the plan derives, as the driver runs its actors
    m = billing.on_cluster(p, rates.estimated(p), parse_cluster("4x8"))
    assert m["profile"].resources.eval.num_gpus == pytest.approx(1 / 3) and m["plan"].eval.packing == why
    assert m["caps"]["eval"] == 96


def test_the_driver_asks_ray_for_the_plans_share(monkeypatch):
    """cluster.eval_pool places the actors at the share the plan derived (the driver passes it)."""
    from orchestrator.run import cluster

    seen = {}

    class Fake:
        def __init__(self, **kw):
            seen.update(kw)

        def __call__(self, worker):
            return self

        def options(self, **kw):
            return self

        def remote(self, *a):
            return None

    monkeypatch.setattr(cluster.ray, "remote", lambda **kw: Fake(**kw))
    monkeypatch.setattr(cluster, "EvalPool", lambda make, n, log=None: make("x"))
    cluster.eval_pool(load_profile("paper"), 3, num_gpus=1 / 3)
    assert seen["num_gpus"] == pytest.approx(1 / 3) and seen["num_cpus"] == 4
    cluster.eval_pool(load_profile("paper"), 3)
    assert seen["num_gpus"] == 0.5  # the profile's, where the plan's is not given
