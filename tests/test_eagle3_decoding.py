"""EAGLE-3 drafters decode losslessly (issue #40): the verifier passes capture the drafter's three
aux layers, the dynamic tree feeds the drafter its own hidden states, and every strategy reproduces
transformers' greedy ``generate`` token for token at T=0, with random drafters (seeds 0/1, whole
vocabulary, as tests/test_lossless.py's) and (make test-full) a drafter trained briefly with the
training-time-test loss (reduced draft vocabulary, accepted tokens > 0).
A composition of EAGLE-3 and EAGLE-2/HASS drafters is refused before anything decodes."""
from __future__ import annotations

import pytest
import torch

from decoding import cpu
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import check_drafter_files, decode_prompt, load_proposers
from decoding.verifier_pass import new_cache, prefill, tree_forward
from drafters.data.templating import benchmark_prompt_ids
from drafters.eagle3 import Eagle3Config, default_aux_layers, init_eagle3, save_eagle3
from drafters.train.eagle3 import ttt_loss
from tests.conftest import VERIFIER
from tests.helpers import eagle3_math_batch
from tests.test_lossless import greedy_reference

pytestmark = pytest.mark.slow
FULL = pytest.mark.full
MAX_NEW = 16
TRAINED_MAX_NEW = 24  # the trained drafter's test (make test-full) counts accepted tokens: longer answers
TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)
N_DRAFT = 1024


def _references(verifier, bench_prompts, max_new: int):
    """GSM8K's first prompt and MT-Bench's (two turns) with the verifier's greedy answers."""
    model, tok = verifier
    return [(p, greedy_reference(model, tok, p, max_new)) for p in (bench_prompts["gsm8k"][0],
                                                                     bench_prompts["mt_bench"][0])]


@pytest.fixture(scope="module")
def references(verifier, bench_prompts):
    return _references(verifier, bench_prompts, MAX_NEW)


@pytest.fixture(scope="module")
def trained_references(verifier, bench_prompts):
    return _references(verifier, bench_prompts, TRAINED_MAX_NEW)


@pytest.fixture(scope="module")
def e3_proposers(verifier, random_eagle3_dirs):
    """Three proposers: the random drafters of seeds 0 and 1, and seed 0 again (depth_adaptive)."""
    return load_proposers(verifier[0], random_eagle3_dirs + random_eagle3_dirs[:1], VERIFIER)


def _decode_all(model, tok, props, references, eos, max_new: int = MAX_NEW, **fields):
    cfg = DecodeConfig(max_new_tokens=max_new, tree=fields.pop("tree", TREE), **fields)
    dec = SpeculativeDecoder(model, props, cfg, eos)
    out = []
    for prompt, ref in references:
        results = decode_prompt(dec, tok, prompt)
        out.append(([res.output_token_ids for _, res, _ in results], ref, results))
    return out


# -- the verifier passes capture the aux layers -------------------------------------------------------
def test_verifier_passes_capture_exactly_the_aux_layers(verifier, bench_prompts):
    """prefill and tree_forward with ``layers`` return the hidden states transformers'
    ``output_hidden_states`` gives at those indices (the last index is the output, post norm),
    concatenated, on the lean pass and on transformers' forward; the hooks are gone afterwards and
    without ``layers`` the features are the last hidden state as before."""
    model, tok = verifier
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    layers = default_aux_layers(model.config.num_hidden_layers) + (model.config.num_hidden_layers,)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    want = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (T, 4H)
    assert cpu.use_lean(model)
    for lean in (True, False):
        with (cpu.lean_disabled(model) if not lean else torch.no_grad()):
            cache = new_cache()
            feats, logits = prefill(model, cache, ids[:-4], layers)
            torch.testing.assert_close(feats, want[:-4], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(logits[0], out.logits[0, -5].float(), atol=1e-3, rtol=1e-3)
            chain = torch.tensor(ids[-3:])  # the last 4 prompt tokens as root + a 3-node chain
            f_tree, _ = tree_forward(model, cache, len(ids) - 4, ids[-4], chain, torch.arange(-1, 2),
                                     torch.arange(1, 4), layers)
            torch.testing.assert_close(f_tree, want[-4:], atol=1e-4, rtol=1e-4)
            plain, _ = prefill(model, new_cache(), ids)
            torch.testing.assert_close(plain, out.hidden_states[-1][0], atol=1e-4, rtol=1e-4)
    assert not any(layer._forward_pre_hooks for layer in model.model.layers)


# -- compositions ----------------------------------------------------------------------------------
def test_mixed_backbones_and_mixed_aux_layers_are_refused_before_decoding(verifier, eos, random_drafter_dirs,
                                                                          random_eagle3_dirs,
                                                                          random_proposers,
                                                                          e3_proposers, tmp_path):
    model, _ = verifier
    with pytest.raises(ValueError, match="cannot compose EAGLE-3 drafters .* with EAGLE-2/HASS drafters"):
        # before any model loads
        check_drafter_files([random_drafter_dirs[0], random_eagle3_dirs[0]], VERIFIER)
    for strategy in ("merged", "confidence"):
        with pytest.raises(ValueError, match="cannot compose EAGLE-3"):
            SpeculativeDecoder(model, [random_proposers[0], e3_proposers[0]], DecodeConfig(strategy=strategy),
                               eos)
    other = Eagle3Config.for_verifier(model, VERIFIER, seed=2, aux_layers=(3, 15, 27))
    odd = str(save_eagle3(init_eagle3(other), tmp_path / "odd"))
    with pytest.raises(ValueError, match="different aux_layers"):
        check_drafter_files([random_eagle3_dirs[0], odd], VERIFIER)
    with pytest.raises(ValueError, match="different aux_layers"):
        SpeculativeDecoder(model, [e3_proposers[0], *load_proposers(model, [odd], VERIFIER)],
                           DecodeConfig(strategy="merged"), eos)
    with pytest.raises(ValueError, match="trained for verifier"):
        load_proposers(model, [random_eagle3_dirs[0]], "another-verifier")
    assert SpeculativeDecoder(model, e3_proposers[:2], DecodeConfig(strategy="merged"), eos).layers == (2, 15,
            27)
    assert SpeculativeDecoder(model, random_proposers, DecodeConfig(strategy="merged"), eos).layers is None


# -- T = 0: every strategy equals generate ---------------------------------------------------------
CASES = {  # id: (drafters, DecodeConfig fields)
    "single": (1, {"strategy": "single"}),
    "confidence": (2, {"strategy": "confidence"}),
    "merged": (2, {"strategy": "merged"}),
    "entropy": (2, {"strategy": "entropy"}),
    "confidence-prompt-node": (2, {"strategy": "confidence", "routing_granularity": "prompt",
                                   "route_score": "node"}),
    "merged-dedup": (2, {"strategy": "merged", "merge_dedup": True}),
    "merged-budget": (2, {"strategy": "merged", "merge_budget": True}),
    "switching": (2, {"strategy": "switching", "switch_after": 1}),
    "switching-merged": (2, {"strategy": "switching", "switch_after": 1, "switch_to": "merged"}),
    "depth_adaptive": (3, {"strategy": "depth_adaptive", "switch_depth": 1}),
}
DEFAULT = ("single", "confidence", "merged")


@pytest.mark.parametrize("case", [c if c in DEFAULT else pytest.param(c, marks=FULL) for c in CASES])
def test_random_eagle3_drafters_match_generate(verifier, eos, e3_proposers, references, case):
    model, tok = verifier
    n, fields = CASES[case]
    for got, ref, _ in _decode_all(model, tok, e3_proposers[:n], references, eos, **fields):
        assert got == ref, f"{case}: eagle3 decoding differs from generate"


@FULL
def test_tree_auto_with_an_eagle3_drafter_matches_generate(verifier, eos, e3_proposers, references,
                                                           monkeypatch):
    from decoding import autotree
    from decoding.autotree import auto_tree, calibration_inputs

    monkeypatch.setattr(autotree, "VERIFY_SIZES", (1, 2, 4, 8, 16))
    model, tok = verifier
    choice = auto_tree(model, e3_proposers[:1], "single", eos, calibration_inputs(tok)[:1], max_new_tokens=8,
                       use_cache=False)
    for got, ref, _ in _decode_all(model, tok, e3_proposers[:1], references, eos, strategy="single",
                                   tree=choice.tree):
        assert got == ref


# -- a briefly trained drafter: accepted tokens, still exact ---------------------------------------
@pytest.fixture(scope="module")
def trained_eagle3(verifier, eos, tmp_path_factory):
    """30 AdamW steps of the training-time-test loss on the real features of three GSM8K/MATH
    conversations (as tests/test_eagle3.py), over a 1024-token draft vocabulary of their targets."""
    model, tok = verifier
    cfg = Eagle3Config.for_verifier(model, VERIFIER, seed=0, draft_vocab_size=N_DRAFT)
    batch = eagle3_math_batch(model, tok, eos, cfg.aux_layers, N_DRAFT)
    drafter = init_eagle3(cfg, batch["vocab"], model.get_output_embeddings().weight)
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3)
    args = (model.get_input_embeddings(), batch["aux"], batch["ids"], batch["logits"], batch["mask"])
    for _ in range(30):
        loss, _ = ttt_loss(drafter, *args)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return str(save_eagle3(drafter, tmp_path_factory.mktemp("trained-e3") / "math"))


# breadth (make test-full): 30 training steps cost ~40 s of the default suite; accepted eagle3 paths at
# T=0 run there in tests/test_eagle3_sampling.py (table drafters: accepted by construction)
@pytest.mark.parametrize("strategy", [pytest.param("single", marks=FULL), pytest.param("merged", marks=FULL)])
def test_trained_eagle3_drafter_is_accepted_and_exact(verifier, eos, trained_eagle3, random_eagle3_dirs,
                                                      trained_references, strategy):
    model, tok = verifier
    props = load_proposers(model, [trained_eagle3] + random_eagle3_dirs[:1], VERIFIER)
    assert props[0].head.size == N_DRAFT
    n = 1 if strategy == "single" else 2
    calls = new = 0
    drafted = []
    dec_fields = {"strategy": strategy}
    for got, ref, results in _decode_all(model, tok, props[:n], trained_references, eos, TRAINED_MAX_NEW,
                                         **dec_fields):
        assert got == ref, f"{strategy}: the trained eagle3 drafter changed the output"
        calls += sum(r.verifier_calls for _, r, _ in results)
        new += sum(r.new_tokens for _, r, _ in results)
        drafted += [s["accepted_owner"] for _, r, _ in results for s in r.steps if s["accepted_depth"]]
    # 30 steps on 3 conversations: 69 tokens in 68 calls on 2026-12-03 (the point is that accepted paths run)
    assert new > calls, f"acceptance length {new / calls:.2f}: no token of the trained drafter was accepted"
    assert 0 in drafted  # accepted paths came from the trained drafter's (reduced-vocabulary) tree
