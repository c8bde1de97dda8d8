"""The prepared GPU check (experiments/gpu_check.sh) runs as shipped, in its dry mode on the CPU: the
same script and code path as on a GPU (a Llama-3-layout verifier and the data built on the spot, bf16
DeepSpeed training through Ray Train, every strategy against ``generate``), at a small shape. What it
prints on a GPU: docs/gpu-check.md."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("single", "confidence", "entropy", "merged", "merged-dedup", "merged-budget")


@pytest.mark.parametrize("train", [pytest.param(True, marks=pytest.mark.full), False],
                         ids=["with-training", "decoding-only"])
def test_the_gpu_check_script_runs_as_shipped_in_its_dry_mode(tmp_path, train):
    """By default without its training row (Ray Train + DeepSpeed bf16 training, which the two-node run
    and the README job cover); make test-full runs the script whole."""
    env = {**os.environ, "PYTHON": sys.executable, "TASKSPEC_DATA_ROOT": str(tmp_path / "no-such-data"),
           "TASKSPEC_CACHE": str(tmp_path / "cache")}  # nothing from ../shared, no verifier copy from earlier tests
    cmd = ["bash", str(ROOT / "experiments/gpu_check.sh"), "--dry", "--workdir", str(tmp_path)]
    out = subprocess.run(cmd + ([] if train else ["--no-train"]), cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "installing" not in log  # everything it needs is in this environment: nothing reinstalled
    rows = [line for line in out.stdout.splitlines() if line.startswith("row: ")]
    checks = [re.search(r"check=([\w()-]+(?: \(ZeRO-1\))?)", r).group(1) for r in rows]
    assert checks == ["train (ZeRO-1)"] * train + ["generate", *STRATEGIES], rows  # each printed as it completed
    if train:
        assert "dtype=bfloat16" in rows[0] and re.search(r"\b4 steps of batch 4\b", rows[0]), rows[0]
        loss = float(re.search(r"loss ([\d.]+)", rows[0]).group(1))
        assert 0 < loss < 20, rows[0]
    for r in rows[1 + train:]:
        assert "equal=2" in r and "MISMATCH=0" in r and "peak mem=" in r, r
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(rows)  # then all of them again as one table
    assert "small (2 layers, hidden 256)" in table[2]
    assert "OK: 0 mismatch(es)" in out.stdout
    assert any(p.name.startswith("small-2l") for p in tmp_path.iterdir())  # the verifier was built here


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "experiments/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sync_counting_names_the_lines_that_synchronize(monkeypatch):
    """On a GPU the check lists, per step, the source lines behind each count: its own (SyncCounter)
    and CUDA's (the warnings of set_sync_debug_mode, attributed where they are raised). Here CUDA's
    warning is raised by hand at a known line; the counting and attribution are the check's own."""
    gc = _gpu_check_module()
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def run():
        for _ in range(2):
            torch.ones(2).tolist()  # a host tensor: not a device read
            warnings.warn("called a synchronizing CUDA operation")  # what CUDA's debug mode raises
        return 2

    counter, per_step, sites, steps = gc._count_syncs("cuda", run)
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, s in enumerate(lines, 1) if "what CUDA's debug" in s)
    assert steps == 2 and per_step == 1.0 and sites == {f"tests/test_gpu_check.py:{line}": 2}, sites
    assert counter.counts["sync"] == 0
    assert gc._sites(sites, steps) == f"tests/test_gpu_check.py:{line} 1.00"
    assert gc.training_failure([5.0, 4.0]) == "" and "did not fall" in gc.training_failure([4.8, 4.9])
    assert "not finite" in gc.training_failure([float("nan"), 4.0])


def test_a_wheels_folder_without_ray_is_refused_before_anything_runs(tmp_path):
    """GPU_CHECK_WHEELS (a machine without a package index) must hold what experiments/gpu_wheels.sh
    makes; a folder without it is named in one error, before anything is installed or built."""
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WHEELS": str(tmp_path)}
    cmd = ["bash", str(ROOT / "experiments/gpu_check.sh"), "--dry"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"GPU_CHECK_WHEELS={tmp_path} has no ray.tar.xz" in out.stderr and "gpu_wheels.sh" in out.stderr
    assert "row:" not in out.stdout and not any(tmp_path.iterdir())
