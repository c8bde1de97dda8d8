"""Online training at world size 2, simulated (rank 0 and rank 1 run ``train`` one after the other).

The verifier is a real, tiny Llama (1 layer, hidden 16) built in the test, and the selection is
hand-made tokenized examples, so nothing loads the embedded verifier. Checked: each rank runs the
verifier only on its own examples (disjoint, together every example once per epoch), and online
mode trains the same batches under the same schedule (warmup, linear decay, HASS's two-stage
switch) as cached mode on the same examples.
"""
from __future__ import annotations

import random

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import drafters.features as features_mod
import drafters.train.loop as trainer_mod
import drafters.variants as variants_mod
from drafters.data.templating import TokenizedExample
from drafters.features import FeatureStore, verifier_features
from drafters.train.backbones import schedule_steps
from drafters.train.config import TrainConfig
from drafters.train.data import plan_batches
from drafters.train.loop import train
from drafters.variants import DataSpec

N, HELD, BATCH, WORLD = 22, 2, 3, 2  # 8 batches (the last holds one example): 4 per rank per epoch
SPEC = DataSpec(n=N, heldout=HELD, max_length=64, seed=0)
VOCAB = 64


def _examples() -> tuple[list, list]:
    rng = random.Random(7)
    out = []
    for i in range(N + HELD):
        n = rng.randrange(8, 40)
        prompt = rng.randrange(2, n - 2)  # user tokens, then the assistant's
        out.append(TokenizedExample(f"ex{i}", [rng.randrange(3, VOCAB) for _ in range(n)],
                                    [0] * prompt + [1] * (n - prompt)))
    return out[:N], out[N:]


@pytest.fixture(scope="module")
def tiny_verifier():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def cache_root(tiny_verifier, tmp_path_factory):
    """The same training examples as a feature cache (what cached mode reads)."""
    root = tmp_path_factory.mktemp("features")
    FeatureStore(root, "toy-train").write(iter(verifier_features(tiny_verifier, _examples()[0])),
                                          {"corpus": "toy"})
    return str(root)


@pytest.fixture
def recorder(monkeypatch):
    """Records the examples the verifier computes features for, the learning rate at each
    optimizer step, and (per micro-batch) the HASS stage and the batch's tokens."""
    rec = {"computed": [], "calls": 0, "lrs": [], "topk": [], "tokens": []}
    monkeypatch.setattr(variants_mod, "select_examples", lambda tok, eos, corpus, spec, *a: _examples())

    def counted(model, exs, *a, **kw):
        rec["calls"] += 1
        rec["computed"] += [e.id for e in exs]
        return verifier_features(model, exs, *a, **kw)

    monkeypatch.setattr(features_mod, "verifier_features", counted)

    def loss(cfg, model, embed, head, batch, gen, use_topk=True):
        rec["topk"].append(use_topk)
        rec["tokens"].append(batch.tokens.clone())
        return compute_loss(cfg, model, embed, head, batch, gen, use_topk=use_topk)

    compute_loss = trainer_mod.compute_loss
    monkeypatch.setattr(trainer_mod, "compute_loss", loss)
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: rec["lrs"].append(opt.param_groups[0]["lr"]))
    yield rec
    hook.remove()


def _cfg(data, out, **kw) -> TrainConfig:
    return TrainConfig(verifier="toy", backbone="hass", variant="math", out_dir=str(out), train_data=data,
                       epochs=kw.pop("epochs", 1), lr=1e-3, batch_size=BATCH, deepspeed=False, **kw)


def _online(out, **kw) -> TrainConfig:
    return _cfg([["online", "toy", None]], out, online_spec=SPEC, **kw)


def _run(cfg, model, rank, rec) -> dict:
    for v in rec.values():
        if isinstance(v, list):
            v.clear()
    rec["calls"] = 0
    train(cfg, model, rank=rank, world=WORLD, tokenizer=None)
    return {k: (list(v) if isinstance(v, list) else v) for k, v in rec.items()}


def test_each_rank_computes_features_only_for_its_own_examples(tiny_verifier, recorder, tmp_path):
    cfg = _online(tmp_path / "plan")
    plan = list(plan_batches(cfg.train_data, BATCH, cfg.init_seed * 1000 + 1, trainer_mod.OnlineFeatures(
        tiny_verifier, None, SPEC), bucket=True))
    assert len(plan) == 8 and recorder["calls"] == 0  # planning the epoch runs no verifier pass
    computed = {}
    for rank in range(WORLD):
        got = _run(_online(tmp_path / f"rank{rank}"), tiny_verifier, rank, recorder)
        own = [e.id for i, g in enumerate(plan) if i % WORLD == rank for e in g]
        assert sorted(got["computed"]) == sorted(own), f"rank {rank} ran the verifier on others' examples"
        assert got["calls"] == 4  # one verifier call per own batch
        computed[rank] = set(got["computed"])
    assert not computed[0] & computed[1]
    assert computed[0] | computed[1] == {e.id for e in _examples()[0]}


def test_online_schedule_and_batches_equal_cached_mode(tiny_verifier, cache_root, recorder, tmp_path):
    kw = dict(epochs=2, grad_accum=2, warmup_steps=1, topk_from=0.5)
    assert schedule_steps(_online("x", **kw), WORLD) == schedule_steps(
        _cfg([[cache_root, "toy-train", None]], "x", **kw), WORLD) == 2 * 4  # micro-batches per rank
    for rank in range(WORLD):
        on = _run(_online(tmp_path / f"online{rank}", **kw), tiny_verifier, rank, recorder)
        cached = _run(_cfg([[cache_root, "toy-train", None]], tmp_path / f"cached{rank}", **kw),
                      tiny_verifier, rank,
                      recorder)
        assert cached["calls"] == 0 and on["calls"] == 8  # 4 own batches x 2 epochs
        # 8 micro-batches, grad_accum 2 -> 4 optimizer steps: warmup 1, then linear decay to 0 at step 4
        assert cached["lrs"] == pytest.approx([1e-3, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3])
        assert on["lrs"] == cached["lrs"]
        assert cached["topk"] == [False] * 4 + [True] * 4  # HASS's top-K term joins at half the steps
        assert on["topk"] == cached["topk"]
        assert len(on["tokens"]) == len(cached["tokens"]) == 8
        for a, b in zip(on["tokens"], cached["tokens"]):
            assert torch.equal(a, b)  # the same examples in the same batches, in the same order
