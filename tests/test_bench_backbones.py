"""experiments/bench_backbones.py: bad input refused before work; a tiny eagle2 + eagle3 run end to end
(real verifier, real math examples, real GSM8K prompt): both train on the one EAGLE-3 cache, decode
exactly like ``generate`` at T=0, and the JSON holds what issue #40 item 6 asks for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments/bench_backbones.py"


@pytest.mark.parametrize("args, msg", [
    (["--benchmarks", "gsm8k,gsm9k"], "unknown benchmark gsm9k; known: mt_bench, gsm8k, math500, svamp"),
    (["--n", "0"], "--n must be >= 1, got 0"),
    (["--backbones", "eagle2,eagle4"], "unknown backbone 'eagle4'; known: eagle2, hass, eagle3"),
    (["--eagle3-epochs", "0"], "eagle3 epochs must be >= 1, got 0"),
    (["--n-prompts", "0"], "n-prompts and repeats must be >= 1 and vocab >= 2, got 8, 0, 1, 8192"),
    (["--backbones", "eagle2", "--equal-cpu"], "--equal-cpu matches the other backbones' CPU time to eagle3's"),
    (["--equal-cpu", "--hass-epochs", "3"], "--equal-cpu sets the epochs of hass: drop --hass-epochs"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, args, msg):
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), *args, "--out", str(out), "--work", str(tmp_path / "w")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and msg in r.stderr, r.stderr
    assert "stage 1/3" not in r.stdout and not out.exists() and not (tmp_path / "w").exists()


def test_tiny_run_trains_both_backbones_on_one_cache_and_decodes_exactly(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--backbones", "eagle2,eagle3", "--n", "4", "--heldout", "2",
           "--max-length", "48", "--epochs", "1", "--eagle3-epochs", "2", "--batch-size", "2", "--vocab", "256",
           "--benchmarks", "gsm8k", "--n-prompts", "1", "--max-new-tokens", "6", "--tree", "fixed",
           "--work", str(tmp_path / "w"), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [p.name for p in (tmp_path / "w").glob("mathinstruct-*")] and \
        all("aux" in p.name for p in (tmp_path / "w").glob("mathinstruct-*"))  # one cache: eagle3's
    t = res["training"]
    assert t["eagle2"]["epochs"] == 1 and t["eagle3"]["epochs"] == 2 and "hass" not in t
    for b in ("eagle2", "eagle3"):
        assert t[b]["loss_tokens"] > 0 and t[b]["process_cpu_s"] > 0 and t[b]["train_tokens_per_s"] > 0
        assert all(0.0 <= t[b]["heldout_top1"][f"depth{j}"] <= 1.0 for j in (1, 2, 3))
    assert t["eagle2"]["loss_tokens"] * 2 == t["eagle3"]["loss_tokens"]  # the same examples, twice
    d = res["decoding"]
    for key in ("eagle2", "eagle3"):
        row = d[key]["fixed"]["benchmarks"]["gsm8k"]
        assert row["same"] == row["prompts"] == 1 and row["tau"] >= 1.0 and row["vs_generate"] > 0
    assert d["autoregressive"]["gsm8k"]["same"] == 1
    assert set(res["targets"]) == {"gsm8k_tau_eagle3_over_eagle2_fixed"}
    assert res["machine"] and res["commit"] and res["date"]
    assert "| eagle3 | fixed 4/4/16 | gsm8k |" in r.stdout
