"""EAGLE-3 trains like EAGLE-2/HASS (issue #40): its feature cache holds exactly the aux layers
(captured by hooks on those layers only, under keys of its own), the trainer runs the training-time
test from that cache and reports agreement at TTT depths 1-3, checkpoints merge (and refuse
EAGLE-2/HASS partners). Real verifier, real GSM8K/MATH conversations."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafters.__main__ import main as drafters_cli
from drafters.checkpoint import init_drafter, initial_of, load_any, save_checkpoint
from drafters.config import DrafterConfig
from drafters.eagle3 import (
    Eagle3Config,
    Eagle3Drafter,
    default_aux_layers,
    init_eagle3,
    is_eagle3_checkpoint,
    save_eagle3,
)
from drafters.features import FeatureStore, captured_layers, content_key, verifier_features
from drafters.merge import merge_checkpoints, task_arithmetic
from drafters.train import eagle3 as eagle3_train
from drafters.train.config import TrainConfig
from drafters.train.loop import train
from drafters.variants import DataSpec, ensure_features, heldout_data, select_examples, variant_data
from drafters.vocab import count_targets, save_vocab, select_ids
from tests.conftest import TRAIN_SPEC, VERIFIER

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SPEC = DataSpec(**TRAIN_SPEC)
AUX = (2, 15, 27)  # SmolLM2's 30 layers: the reference's (2, L // 2, L - 3)
N_DRAFT = 1024
EAGLE2_TENSORS = {"lengths", "input_ids", "loss_mask", "features", "top_ids", "top_probs"}


@pytest.fixture(scope="module")
def train_exs(verifier, eos):
    return select_examples(verifier[1], eos, "mathinstruct", SPEC)[0]


@pytest.fixture(scope="module")
def e3(verifier, eos, train_exs, tmp_path_factory):
    """(root, caches, vocab file): the eagle3 caches of the math corpus and a 1024-token draft vocabulary."""
    model, tok = verifier
    root = tmp_path_factory.mktemp("e3features")
    caches = {"mathinstruct": ensure_features(model, tok, eos, VERIFIER, "mathinstruct", SPEC, str(root),
                                              aux_layers=AUX)}
    vocab = save_vocab(select_ids(count_targets(train_exs, model.config.vocab_size), N_DRAFT, eos),
                       root / "vocab")
    return str(root), caches, str(vocab)


def _cfg(e3, out, **kw) -> TrainConfig:
    root, caches, vocab = e3
    return TrainConfig(verifier=VERIFIER, backbone="eagle3", variant="math", out_dir=str(out),
                       draft_vocab=vocab,
                       train_data=variant_data("math", root, caches, SPEC.n),
                       heldout_data=heldout_data(root, caches), lr=kw.pop("lr", 1e-2), batch_size=4,
                       deepspeed=kw.pop("deepspeed", False), **kw)


def test_the_cache_holds_exactly_the_aux_layers_under_its_own_key(verifier, e3, train_exs):
    model, _ = verifier
    assert default_aux_layers(model.config.num_hidden_layers) == AUX
    root, caches, _ = e3
    key = caches["mathinstruct"]["train"]
    ids = caches["mathinstruct"]["train_ids"]
    assert key != content_key(VERIFIER, "mathinstruct-train", ids, SPEC.max_length)  # the eagle2 cache's key
    assert key.startswith("mathinstruct-train-aux2-15-27-")
    store = FeatureStore(root, key)
    assert store.manifest()["aux_layers"] == list(AUX)
    shard = load_file(str(store.dir / store.manifest()["shards"][0]["file"]))
    assert set(shard) == EAGLE2_TENSORS | {"aux"}
    assert shard["aux"].shape[1] == len(AUX) * model.config.hidden_size
    # the aux features are output_hidden_states at those layers; the rest is what an eagle2 cache holds
    ex = next(store.iter_examples())
    with torch.no_grad():
        hs = model(input_ids=ex.input_ids[None], output_hidden_states=True).hidden_states
    ref = torch.cat([hs[i][0] for i in AUX], dim=-1)
    torch.testing.assert_close(ex.aux.float(), ref, atol=2e-2, rtol=1e-2)
    (e2,) = verifier_features(model, [next(e for e in train_exs if e.id == ex.id)])
    assert e2.aux is None
    torch.testing.assert_close(ex.features.float(), e2.features.float(), atol=2e-2, rtol=1e-2)
    assert torch.equal(ex.top_ids[:, 0], e2.top_ids[:, 0])
    # hooks on the aux layers only, and none left behind
    with captured_layers(model, AUX):
        assert [i for i, la in enumerate(model.model.layers) if la._forward_pre_hooks] == list(AUX)
    assert not any(la._forward_pre_hooks for la in model.model.layers)
    with pytest.raises(ValueError, match="aux_layers must be distinct ints in \\[0, 30\\]"):
        verifier_features(model, [], aux_layers=(2, 31))


def test_eagle3_training_lowers_the_ttt_loss_and_raises_heldout_top1(verifier, e3, tmp_path):
    t0 = time.time()
    final = train(_cfg(e3, tmp_path / "e3", epochs=3), verifier[0])
    print(f"eagle3 training, 3 epochs x 4 steps: {time.time() - t0:.1f}s")
    assert is_eagle3_checkpoint(final)
    drafter = load_any(final)
    assert isinstance(drafter, Eagle3Drafter) and drafter.config.aux_layers == AUX
    hist = drafter.config.training["history"]
    assert {f"top1_depth{j}" for j in (1, 2, 3)} <= set(hist[-1])
    assert hist[-1]["train_loss"] < 0.8 * hist[1]["train_loss"], hist
    assert hist[-1]["top1_depth1"] > hist[0]["top1_depth1"] + 0.03, hist
    # the base of task arithmetic / TIES (the grid's merges, `python -m drafters init`) is the init it
    # started from
    head = verifier[0].get_output_embeddings().weight
    cfg = _cfg(e3, tmp_path / "unused")
    ids = drafter.draft_ids()
    start = eagle3_train.init_drafter(eagle3_train.drafter_config(cfg, verifier[0], ids), verifier[0],
                                      ids).state_dict()
    base, base_cfg = initial_of(final, head)
    assert base_cfg.training == {"init": True} and base_cfg.aux_layers == AUX
    assert all(torch.equal(v, start[k]) for k,
               v in base.state_dict().items()) and set(start) == set(base.state_dict())
    assert not torch.equal(drafter.state_dict()["fc.weight"], start["fc.weight"])  # it did train
    with pytest.raises(ValueError,
                       match="eagle3 checkpoint: its initial drafter needs the verifier's LM head"):
        initial_of(final)
    assert drafters_cli(["init", "--backbone", "eagle3", "--vocab-from", str(final), "--out",
                         str(tmp_path / "init")]) \
        in (0, None)
    cli = load_any(tmp_path / "init").state_dict()
    assert all(torch.equal(v, cli[k]) for k, v in start.items())


def test_training_refuses_an_eagle2_cache_and_a_reference_mask(verifier, e3, tmp_path):
    root, caches, _ = e3
    eagle2 = {"mathinstruct": {**caches["mathinstruct"], "train": "x"}}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_text(json.dumps({"shards": []}))
    cfg = dataclasses.replace(_cfg(e3, tmp_path / "o"), train_data=variant_data("math", str(tmp_path), eagle2,
            SPEC.n))
    with pytest.raises(ValueError,
                       match=r"feature cache x holds aux layers None but the eagle3 drafter fuses"):
        train(cfg, verifier[0])
    assert not (tmp_path / "o").exists()  # refused before any work
    with pytest.raises(ValueError, match="eagle3 trains with loss_mask 'next' only"):
        _cfg(e3, tmp_path / "o", loss_mask="reference")


def _e3_ckpt(model, seed, ids, out) -> str:
    cfg = Eagle3Config.for_verifier(model, VERIFIER, seed=seed, draft_vocab_size=int(ids.shape[0]))
    return str(save_eagle3(init_eagle3(cfg, ids), out))


def test_eagle3_checkpoints_merge_and_refuse_eagle2_partners(verifier, tmp_path):
    model, _ = verifier
    ids = torch.arange(0, 4096, 4)
    a, b, base = (_e3_ckpt(model, s, ids, tmp_path / f"s{s}") for s in (0, 1, 2))
    sa, sb, s0 = (load_any(p).state_dict() for p in (a, b, base))
    merged = load_any(merge_checkpoints("linear", [a, b], str(tmp_path / "avg"), lam=0.3))
    assert isinstance(merged, Eagle3Drafter) and merged.config.training["merge"]["merge"] == "linear"
    for k, v in merged.state_dict().items():
        want = sa[k] if k == "d2t" else 0.3 * sa[k] + 0.7 * sb[k]
        torch.testing.assert_close(v, want, rtol=0, atol=1e-6)
    ta = load_any(merge_checkpoints("task_arithmetic", [a, b], str(tmp_path / "ta"), base=base, alpha=0.5))
    want = task_arithmetic({k: v for k, v in s0.items() if k != "d2t"},
                           [{k: v for k, v in s.items() if k != "d2t"} for s in (sa, sb)], 0.5)
    for k, v in want.items():
        torch.testing.assert_close(ta.state_dict()[k], v, rtol=0, atol=1e-6)
    assert isinstance(load_any(merge_checkpoints("ties", [a, b], str(tmp_path / "ties"), base=base)),
                      Eagle3Drafter)
    e2 = str(save_checkpoint(init_drafter(DrafterConfig.for_verifier(model, VERIFIER, "eagle2")),
                             tmp_path / "e2"))
    for paths, base_ in (([a, e2], None), ([a, b], e2)):
        with pytest.raises(ValueError, match="cannot merge eagle3 checkpoints .* with eagle2/hass ones"):
            merge_checkpoints("linear" if base_ is None else "ties", paths, str(tmp_path / "bad"), lam=0.5,
                              base=base_)
    assert not (tmp_path / "bad").exists()
    other = Eagle3Config.for_verifier(model, VERIFIER, draft_vocab_size=1024, aux_layers=(3, 15, 27))
    c = str(save_eagle3(init_eagle3(other, ids), tmp_path / "aux3"))
    with pytest.raises(ValueError, match="cannot merge drafters with different aux_layers"):
        merge_checkpoints("linear", [a, c], str(tmp_path / "bad"), lam=0.5)


@pytest.mark.full  # breadth: resume inside an epoch is tested by default for HASS (tests/test_faults.py)
def test_eagle3_step_checkpoint_resume_ends_with_the_uninterrupted_weights(verifier, e3, tmp_path):
    model = verifier[0]
    whole = train(_cfg(e3, tmp_path / "whole", epochs=2, checkpoint_every=3), model)
    out = tmp_path / "crash"
    with pytest.raises(RuntimeError, match="injected crash after optimizer step 5"):
        train(_cfg(e3, out, epochs=2, checkpoint_every=3, crash_at_step=5), model)
    resumed = train(_cfg(e3, out, epochs=2, checkpoint_every=3), model)
    a, b = (load_file(str(d / "model.safetensors")) for d in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.full  # breadth: online features for eagle3 (the cached path trains by default)
def test_online_eagle3_features_match_the_cache(verifier, e3):
    from drafters.train.data import OnlineFeatures, iter_examples

    model, tok = verifier
    root, caches, _ = e3
    ids = caches["mathinstruct"]["train_ids"][:3]
    online = OnlineFeatures(model, tok, SPEC, aux_layers=AUX)
    got = {e.id: e for e in iter_examples([["online", "mathinstruct", ids]], None, online=online)}
    ref = {e.id: e for e in iter_examples([[root, caches["mathinstruct"]["train"], ids]], None)}
    assert got.keys() == ref.keys() == set(ids)
    for k in ids:
        torch.testing.assert_close(got[k].aux.float(), ref[k].aux.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.full  # Ray Train + DeepSpeed (ZeRO-1, bf16) for eagle3: over 30 s on this class of machine
def test_eagle3_trains_under_ray_train_and_deepspeed_in_bf16(e3, tmp_path):
    import ray

    from workers.train_worker import run_training

    cfg = _cfg(e3, tmp_path / "ray", epochs=1, deepspeed=True, zero_stage=1, precision="bf16",
               verifier_dtype="bfloat16", checkpoint_every=2)
    with socket.socket() as sock:  # a free port for Ray's minimal dashboard (never 8265: other tests use it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"TASKSPEC_TRAIN_THREADS": "1", "PYTHONPATH": str(ROOT)}  # the workers import this checkout
    ray.init(address="local", num_cpus=1, include_dashboard=False, dashboard_port=port, log_to_driver=False,
             runtime_env={"env_vars": env})
    try:
        t0 = time.time()
        final, result = run_training(cfg, num_workers=1)
        print(f"eagle3 under Ray Train + DeepSpeed (1 worker, bf16): {time.time() - t0:.0f}s")
    finally:
        ray.shutdown()
    drafter = load_any(final)
    hist = drafter.config.training["history"]
    assert isinstance(drafter, Eagle3Drafter) and [h["epoch"] for h in hist] == [0, 1]
    assert result.metrics["epoch"] == 1 and 0.0 <= result.metrics["top1_depth3"] <= 1.0
    assert hist[-1]["train_loss"] == hist[-1]["train_loss"]  # finite (NaN != NaN)


@pytest.mark.full  # the CLI end to end (a subprocess: its own verifier load and extraction)
def test_cli_trains_an_eagle3_drafter(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "workers", "train", "--backbone", "eagle3", "--variant", "math", "--n", "8",
           "--heldout", "2", "--max-length", "64", "--epochs", "1", "--batch-size", "4", "--draft-vocab",
           "512",
           "--no-ray", "--no-deepspeed", "--features-dir", str(tmp_path / "f"), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert is_eagle3_checkpoint(tmp_path / "o" / "final") and "top1_depth3" in r.stdout
    assert all("-aux2-15-27-" in p.name for p in (tmp_path / "f").iterdir()
               if p.name.startswith("mathinstruct"))
    bad = subprocess.run(cmd[:-2] + ["--out", str(tmp_path / "x"), "--loss-mask", "reference"], cwd=ROOT,
                         env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--backbone eagle3 trains with --loss-mask next only" in bad.stderr
