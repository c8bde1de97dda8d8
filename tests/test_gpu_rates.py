"""The GPU rates script (experiments/gpu_rates.sh -> gpu_rates.py) runs as shipped in its CPU mode on
a tiny shape, writes the rates file part by part, and the paper dry run reads it; the file's reader
(orchestrator/plan/rates/gpu.py) refuses what does not stand for the profile; the shell scripts pick the
project's .venv, or name the interpreter before installing into it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plan import rates as rates_mod
from orchestrator.plan.sizing import load_profile
from tests.hub_stub import paper_hub_env

ROOT = Path(__file__).resolve().parents[1]


# the default run times EAGLE-2's training step only: HASS's and EAGLE-3's rows are the same runner
# with another drafter class (both train through it in the default suite: test_faults.py,
# test_eagle3_training.py), and were about 70 of the part's 90 s; make test-full times all three
DEFAULT_BACKBONES = ("eagle2",)
BACKBONES = ("eagle2", "hass", "eagle3")


def _dry(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "TASKSPEC_CACHE": str(tmp / "cache")}
    cmd = ["bash", str(ROOT / "experiments/gpu_rates.sh"), "--dry", "--workdir", str(tmp),
           "--stands-for", "llama3-8b-instruct", "--out", str(tmp / "rates.json"), *extra]
    out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out


@pytest.fixture(scope="module")
def dry_run_file(tmp_path_factory):
    """One run of the script's CPU mode, as shipped but for its training rows (DEFAULT_BACKBONES):
    (its output, the rates file)."""
    tmp = tmp_path_factory.mktemp("gpu-rates")
    out = _dry(tmp, "--backbones", ",".join(DEFAULT_BACKBONES))
    return out.stdout, tmp / "rates.json"


def test_the_cpu_mode_measures_every_part_in_order_and_writes_the_rates_file(dry_run_file):
    stdout, path = dry_run_file
    rows = [line for line in stdout.splitlines() if line.startswith("rate: ")]
    parts = [re.match(r"rate: (\w+):", r).group(1) for r in rows]
    # (c), (b), (a): each row printed as measured, the file rewritten after each part
    data = json.loads(path.read_text())
    feats = data["parts"]["features"]["rows"]
    n_train = 2 * len(DEFAULT_BACKBONES) + 1
    assert parts == ["build", *["eval"] * 4, *["train"] * n_train, *["features"] * (len(feats) + 1)], rows
    assert sum("rewritten" in r for r in rows) == 3
    assert data["kind"] == "gpu-rates" and data["shape"] == "small" and data["full_shape"] is False
    assert data["stands_for"] == "llama3-8b-instruct" and data["commit"] and data["date"] and data["torch"]
    ev = data["parts"]["eval"]
    assert [r["processes"] for r in ev["packing"]] == [1, 2] and ev["tree"] == [4, 4, 16]
    assert all(r["step_s"] > 0 and r["tokens_per_s"] > 0 for r in ev["packing"])
    assert ev["generate_ms_per_token"] > 0
    # the prompts verified B at a time in the one-process row (decoding/batch.py): filled to the largest B,
    # every output the batch-1 output (T=0)
    batched = ev["batched"]["rows"]
    assert [(r["batch"], r["drafts"]) for r in batched] == [(1, "together"), (2, "alone"), (2, "together"),
                                                            (4, "alone"), (4, "together")]
    assert all(r["runs"] == 4 for r in batched)
    assert all(r["tokens_per_s"] > 0 and r["same_as_alone"] == 4 for r in batched), batched
    _check_train_rows(data, DEFAULT_BACKBONES)
    # both kinds of cache, with each host-copy form the extraction code offers (async: drafters/features.py)
    forms = {(k, c) for k in ("hidden", "eagle3") for c in ("sync", "async")}
    assert {(r["kind"], r["copies"]) for r in feats} == forms
    assert all(r["tokens_per_s"] > 0 and r["bytes_per_s"] > 0 for r in feats)
    per_tok = {(r["kind"], r["copies"]): r["bytes_per_s"] / r["tokens_per_s"] for r in feats}
    # the same shards either way; EAGLE-3's cache holds three aux layers beside the hidden state
    assert per_tok["hidden", "sync"] == pytest.approx(per_tok["hidden", "async"])
    assert per_tok["eagle3", "sync"] > 2.5 * per_tok["hidden", "sync"], per_tok
    assert set(data["seconds"]) == {"build", "eval", "train", "features"}


def _check_train_rows(data: dict, backbones: tuple[str, ...]) -> None:
    train = data["parts"]["train"]["rows"]
    assert [(r["backbone"], r["tokens"]) for r in train] == [(b, t) for b in backbones for t in (8, 16)]
    assert all(r["ms_per_step"] > 0 and r["sizing_gib"] > 0 and r["params"] > 0 for r in train)


@pytest.mark.full  # breadth: the same runner's step for HASS and EAGLE-3 (about 70 s)
def test_the_train_part_times_every_backbone(tmp_path):
    out = _dry(tmp_path, "--parts", "train", "--budgets", "train=900")  # all rows: ~4 min on Zen 3
    rows = [line for line in out.stdout.splitlines() if line.startswith("rate: train: ")]
    assert len(rows) == 2 * len(BACKBONES) + 1, rows
    _check_train_rows(json.loads((tmp_path / "rates.json").read_text()), BACKBONES)


def test_the_paper_dry_run_reads_the_file_and_names_it_as_each_rates_source(dry_run_file, tmp_path):
    _, path = dry_run_file
    env = {**os.environ, **paper_hub_env(tmp_path)}
    out = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "paper",
                          "--dry-run", "--cluster", "4x8", "--rates", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    for what in ("features", "train", "eval steps", "generate"):
        line = next(x for x in out.stdout.splitlines() if x.strip().startswith(f"rate of {what}:"))
        assert f"({path})" in line and "measured:" in line, line
    assert "rate of eval tau: assumed" in out.stdout
    train = next(x for x in out.stdout.splitlines() if x.strip().startswith("rate of train:"))
    assert all(f"{b} assumed" in train for b in BACKBONES if b not in DEFAULT_BACKBONES), train  # not timed
    assert "not the full shape of llama3-8b-instruct" in out.stdout  # a tiny shape stays an estimate
    assert "ESTIMATE, not measured" in out.stdout


def _file(**parts) -> dict:
    return {"kind": "gpu-rates", "format": 1, "date": "2026-12-06 00:00 UTC", "commit": "abc",
            "device": "NVIDIA H100",
            "shape": "llama3-8b", "full_shape": True, "stands_for": "llama3-8b-instruct",
            "verifier_dtype": "bfloat16", "parts": parts}


def test_the_reader_turns_rows_into_rates_and_keeps_what_it_did_not_measure_assumed(tmp_path):
    p = load_profile("paper")
    est = rates_mod.estimated(p)
    train = {"rows": [{"backbone": "eagle2", "tokens": 350, "ms_per_step": 35.0},
                      {"backbone": "eagle2", "tokens": 900, "ms_per_step": 90.0}]}
    ev = {"strategy": "single", "tree": [10, 6, 60], "generate_ms_per_token": 25.0,
          "packing": [{"processes": 1, "step_s": 0.060}, {"processes": 2, "step_s": 0.075}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_file(train=train, eval=ev)))
    r = rates_mod.load(path, p)
    assert r.measured and r.train_tokens_per_s["eagle2"] == pytest.approx(1250 / 0.125)
    assert r.train_tokens_per_s["hass"] == est.train_tokens_per_s["hass"]  # not measured: the assumption
    assert "hass assumed" in r.sources["train"]
    assert r.eval_steps_per_s == {"*": pytest.approx(1 / 0.060)}
    assert r.generate_tokens_per_s == pytest.approx(40)
    assert r.features_tokens_per_s == est.features_tokens_per_s and r.eval_tau == est.eval_tau
    assert any("features: not in the file" in n for n in r.notes)
    assert 0 < r.packing["t_dev_s"] < 0.060


@pytest.mark.parametrize("change, message", [
    ({"stands_for": "smollm2-135m-instruct"}, "standing for 'smollm2-135m-instruct'"),
    ({"parts": {}}, "no part was measured"),
])
def test_the_reader_refuses_a_file_that_does_not_stand_for_the_profile(tmp_path, change, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_file(eval={"packing": [{"processes": 1, "step_s": 0.05}]}) | change))
    with pytest.raises(ValueError, match=message):
        rates_mod.load(path, load_profile("paper"))


def _env_setup(cwd: Path, python: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "GPU_CHECK_WHEELS")}
    if python:
        env["PYTHON"] = python
    code = f"source {ROOT}/experiments/gpu_env.sh; gpu_env_setup dry; echo \"PY=$PY\""
    return subprocess.run(["bash", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_scripts_use_the_projects_venv_or_name_the_interpreter_first(tmp_path):
    venv = tmp_path / "with-venv" / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (venv / "python").chmod(0o755)
    out = _env_setup(tmp_path / "with-venv", None)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "PY=.venv/bin/python", out
    assert "[gpu]" not in out.stdout  # nothing to say: the project's own environment
    out = _env_setup(tmp_path / "with-venv", sys.executable)  # PYTHON wins
    assert out.stdout.strip().splitlines()[-1] == f"PY={sys.executable}", out
    (tmp_path / "bare").mkdir()
    out = _env_setup(tmp_path / "bare", None)
    assert "no .venv here and PYTHON unset: using" in out.stdout, out  # named before any install
    first = out.stdout.splitlines()[0]
    assert "python3" in first and "(Python 3." in first, first


def test_a_measured_batch_gain_shortens_eval_and_an_unmeasured_one_is_planned_at_batch_1(tmp_path):
    """resources.eval.verify_batch in the plan: the rates file's batched rows (one process, B prompts a pass,
    tokens/s over its batch 1) divide a shard's decoding time by the gain of the largest measured B that the
    shard fills (rows drafting together; those drafting one by one are for attribution); device work per
    prompt step is the bytes model's (every weight once for B prompts); no measured
    B, or verify_batch 1, leaves the plan as it was; each extra prompt adds a KV cache to an actor's
    memory."""
    from orchestrator.plan import packing
    from orchestrator.plan.costs import VERIFIERS

    ev = {"strategy": "single", "tree": [10, 6, 60], "generate_ms_per_token": 25.0,
          "packing": [{"processes": 1, "step_s": 0.060}, {"processes": 2, "step_s": 0.075}],
          "batched": {"rows": [{"batch": b, "drafts": d, "tokens_per_s": t}
                               for b, d, t in ((1, "together", 10.0), (2, "alone", 12.0),
                                               (2, "together", 15.0), (4, "alone", 14.0),
                                               (4, "together", 20.0))]}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_file(eval=ev)))
    one, four = load_profile("paper"), load_profile("paper", ["resources.eval.verify_batch=4"])
    r = rates_mod.load(path, four)
    assert r.eval_batch_gain == {"2": 1.5, "4": 2.0} and "B = 2, 4" in r.sources["eval batching"]
    assert rates_mod.eval_batching(four, r, 100) == (2.0, 0.25)  # every weight read once for the 4 rows
    v = VERIFIERS[four.verifier]
    assert rates_mod.eval_batching(four, r, 3)[0] == 1.5  # a shard of 3 prompts fills B = 2's measurement
    assert rates_mod.eval_batching(four, r, 1) == rates_mod.eval_batching(one, r, 100) == (1.0, 1.0)
    assert rates_mod.eval_batching(four, rates_mod.estimated(four), 100) == (1.0, 1.0)  # none measured
    t1 = {t.name: t for t in rates_mod.tasks(one, r) if t.stage == "eval"}
    t4 = {t.name: t for t in rates_mod.tasks(four, r) if t.stage == "eval"}
    assert t1.keys() == t4.keys()
    assert all(t4[n].seconds < t1[n].seconds for n in t1 if ":0" in n and "autoregressive" not in n)
    assert sum(t.seconds for t in t4.values()) < 0.75 * sum(t.seconds for t in t1.values())
    kv = packing.kv_row_gb(v, 2)
    assert packing.actor_memory_gb(v, 2, 4.0, 4) == pytest.approx(packing.actor_memory_gb(v, 2, 4.0) + 3 * kv)
    assert 0.5 < kv < 0.6  # Llama-3-8B, bf16, 4,096 tokens: 32 layers x 2 x 8 kv heads x 128 x 2 bytes
