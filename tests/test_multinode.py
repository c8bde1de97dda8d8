"""The smoke grid on a multi-node Ray cluster on this machine, over object storage.

A head with no CPUs and two 1-CPU worker nodes (`ray.cluster_utils.Cluster`), each node with its
own staging directory (`TASKSPEC_STAGING` in the raylet's environment, so every worker on it uses
it), the driver with yet another one, and the output at `s3://` on moto's S3 server on 127.0.0.1.
No path is shared: every feature cache, checkpoint, trace and the report must cross the store.
A second driver on the same output and a local output directory are refused with one line. The
grid is run once, with two faults in its evaluation: the driver killed mid-evaluation and the same
command rerun, and during that rerun a worker node removed and replaced: the grid completes, every
unit has its prompts x turns rows exactly once, the units cut off are retried (the manifest's
attempts), and it prints its figures (work redone, seconds to recover)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow.dataset as ds
import pytest
import safetensors.torch
import torch
from pyarrow import fs
from ray.cluster_utils import Cluster

from drafters.data.sources import load_benchmark
from drafters.train.runners import weights_digest
from orchestrator.grid import eval_cells
from orchestrator.manifest import read_manifest
from orchestrator.plan.sizing import load_profile
from orchestrator.report.build import build_report
from orchestrator.report.duplicates import DuplicateRows
from tests.s3_server import CREDS, moto_s3

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BUCKET, RUN = "taskspec-grid", "smoke/run"
URI = f"s3://{BUCKET}/{RUN}"
REGION = "us-east-1"
# every stage runs (features, both drafters, the merge, the report); evaluation keeps every
# strategy on 3 prompts at T=0 (21 units): what crosses the store is the same, at half the cells;
# every cell times generate next to its own prompts (eval.paired_baseline). Each drafter trains as
# on a GPU cluster: one Ray Train worker on each node (gloo), DeepSpeed in bf16, and a batch count
# the two ranks cannot split evenly (8 examples in batches of 3)
PROMPTS = {"gsm8k": 2, "mt_bench": 1}  # one unit per prompt (the smoke profile's shard_size is 1)
SMALL = ["eval.temperatures=[0.0]", "eval.tree_auto=[]", "eval.benchmarks={gsm8k: 2, mt_bench: 1}",
         "eval.paired_baseline=true", "resources.train.num_workers=2", "train.precision=bf16",
         "train.batch_size=3"]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free loopback port, with one bucket; yields (endpoint, pyarrow fs)."""
    with moto_s3(BUCKET, REGION) as served:
        yield served


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """Head (0 CPUs: runs no work but Ray Train's controller) + two 1-CPU worker nodes, each with its own
    staging dir. The nodes get credentials (as an instance profile would give them) but not the
    endpoint: the driver forwards that (storage.ENDPOINT_VARS)."""
    tmp = tmp_path_factory.mktemp("multinode")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")  # as tests/test_grid.py
    with socket.socket() as sock:  # the head's dashboard on a free port: 8265 belongs to tests/test_grid.py
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # credentials on every node, the head too (Ray Train's controller may run there)
    head = {"num_cpus": 0, "env_vars": {"TASKSPEC_STAGING": str(tmp / "head"), **CREDS},
            "dashboard_port": port}
    c = Cluster(initialize_head=True, head_node_args=head)
    c.tmp, c.n_added = tmp, 0
    for _ in range(2):
        _add_worker(c)
    c.wait_for_nodes()
    yield c
    c.shutdown()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _add_worker(c: Cluster):
    c.n_added += 1
    env = {"TASKSPEC_STAGING": str(c.tmp / f"node-{c.n_added}"), **CREDS}
    return c.add_node(num_cpus=1, object_store_memory=200 << 20, env_vars=env)


def _grid(c: Cluster, s3, *args: str, **popen) -> subprocess.Popen:
    endpoint, _ = s3
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
    env.update(RAY_ADDRESS=c.address, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               TASKSPEC_STAGING=str(c.tmp / "driver"), AWS_ENDPOINT_URL_S3=endpoint,
               AWS_DEFAULT_REGION=REGION, **CREDS)
    sets = [a for s in SMALL for a in ("--set", s)]
    cmd = [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke", "--output-dir", URI,
           *sets, *args]
    return subprocess.Popen(cmd, **{"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen},
                            text=True,
                            env=env)


def _read_json(s3fs, rel: str) -> dict:
    with s3fs.open_input_stream(f"{BUCKET}/{RUN}/{rel}") as f:
        return json.loads(f.read())


def _table(s3fs, rel: str) -> pl.DataFrame:
    return pl.from_arrow(ds.dataset(f"{BUCKET}/{RUN}/{rel}", filesystem=s3fs, format="parquet",
                                    partitioning="hive").to_table())


def _check_traces(s3fs) -> tuple[pl.DataFrame, dict]:
    """Every eval unit done, and the Parquet traces at the URI hold exactly the rows the manifest
    recorded: returns (prompt rows, {lost, duplicated, expected})."""
    units = {k: u for k, u in _read_json(s3fs, "manifest.json")["cells"].items() if u["stage"] == "eval"}
    assert len(units) == sum(PROMPTS[c.benchmark] for c in eval_cells(load_profile("smoke", SMALL)))
    assert all(u["status"] == "done" for u in units.values())
    prompts, steps = _table(s3fs, "traces/prompts"), _table(s3fs, "traces/steps")
    expected = sum(u["rows"] for u in units.values())
    unique = prompts.select("unit_key", "prompt_id", "turn").n_unique()
    figures = {"expected": expected, "lost": expected - unique, "duplicated": prompts.height - unique}
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    assert set(prompts["unit_key"]) == set(units)
    assert steps.height == int(prompts["verifier_calls"].sum())
    return prompts, figures


def _eval_cells(manifest: dict) -> dict:
    return {k: c for k, c in manifest["cells"].items() if c["stage"] == "eval"}


def _wait_to_kill(proc: subprocess.Popen, log: Path, staging: Path, s3fs, t_max: float = 1800) -> int:
    """Wait until the driver has done 3 eval units (its own manifest copy) and the manifest at the
    URI shows a unit started and not finished (so the kill cuts one off in the record too);
    returns how many units it had done then."""
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < t_max:
        try:
            cells = _eval_cells(read_manifest(next(staging.glob("*/manifest.json"))))  # and its journal
        except (StopIteration, OSError, ValueError):
            cells = {}
        done = sum(c["status"] == "done" for c in cells.values())
        if done >= 3:
            try:
                at_uri = _eval_cells(_read_json(s3fs, "manifest.json"))
            except (OSError, ValueError):
                at_uri = {}
            if any(c["status"] == "running" for c in at_uri.values()):
                return done
        time.sleep(0.3)
    raise AssertionError(f"the driver was not caught mid-evaluation: {log.read_text()[-3000:]}")


def _own_eval_units(log: Path) -> int:
    """Eval units a driver has finished itself (its log's progress lines, the skipped ones not counted)."""
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return 0
    return sum("] [eval] " in x and " done, " in x and "(done earlier)" not in x for x in lines)


@pytest.fixture(scope="module")
def grid_run(cluster, s3, tmp_path_factory):
    """The smoke grid, with two faults in one evaluation. SIGKILL of the driver once 3 units are
    done (its actors die with it, its lease stays behind, the manifest at the URI shows a unit
    started and not finished). The same command then takes the dead driver's lease over at once
    (same host and PID space, process gone) and skips the units recorded at the URI; once it has
    finished 3 units of its own, a worker node (with an eval actor on it) is removed and a fresh
    node (empty staging dir) joins, as an autoscaler would replace a lost VM: the shard that was
    running there is retried. Returns what the fault test checks."""
    _, s3fs = s3
    logs = tmp_path_factory.mktemp("grid-logs")
    t = time.time()
    with open(logs / "first.log", "w") as out:
        first = _grid(cluster, s3, stdout=out)
    try:
        done_at_kill = _wait_to_kill(first, logs / "first.log", cluster.tmp / "driver" / "driver", s3fs)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    killed_at = time.time()
    at_kill = _eval_cells(_read_json(s3fs, "manifest.json"))
    log_path = logs / "resumed.log"
    with open(log_path, "w") as out:
        resumed = _grid(cluster, s3, stdout=out)
    removed_at = recovered_at = None
    while resumed.poll() is None and time.time() - killed_at < 1800:
        if removed_at is None and _own_eval_units(log_path) >= 3:
            victim = sorted(cluster.worker_nodes, key=lambda n: n.unique_id)[0]
            cluster.remove_node(victim)
            removed_at = time.time()
            _add_worker(cluster)
        if removed_at and recovered_at is None and "; retrying" in log_path.read_text():
            recovered_at = time.time()  # the driver saw the lost shard and queued it again
        time.sleep(0.5)
    if resumed.poll() is None:
        resumed.kill()
    log = log_path.read_text()
    assert resumed.wait() == 0, log[-4000:]
    stages = [x for x in log.splitlines() if x.startswith("stage wall times")]
    print(f"multi-node smoke grid over s3, killed once and resumed: {time.time() - t:.0f}s; resumed {stages}")
    return {"log": log, "done_at_kill": done_at_kill, "at_kill": at_kill, "killed_at": killed_at,
            "removed_at": removed_at, "recovered_at": recovered_at, "done_at": time.time()}


def test_smoke_grid_runs_on_two_nodes_through_object_storage_only(cluster, s3, grid_run):
    _, s3fs = s3
    prompts, figures = _check_traces(s3fs)
    print(f"rows: {figures}")
    # lossless at T=0 across nodes: every strategy's output equals the autoregressive one
    t0 = prompts.filter(pl.col("temperature") == 0)
    base = t0.filter(pl.col("strategy") == "autoregressive").select("benchmark", "prompt_id", "turn",
                                                                      pl.col("output_token_ids").alias("ref"))
    joined = t0.join(base, on=["benchmark", "prompt_id", "turn"])
    assert joined.height == t0.height and (joined["output_token_ids"] == joined["ref"]).all()
    # the report and the checkpoints are at the URI
    sel = fs.FileSelector(f"{BUCKET}/{RUN}", recursive=True)
    rel = {i.path[len(f"{BUCKET}/{RUN}/"):] for i in s3fs.get_file_info(sel) if i.type == fs.FileType.File}
    assert "report/report.md" in rel and "manifest.json" in rel
    assert {p for p in rel if p.endswith("final/model.safetensors")}, sorted(rel)[:40]
    # two ranks, one per node, in bf16: the same steps (the odd batch dropped) and the same weights as saved
    finals = sorted(p[: -len("/state.json")] for p in rel if p.endswith("final/state.json"))
    assert len(finals) == 2, finals  # the math and chat drafters
    for final in finals:
        ranks = _read_json(s3fs, f"{final}/state.json")["ranks"]
        with s3fs.open_input_stream(f"{BUCKET}/{RUN}/{final}/model.safetensors") as f:
            saved = safetensors.torch.load(f.read())
        assert len(ranks) == 2 and ranks[0] == ranks[1] and ranks[0]["micro_batches"] >= 1, (final, ranks)
        assert weights_digest(saved) == ranks[0]["weights"], final
        assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.bfloat16}, final
    assert {p for p in rel if p.startswith("features/") and p.endswith("manifest.json")}
    # nothing crossed a local path: the driver's staging holds only its own files plus what it fetched
    # (the two specialists of the merge); both worker nodes fetched checkpoints for their eval actor
    tmp = cluster.tmp
    own = [p.relative_to(tmp / "driver") for p in (tmp / "driver" / "driver").rglob("*") if p.is_file()]
    assert own and not [p for p in own if "final" in p.parts or "features" in p.parts]
    assert list((tmp / "driver" / "cache").rglob("final/model.safetensors"))
    for node in ("node-1", "node-2"):
        assert list((tmp / node / "cache").rglob("model.safetensors")), f"{node} decoded nothing"
    assert not (tmp / "head" / "cache").exists()  # the head ran no work


def test_paired_baseline_cells_time_generate_next_to_each_prompt(cluster, s3, grid_run):
    """eval.paired_baseline: every cell timed generate next to its own prompts, on its own node,
    with the same T=0 output, and the speed table at the URI divides by those runs."""
    _, s3fs = s3
    prompts, _ = _check_traces(s3fs)
    assert (prompts["generate_wall_time_s"] > 0).all() and prompts["generate_matches"].all()
    speed = _table(s3fs, "report/tables/speed.parquet").filter(pl.col("method") != "generate (transformers)")
    assert speed.height and speed["paired_baseline"].all() and (speed["outputs_equal_generate"] == 1.0).all()




def test_a_second_driver_and_a_local_output_are_refused_with_one_line(cluster, s3):
    """A live lease of another driver at the URI (another host, not expired) refuses a second
    driver before it reads the manifest; a local --output-dir on this 3-node cluster is refused by
    the cluster check (no cluster.shared_mount). Both exit 2 with one 'error:' line."""
    _, s3fs = s3
    lease = {"host": "other-host", "pid": 4242, "id": "elsewhere", "expires": time.time() + 600}
    with s3fs.open_output_stream(f"{BUCKET}/{RUN}/lease.json") as f:
        f.write(json.dumps(lease).encode())
    try:
        procs = [_grid(cluster, s3), _grid(cluster, s3, "--output-dir", str(cluster.tmp / "local-out"))]
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        s3fs.delete_file(f"{BUCKET}/{RUN}/lease.json")
    errors = [[x for x in log.splitlines() if x.startswith("error:")] for log in logs]
    print("refused:", *[e[0] if e else log[-500:] for e, log in zip(errors, logs)], sep="\n  ")
    assert [p.returncode for p in procs] == [2, 2] and [len(e) for e in errors] == [1, 1], logs
    assert "is in use by driver pid 4242 on other-host" in errors[0][0] and "--take-over" in errors[0][0]
    assert "multi-node Ray cluster (3 nodes)" in errors[1][0] and "cluster.shared_mount: true" in errors[1][0]


def _turns() -> dict:
    """{(benchmark, prompt id): its turns} of the smoke grid's benchmarks."""
    return {(b, p.id): len(p.turns) for b in PROMPTS for p in load_benchmark(b)[0]}


def test_driver_killed_then_a_node_removed_while_the_same_command_resumes(cluster, s3, grid_run, tmp_path):
    """The two faults of ``grid_run``: the grid completes; every eval unit holds exactly its
    prompts x turns rows (turns 0..n-1 of each prompt, once); each unit cut off, by the driver's
    kill (recorded started at the URI) or by the node's removal (the shard retried), was done again
    and counts its attempts; the report refuses a row injected twice."""
    _, s3fs = s3
    g = grid_run
    log, at_kill = g["log"], g["at_kill"]
    at_uri = sum(c["status"] == "done" for c in at_kill.values())
    cut_off = sorted(k for k, c in at_kill.items() if c["status"] == "running")
    evals = [x for x in log.splitlines() if "] [eval] " in x and " done, " in x]
    skipped = sum("(done earlier)" in x for x in evals)
    units = _eval_cells(_read_json(s3fs, "manifest.json"))
    retried_labels = set(re.findall(r"\] \[eval\] (.+): attempt \d+ failed \(\w+\); retrying", log))
    retried = {k: c for k, c in units.items() if c["attempts"] > 1}
    prompts, figures = _check_traces(s3fs)
    lease = [x for x in log.splitlines() if x.startswith("lease:")]
    print(f"driver killed after {g['done_at_kill']} eval units ({at_uri} recorded at the URI, {len(cut_off)} "
          f"started there); the same command: {lease}, {skipped} units skipped, {len(evals) - skipped} "
          "evaluated "
          f"(work redone: {g['done_at_kill'] - at_uri} finished units not yet recorded at the URI + the "
          "shards "
          f"in flight)")
    killed, removed, recovered = g["killed_at"], g["removed_at"], g["recovered_at"]
    print(f"then a worker node removed {'-' if removed is None else f'{removed - killed:.0f}s'} "
          f"after the kill: units retried {sorted(retried_labels)}, the loss seen "
          f"{'-' if recovered is None else f'{recovered - removed:.0f}s'} after the removal; "
          f"grid done {g['done_at'] - killed:.0f}s after the kill; rows {figures}; attempts "
          f"{sorted(c['attempts'] for c in units.values())}")
    assert lease and "its process has exited" in lease[0]
    assert skipped == at_uri and figures["lost"] == 0 and figures["duplicated"] == 0
    assert removed is not None, "evaluation finished before a node could be removed"
    assert len(cluster.worker_nodes) == 2
    # rows per unit = its prompts x their turns, each (prompt, turn) once
    turns = _turns()
    for key, u in units.items():
        rows = prompts.filter(pl.col("unit_key") == key)
        bench = rows["benchmark"][0]
        got = {pid: sorted(r["turn"].to_list()) for (pid,), r in rows.group_by("prompt_id")}
        assert len(got) == u["prompts"] and rows.height == u["rows"], (u["name"], got)
        assert got == {pid: list(range(turns[(bench, pid)])) for pid in got}, (u["name"], got)
    assert set(prompts["turn"]) == {0, 1}  # (mt_bench prompts have two turns)
    # retried: each unit cut off with the driver (attempt 1 at the URI), and the node's shard
    assert cut_off and all(units[k]["attempts"] >= 2 for k in cut_off), {k: units[k]["attempts"]
            for k in cut_off}
    assert retried_labels and all(any(c["name"] == lb for c in retried.values()) for lb in retried_labels)
    # a row injected twice: the report refuses to aggregate (a local copy of the run, one row doubled)
    run = tmp_path / "run"
    for rel in ("traces", "manifest.json", "profile.json"):
        fs.copy_files(f"{BUCKET}/{RUN}/{rel}", str(run / rel), source_filesystem=s3fs,
                      destination_filesystem=fs.LocalFileSystem())
    victim = run / sorted(units.values(), key=lambda c: c["name"])[0]["files"][0]
    table = pl.read_parquet(victim)
    table.vstack(table.head(1)).write_parquet(victim)
    with pytest.raises(DuplicateRows, match=r"1 duplicated prompts row\(s\) in 1 place\(s\)"):
        build_report(run)


@pytest.mark.full  # breadth: the grid above already trains each drafter on two bf16 ranks, odd batch count
def test_training_on_two_nodes_with_an_odd_batch_count_in_bf16(cluster, s3, tmp_path):
    """One Ray Train run with a worker on each node (gloo), DeepSpeed ZeRO-1 in bf16 (what a GPU
    trains in), 5 batches for 2 ranks, a crash after step 3 restarted from the step checkpoint at
    s3:// (tests/two_node_training.py, in a process bounded by a timeout: a hang fails the test).
    Both ranks take the same steps (the fifth batch dropped), hold the same weights as the saved
    drafter, and the loss is finite and falls (the grid above decodes drafters trained so: exact at T=0)."""
    from safetensors.torch import load_file

    from drafters.train.runners import weights_digest

    endpoint, s3fs = s3
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
    env.update(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               TASKSPEC_STAGING=str(cluster.tmp / "train-driver"), AWS_ENDPOINT_URL_S3=endpoint,
               AWS_DEFAULT_REGION=REGION, **CREDS)
    cmd = [sys.executable, str(ROOT / "tests/two_node_training.py"), f"s3://{BUCKET}/two-node-train",
           str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    hist, ranks = s["history"], s["ranks"]
    print(f"two-node training (bf16, ZeRO-1, 2 ranks, 5 batches): {s['seconds']}s with one restart; "
          f"steps per epoch {[h['steps'] for h in hist[1:]]}, base loss "
          f"{[round(h['train_base_loss'], 3) for h in hist[1:]]}, ranks {ranks}")
    assert "injected crash after optimizer step 3" in log  # the first attempt crashed; the restart finished
    assert "the epoch's last batch dropped" in log
    assert [h["epoch"] for h in hist] == [0, 1, 2] and s["epoch"] == 2
    assert [h["steps"] for h in hist[1:]] == [2, 2], hist  # 5 batches // 2 ranks
    assert all(math.isfinite(h["train_loss"]) for h in hist[1:])
    assert hist[2]["train_base_loss"] < hist[1]["train_base_loss"], hist
    assert len(ranks) == 2 and ranks[0] == ranks[1] and ranks[0]["micro_batches"] == 4, ranks
    saved = load_file(str(Path(s["final"]) / "model.safetensors"))
    assert weights_digest(saved) == ranks[0]["weights"]  # the saved drafter is what every rank holds
    assert all(v.dtype == torch.bfloat16 for v in saved.values() if v.is_floating_point())
    assert s["at_uri"] == ["epoch-2", "final"]
    # the workers ran on both nodes: each node's own staging dir holds the checkpoints it fetched or wrote
    used = [d.name for d in cluster.tmp.glob("node-*")
            if list(d.rglob("two-node-train/checkpoints/hass-math"))]
    assert len(used) >= 2, used


class _DiskWatch(threading.Thread):
    """Samples, every few milliseconds, the feature shard bytes in each worker node's mirror of
    ``part`` (shards and their temp copies, staged or downloading; not the manifests): the peak per
    node and phase."""

    def __init__(self, tmp: Path, part: str):
        super().__init__(daemon=True)
        self.tmp, self.part, self.samples, self.stop = tmp, part, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            for node in self.tmp.glob("node-*"):
                total = 0
                for d, _, files in os.walk(node / "cache"):  # (a directory that goes while walked is skipped)
                    for f in files if self.part in f"{d}/" else ():
                        try:
                            total += os.stat(f"{d}/{f}").st_size if f.lstrip(".").startswith("shard-") else 0
                        except FileNotFoundError:  # renamed or evicted while counted
                            pass
                self.samples.append((time.time(), node.name, total))
            time.sleep(0.02)

    def peak(self, t0: float, t1: float) -> dict:
        out = {}
        for t, node, b in self.samples:
            if t0 <= t <= t1:
                out[node] = max(out.get(node, 0), b)
        return out


@contextlib.contextmanager
def _environ(**kv):
    saved = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _downloads(tmp: Path) -> dict:
    """{node: [download records]} from each worker node's shard cache log."""
    out = {}
    for node in tmp.glob("node-*"):
        log = node / "feature-shards" / "downloads.jsonl"
        out[node.name] = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
    return out


@pytest.mark.full  # 5-6 min on 2 cores; its placement of one rank per node is Ray's choice, not asserted
def test_features_streamed_once_and_each_rank_downloads_only_its_own_shards(cluster, s3, tmp_path):
    """The features task streams a corpus's shards to s3:// one by one (its node's disk: at most
    two shards), in two data-parallel parts (a task on each node, then the index), and two ranks,
    one per node, train from it: each downloads exactly the shards the partition of the index gives
    it (and the held-out set, which the ranks evaluate together), both take the same steps, and each
    node's shard cache stays under its bound (smaller than a rank's share, so shards are
    evicted and fetched again in the second epoch). tests/sharded_training.py runs the job."""
    from drafters.train.shards import rank_plan
    from workers.artifacts import localize_data

    endpoint, s3fs = s3
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
    env.update(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               TASKSPEC_STAGING=str(tmp_path / "job"), AWS_ENDPOINT_URL_S3=endpoint,
               AWS_DEFAULT_REGION=REGION,
               **CREDS)
    uri = f"s3://{BUCKET}/sharded"
    watch = _DiskWatch(cluster.tmp, "/sharded/features/")  # (the node mirror's path: the bucket is hashed)
    watch.start()
    try:
        r = subprocess.run([sys.executable, str(ROOT / "tests/sharded_training.py"), uri],
                           capture_output=True,
                           text=True, timeout=1800, env=env, cwd=ROOT)
    finally:
        watch.stop.set()
        watch.join()
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    t, bound = s["times"], s["cache_bytes"]
    # the index, as a rank reads it (the manifest fetched to this process's own staging dir)
    with _environ(AWS_ENDPOINT_URL_S3=endpoint, AWS_DEFAULT_REGION=REGION,
                  TASKSPEC_STAGING=str(tmp_path / "reader"),
                  **CREDS):
        train, held = (localize_data([[s["features"], s["caches"]["mathinstruct"][p], None]])[0]
                       for p in ("train", "heldout"))
        index = json.loads((Path(train[0]) / train[1] / "manifest.json").read_text())
        held_files = {x["file"]
                      for x in json.loads((Path(held[0]) / held[1] / "manifest.json").read_text())["shards"]}
        plan = rank_plan([train], 2, 4)
    biggest = max(x["bytes"] for x in index["shards"])
    share = [sum(u.tokens for u in plan.mine(r)) for r in range(2)]
    # extraction: streamed, at most two shards on its node's disk, none left there
    extract_peak = watch.peak(t["extract_start"], t["extract_end"])
    assert len(index["shards"]) >= 16 and plan.sharded, plan.describe()
    assert index["device"] == "cpu" and index["resumed_shards"] == 0
    # (the writer's own count is exact; a sample may miss a shard that is staged for milliseconds)
    assert 0 < index["staging_peak_bytes"] <= 2 * biggest and max(extract_peak.values()) <= 2 * biggest
    # training: each rank downloaded exactly its own shards (and the held-out set: every rank evaluates
    # its share of its batches, drafters/train/backbones.py; ranks on one node share its cache), within the
    # bound
    logs = _downloads(cluster.tmp)
    by_rank = {}
    for records in logs.values():
        # (Ray may place both ranks on one node: they then share its cache, and each still fetches its own)
        for x in records:
            by_rank.setdefault(x["rank"], []).append(x["ref"].rsplit("/", 1)[1])
    for rank in range(2):
        own = {u.file for u in plan.mine(rank)}
        got = set(by_rank.get(rank, []))
        assert got - held_files == own, (rank, sorted(got - held_files), sorted(own))
        assert len(by_rank[rank]) > len(got)  # the bound bit: some shards evicted and fetched again
    assert set().union(*(by_rank[r] for r in range(2))) >= held_files
    train_peak = watch.peak(t["train_start"], t["train_end"])
    held_max = max(x["held_bytes"] for records in logs.values() for x in records)
    print(f"sharded features on two nodes: {len(index['shards'])} shards ({index['tokens']} tokens, largest "
          f"{biggest} B), extraction {t['extract_end'] - t['extract_start']:.0f}s with a staging peak of "
          f"{index['staging_peak_bytes']} B (sampled {max(extract_peak.values())} B; bound 2 shards = "
          f"{2 * biggest} B); training {t['train_end'] - t['train_start']:.0f}s: {plan.describe()}; "
          f"tokens per rank {share}; downloads per rank {[len(by_rank[r]) for r in range(2)]} of "
          f"{[len(plan.mine(r)) for r in range(2)]} own shards; node disk peak {train_peak} B sampled, "
          f"{held_max} B by the cache's count, bound {bound} B")
    assert held_max <= bound and 0 < max(train_peak.values()) <= bound
    assert abs(share[0] - share[1]) <= max(x["tokens"] for x in index["shards"])
    ranks = s["ranks"]
    assert len(ranks) == 2 and ranks[0] == ranks[1] and ranks[0]["micro_batches"] == 2 * plan.steps, ranks
    assert [h["steps"] for h in s["history"][1:]] == [plan.steps] * 2


# 27 s with the cluster's start (2026-12-06); tests/test_shard_reads.py has the same in-process
@pytest.mark.full
def test_ranks_on_two_nodes_wait_less_for_shards_with_read_ahead(cluster, tmp_path):
    """An EAGLE-3 cache at s3:// behind a bandwidth throttle; two ranks, one per node, read their own
    shards as EAGLE-2 does (tests/shard_read_job.py), without and with read-ahead. Asserted: each
    rank downloads exactly its own shards, and of them only EAGLE-2's tensors; read-ahead strictly
    reduces every rank's wait. Printed: the waits beside orchestrator/plan/feature_io.py's prediction
    (the throttle is one link shared by both ranks)."""
    from common import storage
    from orchestrator.plan import feature_io
    from tests.s3_server import throttled_s3
    from tests.test_shard_reads import make_cache

    bandwidth, compute_s = 0.4e6, 0.6
    m = make_cache(tmp_path / "features", "c", 8, per_shard=8, hidden=256, n_aux=3)
    with throttled_s3("shard-reads", REGION, bandwidth=bandwidth) as (endpoint, _, throttle):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
        env.update(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                   TASKSPEC_STAGING=str(tmp_path / "job"), AWS_ENDPOINT_URL_S3=endpoint,
                   AWS_DEFAULT_REGION=REGION,
                   **CREDS)
        uri = "s3://shard-reads/features"
        with _environ(AWS_ENDPOINT_URL_S3=endpoint, AWS_DEFAULT_REGION=REGION, **CREDS):
            for ahead in (0, 2):  # one copy per run: no node starts with the other run's shards
                storage.sync(str(tmp_path / "features" / "c"), f"{uri}/c{ahead}")
        r = subprocess.run([sys.executable, str(ROOT / "tests/shard_read_job.py"), uri, str(compute_s), "0",
                            "2"],
                           capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    runs = json.loads(r.stdout.strip().splitlines()[-1])
    whole = {s["file"]: s["bytes"] for s in m["shards"]}
    for ahead in ("0", "2"):
        assert len({x["node"] for x in runs[ahead]}) == 2
        for x in runs[ahead]:
            assert x["files"] == x["own"] and len(x["own"]) == 4  # its own shards, each once
            assert x["bytes_read"] < 0.4 * sum(whole[f] for f in x["own"])  # EAGLE-2's tensors only
    for r0, r2 in zip(runs["0"], runs["2"]):
        assert r2["wait_s"] < r0["wait_s"], (r0, r2)
    per_shard = sum(x["bytes_read"] for x in runs["0"]) / 8
    io = {a: feature_io.ShardReads(per_shard, 4, compute_s, bandwidth, ranks_per_node=2, streams=2,
                                   read_ahead=a)
          for a in (0, 2)}
    print(f"two nodes, one throttled link of {bandwidth / 1e6:.1f} MB/s, 4 shards a rank of "
          f"{per_shard / 1e3:.0f} KB, "
          f"{compute_s} s of training each: waited {[round(x['wait_s'], 2) for x in runs['0']]} s without "
          "read-ahead "
          f"(predicted {feature_io.wait_with_read_ahead(io[0]):.2f}), "
          f"{[round(x['wait_s'], 2) for x in runs['2']]} s "
          f"with 2 ahead on 2 streams (predicted {feature_io.wait_with_read_ahead(io[2]):.2f})")
