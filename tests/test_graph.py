"""The driver's task graph (cluster.schedule graph): merges and evaluation start as their inputs
exist while other trials train, and the dry run's makespan is that schedule's."""
from __future__ import annotations

import pytest

from orchestrator.plan import billing, rates
from orchestrator.plan.concurrency import parse_cluster
from orchestrator.plan.costs import ASSUMPTIONS
from orchestrator.plan.makespan import GRAPH_BARRIERS, Task, schedule
from orchestrator.plan.sizing import load_profile
from orchestrator.profile import ProfileError


def test_the_graph_waits_for_every_cache_then_runs_each_trials_work_as_it_ends():
    """Caches A (10 s) and C (1 s); trial B (5 s, cache A) and trial D (20 s, cache C); B's eval E
    (14 s) and D's eval F (4 s), on 2 devices. Stages: 10 + 20 + 14 = 44. Graph: both trials start
    at 10 (every cache first), E runs 15-29 while D trains, F 30-34: 34. Without the features
    barrier D would start at 1 (1-21), E 15-29: 29."""
    ts = [Task("A", "features", 10.0), Task("C", "features", 1.0),
          Task("B", "train", 5.0, deps=("A",)), Task("D", "train", 20.0, deps=("C",)),
          Task("E", "eval", 14.0, deps=("B",)), Task("F", "eval", 4.0, deps=("D",))]
    staged = schedule(ts, 2, barriers=True)
    graph = schedule(ts, 2, barriers=GRAPH_BARRIERS)
    bare = schedule(ts, 2, barriers=False)
    assert staged["makespan"] == 44.0
    assert graph["stages"]["train"][0] == 10.0  # no trial before every cache
    assert graph["makespan"] == 34.0 and graph["stages"]["eval"] == (15.0, 34.0)
    assert bare["makespan"] == 29.0


def test_the_dry_run_times_a_gpu_profile_as_a_graph_and_a_cpu_profile_stage_after_stage():
    p = load_profile("paper")
    assert p.cluster.schedule == "auto" and p.cluster.graph(p.resources.train.use_gpu)
    r = rates.estimated(p)
    m = billing.on_cluster(p, r, parse_cluster("4x8"))
    # spans overlap: no per-stage bill
    assert m["graph"] and m["total"] <= m["staged"] and m["billed"] is None
    # billed: every GPU until the report starts, then until the autoscaler's release
    report = m["stages"]["report"]
    held = m["total"] - report + min(report, ASSUMPTIONS["idle_release_s"])
    assert m["billed_total"] == pytest.approx(m["devices"] * held / 3600, rel=1e-9)
    staged = billing.on_cluster(load_profile("paper", ["cluster.schedule=stages"]), r, parse_cluster("4x8"))
    assert not staged["graph"] and staged["total"] == staged["staged"] == m["staged"]
    assert m["billed_total"] <= staged["billed_total"]
    demo = load_profile("demo")
    assert not demo.cluster.graph(demo.resources.train.use_gpu)  # auto on CPUs: the stages
    assert load_profile("demo", ["cluster.schedule=graph"]).cluster.graph(False)


def test_a_bad_schedule_is_refused_in_one_line():
    with pytest.raises(ProfileError,
                       match=r"cluster\.schedule must be auto, graph or stages, got 'pipelined'$"):
        load_profile("smoke", ["cluster.schedule=pipelined"])


def test_the_dry_run_table_says_which_schedule_the_total_is(capsys):
    for schedule_, heading, why in (("auto", "stage after stage", "cluster.schedule graph"),
                                    ("stages", "no barriers", "cluster.schedule stages")):
        p = load_profile("paper", [f"cluster.schedule={schedule_}"])
        billing.print_makespan(p, rates.estimated(p), ["4x8"])
        out = capsys.readouterr().out
        table = out[out.index("  cluster "):]
        assert heading in table.splitlines()[0] and why in out
        assert ("only the total is billed" in out) == (schedule_ == "auto")
