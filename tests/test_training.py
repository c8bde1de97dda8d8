"""Drafter training on real data with the real verifier, at tiny sizes."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drafters.train.config import TrainConfig
from drafters.train.loop import TrainingDiverged, train
from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data
from tests.conftest import TRAIN_SPEC

pytestmark = pytest.mark.slow
SPEC = DataSpec(**TRAIN_SPEC)
N = SPEC.n


@pytest.fixture(scope="module")
def caches(train_features):
    return train_features  # built once per run (tests/conftest.py), shared with tests/test_faults.py


def _cfg(root, caches, out, backbone, **kw):
    return TrainConfig(verifier="smollm2-135m-instruct", backbone=backbone, variant="math", out_dir=str(out),
                       train_data=variant_data("math", root, caches, N), heldout_data=heldout_data(root,
                               caches)[:1],
                       lr=kw.pop("lr", 1e-3), batch_size=4, deepspeed=kw.pop("deepspeed", False), **kw)


def test_second_extraction_runs_no_verifier_forward(verifier, eos, caches):
    model, tok = verifier
    root, c = caches
    calls = []
    h = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        again = ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", SPEC, root)
    finally:
        h.remove()
    assert again == c["mathinstruct"] and not calls


def test_mixed_variants_reference_single_domain_caches(caches):
    root, c = caches
    half = variant_data("mixed_half", root, c, N)
    full = variant_data("mixed_full", root, c, N)
    assert [d[1] for d in half] == [c["mathinstruct"]["train"], c["sharegpt"]["train"]]
    assert len(half[0][2]) == N // 2 and len(full[0][2]) == N
    assert set(half[0][2]) <= set(c["mathinstruct"]["train_ids"])


@pytest.fixture(scope="module")
def eagle2_final(verifier, caches, tmp_path_factory):
    """An EAGLE-2 drafter trained for 3 epochs (its agreement well above zero)."""
    root, c = caches
    return train(_cfg(root, c, tmp_path_factory.mktemp("eagle2"), "eagle2", epochs=3), verifier[0])


# HASS's objective trains by default in tests/test_multinode.py (two ranks, bf16) and tests/test_faults.py
@pytest.mark.parametrize("backbone", ["eagle2", pytest.param("hass", marks=pytest.mark.full)])
def test_short_training_lowers_loss_and_raises_agreement(verifier, caches, tmp_path, backbone, request):
    root, c = caches
    if backbone == "eagle2":
        final = request.getfixturevalue("eagle2_final")
    else:
        final = train(_cfg(root, c, tmp_path / backbone, backbone, epochs=3), verifier[0])
    hist = json.loads((final / "config.json").read_text())["training"]["history"]
    # the objective shared by every epoch (HASS adds its top-K term in the second stage)
    assert hist[-1]["train_base_loss"] < hist[1]["train_base_loss"], hist
    assert hist[-1]["top1_depth1"] > hist[0]["top1_depth1"] + 0.03, hist


@pytest.mark.full  # the default suite resumes inside an epoch: tests/test_faults.py (bit-equal weights)
def test_resume_after_crash_restores_optimizer_state(verifier, caches, tmp_path):
    root, c = caches
    out = tmp_path / "crash"
    with pytest.raises(RuntimeError, match="injected crash after epoch 1"):
        train(_cfg(root, c, out, "eagle2", epochs=2, crash_after_epoch=1), verifier[0])
    saved = torch.load(out / "epoch-1" / "optimizer.pt")
    final = train(_cfg(root, c, out, "eagle2", epochs=2), verifier[0])
    hist = json.loads((final / "config.json").read_text())["training"]["history"]
    assert [h["epoch"] for h in hist] == [0, 1, 2]  # epoch 1 not redone
    resumed = torch.load(out / "epoch-2" / "optimizer.pt")
    steps = lambda st: [int(v["step"]) for v in st["state"].values()]  # noqa: E731
    assert steps(resumed) == [s + hist[2]["steps"] for s in steps(saved)]  # continued, not restarted


def test_nan_loss_stops_and_keeps_last_good_checkpoint(verifier, caches, tmp_path):
    root, c = caches
    out = tmp_path / "nan"
    train(_cfg(root, c, out, "eagle2", epochs=1), verifier[0])
    with pytest.raises(TrainingDiverged, match="non-finite loss"):
        train(_cfg(root, c, out, "eagle2", epochs=2, lr=1e30), verifier[0])
    assert (out / "epoch-1" / "model.safetensors").is_file() and not (out / "epoch-2").exists()


@pytest.mark.full  # breadth: online features (tests/test_online_training.py checks its plumbing by default)
def test_online_mode_matches_the_cache_and_trains(verifier, caches, tmp_path):
    """`online` computes the same features inside the trainer (no cache) and trains on them."""
    from drafters.train.data import OnlineFeatures, iter_examples

    model, tok = verifier
    root, c = caches
    online = OnlineFeatures(model, tok, SPEC)
    ids = c["mathinstruct"]["train_ids"][:4]
    got = {e.id: e for e in iter_examples([["online", "mathinstruct", ids]], None, online=online)}
    ref = {e.id: e for e in iter_examples([[root, c["mathinstruct"]["train"], ids]], None)}
    assert got.keys() == ref.keys() == set(ids)
    for k in ids:
        assert torch.equal(got[k].input_ids, ref[k].input_ids) and torch.equal(got[k].loss_mask,
                ref[k].loss_mask)
        torch.testing.assert_close(got[k].features.float(), ref[k].features.float(), atol=2e-2, rtol=1e-2)
    cfg = TrainConfig(verifier="smollm2-135m-instruct", backbone="eagle2", variant="math",
                      out_dir=str(tmp_path / "online"),
                      train_data=[["online", "mathinstruct", None]], heldout_data=[["online-heldout",
                              "mathinstruct", None]],
                      epochs=1, lr=1e-3, batch_size=4, deepspeed=False, online_spec=SPEC)
    final = train(cfg, model, tokenizer=tok)
    hist = json.loads((final / "config.json").read_text())["training"]["history"]
    assert hist[-1]["top1_depth1"] > hist[0]["top1_depth1"]


def test_heldout_sets_evaluated_once_give_the_pooled_passs_figures(verifier, caches, eagle2_final):
    """A specialist is judged on its own domain: pooled agreement plus one value per held-out set. Each
    set is evaluated once; the pooled figures, its summed hits over summed positions, equal one pass
    over the sets pooled (where a batch spans both sets), at every depth; ranks that deal the sets'
    batches round-robin count every batch once."""
    from drafters.checkpoint import load_any
    from drafters.train.backbones import (
        backbone,
        corpus_of,
        evaluate,
        heldout_metrics,
        set_counts,
        top1_rates,
    )
    from drafters.train.data import batches
    from drafters.vocab import DraftHead

    model, _ = verifier
    root, c = caches
    cfg = dataclasses.replace(_cfg(root, c, "unused", "eagle2"), heldout_data=heldout_data(root, c))
    drafter, b = load_any(eagle2_final), backbone("eagle2")
    embed, head = model.get_input_embeddings(), DraftHead(model.lm_head)
    pooled = b.agreement(drafter, embed, head, batches(cfg.heldout_data, 8, None, collate_fn=b.collate), 3)
    assert len(cfg.heldout_data) == 2 and min(pooled[1]) > 0 and pooled[0][0] > 0, pooled
    m = heldout_metrics(drafter, embed, head, cfg)
    assert {k: m[k] for k in top1_rates(*pooled)} == top1_rates(*pooled)
    for entry in cfg.heldout_data:  # each set's own figure: one pass over that set alone
        alone = evaluate(drafter, embed, head, [entry], cfg.eval_depths)
        assert {k: m[f"{k}_{corpus_of(entry)}"] for k in alone} == alone
    # two ranks: batch i of the evaluation (over both sets, in order) on rank i % 2
    one = [set_counts(drafter, embed, head, e, cfg, None, None, 0, 0, 1) for e in cfg.heldout_data]
    first = [0, one[0][2]]
    for e, (hits, positions, n), f in zip(cfg.heldout_data, one, first):
        ranks = [set_counts(drafter, embed, head, e, cfg, None, None, f, r, 2) for r in range(2)]
        assert [ranks[0][0][j] + ranks[1][0][j] for j in range(3)] == hits
        assert [ranks[0][1][j] + ranks[1][1][j] for j in range(3)] == positions and ranks[0][2] == n
    assert one[0][2] + one[1][2] >= 2  # (one batch alone would not test the dealing)
