"""The driver's task graph on a local Ray (cluster.schedule graph): the smoke grid with one trial
at a time, so the first drafter's merges and evaluation can only overlap the second's training.
Every unit the stages would run (cluster.schedule stages: their units and keys, planned by the
driver on the same output) is recorded done under the same key, so the stages would find every unit
done and run nothing again (a rerun skips recorded keys: tests/test_grid.py's README job)."""
from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest

from tests.test_grid import ENV, GRID, _end, _private_tmp, _procs_with_env

pytestmark = pytest.mark.slow
# what it proves is the overlap and the keys, so the cheapest grid that shows them: trials without
# DeepSpeed (its engine is the README job's and the two-node grid's), and no merged-tree cell (one drafter
# a cell: each trial's checkpoint, then the average, evaluated as each appears). 146 s -> 126 s alone on Zen 3
SETS = ["cluster.schedule=graph", "resources.train.max_concurrent_trials=1", "eval.temperatures=[0.0]",
        "eval.tree_auto=[]", "eval.strategies=[autoregressive, single]", "train.deepspeed=false"]


def _grid(out, sets: list[str]) -> subprocess.CompletedProcess:
    ray_tmp = _private_tmp()
    try:
        return subprocess.run(GRID + ["--output-dir", str(out), *[a for s in sets for a in ("--set", s)]],
                              capture_output=True, text=True, timeout=1800, env={**ENV, "TMPDIR": ray_tmp})
    finally:
        _end(_procs_with_env("TMPDIR", ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("graph") / "run"
    first = _grid(out, SETS)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return SimpleNamespace(out=out, log=first.stdout)


def test_the_first_drafters_evaluation_starts_while_the_second_trains(graph_run):
    lines = graph_run.log.splitlines()
    opened = [i for i, x in enumerate(lines) if "eval actor(s) started while 1 trial(s) train" in x]
    trained = [i for i, x in enumerate(lines) if "] [train] 2/2 done" in x]
    units = [i for i, x in enumerate(lines) if "] [eval] " in x and " done, " in x]
    assert opened and trained and opened[0] < trained[0], "\n".join(lines[-60:])
    assert units and max(units) > trained[0]  # (the second drafter's units after it)
    assert "FAILED" not in graph_run.log


def test_the_stages_find_every_unit_the_graph_made_done(graph_run, tmp_path, monkeypatch):
    from orchestrator.grid import eval_cells, merge_cells, train_cells
    from orchestrator.manifest import read_manifest
    from orchestrator.plan.sizing import load_profile
    from tests.test_keys_unchanged import planned_keys

    p = load_profile("smoke", SETS)
    man = read_manifest(graph_run.out / "manifest.json")
    done = {st: sum(c["stage"] == st and c["status"] == "done" for c in man["cells"].values())
            for st in ("train", "merge", "eval")}
    assert done == {"train": len(train_cells(p)), "merge": len(merge_cells(p)), "eval": len(eval_cells(p))}
    assert all(man["stages"][st].get("overlapped") for st in ("train", "merge", "eval")), man["stages"]
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    stages = [s.replace("=graph", "=stages") for s in SETS]
    want = {k for u, k in planned_keys("smoke", str(graph_run.out), tuple(stages)).items()
            if u.split(":", 1)[0] in ("train", "merge", "eval")}
    recorded = {k for k, c in man["cells"].items() if c["status"] == "done"}
    assert want <= recorded, sorted(want - recorded)
    assert len(want) == sum(done.values())
