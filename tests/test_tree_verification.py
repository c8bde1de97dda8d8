"""Merged-tree invariance (the study's Lemma A.2) and temperature-1 losslessness, real verifier."""
from __future__ import annotations

import pytest
import torch

from decoding.accept import accept_sampling, logits_to_probs, sample
from decoding.config import TreeConfig
from decoding.strategies import make_strategy
from decoding.verifier_pass import new_cache, prefill, tree_forward
from drafters.data.templating import benchmark_prompt_ids
from tests.helpers import chain_tree

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scenario(verifier, bench_prompts):
    """A GSM8K prompt, its greedy first token as the root, and the verifier's top tokens after it."""
    model, tok = verifier
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][1], 0, [])
    cache = new_cache()
    feats, logits = prefill(model, cache, ids)
    root = int(logits[-1].argmax())
    return ids, root, feats


def _prefilled(model, ids):
    cache = new_cache()
    feats, _ = prefill(model, cache, ids)
    return cache, feats


def _path(tree, i):
    out = []
    while i >= 0:
        out.append(int(tree.tokens[i]))
        i = int(tree.parents[i])
    return out[::-1]


def test_merged_tree_logits_equal_subtree_and_plain_forward(verifier, random_proposers, scenario):
    model, _ = verifier
    ids, root, feats = scenario
    tokens = torch.tensor(ids + [root])
    cfg = TreeConfig(top_k=3, depth=3, total_tokens=12)
    for p in random_proposers:
        p.reset()
    trees = [p.draft(tokens, feats, cfg, 0.0) for p in random_proposers]
    merged = make_strategy("merged", 2).propose(random_proposers, tokens, feats, cfg, 0.0).tree
    assert merged.size == sum(t.size for t in trees)
    cache, _ = _prefilled(model, ids)
    _, l_merged = tree_forward(model, cache, len(ids), root, merged.tokens, merged.parents, merged.depths)
    offset = 0
    for t in trees:
        cache, _ = _prefilled(model, ids)
        _, l_alone = tree_forward(model, cache, len(ids), root, t.tokens, t.parents, t.depths)
        torch.testing.assert_close(l_merged[1 + offset : 1 + offset + t.size], l_alone[1:], atol=2e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(l_merged[0], l_alone[0], atol=2e-4, rtol=1e-4)
        offset += t.size
    for i in range(0, merged.size, 3):  # a plain forward over prefix + root + the node's path
        seq = torch.tensor([ids + [root] + _path(merged, i)])
        plain = model(seq).logits[0, -1].float()
        torch.testing.assert_close(l_merged[1 + i], plain, atol=2e-4, rtol=1e-4)


def _broken_sampling(tokens, parents, q, generator, **kw):
    """A WRONG rule: on rejection it samples from q again instead of the residual q'."""
    acc = accept_sampling(tokens, parents, q, generator, **kw)
    if acc.path:
        return acc
    return type(acc)([], sample(q[0], generator), acc.rejected)


def _within_bounds(freq, p, n, sigmas=5.0):
    """Every token with p >= 0.005, and the rest pooled, within `sigmas` binomial std devs."""
    big = p >= 0.005
    f = torch.cat([freq[big], freq[~big].sum(0, keepdim=True)])
    e = torch.cat([p[big], p[~big].sum(0, keepdim=True)])
    sd = (e * (1 - e) / n).sqrt().clamp_min(1e-4)
    return bool(((f - e).abs() <= sigmas * sd).all())


# by default the two merged trees; in make test-full: single (one chain, a sub-case of both, and end to end
# in test_sampling_e2e.py), routing (one drafter's tree, as single), merged (merged-dedup's with duplicates)
@pytest.mark.parametrize("strategy", [*[pytest.param(s, marks=pytest.mark.full)
                                        for s in ("single", "confidence", "entropy", "merged")],
                                      "merged-dedup", "merged-budget"])
def test_temperature_one_matches_verifier_sampling(verifier, scenario, strategy):
    """N = 20,000 speculative steps from one state. The first committed token's empirical
    distribution matches the verifier's own T=1 distribution at the root (5-sigma binomial bound
    per token with q >= 0.005, the rest pooled; a false alarm has probability < 1e-4), and so does
    the second token given the most likely first. The same check rejects a broken rule."""
    model, _ = verifier
    ids, root, feats = scenario
    q_root = logits_to_probs(model(torch.tensor([ids + [root]])).logits[0, -1], 1.0)
    top = q_root.topk(4).indices.tolist()
    t1 = top[0]
    q_t1 = logits_to_probs(model(torch.tensor([ids + [root, t1]])).logits[0, -1], 1.0)
    c1 = int(q_t1.argmax())

    class Scripted:
        def __init__(self, paths, owner):
            self.paths, self.owner, self.name = paths, owner, f"scripted{owner}"

        def reset(self):
            pass

        def draft(self, tokens, features, cfg, temperature):
            return chain_tree(self.paths, self.owner)

    props = [Scripted([[top[2]], [t1, c1]], 0), Scripted([[t1, c1], [top[1]]], 1)]
    n_props = 1 if strategy == "single" else 2
    tokens = torch.tensor(ids + [root])
    name, dedup, budget = strategy.split("-")[0], strategy.endswith("dedup"), strategy.endswith("budget")
    tree = make_strategy(name, n_props, dedup=dedup, budget=budget).propose(
        props[:n_props], tokens, feats, TreeConfig(2, 2, 4 if budget else 8), 1.0).tree
    if budget:
        assert tree.size == 3  # the union reranked to total_tokens - 1 nodes
    cache, _ = _prefilled(model, ids)
    _, logits = tree_forward(model, cache, len(ids), root, tree.tokens, tree.parents, tree.depths)
    q = logits_to_probs(logits, 1.0)  # (N+1, V)
    n = 20_000
    for rule, should_pass in ((accept_sampling, True), (_broken_sampling, False)):
        g = torch.Generator().manual_seed(123)
        first = torch.zeros_like(q_root)
        second = torch.zeros_like(q_root)
        for _ in range(n):
            acc = rule(tree.tokens, tree.parents, q, g)
            out = [int(tree.tokens[i - 1]) for i in acc.path] + [acc.next_token]
            first[out[0]] += 1
            if out[0] == t1 and len(out) > 1:  # t1 accepted from the tree: next token is drawn at t1
                second[out[1]] += 1
        n_t1 = int(second.sum())
        ok = _within_bounds(first / n, q_root, n) and _within_bounds(second / n_t1, q_t1, n_t1)
        assert ok == should_pass, (f"{rule.__name__}: first-token check "
                                   f"{'failed' if should_pass else 'passed'}")
