"""Temperature 0: every strategy reproduces transformers' greedy `generate` token for token."""
from __future__ import annotations

import pytest
import torch

from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import decode_prompt
from drafters.data.templating import benchmark_prompt_ids
from tests.helpers import ConstantProposer, OracleProposer

pytestmark = pytest.mark.slow
MAX_NEW = 16
TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)


def greedy_reference(model, tok, prompt, max_new=MAX_NEW):
    """transformers' own greedy decoding, turn by turn (turn 2 sees turn 1's answer)."""
    answers, outs = [], []
    for turn in range(len(prompt.turns)):
        ids = benchmark_prompt_ids(tok, prompt, turn, answers)
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)[0,
                len(ids):].tolist()
        outs.append(out)
        answers.append(tok.decode(out, skip_special_tokens=True))
    return outs


@pytest.fixture(scope="module")
def references(verifier, bench_prompts):
    model, tok = verifier
    prompts = [bench_prompts[b][0] for b in ("gsm8k", "math500", "svamp", "mt_bench")]
    return [(p, greedy_reference(model, tok, p)) for p in prompts]


CASES = [("autoregressive", 0, "step", False), ("single", 1, "step", False)] + [
    (s, 2, g, False) for s in ("confidence", "entropy") for g in ("step", "prompt")
] + [("merged", 2, "step", False), ("merged", 2, "step", True), ("hedge", 2, "step", False)]
FULL = pytest.mark.full  # breadth: make test-full runs it (tests/conftest.py)


def _breadth(cases, full):
    """``cases`` with those in ``full`` marked: every strategy stays in the default suite."""
    return [pytest.param(*c, marks=FULL) if c in full else c for c in cases]


# routing (confidence, entropy) against generate by default: tests/test_strategies_next.py (node score
# per prompt, entropy per turn over 4 drafters) and the smoke grid's T=0 cells (step, path score)
# (the dedup union: the oracle and reduced-vocabulary tests below decode it by default)
@pytest.mark.parametrize("strategy,n,granularity,dedup", _breadth(CASES, [c for c in CASES if c[2] == "prompt"
                                                                          or c[0] in ("confidence",
                                                                                  "entropy")]
                                                                  + [("merged", 2, "step", True)]))
def test_random_drafters_match_generate(verifier, eos, random_proposers, references, strategy, n, granularity,
                                        dedup):
    model, tok = verifier
    cfg = DecodeConfig(strategy=strategy, max_new_tokens=MAX_NEW, routing_granularity=granularity,
                       merge_dedup=dedup, tree=TREE)
    dec = SpeculativeDecoder(model, random_proposers[:n], cfg, eos)
    for prompt, ref in references:
        got = [res.output_token_ids for _, res, _ in decode_prompt(dec, tok, prompt)]
        assert got == ref, f"{strategy}/{granularity} differs from generate on {prompt.benchmark} {prompt.id}"


@pytest.mark.parametrize("strategy", ["single", pytest.param("confidence", marks=FULL),
                                      pytest.param("entropy", marks=FULL), "merged", pytest.param("hedge",
                                              marks=FULL)])
def test_adversarial_drafter_is_lossless(verifier, eos, random_proposers, references, strategy):
    model, tok = verifier
    bad = [ConstantProposer(1000, 0), ConstantProposer(2000, 1)]
    props = bad[:1] if strategy == "single" else [bad[0], random_proposers[1]]
    dec = SpeculativeDecoder(model, props, DecodeConfig(strategy=strategy, max_new_tokens=MAX_NEW, tree=TREE),
                             eos)
    for prompt, ref in references[:3]:
        got = [res.output_token_ids for _, res, _ in decode_prompt(dec, tok, prompt)]
        assert got == ref


@pytest.mark.parametrize("strategy,dedup", [("single", False), ("merged", False), ("merged", True),
                                            ("confidence", False)])
def test_oracle_drafter_deep_acceptance(verifier, eos, random_proposers, references, strategy, dedup):
    """A drafter that knows the answer: long accepted paths through a non-first child, still exact."""
    model, tok = verifier
    prompt, ref = references[0]
    ids = benchmark_prompt_ids(tok, prompt, 0, [])
    oracle = OracleProposer(len(ids), ref[0], owner=1 if strategy != "single" else 0)
    props = [oracle] if strategy == "single" else [random_proposers[0], oracle]
    cfg = DecodeConfig(strategy=strategy, max_new_tokens=MAX_NEW, merge_dedup=dedup, tree=TreeConfig(3, 5,
            16))
    res = SpeculativeDecoder(model, props, cfg, eos).generate(ids, seed_key=prompt.id)
    assert res.output_token_ids == ref[0]
    assert res.acceptance_length > 3.0, res.acceptance_length
    if strategy == "merged":  # the accepted path came from the oracle's subtree
        assert all(s["accepted_owner"] == 1 for s in res.steps if s["accepted_depth"] > 0)


def test_kv_cache_equals_fresh_prefill(verifier, eos, references):
    """After many steps with gaps compacted away, the cache equals a fresh prefill."""
    from decoding.verifier_pass import new_cache, prefill

    model, tok = verifier
    prompt, ref = references[1]
    ids = benchmark_prompt_ids(tok, prompt, 0, [])
    dec = SpeculativeDecoder(model, [OracleProposer(len(ids), ref[0])], DecodeConfig(strategy="single",
            max_new_tokens=MAX_NEW, tree=TreeConfig(3, 3, 12)), eos)
    res = dec.generate(ids)
    assert res.verifier_calls >= 4
    committed = ids + res.output_token_ids
    cache = dec.last_cache
    n = cache.get_seq_length()
    assert n == len(committed) - 1  # every committed token but the last (the next root)
    fresh = new_cache()
    prefill(model, fresh, committed[:n])
    for a, b in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=2e-4, rtol=1e-3)
        torch.testing.assert_close(a.values, b.values, atol=2e-4, rtol=1e-3)


def test_prompt_cache_reuses_the_prefill_and_changes_nothing(verifier, eos, random_proposers, references):
    """A repeated prompt reuses a copy of its prefill (no forward over the prompt); every result, at T=0
    and seeded T=1, equals a decoder without the cache, and a different prompt is prefilled afresh."""
    model, tok = verifier
    (p0, _), (p1, _) = references[0], references[1]
    a, b = benchmark_prompt_ids(tok, p0, 0, []), benchmark_prompt_ids(tok, p1, 0, [])
    assert min(len(a), len(b)) > 2 * TREE.total_tokens + 1 and a != b
    rows = []
    # rows fed per verifier pass, seen at the embedding (the lean pass and transformers' both call it
    # with (1, T) ids; the drafters share the module with 1-D ids)
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda m, args: rows.append(args[0].shape[1]) if args[0].dim() == 2 else None)
    try:
        for t in (0.0, 1.0):
            cfg = DecodeConfig(strategy="merged", temperature=t, max_new_tokens=6, tree=TREE)
            plain = SpeculativeDecoder(model, random_proposers, cfg, eos)
            cached = SpeculativeDecoder(model, random_proposers, cfg, eos, prompt_cache=True)
            # T=0: a repeat, a new prompt and the first again; T=1: a second seed on the cached prompt
            runs = (((a, "x", True), (a, "y", False), (b, "x", True), (a, "x", True)) if t == 0.0
                    else ((a, "x", True), (a, "y", False)))
            for ids, key, prefills in runs:
                want = plain.generate(ids, seed_key=key).output_token_ids
                rows.clear()
                got = cached.generate(ids, seed_key=key)
                assert got.output_token_ids == want, (t, key)
                assert (rows[0] == len(ids)) == prefills, (t, key, rows)  # a tree pass feeds <= 21 rows
    finally:
        hook.remove()


@pytest.fixture(scope="module")
def reduced_vocab_proposers(verifier, references, tmp_path_factory):
    """Two random drafters (seeds 0/1, shared vocabulary) over a 512-token draft vocabulary that
    holds the reference outputs' tokens, so drafts go through the d2t map into the verifier's ids."""
    from decoding.runner import load_proposers
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from tests.conftest import VERIFIER

    model, _ = verifier
    used = sorted({t for _, ref in references for turn in ref for t in turn})
    fill = [i for i in range(600) if i not in set(used)][: 512 - len(used)]
    ids = torch.tensor(sorted(set(used) | set(fill)))
    root = tmp_path_factory.mktemp("vocab-drafters")
    paths = []
    for seed in (0, 1):
        cfg = DrafterConfig.for_verifier(model, VERIFIER, "hass", seed=seed,
                                         draft_vocab_size=int(ids.shape[0]))
        paths.append(str(save_checkpoint(init_drafter(cfg, ids), root / f"v{seed}")))
    props = load_proposers(model, paths, VERIFIER)
    assert all(p.head.size == 512 and torch.equal(p.head.ids, ids) for p in props)
    return props, ids


@pytest.mark.parametrize("strategy,n,granularity,dedup", _breadth([c for c in CASES[1:] if c[2] == "step"],
                                                                  [c for c in CASES if c[0] in ("confidence",
                                                                          "entropy",
                                                                                                "hedge")]
                                                                  + [("merged", 2, "step", False)]))
def test_reduced_vocabulary_drafters_match_generate(verifier, eos, reduced_vocab_proposers, references,
                                                    strategy, n,
                                                    granularity, dedup):
    model, tok = verifier
    props, ids = reduced_vocab_proposers
    cfg = DecodeConfig(strategy=strategy, max_new_tokens=MAX_NEW, routing_granularity=granularity,
                       merge_dedup=dedup, tree=TREE)
    dec = SpeculativeDecoder(model, props[:n], cfg, eos)
    seen = []
    dec.observer = lambda tree, target, prop: seen.append(tree.tokens)
    for prompt, ref in (references[0], references[-1]):  # GSM8K and both MT-Bench turns
        got = [res.output_token_ids for _, res, _ in decode_prompt(dec, tok, prompt)]
        assert got == ref, f"{strategy}/{granularity} with a reduced vocabulary differs from generate"
    drafted = torch.cat(seen)
    # every draft token is a verifier id in the vocab
    assert drafted.numel() and bool(torch.isin(drafted, ids).all())


def test_drafting_in_lock_step_stacks_the_shared_head(verifier, bench_prompts, reduced_vocab_proposers):
    """Routing and merged trees draft every drafter in lock step: drafters of one vocabulary share one
    head, which runs once per level for all of them, and each tree equals the tree drafted alone."""
    from decoding.drafting import draft_together
    from decoding.verifier_pass import new_cache, prefill

    model, tok = verifier
    props, _ = reduced_vocab_proposers
    assert props[0].head is props[1].head  # one (N, H) weight slice for the backbone's drafters
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    feats, _ = prefill(model, new_cache(), ids)
    toks = torch.tensor(ids)
    alone = []
    for p in props:
        p.reset()
        alone.append(p.draft(toks, feats[:-1], TREE, 0.0))
    calls = []
    hook = props[0].head.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))
    try:
        for p in props:
            p.reset()
        together = draft_together(props, toks, feats[:-1], TREE, 0.0)
    finally:
        hook.remove()
    assert calls == [2] + [2 * TREE.top_k] * (TREE.depth - 1)  # one matmul per level, both drafters' rows
    for a, b in zip(alone, together):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
        torch.testing.assert_close(a.path_logp, b.path_logp, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_steps_record_the_path_scores_taps_router_reads(verifier, eos, random_proposers, references, drafter):
    """Each step records V (the path score from the root) of every accepted node and the sum of V over
    every other drafted node, with their counts: V of the accepted nodes is the running product of their
    c(v), and accepted + off-path V add up to the whole tree's (read here off the step's tree)."""
    model, tok = verifier
    prompt, ref = references[0]
    ids = benchmark_prompt_ids(tok, prompt, 0, [])
    prop = OracleProposer(len(ids), ref[0]) if drafter == "oracle" else random_proposers[0]
    dec = SpeculativeDecoder(model, [prop], DecodeConfig(strategy="single", max_new_tokens=MAX_NEW,
                                                         tree=TreeConfig(3, 5, 16)), eos)
    totals = []
    dec.observer = lambda tree, argmax, p: totals.append(float(tree.confidence.double().sum()))
    res = dec.generate(ids, seed_key=prompt.id)
    assert res.output_token_ids == ref[0] and len(totals) == len(res.steps)
    deep = 0
    for s, total in zip(res.steps, totals):
        acc = s["accepted_path_confidence"]
        assert len(acc) == s["accepted_depth"] and s["offpath_nodes"] == s["tree_size"] - s["accepted_depth"]
        assert acc == pytest.approx(torch.tensor(s["accepted_draft_confidence"]).double().cumprod(0).tolist(),
                                    rel=1e-5)
        assert sum(acc) + s["offpath_confidence_sum"] == pytest.approx(total, rel=1e-6)
        deep += len(acc) >= 2
    assert deep or drafter == "random"  # the oracle's paths run deep: V is a product there, not c(v)
