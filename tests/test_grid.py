"""The smoke grid end to end on a local Ray: traces, resume, SIGKILL of an eval worker, and
`ray job submit` against a local head (dashboard on 127.0.0.1)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
GRID = [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke"]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _eval_units(run: Path) -> dict:
    cells = json.loads((run / "manifest.json").read_text())["cells"]
    return {k: c for k, c in cells.items() if c["stage"] == "eval"}


def _check_traces(run: Path, overrides: list[str] = ()):
    from orchestrator.grid import eval_cells
    from orchestrator.profile import load_profile

    p = load_profile("smoke", list(overrides))
    units = _eval_units(run)
    assert len(units) == len(eval_cells(p)) and all(u["status"] == "done" for u in units.values())
    prompts = pl.scan_parquet(str(run / "traces/prompts/**/*.parquet"), hive_partitioning=True).collect()
    steps = pl.scan_parquet(str(run / "traces/steps/**/*.parquet"), hive_partitioning=True).collect()
    expected_rows = sum(u["rows"] for u in units.values())
    assert prompts.height == expected_rows  # no lost rows
    assert prompts.select("unit_key", "prompt_id", "turn").n_unique() == prompts.height  # no duplicated rows
    assert steps.height == int(prompts["verifier_calls"].sum())
    assert {"backbone", "benchmark", "temperature", "strategy", "acceptance_length", "routing_choice"} <= set(prompts.columns)
    return prompts


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("smoke")
    t = time.time()
    with socket.socket() as s:  # a free port for the head's Prometheus endpoint, scraped while the grid runs
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, err = run.parent / f"{run.name}-stdout.txt", run.parent / f"{run.name}-stderr.txt"
    seen = set()
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(GRID + ["--output-dir", str(run), "--tracking", "mlflow"], stdout=fo, stderr=fe,
                                text=True, env={**ENV, "TASKSPEC_METRICS_PORT": str(port)})
        while proc.poll() is None and time.time() - t < 900:
            seen |= _scrape(port)
            time.sleep(3)
        if proc.poll() is None:
            proc.kill()
    assert proc.wait() == 0, out.read_text()[-3000:] + err.read_text()[-3000:]
    print(f"smoke grid wall time {time.time() - t:.0f}s")
    (run.parent / f"{run.name}-metrics.txt").write_text("\n".join(sorted(seen)))
    return run


def _scrape(port: int) -> set[str]:
    """taskspec metric samples (name{labels}) on the local head's Prometheus endpoint, if it is up."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return set()
    return {line.split(" ")[0] for line in text.splitlines() if "taskspec" in line and not line.startswith("#")}


def test_ray_metrics_are_exported_under_the_documented_names(smoke_run):
    seen = (smoke_run.parent / f"{smoke_run.name}-metrics.txt").read_text().splitlines()
    names = {x.split("{")[0] for x in seen}
    assert {"ray_taskspec_units_done_total", "ray_taskspec_acceptance_length"} <= names, seen
    assert any('stage="eval"' in x for x in seen if x.startswith("ray_taskspec_units_done_total")), seen
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{n}{{" in readme for n in ("ray_taskspec_units_done_total", "ray_taskspec_acceptance_length"))


def test_console_output_is_short_and_ends_with_the_summary(smoke_run):
    """No per-process loading bars or Tune tables by default: a few hundred lines, summary last."""
    lines = (smoke_run.parent / f"{smoke_run.name}-stdout.txt").read_text().splitlines()
    err = (smoke_run.parent / f"{smoke_run.name}-stderr.txt").read_text().splitlines()
    assert len(lines) + len(err) < 150, f"{len(lines)} + {len(err)} lines of output:\n" + "\n".join((lines + err)[:80])
    assert not [x for x in lines + err if "de-quantizing" in x or "it/s]" in x], "a progress bar leaked into the output"
    tail = "\n".join(lines[-12:])
    assert "summary:" in tail and "best tau" in tail and lines[-1].startswith("done: results in"), tail


def test_mlflow_store_has_the_training_curves_and_the_summary(smoke_run):
    """--tracking mlflow: a real local MLflow file store under the output dir, written through
    Ray Tune's MLflow callback (one run per training cell, one step per epoch) and the summary run."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from orchestrator.grid import train_cells
    from orchestrator.profile import load_profile

    p = load_profile("smoke")
    client = MlflowClient((smoke_run / "mlruns").as_uri())
    exp = client.get_experiment_by_name("taskspec-smoke")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    train = [r for r in runs if r.data.tags.get("taskspec.stage") == "train"]
    assert sorted(r.data.params["cell"] for r in train) == sorted(c.name for c in train_cells(p))
    for r in train:
        assert r.data.params["train/lr"] == str(p.train.lr) and r.data.params["train/backbone"] in p.train.backbones
        curve = client.get_metric_history(r.info.run_id, "epoch")
        assert [m.value for m in sorted(curve, key=lambda m: m.step)] == [float(e) for e in range(1, p.train.epochs + 1)]
        assert "top1_depth1" in r.data.metrics and "train_loss" in r.data.metrics
    (summary,) = [r for r in runs if r.data.tags.get("taskspec.stage") == "summary"]
    assert summary.data.params["eval.max_new_tokens"] == str(p.eval.max_new_tokens)
    t1 = pl.read_parquet(smoke_run / "report/tables/table1_acceptance.parquet")
    taus = {k: v for k, v in summary.data.metrics.items() if k.startswith("tau.")}
    assert len(taus) == t1.height and all(v > 0 for v in taus.values())
    assert any(k.startswith("speedup.") for k in summary.data.metrics)
    arts = [a.path for a in client.list_artifacts(summary.info.run_id, "report")]
    assert "report/report.md" in arts


def test_smoke_grid_writes_traces_and_report(smoke_run):
    prompts = _check_traces(smoke_run)
    ar = prompts.filter(pl.col("strategy") == "autoregressive")
    assert (ar["acceptance_length"] == 1.0).all()
    # lossless at T=0: every strategy's output equals the autoregressive baseline's, prompt by prompt
    t0 = prompts.filter(pl.col("temperature") == 0.0).select("benchmark", "prompt_id", "turn", "strategy", "drafter", "output_token_ids")
    base = t0.filter(pl.col("strategy") == "autoregressive").select("benchmark", "prompt_id", "turn", pl.col("output_token_ids").alias("ref"))
    joined = t0.join(base, on=["benchmark", "prompt_id", "turn"])
    assert joined.height == t0.height and (joined["output_token_ids"] == joined["ref"]).all()
    assert (smoke_run / "report/report.md").is_file() and list((smoke_run / "checkpoints").glob("*/final/model.safetensors"))
    # one draft vocabulary for the run: every trained drafter and every merge carries the same map
    from drafters.checkpoint import load_checkpoint

    ckpts = list(smoke_run.glob("checkpoints/*/final")) + [p for p in smoke_run.glob("checkpoints/*avg*")]
    maps = [load_checkpoint(c).draft_ids() for c in ckpts]
    assert len(ckpts) >= 3 and all(m is not None and m.shape == (1024,) and (m == maps[0]).all() for m in maps)
    # tree auto cells ran beside the fixed ones, with the chosen shape recorded
    auto = prompts.filter(pl.col("tree") == "auto")
    assert auto.height and auto["tree_shape"].null_count() == 0
    # the autoregressive cells timed transformers' generate on the same inputs, with the same T=0 output
    ar0 = prompts.filter((pl.col("strategy") == "autoregressive") & (pl.col("temperature") == 0.0))
    assert (ar0["generate_wall_time_s"] > 0).all() and ar0["generate_matches"].all()


def test_rerun_skips_every_finished_unit(smoke_run):
    before = (smoke_run / "manifest.json").read_text()
    r = subprocess.run(GRID + ["--output-dir", str(smoke_run)], capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(done earlier)" in r.stdout and "Tune sweep" not in r.stdout
    assert json.loads(before)["cells"].keys() == json.loads((smoke_run / "manifest.json").read_text())["cells"].keys()
    _check_traces(smoke_run)


def test_force_train_then_sigkill_of_an_eval_worker_loses_and_duplicates_nothing(smoke_run):
    """--force train retrains (not a restore of the finished Tune sweep), then an eval worker is
    SIGKILLed mid-stage: the driver retries its shard and no row is lost or duplicated."""
    finals = sorted(smoke_run.glob("checkpoints/*-math/final/model.safetensors"))
    before = [f.stat().st_mtime_ns for f in finals]
    proc = subprocess.Popen(GRID + ["--output-dir", str(smoke_run), "--force", "train"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)
    killed = None
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        units = _eval_units(smoke_run) if (smoke_run / "manifest.json").is_file() else {}
        done = sum(u["status"] == "done" for u in units.values())
        if killed is None and done >= 3:
            # an idle actor is titled ray::EvalWorker; one running a cell carries the task's name, ray::eval:<cell>
            out = subprocess.run(["pgrep", "-f", "^ray::(EvalWorker|eval:)"], capture_output=True,
                                 text=True).stdout.split()
            if out:
                killed = int(out[0])
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.5)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-3000:]
    assert killed is not None, "no eval worker process was found to kill"
    assert "Tune sweep" in log and "FAILED" not in log.split("[eval]")[0]
    assert [f.stat().st_mtime_ns for f in finals] != before  # trained again
    _check_traces(smoke_run)


def _readme_job_block() -> str:
    """The README's job-submit commands, exactly as a user would paste them."""
    text = (ROOT / "README.md").read_text()
    after = text.split("<!-- job-submit:", 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def test_ray_job_submit_runs_the_grid_through_a_uri(tmp_path):
    """First the README's own commands, verbatim, with token authentication on (an isolated HOME,
    so ~/.ray/auth_token is created by them). Then, on the same head, the output is a file:// URI
    and the driver keeps its files apart from the workers' (TASKSPEC_STAGING differs), as on a
    multi-node cluster: every feature cache, checkpoint and trace must travel through the URI. A
    second submission from a driver with an empty staging dir (a new machine) resumes everything."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
               TASKSPEC_STAGING=str(tmp_path / "worker-node"))
    for port in (6379, 8265):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is busy: the README's commands need it"
    readme_run = ROOT / "runs" / "smoke-job"
    shutil.rmtree(readme_run, ignore_errors=True)
    block = _readme_job_block()
    assert "RAY_AUTH_MODE=token" in block and "ray job submit" in block
    run = tmp_path / "bucket" / "run"
    auth_env = {**env, "RAY_AUTH_MODE": "token"}
    # the URI runs keep every stage (features, both drafters, the merge) but evaluate only GSM8K at T=0
    # with single and merged trees: what travels through the URI is the same, at a third of the cells.
    # Every cell times generate next to its own prompt (eval.paired_baseline) and is divided by it.
    small = ["eval.temperatures=[0.0]", "eval.strategies=[single, merged]", "eval.tree_auto=[]",
             "eval.benchmarks={gsm8k: 1}", "eval.paired_baseline=true"]

    def submit(driver_staging: str) -> str:
        sets = [a for s in small for a in ("--set", s)]
        r = subprocess.run([ray_bin, "job", "submit", "--address", "http://127.0.0.1:8265", "--",
                            "env", f"TASKSPEC_STAGING={tmp_path / driver_staging}", sys.executable,
                            str(ROOT / "experiments/full_grid.py"), "--profile", "smoke", "--output-dir", f"file://{run}",
                            *sets],
                           capture_output=True, text=True, timeout=900, env=auth_env)
        assert r.returncode == 0 and "succeeded" in r.stdout.lower(), r.stdout[-3000:] + r.stderr[-2000:]
        return r.stdout

    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, capture_output=True, text=True,
                           timeout=900, env=env)
        assert r.returncode == 0 and "succeeded" in r.stdout.lower(), r.stdout[-3000:] + r.stderr[-3000:]
        assert (home / ".ray" / "auth_token").is_file()  # authentication was on
        assert (readme_run / "report" / "report.md").is_file()
        _check_traces(readme_run)
        # without the token the head refuses: authentication really is enforced
        bad = subprocess.run([ray_bin, "job", "list", "--address", "http://127.0.0.1:8265"], capture_output=True,
                             text=True, timeout=120, env={**env, "HOME": str(tmp_path)})
        assert bad.returncode != 0 and "token" in (bad.stdout + bad.stderr).lower()
        submit("driver-a")
        prompts = _check_traces(run, small)
        assert (prompts["generate_wall_time_s"] > 0).all() and prompts["generate_matches"].all()  # T=0: lossless
        speed = pl.read_parquet(run / "report/tables/speed.parquet").filter(pl.col("method") != "generate (transformers)")
        assert speed["paired_baseline"].all() and (speed["outputs_equal_generate"] == 1.0).all()
        assert list(run.glob("checkpoints/*-math/final/model.safetensors")) and (run / "report/report.md").is_file()
        assert list(run.glob("checkpoints/*-math/epoch-1/state.json"))  # epochs published by the Train workers
        own = [p.relative_to(tmp_path / "driver-a") for p in (tmp_path / "driver-a" / "driver").rglob("*") if p.is_file()]
        assert own and not [p for p in own if "final" in p.parts or "features" in p.parts]  # nothing a worker wrote
        assert list((tmp_path / "driver-a" / "cache").rglob("final/model.safetensors"))  # fetched for the merges
        assert list((tmp_path / "worker-node" / "cache").rglob("epoch-1/model.safetensors"))
        log = submit("driver-b")
        assert "(done earlier)" in log and "Tune sweep" not in log
        assert list((tmp_path / "driver-b").rglob("report.md"))
        _check_traces(run, small)
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120, env=auth_env)
        shutil.rmtree(readme_run, ignore_errors=True)
