"""Self-distilled training data: the verifier's own answers, cached, turn by turn."""
from __future__ import annotations

import warnings

import pytest
import torch

from drafters.data.sources import load_corpus
from drafters.data.templating import prompt_ids
from drafters.distill import distilled, regenerate
from drafters.features import FeatureStore
from drafters.variants import DataSpec, ensure_features, select_conversations

pytestmark = pytest.mark.slow
MAX_LEN = 96


@pytest.fixture(scope="module")
def convs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        math, _ = load_corpus("mathinstruct")
        chat, _ = load_corpus("sharegpt")
    multi = next(c for c in chat if sum(r == "assistant" for r, _ in c.turns) >= 2
                 and len(c.turns[0][1]) < 120 and len(c.turns[1][1]) < 300)
    short = next(c for c in math if len(c.turns[0][1]) < 100)
    return [short, multi]


@pytest.fixture(scope="module")
def greedy(verifier, eos, convs):
    """Both conversations regenerated greedily (one verifier pass per token: computed once here)."""
    model, tok = verifier
    return regenerate(model, tok, eos, convs, MAX_LEN, "greedy", batch_size=1)


def test_greedy_regeneration_is_the_verifiers_own_greedy_answer(verifier, eos, convs, greedy):
    model, tok = verifier
    out, stats = greedy
    for c, d in zip(convs, out):
        assert [r for r, _ in c.turns] == [r for r, _ in d.turns]  # same roles, same user turns
        assert [t for r, t in c.turns if r != "assistant"] == [t for r, t in d.turns if r != "assistant"]
        ids = prompt_ids(tok, [{"role": r, "content": t} for r, t in c.turns[:1]])
        x = torch.tensor([ids])
        ref = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=MAX_LEN - len(ids),
                             eos_token_id=eos)[0, len(ids):].tolist()
        assert d.turns[1][1] == tok.decode([t for t in ref if t not in eos], skip_special_tokens=True)
        assert d.turns[1][1] != c.turns[1][1]
    # the chat's second answer was generated after the first REGENERATED answer (or is past max_length)
    assert stats["turns"] >= 3
    assert stats["regenerated"] + stats["kept_past_max_length"] + stats["kept_empty"] == stats["turns"]


def test_sampled_answers_are_seeded_and_cached(verifier, eos, convs, greedy, tmp_path):
    model, tok = verifier
    a = distilled(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", convs[:1], MAX_LEN, "sample", 3,
                  tmp_path)
    again = distilled(None, tok, eos, "smollm2-135m-instruct", "mathinstruct", convs[:1], MAX_LEN, "sample",
                      3, tmp_path)
    assert a == again  # a cache hit needs no verifier
    b, _ = regenerate(model, tok, eos, convs[:1], MAX_LEN, "sample", seed=3)
    assert b[0].turns == a[0].turns  # seeded: the same answer again
    assert greedy[0][0].turns[1] != a[0].turns[1]  # sampled, not the greedy answer
    with pytest.raises(FileNotFoundError, match="no self-distilled cache"):
        distilled(None, tok, eos, "smollm2-135m-instruct", "mathinstruct", convs[:1], MAX_LEN, "sample", 4,
                  tmp_path)


def test_self_distilled_features_keep_the_heldout_slice(verifier, eos, tmp_path):
    model, tok = verifier
    plain = DataSpec(n=2, heldout=1, max_length=MAX_LEN, seed=7)
    dist = DataSpec(n=2, heldout=1, max_length=MAX_LEN, seed=7, self_distill="greedy")
    a = ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", plain, str(tmp_path))
    b = ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", dist, str(tmp_path))
    assert a["heldout"] == b["heldout"] and a["train"] != b["train"] and a["train_ids"] == b["train_ids"]
    train, _ = select_conversations(tok, eos, "mathinstruct", plain)
    answers = distilled(None, tok, eos, "smollm2-135m-instruct", "mathinstruct", [c for c, _ in train],
                        MAX_LEN, "greedy",
                        7, tmp_path)
    ex = next(iter(FeatureStore(str(tmp_path), b["train"]).iter_examples()))
    text = tok.decode(ex.input_ids[ex.loss_mask].tolist(), skip_special_tokens=True)
    assert answers[0].turns[1][1].strip() in text  # the loss positions are the verifier's answer
    with pytest.raises(ValueError, match="self_distill must be null, greedy or sample"):
        DataSpec(n=2, self_distill="beam")
    # self_distill_corpora: a corpus it does not name keeps its original answers (the plain cache, no decode)
    other = DataSpec(n=2, heldout=1, max_length=MAX_LEN, seed=7, self_distill="greedy",
                     self_distill_corpora=["sharegpt"])
    assert other.distills("mathinstruct") is None and other.distills("sharegpt") == "greedy"
    c = ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", other, str(tmp_path))
    assert c["train"] == a["train"]
    named = DataSpec(n=2, heldout=1, max_length=MAX_LEN, seed=7, self_distill="greedy",
                     self_distill_corpora=["mathinstruct"])
    assert ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", named,
                           str(tmp_path))["train"] == b["train"]
    with pytest.raises(ValueError, match="self_distill_corpora names the corpora .* self_distill is null"):
        DataSpec(n=2, self_distill_corpora=["mathinstruct"])
