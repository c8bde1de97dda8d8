"""Faults and bounds on one machine (issue 24): step checkpoints that resume to the same weights,
one driver per output (the lease), failed eval actors replaced without blocking the others, the
drafter LRU, tracker records at the output URI, cluster guard rails, Ray Train's failure and
checkpoint settings. The multi-node fault tests are in tests/test_multinode.py."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from drafters.train.config import TrainConfig
from drafters.train.loop import train
from drafters.variants import DataSpec, heldout_data, variant_data
from orchestrator.manifest import Lease, LeaseHeld
from orchestrator.plan import preflight
from orchestrator.plan.sizing import load_profile
from tests.conftest import TRAIN_SPEC
from workers.eval_worker import DrafterCache

ROOT = Path(__file__).resolve().parents[1]
SPEC = DataSpec(**TRAIN_SPEC)
TIMING = ("epoch_seconds", "train_tokens_per_s")  # the only history fields a resume may change


# ---------------------------------------------------------------- step checkpoints
@pytest.fixture(scope="module")
def features(train_features):
    return train_features  # built once per run (tests/conftest.py), shared with tests/test_training.py


def _cfg(features, out, **kw) -> TrainConfig:
    root, caches = features
    return TrainConfig(verifier="smollm2-135m-instruct", backbone="hass", variant="math", out_dir=str(out),
                       train_data=variant_data("math", root, caches, SPEC.n),
                       heldout_data=heldout_data(root, caches)[:1], epochs=2, lr=1e-3, batch_size=4,
                       deepspeed=False, hass_steps=2, topk_from=0.5, warmup_steps=2, **kw)


@pytest.mark.slow
def test_step_checkpoint_resume_ends_with_the_uninterrupted_weights(verifier, features, tmp_path):
    """Checkpoints every 3 optimizer steps; a crash after step 7 (2 epochs x 4 steps) resumes from
    step 6, inside epoch 2 (data position, optimizer, noise generator restored), and ends with the
    same weights, bit for bit, as a run that never stopped (and as one without step checkpoints)."""
    model = verifier[0]
    plain = train(_cfg(features, tmp_path / "plain"), model)
    whole = train(_cfg(features, tmp_path / "whole", checkpoint_every=3, keep_checkpoints=1), model)
    out = tmp_path / "crash"
    t0 = time.time()
    with pytest.raises(RuntimeError, match="injected crash after optimizer step 7"):
        train(_cfg(features, out, checkpoint_every=3, keep_checkpoints=1, crash_at_step=7), model)
    crashed_at = time.time()
    left = sorted(p.name for p in out.iterdir() if (p / "state.json").is_file())
    assert left == ["epoch-1", "step-2-2"], left  # step-1-3 dropped once epoch-1 was written
    state = json.loads((out / "step-2-2/state.json").read_text())
    redone = 7 - (sum(h["steps"] for h in state["history"]) + state["position"]["sums"]["batches"])
    resumed = train(_cfg(features, out, checkpoint_every=3, keep_checkpoints=1), model)
    print(f"step checkpoints: crash after step 7, resumed from step-2-2 (step 6): {redone} step redone; "
          f"resume to final {time.time() - crashed_at:.1f}s (crashed run {crashed_at - t0:.1f}s)")
    assert redone == 1
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (whole, resumed, plain))
    for k in a:
        assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
    hist = [json.loads((d / "config.json").read_text())["training"]["history"] for d in (whole, resumed)]
    strip = lambda h: [{k: v for k, v in e.items() if k not in TIMING} for e in h]  # noqa: E731
    assert strip(hist[0]) == strip(hist[1]) and [e["epoch"] for e in hist[1]] == [0, 1, 2]
    # keep 1
    assert sorted(p.name for p in out.iterdir() if (p / "state.json").is_file()) == ["epoch-2", "final"]


def _slow_uploads(monkeypatch, log: list, delay: float = 0.3, fail: str | None = None, stepped=None):
    """storage.sync with each checkpoint's upload (its files, state.json excluded) taking ``delay``
    seconds more, after the loop's next step where ``stepped`` (an Event the step sets) says so (at
    most 2 s), logged as (name, start, end), checking its files are all still there when it ends;
    the upload of checkpoint ``fail`` raises."""
    import threading

    from common import storage

    real, stepped = storage.sync, stepped or threading.Event()

    def sync(src, dst, exclude=(), **kw):
        if "state.json" not in exclude:
            return real(src, dst, exclude=exclude, **kw)
        name, t0 = Path(src).name.removeprefix(".").removesuffix(".tmp"), time.time()
        if name == fail:
            raise OSError(f"injected: the store refused {name}")
        files = sorted(p.relative_to(src) for p in Path(src).rglob("*") if p.is_file())
        stepped.clear()
        stepped.wait(2.0)  # (a next save that did not wait would come right after this step)
        time.sleep(delay)
        n = real(src, dst, exclude=exclude, **kw)
        assert sorted(p.relative_to(src) for p in Path(src).rglob("*") if p.is_file()) == files, name
        log.append((name, t0, time.time()))
        return n

    monkeypatch.setattr(storage, "sync", sync)


@pytest.mark.slow
def test_uploads_run_beside_training_and_a_kill_mid_upload_resumes_from_complete_ones(verifier, features,
                                                                                       tmp_path, monkeypatch):
    """Checkpoints every optimizer step to a file:// URI, each upload slowed: training goes on while
    one uploads, one at a time, and no directory is dropped while it uploads (rank 0 drops stale ones
    after each save). Then the same run is killed (SIGKILL) mid-upload of step-2-2: the URI holds
    that checkpoint in part, without state.json, and resume sees only complete ones, fetches step-2-1
    and ends with the uninterrupted run's weights; the partial copy is gone from the URI after."""
    import threading

    from common import storage
    from tests.upload_job import train_uploading
    from workers.artifacts import remote_checkpoints

    model = verifier[0]
    uri = f"file://{tmp_path}/bucket"
    steps, log = [], []
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node-a"))
    import drafters.train.loop as trainer

    real_step = trainer._step
    def step(*a):
        t0 = time.time()
        real_step(*a)
        steps.append((t0, time.time()))
        stepped.set()

    stepped = threading.Event()
    monkeypatch.setattr(trainer, "_step", step)
    _slow_uploads(monkeypatch, log, stepped=stepped)
    cfg = _cfg(features, "unused", checkpoint_every=1, keep_checkpoints=1, out_uri=f"{uri}/whole")
    cfg = dataclasses.replace(cfg, backbone="eagle2")  # (the loop's, the cheaper objective)
    whole = train_uploading(cfg, model)
    names = [n for n, _, _ in log]
    assert names == ["step-1-1", "step-1-2", "step-1-3", "step-1-4", "epoch-1",
                     "step-2-1", "step-2-2", "step-2-3", "step-2-4", "epoch-2"], names
    assert all(a[2] <= b[1] for a, b in zip(log, log[1:]))  # one upload in flight at a time
    assert any(s0 < t1 and t0 < s1 for _, t0, t1 in log for s0, s1 in steps)  # a step while one uploaded
    assert storage.listdir(f"{uri}/whole") == ["epoch-2", "final"]

    monkeypatch.undo()  # the child kills itself in step-2-2's upload
    out_uri = f"{uri}/killed"
    child = dataclasses.asdict(dataclasses.replace(cfg, out_uri=out_uri))
    r = subprocess.run([sys.executable, str(ROOT / "tests/upload_job.py"), json.dumps(child), "step-2-2",
                        str(torch.get_num_threads())],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "TASKSPEC_STAGING": str(tmp_path / "node-b")})
    assert r.returncode == -9, r.stdout[-2000:] + r.stderr[-3000:]
    there = storage.listdir(out_uri)
    assert "step-2-2" in there and not storage.exists(f"{out_uri}/step-2-2/state.json"), there
    assert sorted(remote_checkpoints(out_uri)) == ["epoch-1", "step-2-1"]
    for name in remote_checkpoints(out_uri):  # what the URI calls complete is there whole
        local = tmp_path / "node-b" / "x"
        storage.sync(f"{out_uri}/{name}", str(local / name))
        assert sorted(p.name for p in (local / name).iterdir()) == ["config.json", "model.safetensors",
                                                                    "optimizer.pt", "rng.pt", "state.json"]
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node-c"))  # a fresh node resumes
    resumed = train_uploading(dataclasses.replace(cfg, out_uri=out_uri), model)
    hist = json.loads((resumed / "config.json").read_text())["training"]["history"]
    assert [e["epoch"] for e in hist] == [0, 1, 2]
    a, b = (load_file(str(d / "model.safetensors")) for d in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert storage.listdir(out_uri) == ["epoch-2", "final"]


@pytest.mark.slow
def test_a_failed_upload_is_raised_at_the_next_save_and_at_the_end(verifier, features, tmp_path, monkeypatch):
    """The upload of step-1-2 fails in the background: the next save raises it (the run stops; the URI
    never calls step-1-2 complete). A one-epoch run whose last upload fails raises it at the end,
    before the final checkpoint is made."""
    from common import storage
    from tests.upload_job import train_uploading
    from workers.artifacts import UploadFailed, remote_checkpoints

    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    uri = f"file://{tmp_path}/bucket"
    _slow_uploads(monkeypatch, [], delay=0.0, fail="step-1-2")
    cfg = dataclasses.replace(_cfg(features, "unused", checkpoint_every=1, keep_checkpoints=1,
                                   out_uri=f"{uri}/a"),
                              backbone="eagle2")
    with pytest.raises(UploadFailed, match="step-1-2.*injected: the store refused step-1-2"):
        train_uploading(cfg, verifier[0])
    assert remote_checkpoints(f"{uri}/a") == ["step-1-1"]
    assert not (storage.node_cache(f"{uri}/a") / "step-1-3").exists()  # raised before the next was written
    _slow_uploads(monkeypatch, [], delay=0.0, fail="epoch-1")
    cfg = dataclasses.replace(cfg, out_uri=f"{uri}/b", checkpoint_every=None, epochs=1)
    with pytest.raises(UploadFailed, match="epoch-1"):
        train_uploading(cfg, verifier[0])
    assert remote_checkpoints(f"{uri}/b") == [] and not (storage.node_cache(f"{uri}/b") / "final").exists()


def test_with_several_nodes_a_checkpoint_is_complete_at_the_uri_only_once_every_node_uploaded(tmp_path):
    """Rank 0 of a two-node run: its thread uploads its node's files but cannot know the other node is
    done, so the checkpoint has no state.json at the URI until the next settle (where the ranks agree
    every upload succeeded); that settle completes it and drops the one it makes stale."""
    from common import storage
    from workers.artifacts import Uploads, remote_checkpoints

    uri = f"file://{tmp_path}/bucket"
    cfg = SimpleNamespace(out_uri=uri, keep_checkpoints=1)
    up = Uploads(cfg, rank=0, local_rank=0, world=1, nodes=2)
    for name in ("step-1-1", "step-1-2"):
        d = tmp_path / "node" / name
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w" * 64)
        (d / "state.json").write_text("{}")
        up.settle()  # (as the trainer does before each save)
        up.start(d)
        up._thread.join()
        assert storage.exists(f"{uri}/{name}/model.safetensors") and name not in remote_checkpoints(uri)
    assert remote_checkpoints(uri) == ["step-1-1"]  # completed by the settle before step-1-2
    up.settle()
    assert remote_checkpoints(uri) == ["step-1-2"] and storage.listdir(uri) == ["step-1-2"]


def test_ray_train_gets_the_profiles_retries_and_keeps_few_checkpoints(tmp_path):
    from workers.train_worker import trainer_for

    cfg = TrainConfig(verifier="v", backbone="hass", variant="math", out_dir=str(tmp_path / "x"),
                      train_data=[["r", "k", None]], keep_checkpoints=2)
    run = trainer_for(cfg, max_failures=3).run_config
    assert run.failure_config.max_failures == 3 and run.checkpoint_config.num_to_keep == 2
    assert load_profile("smoke").retries == 2  # the driver passes it as max_failures (stage_train)


# ---------------------------------------------------------------- the lease
def _holder(ref: str) -> subprocess.Popen:
    code = ("import sys, time; from orchestrator.manifest import Lease; "
            f"Lease({ref!r}, ttl=60, settle=0).acquire(); print('held', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("uri", [False, True])
def test_a_second_driver_is_refused_until_the_first_is_gone(tmp_path, uri):
    out = f"file://{tmp_path}/run" if uri else str(tmp_path / "run")
    ref = f"{out}/lease.json"
    holder = _holder(ref)
    try:
        with pytest.raises(LeaseHeld) as e:
            Lease(ref, settle=0).acquire()
        msg = str(e.value)
        assert "\n" not in msg and f"driver pid {holder.pid} on" in msg and "--take-over" in msg, msg
        print(f"second driver: {msg}")
    finally:
        holder.kill()
        holder.wait()
    lease = Lease(ref, settle=0)
    assert "its process has exited" in lease.acquire()  # a killed driver's command resumes at once
    lease.release()
    assert not Path(ref.removeprefix("file://")).exists()


def test_a_live_lease_elsewhere_expires_or_is_taken_over_and_the_loser_stops(tmp_path):
    ref = str(tmp_path / "lease.json")
    other = {"host": "other-host", "pid": 1, "id": "x"}
    Path(ref).write_text(json.dumps({**other, "expires": time.time() + 60}))
    with pytest.raises(LeaseHeld, match="in use by driver pid 1 on other-host"):
        Lease(ref, settle=0).acquire()
    first = Lease(ref, ttl=0.4, settle=0)
    assert "--take-over" in first.acquire(take_over=True)
    Path(ref).write_text(json.dumps({**other, "expires": time.time() - 5}))  # another driver took it back
    time.sleep(0.5)  # the holder's renewal (every ttl / 4) sees it
    with pytest.raises(LeaseHeld, match="taken by driver pid 1 on other-host"):
        first.check()
    second = Lease(ref, settle=0)
    assert "expired" in second.acquire()
    second.release()


# ---------------------------------------------------------------- eval actors
class _Flaky:
    """An eval-actor stand-in: ``run`` sleeps, or kills its process; a restart takes ``restart_s``;
    ``broken``: the constructor always raises (a verifier that cannot load)."""

    def __init__(self, restart_s: float, broken: bool = False):
        import ray

        if broken:
            raise OSError("verifier weights not found (a stand-in)")
        if ray.get_runtime_context().was_current_actor_reconstructed:
            time.sleep(restart_s)  # reloading the verifier

    def pid(self) -> int:
        return os.getpid()

    def run(self, item: int, die: bool) -> int:
        if die:
            os._exit(1)
        time.sleep(0.3)
        return item


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray whose workers keep their node-local files under a staging dir of their own."""
    import ray

    with socket.socket() as sock:  # a free port for Ray's minimal dashboard (never 8265: other tests use it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"TASKSPEC_STAGING": str(tmp_path_factory.mktemp("node")), "TASKSPEC_TRAIN_THREADS": "1"}
    # this module's actor classes travel by value: Ray's workers cannot import a test module by name
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, dashboard_port=port,  # never another's
             log_to_driver=False, runtime_env={"env_vars": env})
    yield ray, env["TASKSPEC_STAGING"]
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.full  # the default suite's Ray Train restart: tests/test_multinode.py, on two nodes, in bf16
def test_ray_train_restarts_after_a_crash_and_resumes_from_the_step_checkpoint_at_the_uri(features, local_ray,
                                                                                        tmp_path,
                                                                                        monkeypatch):
    """Two ZeRO-1 workers, a checkpoint every 3 optimizer steps, a crash after step 4 (fresh runs
    only): FailureConfig(max_failures=1) restarts the worker group, which fetches step-2-1 from the
    file:// URI and finishes. Inputs, epochs (both ranks' optimizer shards) and the final checkpoint
    move only through the URI; stale checkpoints are gone there and on the node. Then the node's
    files are deleted, as if the next run landed on a new node, and a third epoch resumes from the
    URI alone (its history starts with the first run's, timings included)."""
    import shutil

    from common import storage
    from drafters.checkpoint import load_checkpoint
    from workers.train_worker import run_training

    root, caches = features
    uri = f"file://{tmp_path}/bucket/run"
    for corpus in caches.values():  # the feature caches, published as the features stage does
        for part in ("train", "heldout"):
            storage.publish(f"{root}/{corpus[part]}", storage.join(uri, "features", corpus[part]))
    out_uri, feats = storage.join(uri, "checkpoints", "hass-math"), storage.join(uri, "features")
    cfg = TrainConfig(verifier="smollm2-135m-instruct", backbone="hass", variant="math", out_dir="unused",
                      out_uri=out_uri, train_data=variant_data("math", feats, caches, SPEC.n),
                      heldout_data=heldout_data(feats, caches)[:1], epochs=2, lr=1e-3, batch_size=4,
                      hass_steps=2,
                      deepspeed=True, zero_stage=1, checkpoint_every=3, keep_checkpoints=1, crash_at_step=4)
    t0 = time.time()
    _, result = run_training(cfg, num_workers=2, max_failures=1)  # the first attempt must crash: a restart
    hist = json.loads((tmp_path / "bucket/run/checkpoints/hass-math/final/config.json").read_text())
    print(f"Ray Train: crash after step 4 of 4, restart from step-2-1 (1 step redone), done in "
          f"{time.time() - t0:.0f}s; at the URI: {storage.listdir(out_uri)}")
    assert [h["epoch"] for h in hist["training"]["history"]] == [0, 1, 2] and result.metrics["epoch"] == 2
    assert storage.listdir(out_uri) == ["epoch-2", "final"]  # keep_checkpoints 1, step checkpoints dropped
    monkeypatch.setenv("TASKSPEC_STAGING", local_ray[1])
    node = storage.node_cache(out_uri)  # where the workers kept their copies
    assert sorted(p.name for p in node.iterdir() if not p.name.startswith(".pointer")) == ["final"]
    remote = tmp_path / "bucket/run/checkpoints/hass-math"
    shards = sorted(p.name for p in (remote / "epoch-2/deepspeed/state").glob("*optim_states.pt"))
    assert len(shards) == 2, shards  # one ZeRO-1 optimizer shard per rank
    ray_train = tmp_path / "bucket/run/checkpoints/_ray_train"  # Ray Train's record: pointers, no second copy
    assert list(ray_train.rglob("pointer.json")) and not list(ray_train.rglob("*.safetensors"))
    first = hist["training"]["history"]

    shutil.rmtree(local_ray[1])  # a new node: nothing local, everything comes from the URI
    t1 = time.time()
    final, result = run_training(dataclasses.replace(cfg, epochs=3), num_workers=2, max_failures=1)
    print(f"Ray Train on a new node: epoch 3 resumed from epoch-2 at the URI in {time.time() - t1:.0f}s")
    assert result.metrics["epoch"] == 3
    history = load_checkpoint(str(storage.fetch(storage.join(out_uri, "final")))).config.training["history"]
    assert history[: len(first)] == first and history[-1]["epoch"] == 3
    assert storage.listdir(out_uri) == ["epoch-3", "final"]


def _drain(pool, items, die_once):
    """Run ``items`` through ``pool`` as the driver does (a failed item is queued again)."""
    queue, done, t_fail, during = list(items), {}, None, 0
    while queue or pool.running:
        while queue and pool.free:
            i = queue.pop(0)
            die = i in die_once
            die_once.discard(i)
            pool.submit(lambda a, i=i, die=die: a.run.remote(i, die), i)
        got = pool.next()
        if got is None:
            continue
        item, result, err = got
        if err is not None:
            t_fail = t_fail or time.time()
            queue.append(item)
            continue
        done[item] = done.get(item, 0) + 1
        during += bool(t_fail and pool.probes)  # finished while the failed actor was restarting
    return done, during


@pytest.mark.slow
def test_a_dead_eval_actor_restarts_in_the_background_and_the_others_go_on(local_ray):
    from orchestrator.run.eval_pool import EvalPool

    ray = local_ray[0]
    cls = ray.remote(num_cpus=0.5, max_restarts=-1, max_task_retries=0)(_Flaky)
    names = []
    pool = EvalPool(lambda name: names.append(name) or cls.options(name=name).remote(4.0), 2,
                    log=lambda m: None)
    t0 = time.time()
    done, during = _drain(pool, range(12), {1})
    print(f"eval pool: 12 shards, one actor killed and restarted (4 s): {during} shards finished meanwhile "
          f"by the other actor; {time.time() - t0:.1f}s in all")
    assert done == {i: 1 for i in range(12)} and during >= 3 and pool.replaced == 0
    pool.close()
    # an actor that cannot restart is replaced at once, under a new name
    cls0 = ray.remote(num_cpus=0.5, max_restarts=0, max_task_retries=0)(_Flaky)
    names.clear()
    pool = EvalPool(lambda name: names.append(name) or cls0.options(name=name).remote(0.0), 2,
                    log=lambda m: None)
    done, _ = _drain(pool, range(6), {0, 3})
    assert done == {i: 1 for i in range(6)} and pool.replaced == 2
    assert len(names) == len(set(names)) == 4, names
    pool.close()


@pytest.mark.slow
def test_actors_that_never_start_end_the_pool_with_the_error_not_a_hang(local_ray):
    """A constructor that always raises (on 2026-12-01 a test module Ray could not import did
    this, and the pool replaced actors forever): each slot is retired after 3 failed starts in a
    row and the pool raises NoEvalActor naming the error, within seconds."""
    from orchestrator.run.eval_pool import EvalPool, NoEvalActor

    ray = local_ray[0]
    cls = ray.remote(num_cpus=0.5, max_restarts=-1, max_task_retries=0)(_Flaky)
    lines, t0 = [], time.time()
    pool = EvalPool(lambda name: cls.options(name=name).remote(0.0, broken=True), 2, log=lines.append)
    with pytest.raises(NoEvalActor, match="verifier weights not found"):
        _drain(pool, range(4), set())
    assert pool.replaced == 4 and sum("retired" in x for x in lines) == 2 and time.time() - t0 < 120, lines
    pool.close()


def _long_unit(relay, every):
    from workers.relay import RelaySender

    sender = RelaySender(relay, "mathinstruct", every=every)
    for i in range(1, 9):  # ~5 s: lines keep coming on a loaded machine too
        sender.send(f"mathinstruct/train: {i}/8")
        time.sleep(0.6)
    return "caches"


@pytest.mark.slow
def test_a_long_units_own_progress_reaches_the_driver_log_and_a_dead_relay_loses_nothing(local_ray):
    """A features task's done/total lines reach the driver's log while the driver waits for it
    (through the Relay actor); with the relay killed the task and the wait still give the result."""
    import io

    from orchestrator.run.progress import Progress, wait_relaying
    from workers.relay import Relay

    ray = local_ray[0]
    task = ray.remote(num_cpus=0)(_long_unit)
    out = io.StringIO()
    prog = Progress("features", 1, stream=out, quiet=True)
    relay = Relay.remote()
    assert wait_relaying(task.remote(relay, 0.0), relay, prog, every=0.5) == "caches"
    msgs = [x.split("] ", 2)[2] for x in out.getvalue().splitlines() if "[features] mathinstruct/train:" in x]
    assert len(msgs) >= 2 and len(set(msgs)) == len(msgs), out.getvalue()  # each line once
    ray.kill(relay)
    assert wait_relaying(task.remote(relay, 0.0), relay, prog, every=0.5) == "caches"


# ---------------------------------------------------------------- memory, tracking, guard rails
def test_drafter_cache_drops_the_least_recently_used_within_its_budget():
    loads = []
    cache = DrafterCache(250, size=lambda v: 100)
    get = lambda k, keep=frozenset(): cache.get(k, lambda: loads.append(k) or k, keep)  # noqa: E731
    for k in ("a", "b", "a", "c"):  # c pushes out b (a was used after b)
        get(k)
    assert list(cache.items) == ["a", "c"] and loads == ["a", "b", "c"] and cache.evicted == 1
    get("d", keep={"a", "d"})  # a cell of a and d: c goes, though a is older
    assert list(cache.items) == ["a", "d"] and cache.nbytes() <= 250
    get("e", keep={"a", "d", "e"})  # three drafters of one cell stay, over budget
    assert list(cache.items) == ["a", "d", "e"]


def test_tracker_records_reach_the_output_uri(tmp_path):
    pytest.importorskip("mlflow")
    import mlflow

    from orchestrator.run.tracking import Tracker

    uri = f"file://{tmp_path}/bucket/run"
    first = Tracker("mlflow", tmp_path / "driver-a", "smoke", remote=uri)
    first.log_run({"a": 1}, [{"name": "x", "tau": 2.0}], {"eval": 3.0}, tmp_path / "none")
    first.publish()
    assert (tmp_path / "bucket/run/mlruns").is_dir()
    second = Tracker("mlflow", tmp_path / "driver-b", "smoke", remote=uri)  # a driver on a new machine
    mlflow.set_tracking_uri(second.uri)
    runs = mlflow.search_runs(experiment_names=["taskspec-smoke"])
    assert len(runs) == 1 and runs["metrics.tau.x"][0] == 2.0


def test_local_output_on_multi_node_is_refused_unless_shared():
    assert preflight.output_problem(True, False, nodes=1, max_nodes=None) is None
    assert preflight.output_problem(False, False, nodes=3, max_nodes=None) is None  # a URI
    assert preflight.output_problem(True, True, nodes=3, max_nodes=None) is None  # declared shared mount
    for nodes, most in ((3, None), (1, 4.0)):  # several nodes now, or once the autoscaler adds them
        line = preflight.output_problem(True, False, nodes=nodes, max_nodes=most)
        assert "cluster.shared_mount: true" in line and "\n" not in line


def test_training_resources_are_checked_against_the_autoscalers_maximum(monkeypatch, capsys):
    """A resume with cached features starts training at once: a head-only cluster that can grow
    is not refused (the autoscaler's maximum counts). Without an autoscaler config the start only
    warns (worker pods may still be starting) and training checks the cluster as it is by then."""
    import ray
    from ray._private.state import state

    p = load_profile("smoke", ["resources.train.num_workers=4", "resources.train.use_gpu=true"])
    head = {"Alive": True, "Resources": {"CPU": 8.0}}
    now = {"resources": {"CPU": 8.0}, "nodes": [head]}
    monkeypatch.setattr(ray, "cluster_resources", lambda: now["resources"])
    monkeypatch.setattr(ray, "nodes", lambda: now["nodes"])
    group = SimpleNamespace(resources={"CPU": 8, "GPU": 1}, max_count=8)
    monkeypatch.setattr(state, "get_max_resources_from_cluster_config", lambda: {"CPU": 64, "GPU": 8})
    monkeypatch.setattr(state, "get_cluster_config", lambda: SimpleNamespace(node_group_configs=[group]))
    preflight.check_cluster(p, local_output=False)  # a GPU worker fits a node it can add
    assert "autoscaler's maximum" in capsys.readouterr().out
    assert preflight.cluster_capacity()[4] == [{"CPU": 8.0}, {"CPU": 8, "GPU": 1}]  # the head, the GPU nodes
    preflight.check_train_resources(p)  # 4 GPU workers fit the maximum
    monkeypatch.setattr(state, "get_cluster_config", lambda: SimpleNamespace(node_group_configs=[]))
    with pytest.raises(preflight.PreflightError, match="train asks for 1 CPU [+] 1 GPU on one node"):
        preflight.check_cluster(p, local_output=False)  # an autoscaler that can add no GPU node
    monkeypatch.setattr(state, "get_max_resources_from_cluster_config", lambda: None)
    preflight.check_cluster(p, local_output=False)  # no autoscaler: GPU nodes may still be joining
    assert "warning: resources.train asks for 1 CPU + 1 GPU" in capsys.readouterr().out
    with pytest.raises(preflight.PreflightError, match="current size .* is 8 CPU / 0 GPU"):
        preflight.check_train_resources(p)  # still the head alone at the training stage
    now["nodes"] = [head] + [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}] * 4
    now["resources"] = {"CPU": 40.0, "GPU": 4.0}
    preflight.check_train_resources(p)  # they joined meanwhile: the cluster as it is now


def test_a_unit_that_fits_on_no_node_is_refused_and_an_exact_fit_is_not():
    """Totals are not enough: a training worker's CPUs and GPU, an eval actor's, a features task's
    go on one node (Ray would wait for that placement for ever), refused before any work. And a
    cluster exactly the workers' size fits: the Tune trial's own actor holds no CPU."""
    p = load_profile("smoke", ["resources.train.num_workers=4", "resources.train.cpus_per_worker=8",
                               "resources.train.use_gpu=true", "resources.eval.num_gpus=1"])
    assert preflight.placement_problems(p, [{"CPU": 64, "GPU": 8}]) == []
    lines = preflight.placement_problems(p, [{"CPU": 4, "GPU": 1}] * 16 + [{"CPU": 16}])
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "resources.train asks for 8 CPU + 1 GPU on one node" in lines[0]
    assert "largest has 4 CPU / 1 GPU" in lines[0]
    lines = preflight.placement_problems(p, [{"CPU": 16}])  # no GPU anywhere: workers and eval actors
    assert [x.split(" asks")[0] for x in lines] == ["resources.train", "resources.eval"]
    assert preflight.placement_problems(p, []) == []  # nothing known: nothing refused
    exact = load_profile("smoke", ["resources.train.num_workers=2", "resources.train.cpus_per_worker=1"])
    assert preflight.train_problem(exact, {"CPU": 2}, "x") is None
    assert "2 worker(s) x 1 CPU" in preflight.train_problem(exact, {"CPU": 1.99}, "x")


def _trial_sees_cpus(config):
    import ray
    from ray import tune

    time.sleep(1.5)  # both trials run at once
    tune.report({"cpu_free": ray.available_resources().get("CPU", 0.0)})


def test_concurrent_tune_trials_hold_no_cpu(local_ray, tmp_path):
    """Two trials at once on the 2-CPU node, each with the sweep's trial resources: every CPU stays
    free for the Train workers (with a 0.01 CPU sliver per trial, 1.98 were)."""
    from ray import tune

    from workers.tune_sweep import TRIAL_RESOURCES

    ray, _ = local_ray
    free = ray.available_resources().get("CPU", 0.0)  # 2, less any CPU an earlier test's actor holds
    tuner = tune.Tuner(tune.with_resources(_trial_sees_cpus, TRIAL_RESOURCES),
                       param_space={"x": tune.grid_search([1, 2])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0))
    results = tuner.fit()
    assert free >= 1 and not results.errors and [r.metrics["cpu_free"] for r in results] == [free, free]
