"""Unit keys are what let a run resume: every key the driver would write for the shipped profiles is
the key the driver wrote at 7b1ea68 (tests/data/unit_keys_7b1ea68.json, computed there by the same
walk), so a run started before the redesign resumes after it with every finished unit skipped. The
demo's entry was re-pinned on 2026-12-07, when the demo was re-sized (issue 63: its grid changed, so
its keys did), and cpu-study's when its grid changed (issue 64). The same day the walk was found to
place an averaged checkpoint under ``final/`` as a trial's, where the stages keep it in its own dir,
so the pinned keys of the units that evaluate an averaged checkpoint were never a run's (2 of smoke's
24, 8 of the demo's 51, 24 of cpu-study's 112, and the paper's hash): those were re-pinned from the
corrected walk, which reproduces every train, merge and eval key of the cpu-study run of that day
(runs/cpu-study-6b9fb1b's manifest) and of tests/test_graph_run.py's graph run. Later re-pins, each
because the profile's grid changed: the demo's when its drafters' data became self-distilled, and
cpu-study's hedge cells when their weights became carried across a shard's prompts (issues 63, 64)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from common.verifiers import resolve
from orchestrator import keys
from orchestrator.grid import corpora, merge_cells, train_cells
from orchestrator.plan.sizing import load_profile
from orchestrator.run.driver import Driver

FIXTURE = Path(__file__).parent / "data" / "unit_keys_7b1ea68.json"


def planned_keys(name: str, output: str, sets: tuple[str, ...] = ()) -> dict:
    """{unit: key} for every unit of a shipped profile (with ``--set`` overrides), the drafters' keys
    chained as the stages do."""
    d = Driver(load_profile(name, list(sets)), output)
    verifier, p = resolve(d.p.verifier).name, d.p
    d.verifier_name = verifier  # (set by Driver.run's preflight)
    try:
        aux = "eagle3" in p.train.backbones
        out = {f"features:{c}": keys.features_key(p, verifier, c, aux) for c in corpora(p)}
        if p.train.draft_vocab is not None:
            out["vocab"] = keys.vocab_key(p, verifier, corpora(p))
        for c in train_cells(p):
            out[f"train:{c.name}"] = d.ckpt_keys[c.name] = keys.train_key(p, verifier, c.backbone, c.variant)
        for m in merge_cells(p):
            sources = [d.ckpt_keys.get(f"{m.backbone}-{v}") for v in ("math", "chat")]
            out[f"merge:{m.name}"] = d.ckpt_keys[m.name] = keys.merge_key(p, m.kind, m.lam, sources)
        for cell, shard, ks, _ in d._eval_units(d.checkpoint_refs()):
            out[f"eval:{cell.key}:{shard[0].id}"] = ks[0]
        return out
    finally:
        d.lease.release()


@pytest.mark.parametrize("name", ["smoke", "demo", "cpu-study", "paper"])
def test_unit_keys_are_the_keys_runs_wrote_at_7b1ea68(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    want = json.loads(FIXTURE.read_text())[name]
    got = planned_keys(name, str(tmp_path / "run"))
    if name != "paper":
        assert got == want
        return
    assert {k: v for k, v in got.items() if not k.startswith("eval:")} == want["not_eval"]
    items = sorted(got.items())
    assert len(items) == want["count"]
    assert hashlib.sha256(json.dumps(items).encode()).hexdigest() == want["sha256"]
