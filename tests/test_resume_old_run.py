"""A run made by the code at 7b1ea68 (before the redesign) resumes under this code with every
finished unit skipped and its report rebuilt to the same Markdown and CSV bytes."""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from drafters.data.sources import default_data_root

ROOT = Path(__file__).resolve().parents[1]
OLD = "7b1ea68"  # the last commit before the redesign (tests/data/unit_keys_7b1ea68.json)


def _grid(checkout: Path, run: Path, data: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "TASKSPEC_DATA_ROOT": str(data)}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "experiments/full_grid.py", "--profile", "smoke", "--output-dir",
                          str(run)], cwd=checkout, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _old_checkout(dest: Path) -> Path:
    archive = dest.with_suffix(".tar")
    got = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), OLD], capture_output=True,
                         text=True)
    if got.returncode != 0:
        pytest.fail(f"git archive {OLD} failed (a clone without history?): {got.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _reports(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted((run / "report").rglob("*"))
            if p.suffix in (".md", ".csv")}


@pytest.mark.slow
@pytest.mark.full  # two smoke grids (old code, then this code): about 3 minutes on 2 cores
def test_a_run_made_before_the_redesign_resumes_with_nothing_redone(tmp_path):
    data = default_data_root()
    assert data is not None, "the shared data root is needed (../shared/data or $TASKSPEC_DATA_ROOT)"
    old, run = _old_checkout(tmp_path / "old"), tmp_path / "run"
    _grid(old, run, data)
    before = json.loads((run / "manifest.json").read_text())
    reports = _reports(run)
    log = _grid(ROOT, run, data)
    after = json.loads((run / "manifest.json").read_text())
    assert "FAILED" not in log
    units = sum(1 for c in before["cells"].values() if c["stage"] in ("train", "merge", "eval"))
    assert log.count("(done earlier)") == units > 10
    assert after["stages"] == before["stages"], "a stage ran units again"
    assert {k: c["status"] for k, c in after["cells"].items()} == {k: c["status"] for k,
                                                                   c in before["cells"].items()}
    assert _reports(run) == reports, [f for f in reports if _reports(run).get(f) != reports[f]]
    assert not filecmp.dircmp(old / "experiments" / "profiles", ROOT / "experiments" / "profiles").diff_files
