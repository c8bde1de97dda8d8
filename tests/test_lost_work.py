"""What a fault may cost and what a long grid may hold: the Tune sweep retries a trial whose actor
died; the paper profile's step checkpoints bound a lost node to about ten minutes of a trial; the
checkpoints evaluation nodes fetch stay within a disk budget, without deleting one in use."""
from __future__ import annotations

import dataclasses
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common import storage
from common.fetch_cache import FetchCache, tree_bytes
from orchestrator.plan.rates import estimated, optimizer_step_seconds
from orchestrator.plan.sizing import load_profile
from tests.conftest import VERIFIER

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
    """Each backbone's train.checkpoint_every x its slowest optimizer step of the paper grid (the dry
    run's GPU estimate, orchestrator.plan.rates, in the features mode the profile resolves to) is at most
    10 minutes, and x its fastest at least one minute."""
    p = load_profile("paper")
    steps = optimizer_step_seconds(p, estimated(p))
    assert set(steps) == {(b, c) for b in p.train.backbones for c in ("mathinstruct", "sharegpt")}
    epoch_steps = p.data.n // p.train.global_batch
    docs = (ROOT / "docs/cluster.md").read_text()
    for b in p.train.backbones:
        every = p.train.for_backbone(b).checkpoint_every
        assert every is not None, (f"paper.yaml sets no train.checkpoint_every for {b}: "
                                   "a lost node loses the epoch")
        mine = [s for (bb, _), s in steps.items() if bb == b]
        slowest, fastest = max(mine), min(mine)
        assert every * slowest <= LOST_WORK_S, (f"{b}: {every} steps x {slowest:.3f} s = "
                                                f"{every * slowest / 60:.1f} min")
        assert every * fastest >= MIN_INTERVAL_S, (f"{b}: {every} steps x {fastest:.3f} s = "
                                                   f"{every * fastest:.0f} s")
        assert every < epoch_steps  # inside an epoch, or it adds nothing to the epoch checkpoints
        assert f"{b} every {every}" in docs, b  # the docs state the same numbers


# ---------------------------------------------------------------- fetched checkpoints on an eval node
def _checkpoints(root: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` checkpoint directories (config.json + a weights file of 60-200 KB) under a file:// bucket."""
    rng = random.Random(seed)
    refs = []
    for i in range(n):
        d = root / f"bucket/run/checkpoints/d{i}/final"
        d.mkdir(parents=True)
        (d / "config.json").write_text(f'{{"drafter": {i}}}')
        (d / "model.safetensors").write_bytes(rng.randbytes(rng.randrange(60_000, 200_000)))
        refs.append(f"file://{d}")
    return refs


def test_fetched_checkpoints_stay_within_the_budget_over_a_long_grid(tmp_path, monkeypatch):
    """400 eval units over 30 checkpoints, each unit fetching 1-4 of them as the eval actor does:
    the node's fetched files never exceed the budget between uses, nor budget + the one in use
    during a use; each copy read is the checkpoint's own bytes; the most recent stays cached."""
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    refs = _checkpoints(tmp_path, 30)
    sizes = {r: tree_bytes(Path(r.removeprefix("file://"))) for r in refs}
    budget = 600_000  # about 5 of the 30
    cache, rng, fetched, peak = FetchCache(budget), random.Random(1), 0, 0
    node = tmp_path / "node"
    for _ in range(400):
        for ref in rng.sample(refs, rng.randint(1, 4)):
            with cache.use(ref) as local:
                assert local == storage.node_cache(ref) and local.is_relative_to(node)
                src = Path(ref.removeprefix("file://"))
                assert (local / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
                during = tree_bytes(node / "cache")
                assert during <= budget + sizes[ref], during
            fetched += sizes[ref]
            after = tree_bytes(node / "cache")
            peak = max(peak, after)
            assert after <= budget and after == cache.nbytes(), after
    assert fetched > 50 * budget and cache.deleted > 100 and peak > budget / 2
    last = cache.entries()[-1][2]
    inode = (last / "model.safetensors").stat().st_ino
    with cache.use(f"file://{tmp_path}/bucket/run/checkpoints/{last.parent.name}/final") as again:
        assert (again / "model.safetensors").stat().st_ino == inode  # no second copy of a cached one
    assert all(Path(r.removeprefix("file://")).is_dir() for r in refs)  # the sources are untouched


def test_a_local_checkpoint_is_used_in_place_and_never_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    local = [r.removeprefix("file://") for r in _checkpoints(tmp_path, 5)]
    cache = FetchCache(1)
    for path in local * 2:
        with cache.use(path) as got:
            assert got == Path(path)
    assert all((Path(p) / "model.safetensors").is_file() for p in local) and cache.deleted == 0
    with pytest.raises(ValueError, match="budget must be > 0"):
        FetchCache(0)


def test_a_checkpoint_another_actor_is_loading_is_not_pruned(tmp_path, monkeypatch):
    """Two processes on one node (one staging directory), as two eval actors are: while this one
    holds a checkpoint, the other fetches 20 others with a budget of one byte; the held one stays
    whole, and the first prune after its use ends takes it."""
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    refs = _checkpoints(tmp_path, 21)
    held, others = refs[0], refs[1:]
    code = textwrap.dedent(f"""
        from common.fetch_cache import FetchCache
        cache = FetchCache(1)
        for ref in {others!r}:
            with cache.use(ref):
                pass
        print(cache.deleted)
    """)
    cache = FetchCache(1)
    with cache.use(held) as local:
        r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) == 20  # every other checkpoint went (each after its own use), not this one
        src = Path(held.removeprefix("file://"))
        assert (local / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert not local.exists() and cache.nbytes() == 0 and cache.deleted == 1


@pytest.mark.slow
def test_an_eval_actor_keeps_its_nodes_fetched_drafters_within_the_disk_budget(verifier, tmp_path,
        monkeypatch):
    """The evaluation actor's own path (EvalWorker.run, no Ray): 8 real drafter checkpoints at a
    file:// output, one single-drafter cell each, a disk budget of about two checkpoints: every
    cell decodes, and after each the node holds at most the budget of fetched files."""
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from drafters.data.sources import load_benchmark
    from orchestrator.grid import eval_cells, eval_job
    from workers.eval_worker import EvalWorker

    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    drafter = init_drafter(DrafterConfig.for_verifier(verifier[0], VERIFIER, "eagle2", seed=0))
    refs = []
    for i in range(8):
        out = save_checkpoint(drafter, tmp_path / f"bucket/run/checkpoints/eagle2-d{i}/final")
        refs.append(f"file://{out}")
    size = tree_bytes(Path(refs[0].removeprefix("file://")))
    p = load_profile("demo", ["train.backbones=[eagle2]", "eval.temperatures=[0.0]",
                              "eval.benchmarks={gsm8k: 1}"])
    cell = next(c for c in eval_cells(p) if c.strategy == "single")
    prompts = load_benchmark("gsm8k")[0][:1]
    budget_gb = 2.5 * size / 2**30
    w = EvalWorker(VERIFIER, drafter_cache_gb=1e-6, checkpoint_disk_gb=budget_gb)  # every cell loads anew
    job = eval_job(p, cell)  # what the driver sends, with a smaller tree and budget
    tree = dataclasses.replace(job.decode.tree, top_k=2, depth=2)
    job = dataclasses.replace(job, decode=dataclasses.replace(job.decode, tree=tree, max_new_tokens=2,
                                                              seed=42))
    for ref in refs:
        rows, _ = w.run(job, [ref], prompts)
        assert rows and len(rows[0]["output_token_ids"]) > 0
        assert tree_bytes(tmp_path / "node/cache") <= budget_gb * 2**30
    assert w._fetched.deleted >= len(refs) - 2
