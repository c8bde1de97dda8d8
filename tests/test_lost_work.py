"""What a fault may cost and what a long grid may hold: the Tune sweep retries a trial whose actor
died; the paper profile's step checkpoints bound a lost node to about ten minutes of a trial."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from orchestrator.profile import load_profile
from orchestrator.rates import estimated, optimizer_step_seconds

ROOT = Path(__file__).resolve().parents[1]
LOST_WORK_S = 600  # a lost node may cost about this much of a trial's training
MIN_INTERVAL_S = 60  # and checkpoints (weights, optimizer shards, to the URI) come at most once a minute


# ---------------------------------------------------------------- the Tune sweep's FailureConfig
@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    import ray

    with socket.socket() as sock:  # a free port for Ray's minimal dashboard (never 8265: other tests use it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the trial travels by value
    ray.init(address="local", num_cpus=1, include_dashboard=False, dashboard_port=port, log_to_driver=False,
             runtime_env={"env_vars": {"TASKSPEC_STAGING": str(tmp_path_factory.mktemp("node"))}})
    yield ray
    ray.shutdown()


def _trial_dies_once(config):
    """The first attempt's actor exits as if its node were lost; the retry reports."""
    from ray import tune

    marker = Path(config["marker"])
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    tune.report({"first_pid": int(marker.read_text()), "pid": os.getpid()})


@pytest.mark.parametrize("retries", [0, 3])
def test_the_sweeps_failure_config_retries_a_trial_whose_actor_died(ray_local, tmp_path, retries):
    """A trial actor killed mid-run (os._exit) is started again under the sweep's RunConfig with
    the profile's retries (the driver passes them as max_failures); with none, the trial fails."""
    from ray import tune

    from workers.tune_sweep import TRIAL_RESOURCES, sweep_run_config

    run = sweep_run_config("sweep", str(tmp_path / "results"), {"max_failures": retries})
    assert run.failure_config.max_failures == retries
    tuner = tune.Tuner(tune.with_resources(_trial_dies_once, TRIAL_RESOURCES),
                       param_space={"marker": str(tmp_path / "died")}, run_config=run)
    [result] = tuner.fit()
    if retries:
        assert result.error is None and result.metrics["pid"] != result.metrics["first_pid"]
    else:
        assert result.error is not None
    assert load_profile("paper").retries >= 1


# ---------------------------------------------------------------- step checkpoints of the paper profile
def test_paper_checkpoints_often_enough_that_a_lost_node_costs_about_ten_minutes():
    """train.checkpoint_every x the slowest optimizer step of the paper grid (the dry run's GPU
    estimate, orchestrator.rates) is at most 10 minutes, and x the fastest at least one minute."""
    p = load_profile("paper")
    every = p.train.checkpoint_every
    assert every is not None, "paper.yaml sets no train.checkpoint_every: a lost node loses the epoch"
    steps = optimizer_step_seconds(p, estimated(p))
    assert set(steps) == {(b, c) for b in p.train.backbones for c in ("mathinstruct", "sharegpt")}
    slowest, fastest = max(steps.values()), min(steps.values())
    assert every * slowest <= LOST_WORK_S, f"{every} steps x {slowest:.2f} s = {every * slowest / 60:.1f} min"
    assert every * fastest >= MIN_INTERVAL_S, f"{every} steps x {fastest:.2f} s = {every * fastest:.0f} s"
    epoch_steps = p.data.n // p.train.global_batch
    assert every < epoch_steps  # inside an epoch, or it adds nothing to the epoch checkpoints
    assert "checkpoint_every: 1000" in (ROOT / "docs/cluster.md").read_text()  # the docs state the same rule
