"""The prepared GPU check (experiments/gpu_check.sh) runs as shipped, in its dry mode on the CPU: the
same script and code path as on a GPU (a Llama-3-layout verifier and the data built on the spot, bf16
DeepSpeed training through Ray Train, every strategy against ``generate``), at a small shape. What it
prints on a GPU: docs/gpu-check.md."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
