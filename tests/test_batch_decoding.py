"""Verification batched across prompts (decoding/batch.py, decoding/batch_pass.py): one verifier pass
for several prompts' trees gives each prompt what its own pass gives (logits and cache rows to
rounding), so decoding stays lossless: transformers' greedy tokens at T=0 here, the verifier's
distribution at T=1 in tests/test_sampling_e2e.py (its seeds are decoded 8 at a time)."""
from __future__ import annotations

import pytest
import torch

from decoding.batch import add_baselines, decode_prompts, row_decoders
from decoding.batch_pass import forward_many
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder, VerifyRequest
from decoding.tree import DraftTree
from decoding.verifier_pass import new_cache, prefill
from drafters.data.templating import benchmark_prompt_ids
from tests.helpers import OracleProposer
from tests.test_lossless import greedy_reference

pytestmark = pytest.mark.slow
MAX_NEW = 16
TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)


@pytest.fixture(scope="module")
def prompts(bench_prompts):
    """Five real prompts of every benchmark: single-turn ones and a two-turn MT-Bench one."""
    return [bench_prompts["gsm8k"][0], bench_prompts["mt_bench"][0], bench_prompts["math500"][0],
            bench_prompts["svamp"][0], bench_prompts["gsm8k"][1]]


@pytest.fixture(scope="module")
def references(verifier, prompts):
    model, tok = verifier
    return [greedy_reference(model, tok, p, MAX_NEW) for p in prompts]


def _outputs(results) -> list[list[list[int]]]:
    return [[res.output_token_ids for _, res, _ in r] for r in results]


def _tree(tokens, parents, depths) -> DraftTree:
    """A tree of given tokens and shape (scores are not read by the verifier pass)."""
    n = len(tokens)
    z, zi = torch.zeros(n), torch.zeros(n, dtype=torch.long)
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     torch.tensor(depths, dtype=torch.long), z, z.clone(), zi, zi.clone())


def test_one_pass_verifies_every_prompt_as_its_own_pass(verifier):
    """Three prompts of different lengths, a chain, a branching tree and a root alone: one packed pass
    (one embedding call) gives each prompt the logits and cache rows its own pass gives."""
    model, tok = verifier
    texts = ["The capital of France is", "Two plus two equals four, and three plus three", "Hi there, friend"]
    trees = [_tree([1000, 1001, 1002], [-1, 0, 1], [1, 2, 3]),
             _tree([5, 6, 7, 8], [-1, -1, 0, 1], [1, 1, 2, 2]), _tree([], [], [])]
    alone, packed = [], []
    for ids in (tok(t)["input_ids"] for t in texts):
        for out in (alone, packed):
            cache = new_cache()
            prefill(model, cache, ids[:-1])
            out.append((cache, len(ids) - 1, torch.tensor([ids[-1]])))
    want = [VerifyRequest(c, n, r, t).run(model, None) for (c, n, r), t in zip(alone, trees)]
    calls = []
    hook = model.model.embed_tokens.register_forward_pre_hook(lambda m, a: calls.append(tuple(a[0].shape)))
    try:
        got = forward_many(model, [VerifyRequest(c, n, r, t) for (c, n, r), t in zip(packed, trees)])
    finally:
        hook.remove()
    assert calls == [(1, 4 + 5 + 1)]
    for (fw, lw), (fg, lg), (ca, _, _), (cp, _, _) in zip(want, got, alone, packed):
        torch.testing.assert_close(lg, lw, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(fg, fw, atol=1e-4, rtol=1e-4)
        assert torch.equal(lg.argmax(-1), lw.argmax(-1))
        for a, b in zip(ca.layers, cp.layers):
            torch.testing.assert_close(b.keys, a.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(b.values, a.values, atol=1e-4, rtol=1e-4)


# the strategy runs per row as it runs alone: merged and hedge are breadth (make test-full)
@pytest.mark.parametrize("strategy,n", [("single", 1), pytest.param("merged", 2, marks=pytest.mark.full),
                                        pytest.param("hedge", 2, marks=pytest.mark.full)])
def test_batched_prompts_match_generate(verifier, eos, random_proposers, prompts, references, strategy, n):
    """Five prompts (one of two turns) on three rows: rows are refilled as prompts end, and every
    prompt's every turn is transformers' greedy output."""
    model, tok = verifier
    cfg = DecodeConfig(strategy=strategy, max_new_tokens=MAX_NEW, tree=TREE)
    rows = row_decoders(SpeculativeDecoder(model, random_proposers[:n], cfg, eos), 3)
    assert len({id(d.proposers[0]) for d in rows}) == 3  # each row drafts with its own state
    assert all(d.proposers[0].drafter is random_proposers[0].drafter for d in rows)  # and the same weights
    done = []
    got = decode_prompts(rows, tok, prompts, on_done=lambda i, r: done.append(i))
    assert _outputs(got) == references, strategy
    assert sorted(done) == list(range(len(prompts)))


def test_rows_with_long_accepted_paths_and_uneven_lengths(verifier, eos, prompts, references):
    """Each row an oracle for its own prompt: long accepted paths (through non-first children) commit
    different numbers of tokens per row at every step, and every row stays exact."""
    model, tok = verifier
    single = [(p, ref) for p, ref in zip(prompts, references) if len(p.turns) == 1]
    shapes = [TreeConfig(3, 5, 16), TreeConfig(2, 3, 8), TreeConfig(3, 7, 20), TreeConfig(1, 2, 3)]
    rows = [SpeculativeDecoder(model, [OracleProposer(len(benchmark_prompt_ids(tok, p, 0, [])), ref[0])],
                               DecodeConfig(strategy="single", max_new_tokens=MAX_NEW, tree=shape), eos)
            for (p, ref), shape in zip(single, shapes)]
    got = decode_prompts(rows, tok, [p for p, _ in single])
    assert _outputs(got) == [ref for _, ref in single]
    assert all(r[0][1].acceptance_length > 2.5 for r in got)
    assert len({r[0][1].verifier_calls for r in got}) > 1  # the rows ended at different steps


def test_the_baseline_is_timed_after_the_batch_on_each_turns_input(verifier, eos, random_proposers, prompts):
    model, tok = verifier
    cfg = DecodeConfig(strategy="single", max_new_tokens=6, tree=TREE)
    got = decode_prompts(row_decoders(SpeculativeDecoder(model, random_proposers[:1], cfg, eos), 2), tok,
                         prompts[:2])
    inputs = []
    add_baselines(got[1], tok, prompts[1], lambda ids: inputs.append(ids) or ([0], 0.5))
    assert inputs == [benchmark_prompt_ids(tok, prompts[1], t, [x[2] for x in got[1][:t]]) for t in range(2)]
    assert [res.baseline for _, res, _ in got[1]] == [([0], 0.5)] * 2


def test_eagle3_features_are_tapped_per_prompt(verifier, eos, random_eagle3_dirs, prompts, references):
    """EAGLE-3 drafters read three verifier layers: the packed pass splits each prompt's taps."""
    from decoding.runner import load_proposers
    from tests.conftest import VERIFIER

    model, tok = verifier
    props = load_proposers(model, random_eagle3_dirs[:1], VERIFIER)
    cfg = DecodeConfig(strategy="single", max_new_tokens=MAX_NEW, tree=TREE)
    got = decode_prompts(row_decoders(SpeculativeDecoder(model, props, cfg, eos), 2), tok, prompts[2:4])
    assert _outputs(got) == references[2:4]


def test_bad_row_counts_and_mixed_decoders_are_refused(verifier, eos, random_proposers, random_eagle3_dirs):
    from decoding.runner import load_proposers
    from tests.conftest import VERIFIER

    model, tok = verifier
    dec = SpeculativeDecoder(model, random_proposers[:1], DecodeConfig(), eos)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="rows must be a positive int"):
            row_decoders(dec, bad)
    e3_props = load_proposers(model, random_eagle3_dirs[:1], VERIFIER)
    e3 = SpeculativeDecoder(model, e3_props, DecodeConfig(), eos)
    with pytest.raises(ValueError, match="same verifier features"):
        decode_prompts([dec, e3], tok, [])


@pytest.mark.parametrize("backbone", ["eagle2", "eagle3"])
def test_one_drafter_pass_drafts_for_every_prompt(verifier, random_proposers, random_eagle3_dirs, backbone):
    """Three prompts' drafter passes (a catch-up of 5 pairs, a tree level of 3 nodes, one pair) through
    ONE packed pass: each gets the output and cache rows its own pass gives (EAGLE-2/HASS's layer, and
    EAGLE-3's with its input norms)."""
    from decoding.rounds import LayerCall, run_round
    from decoding.runner import load_proposers
    from drafters.model import KVCache, causal_mask
    from tests.conftest import VERIFIER

    p = random_proposers[0] if backbone == "eagle2" else load_proposers(verifier[0], random_eagle3_dirs[:1],
                                                                          VERIFIER)[0]
    h = p.drafter.config.hidden_size
    gen = torch.Generator().manual_seed(0)

    def calls():
        out = []
        level = torch.tensor([[1] * 7 + [1, 0, 0], [1] * 7 + [1, 1, 0], [1] * 7 + [0, 0, 1]]).bool()
        for past, t, mask in ((0, 5, causal_mask(5)), (7, 3, level), (4, 1, causal_mask(1, 4))):
            cache = KVCache()
            if past:
                p.drafter(torch.randn(1, past, h, generator=gen), torch.randn(1, past, h, generator=gen),
                          torch.arange(past), causal_mask(past), cache=cache)
            emb, ctx = torch.randn(t, h, generator=gen), torch.randn(t, h, generator=gen)
            out.append((p, LayerCall(p.drafter, emb, ctx, torch.arange(past, past + t), mask, cache)))
        return out

    gen.manual_seed(0)
    alone = calls()
    want = [c.run() for _, c in alone]
    gen.manual_seed(0)
    packed = calls()
    seen = []
    q = p.drafter.layer.q_proj
    hook = q.register_forward_hook(lambda m, a, o: seen.append(tuple(a[0].shape)))
    try:
        got = run_round(packed)
    finally:
        hook.remove()
    assert seen == [(1, 9, q.in_features)]  # one pass over every prompt's rows
    for g, w, (_, a), (_, b) in zip(got, want, alone, packed):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.cache.k, a.cache.k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.cache.v, a.cache.v, atol=1e-5, rtol=1e-5)


def test_rows_draft_in_lock_step_as_they_draft_alone(verifier, eos, random_proposers, prompts, references):
    """Three turns on three rows drafting together: one drafter pass per level for every row (a third of
    the passes of rows drafting one by one), the same steps as rows drafting one by one (as alone), and
    transformers' greedy tokens."""
    from decoding.batch import decode_turns

    model, tok = verifier
    cfg = DecodeConfig(strategy="single", max_new_tokens=MAX_NEW, tree=TREE)
    dec = SpeculativeDecoder(model, random_proposers[:1], cfg, eos)
    inputs = [(benchmark_prompt_ids(tok, p, 0, []), f"{p.id}/0") for p in prompts[:3] if len(p.turns) == 1]
    inputs += [(benchmark_prompt_ids(tok, prompts[1], 0, []), "mt/0")]
    fc, runs = random_proposers[0].drafter.fc, {}
    for together in (False, True):
        seen = []
        hook = fc.register_forward_hook(lambda m, a, o, seen=seen: seen.append(1))
        try:
            runs[together] = decode_turns(row_decoders(dec, len(inputs)), inputs, draft_rows=together)
        finally:
            hook.remove()
        runs[together, "passes"] = len(seen)
    refs = [references[0][0], references[2][0], references[1][0]]
    for got in (runs[False], runs[True]):
        assert [r.output_token_ids for r in got] == refs
    assert [[s["accepted_depth"] for s in r.steps] for r in runs[True]] == \
        [[s["accepted_depth"] for s in r.steps] for r in runs[False]]
    assert runs[True, "passes"] * 2 < runs[False, "passes"]
