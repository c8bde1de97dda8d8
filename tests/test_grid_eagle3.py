"""EAGLE-3 in the grid (issue #40): the smoke profile with EAGLE-2 and EAGLE-3 side by side, run
by the driver on a local Ray. One feature cache per corpus holds EAGLE-3's three layers and serves
both backbones; EAGLE-3 trains only the specialists (``train.per_backbone``); the task-arithmetic
and TIES merges start from EAGLE-3's own initial drafter (built where the verifier loads); every
cell decodes losslessly at T=0; the report's tables and the dry run count both backbones."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import polars as pl
import pytest
import torch

from drafters.checkpoint import load_any
from drafters.eagle3 import Eagle3Drafter, is_eagle3_checkpoint
from orchestrator.grid import eval_cells, merge_cells, train_cells
from orchestrator.plan.sizing import load_profile
from tests.test_grid import ENV, GRID, ROOT, _end, _private_tmp, _procs_with_env

# a whole grid run (282 s here under load): make test-full. By default, the pieces: the shared init
# (tests/test_eagle3_training.py), per-backbone cells (tests/test_protocol.py), the scaled rates
pytestmark = [pytest.mark.slow, pytest.mark.full]
# EAGLE-2 trains math and chat; EAGLE-3 the same two (its per-backbone list), averaged, and merged by task
# arithmetic and TIES; one GSM8K prompt at T=0, every cell checked against the autoregressive output
SETS = ["train.backbones=[eagle2, eagle3]", "train.per_backbone={eagle3: {variants: [math, chat]}}",
        "merge.kinds=[linear, task_arithmetic, ties]", "merge.sweep_backbones=[eagle3]",
        "eval.temperatures=[0.0]", "eval.tree_auto=[]",
        "eval.strategies=[autoregressive, single, confidence, merged]"]


@pytest.fixture(scope="module")
def e3_run(tmp_path_factory):
    run = ROOT / "runs" / "smoke-eagle3"
    shutil.rmtree(run, ignore_errors=True)
    ray_tmp = _private_tmp()
    sets = [a for s in SETS for a in ("--set", s)]
    t = time.time()
    try:
        r = subprocess.run(GRID + ["--output-dir", str(run), *sets], capture_output=True, text=True,
                           timeout=1800,
                           env={**ENV, "TMPDIR": ray_tmp})
    finally:
        _end(_procs_with_env("TMPDIR", ray_tmp))  # nothing, unless the driver died before ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(f"smoke grid with eagle2 and eagle3: {time.time() - t:.0f}s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield run, r.stdout
    shutil.rmtree(run, ignore_errors=True)


def test_the_grid_trains_merges_and_decodes_eagle3_beside_eagle2(e3_run):
    run, stdout = e3_run
    p = load_profile("smoke", SETS)
    assert [c.name for c in train_cells(p)] == ["eagle2-math", "eagle2-chat", "eagle3-math", "eagle3-chat"]
    cells = json.loads((run / "manifest.json").read_text())["cells"]
    assert all(c["status"] == "done" for c in cells.values()), [c for c in cells.values()
                                                                if c["status"] != "done"]
    # one cache per corpus, with EAGLE-3's layers (2, 15, 27), read by both backbones
    feats = [c for c in cells.values() if c["stage"] == "features" and "caches" in c]
    assert len(feats) == 2 and all("-aux2-15-27-" in c["caches"]["train"] for c in feats)
    assert not [d for d in (run / "features").glob("*-train-*") if "-aux" not in d.name]
    for name in ("eagle3-math", "eagle3-chat"):
        assert is_eagle3_checkpoint(run / "checkpoints" / name / "final")
    assert not is_eagle3_checkpoint(run / "checkpoints" / "eagle2-math" / "final")
    # task arithmetic / TIES: eagle3 drafters, from eagle3's initial drafter (the verifier's head rows)
    assert {m.name for m in merge_cells(p)} == {"eagle2-avg0.5", "eagle3-avg0.5", "eagle3-task_arithmetic",
                                                "eagle3-ties"}
    init = load_any(run / "checkpoints" / "eagle3-init")
    math_ = load_any(run / "checkpoints" / "eagle3-math" / "final")
    assert isinstance(init, Eagle3Drafter) and init.config.training == {"init": True}
    assert torch.equal(init.d2t, math_.d2t) and not torch.equal(init.fc.weight, math_.fc.weight)
    for m in ("eagle3-task_arithmetic", "eagle3-ties", "eagle3-avg0.5"):
        assert is_eagle3_checkpoint(run / "checkpoints" / m)
    # every cell ran, lossless at T=0 against the autoregressive output
    prompts = pl.scan_parquet(str(run / "traces/prompts/**/*.parquet"), hive_partitioning=True).collect()
    assert prompts.select("unit_key").n_unique() == len(eval_cells(p))
    e3 = prompts.filter(pl.col("backbone") == "eagle3")
    assert set(e3["strategy"]) == {"single", "confidence", "merged"}
    assert set(e3["drafter"]) == {"math", "chat", "avg0.5", "task_arithmetic", "ties", "math+chat"}
    base = prompts.filter(pl.col("strategy") == "autoregressive").select("prompt_id",
            pl.col("output_token_ids").alias("ref"))
    joined = prompts.join(base, on="prompt_id")
    assert joined.height == prompts.height and (joined["output_token_ids"] == joined["ref"]).all()
    assert (e3["verifier_calls"] > 0).all()
    # the report's acceptance table has both backbones
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    assert {"eagle2", "eagle3"} <= set(t1["backbone"])
    assert "eagle3" in (run / "report/report.md").read_text()
    # the dry run counts the same grid and estimates EAGLE-3 from this run's EAGLE-2 rate where unmeasured
    sets = [a for s in SETS for a in ("--set", s)]
    dry = subprocess.run(GRID + ["--dry-run", "--rates", str(run), *sets], capture_output=True, text=True,
                         timeout=300, env=ENV)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "train    : 4 runs" in dry.stdout and "makespan from rates" in dry.stdout
