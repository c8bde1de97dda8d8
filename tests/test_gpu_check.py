"""experiments/gpu_check.py stays runnable: its exactness and speed checks on the CPU (the GPU run
is done by hand on a GPU machine; its output goes in docs/cluster.md)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_the_cpu(verifier, capsys):
    """float32 only: every row of the script runs (generate and each strategy: exactness against
    generate, tokens/s, tau). bfloat16 on a CPU costs minutes (a second verifier load, a second
    round of matmul tuning, slow bf16 kernels) and adds no code path of the script; bf16 decoding
    on a CPU is tests/test_llama3_shaped.py's."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "experiments/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--device", "cpu", "--dtypes", "float32", "--n-prompts", "1", "--max-new-tokens", "8",
                   "--no-train"])
    out = capsys.readouterr().out
    assert rc == 0, out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + 1 + len(mod.STRATEGIES), out  # one table: header, rule, generate + strategies
    for s in ("generate", *mod.STRATEGIES):
        row = [line for line in table if f" {s} " in line]
        assert len(row) == 1 and " float32 " in row[0], out  # one row each
    assert "OK: 0 mismatch(es)" in out
