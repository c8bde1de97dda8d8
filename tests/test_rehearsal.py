"""A paper-shaped rehearsal: `--profile paper` with only its sizes shrunk through `--set`, on the
two-node `Cluster` with the output on moto's S3 server (as tests/test_multinode.py), to 0 failed units.

What stays the paper's: the whole grid (eagle2 + hass + eagle3 x four variants, the merge sweep,
every strategy, router, head and temperature, all four benchmarks), DeepSpeed ZeRO-2 in bf16 on two
Ray Train ranks (one per node, gloo), a bf16 verifier of Llama-3's shape (7 layers, GQA, 128,256-token
vocabulary, its chat template; experiments/llama3_shaped.py, built locally), evaluation actors on
fractional resources (half a CPU each: four actors on two 1-CPU nodes), the report. Shrunk: the
verifier's width and depth, examples, epochs, tokens, trees, prompts (2 per benchmark), and the
resources (CPU ranks, no GPU). The features run twice, at two URIs: cached (extracted once,
streamed to the store, each rank reading its own shards) and online (the verifier's forward inside
training). What it cannot show (CUDA, bf16 on CUDA, NCCL, real sizes): docs/cluster.md, "What the
rehearsal covers and what it cannot"."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyarrow import fs
from ray.cluster_utils import Cluster

from orchestrator.manifest import read_manifest
from tests.s3_server import CREDS, moto_s3

ROOT = Path(__file__).resolve().parents[1]
BUCKET, REGION = "taskspec-rehearsal", "us-east-1"
# every process: no CPU kernel tuning (decoding/cpu; a GPU never runs it), which would time each new
# shape's matmul tables in each task and actor on this loaded machine, as tests/test_eval_packing.py
NODE_ENV = {**CREDS, "TASKSPEC_CPU_SPEED": "0", "TOKENIZERS_PARALLELISM": "false"}
BENCHMARKS = {"mt_bench": 2, "gsm8k": 2, "math500": 2, "svamp": 2}
# sizes only: the grid's axes (backbones, variants, merges, strategies, routers, temperatures) are the paper's
SIZES = [
    "data.n=8", "data.heldout=4", "data.max_length=64", "data.feature_storage_gib=1",
    "train.epochs=1", "train.per_backbone={hass: {warmup_steps: 1}, eagle3: {lr: 1.0e-4, epochs: 1}}",
    "train.warmup_steps=1", "train.global_batch=4", "train.batch_size=2", "train.checkpoint_every=2",
    "train.draft_vocab=1024", f"eval.benchmarks={json.dumps(BENCHMARKS)}", "eval.max_new_tokens=8",
    "eval.tree={top_k: 3, depth: 3, total_tokens: 8}",
    "resources.features={num_cpus: 1, num_gpus: 0}",
    "resources.train={num_workers: 2, cpus_per_worker: 1, use_gpu: false, max_concurrent_trials: 1}",
    "resources.eval={num_cpus: 0.5, num_gpus: 0}", "resources.eval_actors=4",
]


def _llama3_shaped():
    spec = importlib.util.spec_from_file_location("llama3_shaped", ROOT / "experiments/llama3_shaped.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    """A 7-layer, 64-wide bf16 model of Llama-3-8B-Instruct's shape (every node reads it from this path:
    all nodes are this machine). 7 layers: the fewest whose EAGLE-3 feature layers (2, L // 2, L - 3;
    drafters/eagle3.py) are distinct."""
    return _llama3_shaped().build(tmp_path_factory.mktemp("llama3") / "model", hidden=64, layers=7)


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server with the rehearsal's bucket; yields (endpoint, pyarrow fs)."""
    with moto_s3(BUCKET, REGION) as served:
        yield served


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """Head with 0 CPUs (Ray Train's controller only) + two 1-CPU worker nodes, each its own staging dir."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    with socket.socket() as sock:  # a free dashboard port (8265 belongs to tests/test_grid.py)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    head = {"num_cpus": 0, "env_vars": {"TASKSPEC_STAGING": str(tmp / "head"), **NODE_ENV},
            "dashboard_port": port}
    c = Cluster(initialize_head=True, head_node_args=head)
    c.tmp = tmp
    for i in (1, 2):
        c.add_node(num_cpus=1, object_store_memory=200 << 20,
                   env_vars={"TASKSPEC_STAGING": str(tmp / f"node-{i}"), **NODE_ENV})
    c.wait_for_nodes()
    yield c
    c.shutdown()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _command(verifier, mode: str, out: str, *extra: str) -> list[str]:
    sets = [a for s in [f"verifier={verifier}", f"data.feature_mode={mode}", *SIZES] for a in ("--set", s)]
    return [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "paper", "--output-dir", out,
            *sets, *extra]


def test_the_rehearsals_command_is_the_paper_grid_with_only_sizes_shrunk(tmp_path):
    """The default suite's cousin (seconds): the rehearsal's own command, dry run, plans the paper's
    whole grid (12 trials, ZeRO-2, the merge sweep, every eval cell at 2 prompts a benchmark, fractional
    actors) with the data counted against what it asks. The run itself is minutes of Ray Train start-ups
    and several hundred eval units: `make test-full`."""
    r = subprocess.run(_command(tmp_path / "model", "cached", f"s3://{BUCKET}/dry", "--dry-run"),
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **NODE_ENV})
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "features : 2 corpora ['mathinstruct', 'sharegpt'] (mode: cached" in log, log
    assert "train    : 12 runs, 1 epochs, ZeRO-2, 2 worker(s) x 1 CPU" in log, log
    assert "merge    : 27 checkpoints" in log and "x (0.5 CPU, 0.0 GPU)" in log, log
    cells = int(re.search(r"eval     : (\d+) cells, (\d+) prompt runs", log).group(1))
    assert cells > 500 and f"{2 * cells} prompt runs" in log, log
    assert log.count("; 12 asked)") == 2, log  # data.n + data.heldout per corpus, counted before any work


@pytest.mark.slow
@pytest.mark.full  # breadth: each a paper-shaped grid of several hundred units (docs/cluster.md: its time)
@pytest.mark.parametrize("mode", ["cached", "online"])
def test_the_paper_grid_rehearses_on_two_nodes_over_s3(cluster, s3, verifier_dir, mode):
    """The whole paper grid to its report with 0 failed units, its features cached (extracted once and
    streamed to the store) or online (the verifier's forward inside each trial's training)."""
    _, s3fs = s3
    r = _rehearse(cluster, s3, verifier_dir, f"paper-{mode}", mode)
    units = _check(s3fs, r)
    rel = _files(s3fs, r["run"])
    shards = [p for p in rel if p.startswith("features/") and "/shard-" in p]
    if mode == "cached":
        assert shards, sorted(rel)[:40]  # streamed to the store, once
    else:
        assert not shards, shards[:5]  # computed inside training: no cache
    stages = [x for x in r["log"].splitlines() if x.startswith("stage wall times")]
    print(f"paper-shaped rehearsal ({mode} features) on two nodes over s3: {r['seconds']:.0f}s, units "
          f"{units}, "
          f"{stages}")


def _rehearse(c: Cluster, s3, verifier: Path, run: str, mode: str) -> dict:
    """The paper grid at ``s3://BUCKET/run`` in one driver process; returns its log, seconds and manifest."""
    endpoint, s3fs = s3
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
    env.update(RAY_ADDRESS=c.address, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               TASKSPEC_STAGING=str(c.tmp / f"driver-{run}"), AWS_ENDPOINT_URL_S3=endpoint,
               AWS_DEFAULT_REGION=REGION, **NODE_ENV)
    cmd = _command(verifier, mode, f"s3://{BUCKET}/{run}")
    t, log_path = time.time(), c.tmp / f"{run}.log"
    with open(log_path, "w") as out:  # a file, to follow a long run while it goes
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                           timeout=3600)
    seconds, log = time.time() - t, log_path.read_text()
    assert r.returncode == 0, log[-6000:]
    local = c.tmp / f"manifest-{run}"
    local.mkdir()
    fs.copy_files(f"{BUCKET}/{run}/manifest.json", str(local / "manifest.json"), source_filesystem=s3fs,
                  destination_filesystem=fs.LocalFileSystem())
    return {"log": log, "seconds": seconds, "manifest": read_manifest(local / "manifest.json"), "run": run,
            "mode": mode}


def _files(s3fs, run: str) -> set:
    sel = fs.FileSelector(f"{BUCKET}/{run}", recursive=True)
    return {i.path[len(f"{BUCKET}/{run}/"):] for i in s3fs.get_file_info(sel) if i.type == fs.FileType.File}


def _check(s3fs, r: dict) -> dict:
    """0 failed units, every stage's units done, the report at the URI, every trained drafter from
    two ranks holding the same weights, ZeRO-2; returns units per stage."""
    cells = r["manifest"]["cells"]
    status = {}
    for c in cells.values():
        status.setdefault(c["stage"], {}).setdefault(c["status"], 0)
        status[c["stage"]][c["status"]] += 1
    assert all(set(s) == {"done"} for s in status.values()), status
    assert {"train", "merge", "eval"} <= set(status), status
    assert status["train"]["done"] == 12, status  # 3 backbones x 4 variants
    rel = _files(s3fs, r["run"])
    assert "report/report.md" in rel, sorted(rel)[:40]
    finals = sorted(p[: -len("/state.json")] for p in rel if p.endswith("final/state.json"))
    assert len(finals) == 12 and any("eagle3" in f for f in finals), finals
    for final in finals:
        with s3fs.open_input_stream(f"{BUCKET}/{r['run']}/{final}/state.json") as f:
            state = json.loads(f.read())
        ranks, cfg = state["ranks"], state["config"]
        assert len(ranks) == 2 and ranks[0] == ranks[1] and ranks[0]["micro_batches"] >= 1, (final, ranks)
        assert (cfg["deepspeed"], cfg["zero_stage"], cfg["precision"]) == (True, 2, "bf16"), (final, cfg)
        assert (cfg["online_spec"] is not None) == (r["mode"] == "online"), (final, cfg["online_spec"])
    assert "eval 4 actors x 0.5 CPU = 2/2 CPUs" in r["log"], r["log"][:3000]  # packed: 2 actors a node
    return {stage: sum(s.values()) for stage, s in status.items()}

