"""The smoke grid end to end on a local Ray, in two grid runs (and reruns) on one output:

1. ``readme_run``: the README's job-submit block, verbatim, with token authentication on (a fresh
   head on 127.0.0.1:6379/8265, an isolated HOME): the whole smoke profile through `ray job
   submit`, the head's metrics endpoint scraped during the run and one eval worker SIGKILLed
   mid-stage. Its traces (no row lost or duplicated), report, lossless T=0 outputs, draft
   vocabulary, tree auto cells and metrics are checked; a rerun on the same output skips every
   unit, the stage rates it recorded time it back, and (make test-full) a driver on a new machine
   resumes it at a file:// URI.
2. ``forced_run``: on that output, ``--force train`` run directly (the driver starts its own local
   Ray, as `make smoke` does) with MLflow tracking, one trial and 2 eval cells: it retrains (not a restore
   of the finished Tune sweep), the MLflow store has the curves and the summary, and the console
   stays short.

The tests run in file order (the checks of 1 before 2 rewrites the output). What moves through an
object-store URI, with a staging dir per node, and eval.paired_baseline are
tests/test_multinode.py's part. Every Ray process started here is found by its environment (an
isolated HOME or TMPDIR) and ended by its pid, never by a broad name, so a Ray cluster of
someone else's on the machine is left alone."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import psutil
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
GRID = [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke"]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# the forced run retrains the math drafter (one trial; the chat drafter of run 1 stays) and
# evaluates 2 cells (autoregressive and single math, GSM8K, T=0): what it proves is the retraining
# and what the driver writes around it (MLflow, the console, its summary of tau and speed); run 1
# evaluates every strategy
FORCED = ["train.variants=[math]", "merge.kinds=[]", "eval.temperatures=[0.0]", "eval.tree_auto=[]",
          "eval.benchmarks={gsm8k: 1}", "eval.strategies=[autoregressive, single]"]


def _eval_units(run: Path) -> dict:
    from orchestrator.manifest import read_manifest

    cells = read_manifest(run / "manifest.json")["cells"]  # mid-run too: manifest.json and its journal
    return {k: c for k, c in cells.items() if c["stage"] == "eval"}


def _check_traces(run: Path, overrides: list[str] = ()):
    from orchestrator.grid import eval_cells
    from orchestrator.plan.sizing import load_profile

    p = load_profile("smoke", list(overrides))
    units = _eval_units(run)
    assert len(units) == len(eval_cells(p)) and all(u["status"] == "done" for u in units.values())
    prompts = pl.scan_parquet(str(run / "traces/prompts/**/*.parquet"), hive_partitioning=True).collect()
    steps = pl.scan_parquet(str(run / "traces/steps/**/*.parquet"), hive_partitioning=True).collect()
    expected_rows = sum(u["rows"] for u in units.values())
    assert prompts.height == expected_rows  # no lost rows
    assert prompts.select("unit_key", "prompt_id", "turn").n_unique() == prompts.height  # no duplicated rows
    assert steps.height == int(prompts["verifier_calls"].sum())
    assert {"backbone", "benchmark", "temperature", "strategy", "acceptance_length",
            "routing_choice"} <= set(prompts.columns)
    return prompts


def _procs_with_env(key: str, value: str) -> list[psutil.Process]:
    """This user's processes started with ``key=value`` in their environment (children inherit it)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(key) == value:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def _end(procs: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL what is left after 20 s: these processes only, by pid."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    for p in psutil.wait_procs(procs, timeout=20)[1]:
        try:
            p.kill()
        except psutil.Error:
            pass


def _private_tmp() -> str:
    """A short TMPDIR of its own for one Ray instance (Ray keeps its sockets and its address file
    under it, so a later ray.init() never finds this instance, nor this one another's)."""
    return tempfile.mkdtemp(prefix="tsg-", dir="/tmp" if os.path.isdir("/tmp") else None)


def _readme_job_block() -> str:
    """The README's job-submit commands, exactly as a user would paste them."""
    text = (ROOT / "README.md").read_text()
    after = text.split("<!-- job-submit:", 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """The README's commands, verbatim, with token authentication on (an isolated HOME, so
    ~/.ray/auth_token is created by them); then a request without the token. The head is stopped
    before any other test starts a Ray of its own. Yields the output (runs/smoke-job) and what was seen."""
    tmp = tmp_path_factory.mktemp("readme-job")
    ray_bin = str(Path(sys.executable).parent / "ray")
    home = tmp / "home"
    home.mkdir()
    ray_tmp = _private_tmp()
    from common.caches import cache_dir
    from drafters.train.runners import jit_build_dir

    # no RAY_* setting of ours reaches the commands (RAY_DASHBOARD_STARTUP_TIMEOUT_S excepted: a
    # loaded machine may need a longer wait); the machine's caches (matmul tuning, verify costs,
    # the verifier's de-quantized copy: common/caches.py; DeepSpeed's JIT-built ops) stay the
    # machine's, so the isolated HOME does not redo them
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")
           or k == "RAY_DASHBOARD_STARTUP_TIMEOUT_S"}
    ops = os.environ.get("TORCH_EXTENSIONS_DIR") or str(jit_build_dir())  # this environment's, as in-process
    env.update(HOME=str(home), TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0", TASKSPEC_CACHE=str(cache_dir()),
               TORCH_EXTENSIONS_DIR=ops, PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    for port in (6379, 8265):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1",
                                 port)) != 0, f"port {port} is busy: the README's commands need it"
    out = ROOT / "runs" / "smoke-job"
    shutil.rmtree(out, ignore_errors=True)
    block = _readme_job_block()
    assert "RAY_AUTH_MODE=token" in block and "ray job submit" in block
    t = time.time()
    try:
        r, seen, killed, listening = _watch(["bash", "-euo", "pipefail", "-c", block], env, ray_tmp, out, tmp)
        assert r.returncode == 0 and "succeeded" in r.stdout.lower(), r.stdout[-3000:] + r.stderr[-3000:]
        # without the token the head refuses: authentication really is enforced
        refused = subprocess.run([ray_bin, "job", "list", "--address", "http://127.0.0.1:8265"],
                                 capture_output=True,
                                 text=True, timeout=120, env={**env, "HOME": str(tmp)})
    finally:
        _end(_procs_with_env("HOME", str(home)))  # the head and everything it started
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(f"README job (smoke grid through ray job submit, an eval worker SIGKILLed): {time.time() - t:.0f}s")
    yield SimpleNamespace(run=out, home=home, refused=refused, metrics=seen, killed=killed, stdout=r.stdout,
                          listening=listening)
    shutil.rmtree(out, ignore_errors=True)


def _watch(cmd: list[str], env: dict, ray_tmp: str, run: Path, tmp: Path):
    """Run the grid, scraping the head's Prometheus endpoint every 3 s and SIGKILLing one eval
    worker once 3 eval units are done. Returns (completed process, metric samples seen, killed pid,
    {port: addresses} the head's processes listened on once the eval stage ran)."""
    out, err = tmp / "stdout.txt", tmp / "stderr.txt"
    seen, killed, port, t, last_scrape, listening = set(), None, None, time.time(), 0.0, {}
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fo, stderr=fe, text=True, env=env)
        while proc.poll() is None and time.time() - t < 2400:
            if time.time() - last_scrape > 3:
                port = port or _metrics_port(ray_tmp)
                seen |= _scrape(port) if port else set()
                last_scrape = time.time()
            if killed is None:
                units = _eval_units(run) if (run / "manifest.json").is_file() else {}
                if sum(u["status"] == "done"
                       for u in units.values()) >= 3 and (victim := _eval_worker(ray_tmp)):
                    listening = _listening(_procs_with_env("TMPDIR", ray_tmp))
                    killed = victim.pid
                    victim.kill()
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    return subprocess.CompletedProcess(cmd, rc, out.read_text(), err.read_text()), seen, killed, listening


def _listening(procs: list[psutil.Process]) -> dict[int, set[str]]:
    """{port: local addresses} of the TCP sockets these processes listen on."""
    out: dict[int, set[str]] = {}
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.setdefault(c.laddr.port, set()).add(c.laddr.ip)
        except psutil.Error:
            pass
    return out


def test_readme_job_block_runs_the_smoke_grid_with_token_auth(readme_run):
    assert (readme_run.home / ".ray" / "auth_token").is_file()  # authentication was on
    bad = readme_run.refused
    assert bad.returncode != 0 and "token" in (bad.stdout + bad.stderr).lower()
    assert (readme_run.run / "report" / "report.md").is_file()
    _check_traces(readme_run.run)


def test_smoke_grid_writes_traces_and_report(readme_run):
    run = readme_run.run
    prompts = _check_traces(run)
    assert set(prompts["temperature"]) == {0.0, 1.0}
    ar = prompts.filter(pl.col("strategy") == "autoregressive")
    assert (ar["acceptance_length"] == 1.0).all()
    # lossless at T=0: every strategy's output equals the autoregressive baseline's, prompt by prompt
    t0 = prompts.filter(pl.col("temperature") == 0.0).select("benchmark", "prompt_id", "turn", "strategy",
                                                             "drafter", "output_token_ids")
    base = t0.filter(pl.col("strategy") == "autoregressive").select("benchmark", "prompt_id", "turn",
                                                                    pl.col("output_token_ids").alias("ref"))
    joined = t0.join(base, on=["benchmark", "prompt_id", "turn"])
    assert joined.height == t0.height and (joined["output_token_ids"] == joined["ref"]).all()
    assert (run / "report/report.md").is_file() and list((run / "checkpoints").glob(
            "*/final/model.safetensors"))
    # one draft vocabulary for the run: every trained drafter and every merge carries the same map
    from drafters.checkpoint import load_checkpoint

    ckpts = list(run.glob("checkpoints/*/final")) + [p for p in run.glob("checkpoints/*avg*")]
    maps = [load_checkpoint(c).draft_ids() for c in ckpts]
    assert len(ckpts) >= 3 and all(m is not None and m.shape == (1024,) and (m == maps[0]).all()
                                   for m in maps)
    # tree auto cells ran beside the fixed ones, with the chosen shape recorded
    auto = prompts.filter(pl.col("tree") == "auto")
    assert auto.height and auto["tree_shape"].null_count() == 0
    # the autoregressive cells timed transformers' generate on the same inputs, with the same T=0 output
    ar0 = prompts.filter((pl.col("strategy") == "autoregressive") & (pl.col("temperature") == 0.0))
    assert (ar0["generate_wall_time_s"] > 0).all() and ar0["generate_matches"].all()


def _nothing_redone(log: str) -> bool:
    """Every unit of every stage was found done: features cached, the rest done earlier."""
    lines = [x for x in log.splitlines() if re.search(r"\[(features|train|merge|eval)\] \d+/\d+ done", x)]
    assert lines, log[-2000:]
    redone = [x for x in lines if "(done earlier)" not in x and "(cached)" not in x]
    assert not redone, redone
    return True


def test_rerun_skips_every_finished_unit(readme_run):
    run = readme_run.run
    before = (run / "manifest.json").read_text()
    ray_tmp = _private_tmp()
    try:
        r = subprocess.run(GRID + ["--output-dir", str(run)], capture_output=True, text=True, timeout=600,
                           env={**ENV, "TMPDIR": ray_tmp})
    finally:
        _end(_procs_with_env("TMPDIR", ray_tmp))  # nothing, unless the driver died before ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Tune sweep" not in r.stdout and _nothing_redone(r.stdout)
    man = json.loads((run / "manifest.json").read_text())
    assert json.loads(before)["cells"].keys() == man["cells"].keys()
    # the eval plan (what the report reads) holds every unit of this configuration, done earlier or not
    assert set(man["plan"]["eval"]) >= set(_eval_units(run))
    _check_traces(run)


def test_the_run_measures_its_stage_rates_and_predicts_its_own_time(readme_run):
    """The driver recorded each stage's wall time (the rerun above, which ran nothing, left them);
    the rates measured from them, the caches and the traces time the same profile back to within
    30% of each stage's real time (overheads are fitted per unit, decode times are not)."""
    from orchestrator.plan import rates
    from orchestrator.plan.billing import as_configured
    from orchestrator.plan.sizing import load_profile

    man = json.loads((readme_run.run / "manifest.json").read_text())
    stages = man["stages"]
    assert {"features", "train", "merge", "eval", "report"} <= set(stages)
    assert all("CPU" in s["machine"] for s in stages.values())
    r = rates.measure(readme_run.run)
    p = load_profile("smoke")
    assert r.measured and r.features_tokens_per_s > 0 and set(r.train_tokens_per_s) == set(p.train.backbones)
    assert r.eval_tau["single"] >= 1.0 and r.eval_steps_per_s["autoregressive"] > 0 and not r.notes
    own = as_configured(p, r)  # the profile's own concurrency on its own machine
    for st in ("train", "eval"):
        assert own["stages"][st] == pytest.approx(stages[st]["seconds"], rel=0.3), (st, own, stages)


@pytest.mark.full  # breadth: the two-node grid resumes at s3:// from a driver with its own staging
def test_a_driver_on_a_new_machine_resumes_a_run_at_a_uri(readme_run, tmp_path):
    """The finished run, copied to a file:// URI (without the epochs, Ray's records and the report:
    resuming needs none of them), and the same command from a
    driver whose staging dir is empty (a new machine): the manifest is read from the URI, every
    unit's files are found there, nothing is trained or evaluated again, and the report is written
    back to the URI. (A URI run's own layout, node by node, is tests/test_multinode.py's.)"""
    remote = tmp_path / "bucket" / "run"
    shutil.copytree(readme_run.run, remote, ignore=shutil.ignore_patterns("epoch-*", "_ray_train",
            "ray_results", "report"))
    uri = f"file://{remote}"
    ray_tmp = _private_tmp()
    try:
        r = subprocess.run(GRID + ["--output-dir", uri], capture_output=True, text=True, timeout=600,
                           env={**ENV, "TMPDIR": ray_tmp, "TASKSPEC_STAGING": str(tmp_path / "new-machine")})
    finally:
        _end(_procs_with_env("TMPDIR", ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Tune sweep" not in r.stdout and _nothing_redone(r.stdout)
    assert (remote / "report" / "report.md").is_file() and list((tmp_path / "new-machine").rglob("report.md"))
    _check_traces(remote)


def _scrape(port: int) -> set[str]:
    """taskspec metric samples (name{labels}) on the local head's Prometheus endpoint, if it is up."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return set()
    return {line.split(" ")[0] for line in text.splitlines() if "taskspec" in line
            and not line.startswith("#")}


def _metrics_port(ray_tmp: str) -> int | None:
    """The port where the head's metrics agent serves Prometheus: `ray start` picks one and
    writes it to the session directory (metrics_export_port_<node id>)."""
    for f in Path(ray_tmp).glob("ray/session_latest/metrics_export_port_*"):
        try:
            return int(f.read_text().strip()) or None
        except (OSError, ValueError):
            pass
    return None


def _eval_worker(ray_tmp: str) -> psutil.Process | None:
    """An eval actor of this run: titled ray::EvalWorker when idle, ray::eval:<cell> while running a cell."""
    for p in _procs_with_env("TMPDIR", ray_tmp):
        try:
            if re.match(r"ray::(EvalWorker|eval:)", " ".join(p.cmdline())):
                return p
        except psutil.Error:
            pass
    return None


@pytest.fixture(scope="module")
def forced_run(readme_run):
    """``--force train`` on run 1's output, run directly (the driver starts its own local Ray, as
    `make smoke` does) with --tracking mlflow and FORCED. The traces of run 1 are removed first,
    so every trace row read afterwards was written here."""
    run = readme_run.run
    shutil.rmtree(run / "traces")
    finals = sorted(run.glob("checkpoints/*-math/final/model.safetensors"))
    before = [f.stat().st_mtime_ns for f in finals]
    ray_tmp = _private_tmp()
    sets = [a for s in FORCED for a in ("--set", s)]
    t = time.time()
    try:
        r = subprocess.run(GRID + ["--output-dir", str(run), "--force", "train", "--tracking", "mlflow",
                                   *sets],
                           capture_output=True, text=True, timeout=1800, env={**ENV, "TMPDIR": ray_tmp})
    finally:
        _end(_procs_with_env("TMPDIR", ray_tmp))  # nothing, unless the driver died before ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(f"forced run (one trial, 2 eval cells): {time.time() - t:.0f}s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield SimpleNamespace(run=run, stdout=r.stdout, stderr=r.stderr,
                          retrained=[f.stat().st_mtime_ns for f in finals] != before)


def test_sigkill_of_an_eval_worker_loses_and_duplicates_nothing(readme_run):
    """An eval worker SIGKILLed mid-stage in the README's job: the driver retries its shard, the
    job succeeds, and no row is lost or duplicated."""
    assert readme_run.killed is not None, "no eval worker process was found to kill"
    assert "FAILED" not in readme_run.stdout.split("[eval]")[0]
    _check_traces(readme_run.run)


def test_the_dashboard_and_job_api_listen_on_loopback_only(readme_run):
    """README: the dashboard (and the job API it serves) binds 127.0.0.1; Ray 2.60's own gRPC
    servers and the metrics agent listen on every interface, guarded by the token (README)."""
    ports = readme_run.listening
    assert ports, "no listening socket of the head was seen"
    assert ports.get(8265) == {"127.0.0.1"}, ports.get(8265)
    print("listening:", {k: sorted(v) for k, v in sorted(ports.items())})


def test_ray_metrics_are_exported_under_the_documented_names(readme_run):
    seen = sorted(readme_run.metrics)
    names = {x.split("{")[0] for x in seen}
    assert {"ray_taskspec_units_done_total", "ray_taskspec_acceptance_length"} <= names, seen
    assert any('stage="eval"' in x for x in seen if x.startswith("ray_taskspec_units_done_total")), seen
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{n}{{" in readme for n in ("ray_taskspec_units_done_total",
                                             "ray_taskspec_acceptance_length"))


@pytest.mark.full  # breadth: make test-full (the forced run costs a second grid run)
def test_force_train_retrains_rather_than_restoring_the_finished_sweep(forced_run):
    assert "Tune sweep" in forced_run.stdout and forced_run.retrained
    _check_traces(forced_run.run, FORCED)


@pytest.mark.full  # breadth: make test-full (the forced run costs a second grid run)
def test_console_output_is_short_and_ends_with_the_summary(forced_run):
    """No per-process loading bars or Tune tables by default: a few hundred lines, summary last."""
    lines, err = forced_run.stdout.splitlines(), forced_run.stderr.splitlines()
    assert len(lines) + len(err) < 150, (f"{len(lines)} + {len(err)} lines of output:\n"
                                         + "\n".join((lines + err)[:80]))
    assert not [x for x in lines + err if "de-quantizing" in x
                or "it/s]" in x], "a progress bar leaked into the output"
    tail = "\n".join(lines[-12:])
    assert "summary:" in tail and "best tau" in tail and lines[-1].startswith("done: results in"), tail


@pytest.mark.full  # breadth: make test-full (the forced run costs a second grid run)
def test_mlflow_store_has_the_training_curves_and_the_summary(forced_run):
    """--tracking mlflow: a real local MLflow file store under the output dir, written through
    Ray Tune's MLflow callback (one run per training cell, one step per epoch) and the summary run."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from orchestrator.grid import train_cells
    from orchestrator.plan.sizing import load_profile

    run = forced_run.run
    p = load_profile("smoke", FORCED)
    client = MlflowClient((run / "mlruns").as_uri())
    exp = client.get_experiment_by_name("taskspec-smoke")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    train = [r for r in runs if r.data.tags.get("taskspec.stage") == "train"]
    assert sorted(r.data.params["cell"] for r in train) == sorted(c.name for c in train_cells(p))
    for r in train:
        assert (r.data.params["train/lr"] == str(p.train.lr)
                and r.data.params["train/backbone"] in p.train.backbones)
        curve = client.get_metric_history(r.info.run_id, "epoch")
        assert [m.value for m in sorted(curve, key=lambda m: m.step)] == [float(e) for e in range(1,
                p.train.epochs + 1)]
        assert "top1_depth1" in r.data.metrics and "train_loss" in r.data.metrics
    (summary,) = [r for r in runs if r.data.tags.get("taskspec.stage") == "summary"]
    assert summary.data.params["eval.max_new_tokens"] == str(p.eval.max_new_tokens)
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    taus = {k: v for k, v in summary.data.metrics.items() if k.startswith("tau.")}
    assert len(taus) == t1.height and all(v > 0 for v in taus.values())
    assert any(k.startswith("speedup.") for k in summary.data.metrics)
    arts = [a.path for a in client.list_artifacts(summary.info.run_id, "report")]
    assert "report/report.md" in arts
