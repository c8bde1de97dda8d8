"""The machine record the CPU benches print (decoding/cpu/machine.py), and the kernel's fallback
builds: for a CPU without AVX2/AVX-512 (the x86-64 baseline) and with no compiler at all."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoding.cpu import kernel as cpu_kernel
from decoding.cpu import machine
from decoding.cpu import matmul as cpu_matmul

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_matmul, "CACHE", tmp_path / "cpu_matmul.json")
    monkeypatch.setattr(cpu_matmul, "_SESSION", {})
    monkeypatch.setattr(cpu_kernel, "_STATE", {})
    monkeypatch.setattr(cpu_matmul, "COLD_BYTES", 2**20)
    return tmp_path


def test_isa_classes():
    assert machine.isa_class({"avx2", "avx512f", "amx_tile"}) == "x86 AVX-512 + AMX"
    assert machine.isa_class({"avx2", "avx512f"}) == "x86 AVX-512"
    assert machine.isa_class({"avx2", "fma"}) == "x86 AVX2"


def test_record_names_the_machine_and_measures_the_bound():
    ws = [torch.randn(256, 512) for _ in range(4)]
    rec = machine.record(ws)
    assert rec["cpu"] and rec["threads"] == torch.get_num_threads() and rec["class"]
    assert rec["weights_mb"] == pytest.approx(4 * 256 * 512 * 4 / 1e6)
    assert rec["sum_ms"] > 0 and rec["bandwidth_gbs"] > 0
    text = machine.describe(rec)
    assert text.startswith("machine: ") and "plain sum" in text.splitlines()[1]
    assert "thin-GEMM kernel" in text


def test_forms_summary_reads_the_installed_tables(fresh_kernel):
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 64))
    tables = cpu_matmul.install(model)
    line = machine.forms_summary(tables, 6)
    assert "(96, 64)" in line and "(64, 96)" in line
    assert all(f.split()[-1] in cpu_matmul.FORMS for f in line.split("; "))
    assert machine.forms_summary({}, 1).startswith("none installed")


def test_the_kernel_built_for_the_x86_64_baseline_is_exact_and_chosen_by_measurement(fresh_kernel,
        monkeypatch):
    """A CPU without AVX2 or AVX-512: the same source built for the SSE2 baseline, then tuned."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86-64 baseline build needs an x86 machine")
    monkeypatch.setenv("TASKSPEC_CPU_MARCH", "x86-64")
    assert cpu_kernel.available(), cpu_kernel.status()
    assert "-march=x86-64" in cpu_kernel.flags()
    torch.manual_seed(0)
    W = torch.randn(300, 96)
    for rows in (1, 5, 12, 32):
        x = torch.randn(rows, 96)
        ref = (x.double() @ W.double().T).float()
        torch.testing.assert_close(cpu_kernel.matmul(x, W), ref, rtol=1e-4, atol=1e-4)
        assert torch.equal(cpu_kernel.matmul(x, W, l2=True), cpu_kernel.matmul(x, W))
        xb, Wb = x.bfloat16(), W.bfloat16()  # the bf16 path: a 16-bit shift widens, no AVX512-BF16 needed
        refb = (xb.double() @ Wb.double().T).float().bfloat16()
        torch.testing.assert_close(cpu_kernel.matmul(xb, Wb), refb, rtol=1e-2, atol=1e-2)
    model = nn.Sequential(nn.Linear(96, 300))
    tables = cpu_matmul.install(model)
    assert set(next(iter(tables.values())).values()) <= set(cpu_matmul.FORMS)
    x = torch.randn(1, 7, 96)
    torch.testing.assert_close(model(x), F.linear(x, model[0].weight, model[0].bias), rtol=1e-5, atol=1e-5)


@pytest.mark.full  # breadth: a benchmark script's output (the machine module's parts are tested above)
def test_bench_matmul_prints_the_machine_and_the_bound_per_row_count():
    cmd = [sys.executable, str(ROOT / "experiments/bench_matmul.py"), "--rows", "1,6", "--repeats", "1"]
    r = subprocess.run(cmd,
                       capture_output=True, text=True, timeout=600, env=os.environ, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("machine: ") and lines[1].startswith("bound: a plain sum")
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0] in ("1", "6")]
    assert len(rows) == 2
    for row in rows:  # ... best GB/s, tuned/sum, tuned/1row, then the forms the tuner chose
        ratios = [x for x in row if x.endswith("x") and x[:-1].replace(".", "").isdigit()]
        assert len(ratios) == 2 and any(f in row for f in cpu_matmul.FORMS), row
    assert "1.00x" in rows[0]  # the one-row pass against itself


def test_the_bound_reads_a_bf16_weights_bytes_once_as_float32_words():
    """The plain sum behind the bound reads every byte once; a bf16 weight through a float32 view
    of its bytes (torch's bf16 sum widens each element and measured compute, not memory)."""
    w = torch.randn(64, 96).bfloat16()
    assert machine.stream(w).dtype == torch.float32  # the view: 64 x 48 float32 words
    assert machine.stream(w[:, :95].contiguous()).dtype == torch.bfloat16  # odd rows: a plain sum
    assert machine.stream(w.float()).item() == pytest.approx(w.float().sum().item())
    assert machine.weights_sum_ms([w], repeats=1) > 0
