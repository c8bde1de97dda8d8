"""experiments/bench_backbones.py refuses bad input with one line before any work (no model loads).

The run itself (training three backbones and decoding) takes minutes even at its smallest, so it
has no test here; docs/eagle3.md "Backbones compared" gives the smoke command and what it showed."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments/bench_backbones.py"
_spec = importlib.util.spec_from_file_location("bench_backbones", SCRIPT)
# (dataclasses need it)
bench = sys.modules.setdefault("bench_backbones", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("args, msg", [
    (["--benchmarks", "gsm8k,gsm9k"], "unknown benchmark gsm9k; known: mt_bench, gsm8k, math500, svamp"),
    (["--n", "0"], "--n must be >= 1, got 0"),
    (["--heldout", "0"], "--heldout must be >= 1, got 0"),
    (["--backbones", "eagle2,eagle4"], "unknown backbone 'eagle4'; known: eagle2, hass, eagle3"),
    (["--eagle3-epochs", "0"], "eagle3 epochs must be >= 1, got 0"),
    (["--n-prompts", "0"], "n-prompts and repeats must be >= 1 and vocab >= 2, got 8, 0, 1, 8192"),
    (["--backbones", "eagle2", "--equal-cpu"],
     "--equal-cpu matches the other backbones' CPU time to eagle3's"),
    (["--equal-cpu", "--hass-epochs", "3"], "--equal-cpu sets the epochs of hass: drop --hass-epochs"),
    (["--drafter", "x"], "--drafter: this bench trains its own drafters"),
])
def test_bad_input_is_refused_with_one_line(args, msg):
    with pytest.raises(SystemExit) as e:
        bench.parse(args)
    assert str(e.value).startswith("bench_backbones: ") and msg in str(e.value) and "\n" not in str(e.value)


def test_cli_refuses_before_any_work(tmp_path):
    """main() refuses before it loads anything or makes the output and work dirs (in process: a
    subprocess paid ~30 s of imports under load for what SystemExit's string already shows)."""
    out, work = tmp_path / "r.json", tmp_path / "w"
    with pytest.raises(SystemExit) as e:
        bench.main(["--benchmarks", "gsm8k,foo", "--out", str(out), "--work", str(work)])
    assert e.value.code == "bench_backbones: unknown benchmark foo; known: mt_bench, gsm8k, math500, svamp"
    assert not out.exists() and not work.exists()
