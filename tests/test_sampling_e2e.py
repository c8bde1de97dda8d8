"""Temperature 1, end to end: the decoder samples the verifier's own distribution.

For every strategy (single, confidence, entropy, merged, merged-dedup, budget-matched merged) the
first two generated tokens of a real MT-Bench prompt (48 tokens; its first token is 89% likely),
over 200 seeds, are compared with the exact joint p(t1) p(t2 | t1) computed from the verifier:
Pearson's chi-square over the pairs with expected count >= 8 (the rest pooled) must stay under
its upper 1e-5 quantile (the seeds are fixed, so the outcome is too). The first token comes from
the prefill, the second from the first speculative step, whose tree holds the verifier's most
likely child of t1 and that child's best child (drafter 0), plus the second most likely child
(drafter 1), so acceptance, rejection and the residual rule are all exercised. The same bound
catches a broken rule (on rejection, resample from the verifier's distribution instead of the
residual): measured chi-square 0.5 for the real rule, 35.1 for the broken one, bound 24.7 (at
400 seeds: 2.5, 68.6 and 24.7; 200 keep the power at half the time). The seeds are decoded 8 at a
time with one verifier pass for their trees (decoding/batch.py), as an eval actor with
resources.eval.verify_batch 8 would; `generate` one prompt at a time is the same loop with each pass
alone (tests/test_eagle3_sampling.py samples through it).
"""
from __future__ import annotations

import pytest
import torch

import decoding.engine as engine
from decoding.accept import accept_sampling, logits_to_probs, sample
from decoding.batch import decode_turns
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.tree import chain_tree
from drafters.data.sources import load_benchmark
from drafters.data.templating import benchmark_prompt_ids

pytestmark = pytest.mark.slow
N = 200
ROWS = 8  # seeds decoded at once


class TableProposer:
    """Drafts, after t1, the chain (c1, g1) of the verifier's most likely child of t1 and its best
    child (looked up in a table computed once); owner 1 adds the second most likely child c2."""

    def __init__(self, table: dict, owner: int):
        self.table, self.owner, self.name = table, owner, f"table{owner}"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        c1, g1, c2 = self.table.get(int(tokens[-1]), (1000, 1001, 1002))
        paths = [[c1, g1]] if self.owner == 0 else [[c2], [c1, g1]]
        return chain_tree(paths, self.owner)


@pytest.fixture(scope="module")
def joint(verifier):
    return exact_joint(*verifier)


def exact_joint(model, tok):
    """ids, the exact joint {(t1, t2): p} over the likely first tokens, and the proposers' table."""
    ids = benchmark_prompt_ids(tok, load_benchmark("mt_bench")[0][63], 0, [])
    with torch.no_grad():
        p1 = logits_to_probs(model(torch.tensor([ids])).logits[0, -1], 1.0)
        firsts = [t for t in p1.topk(8).indices.tolist() if p1[t] >= 0.01]
        p2 = logits_to_probs(model(torch.tensor([ids + [t] for t in firsts])).logits[:, -1], 1.0)  # (M, V)
        top2 = p2.topk(2).indices
        p3 = logits_to_probs(model(torch.tensor([ids + [t, int(c[0])] for t, c in zip(firsts,
                top2)])).logits[:, -1], 1.0)
    table = {t: (int(top2[i, 0]), int(p3[i].argmax()), int(top2[i, 1])) for i, t in enumerate(firsts)}
    pairs = {(t, c): float(p1[t] * p2[i, c]) for i, t in enumerate(firsts)
             for c in p2[i].topk(6).indices.tolist()}
    return ids, pairs, table


def chi2(outs: list[tuple[int, int]], pairs: dict) -> tuple[float, float]:
    """Pearson's statistic over the bins (pairs with N p >= 8, the rest pooled) and its upper
    1e-5 critical value (Wilson-Hilferty approximation of the chi-square quantile)."""
    bins = [k for k, p in pairs.items() if N * p >= 8]
    counts = {k: 0 for k in bins}
    for o in outs:
        if o in counts:
            counts[o] += 1
    probs = [pairs[k] for k in bins] + [1.0 - sum(pairs[k] for k in bins)]
    obs = [counts[k] for k in bins] + [N - sum(counts.values())]
    stat = sum((o - N * p) ** 2 / (N * p) for o, p in zip(obs, probs))
    df = len(probs) - 1
    return stat, df * (1 - 2 / (9 * df) + 4.265 * (2 / (9 * df)) ** 0.5) ** 3


def _broken_sampling(tokens, parents, q, generator, **kw):
    """A WRONG rule: on rejection of every child, sample from q at the root instead of the residual."""
    acc = accept_sampling(tokens, parents, q, generator, **kw)
    return acc if acc.path else type(acc)([], sample(q[0], generator), acc.rejected)


def _sample(model, eos, table, ids, strategy, n_props):
    name, dedup, budget = strategy.split("-")[0], strategy.endswith("dedup"), strategy.endswith("budget")
    cfg = DecodeConfig(strategy=name, temperature=1.0, max_new_tokens=2, merge_dedup=dedup,
                       merge_budget=budget,
                       tree=TreeConfig(2, 2, 4 if budget else 8))
    # ROWS seeds at a time, one verifier pass for their trees (decoding/batch.py; lossless as one at a
    # time, tests/test_batch_decoding.py); each row reuses its prefill of the prompt (prompt_cache), so
    # the runs differ only in their samples
    rows = [SpeculativeDecoder(model, [TableProposer(table, i) for i in range(n_props)], cfg, eos,
                               prompt_cache=True) for _ in range(ROWS)]
    return [tuple(r.output_token_ids[:2]) for r in decode_turns(rows, [(ids, f"s{i}") for i in range(N)])]


# by default one tree of each kind: a chain (single), a router's pick (confidence), the union
# (merged) and the union pruned to a budget; entropy routing and the dedup union in make test-full
@pytest.mark.parametrize("strategy", ["single", "confidence", pytest.param("entropy", marks=pytest.mark.full),
                                      "merged", pytest.param("merged-dedup", marks=pytest.mark.full),
                                      "merged-budget"])
def test_generate_samples_the_verifier_distribution(verifier, eos, joint, strategy):
    model, _ = verifier
    ids, pairs, table = joint
    stat, bound = chi2(_sample(model, eos, table, ids, strategy, 1 if strategy == "single" else 2), pairs)
    assert stat <= bound, (f"{strategy}: chi-square {stat:.1f} > {bound:.1f} "
                           "against the verifier's joint distribution")


def test_the_same_bound_catches_a_broken_rule(verifier, eos, joint, monkeypatch):
    model, _ = verifier
    ids, pairs, table = joint
    monkeypatch.setattr(engine, "accept_sampling", _broken_sampling)
    stat, bound = chi2(_sample(model, eos, table, ids, "single", 1), pairs)
    assert stat > bound, (f"the broken rule stayed under the bound ({stat:.1f} <= {bound:.1f}): "
                          "the test has no power")
