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


def test_the_gpu_check_script_runs_as_shipped_in_its_dry_mode(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "TASKSPEC_DATA_ROOT": str(tmp_path / "no-such-data"),
           "TASKSPEC_CACHE": str(tmp_path / "cache")}  # nothing from ../shared, no verifier copy from earlier tests
    out = subprocess.run(["bash", str(ROOT / "experiments/gpu_check.sh"), "--dry", "--workdir", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "installing" not in log  # everything it needs is in this environment: nothing reinstalled
    rows = [line for line in out.stdout.splitlines() if line.startswith("row: ")]
    checks = [re.search(r"check=([\w()-]+(?: \(ZeRO-1\))?)", r).group(1) for r in rows]
    assert checks == ["train (ZeRO-1)", "generate", *STRATEGIES], rows  # each row printed as it completed
    train = rows[0]
    assert "dtype=bfloat16" in train and re.search(r"\b4 steps of batch 4\b", train), train
    loss = float(re.search(r"loss ([\d.]+)", train).group(1))
    assert 0 < loss < 20, train
    for r in rows[2:]:
        assert "equal=2" in r and "MISMATCH=0" in r and "peak mem=" in r, r
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(rows)  # then all of them again as one table
    assert "small (2 layers, hidden 256)" in table[2]
    assert "OK: 0 mismatch(es)" in out.stdout
    assert any(p.name.startswith("small-2l") for p in tmp_path.iterdir())  # the verifier was built here
