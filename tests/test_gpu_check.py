"""experiments/gpu_check.py stays runnable: its exactness and speed checks on the CPU (the GPU run
is done by hand on a GPU machine; its output goes in the README)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_the_cpu(verifier, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "experiments/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--device", "cpu", "--dtypes", "float32,bfloat16", "--n-prompts", "1", "--max-new-tokens", "8",
                   "--no-train"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for s in mod.STRATEGIES:
        assert out.count(f"\n{s} ") == 2, out  # one row per dtype
    assert "OK: 0 mismatch(es)" in out
