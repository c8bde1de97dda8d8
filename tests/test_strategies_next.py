"""The study's routers as its text and code ran them, and its two proposed next experiments.

- ``confidence`` scored by mean node confidence c(v) (``score="node"``), decided once per prompt;
- ``entropy`` per prompt turn over four heads (the study's code);
- ``switching``: acceptance-history switching between two specialists (or to merged trees);
- ``depth_adaptive``: the mixed drafter's shallow levels, the chosen specialist's deep ones.

Unit tests drive the pure functions (``switch_rule``, ``match_paths``, ``graft_trees``) and the
strategies with scripted trees; the slow tests run the real verifier on real prompts: T=0 equals
transformers' greedy ``generate`` token for token, T=1 samples the verifier's own distribution
(the chi-square check of tests/test_sampling_e2e.py, over two or three tokens).
"""
from __future__ import annotations

import pytest
import torch

from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import decode_prompt, load_proposers
from decoding.strategies import STAT, make_strategy, switch_rule
from decoding.tree import DraftTree, chain_tree, graft_trees, match_paths
from drafters.data.templating import benchmark_prompt_ids
from tests.helpers import OracleProposer
from tests.test_lossless import greedy_reference
from tests.test_sampling_e2e import N, TableProposer, chi2, exact_joint

MAX_NEW = 16
TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)


# -- pure functions ------------------------------------------------------------------------------
def test_switch_rule_counts_empty_steps_and_resets():
    fails, out = 0, []
    for depth in (0, 0, 2, 0, 0, 0, 1, 0):
        fails, switch = switch_rule(fails, depth, 3)
        out.append((fails, switch))
    assert out == [(1, False), (2, False), (0, False), (1, False), (2, False), (0, True), (0, False), (1,
            False)]
    assert switch_rule(0, 0, 1) == (0, True)  # k = 1: every empty step switches


def _tree(paths, owner, logp=None):
    t = chain_tree(paths, owner)
    if logp is not None:
        t.path_logp[:] = torch.tensor(logp)
    return t


def test_node_confidence_is_the_conditional_probability():
    t = _tree([[1, 2, 3], [4]], 0, [-0.5, -1.0, -0.7, -2.0])  # nodes: 1, 4, 2, 3
    want = torch.tensor([-0.5, -1.0, -0.2, -1.3]).exp()  # root children: V; below: V / V(parent)
    torch.testing.assert_close(t.node_confidence, want)
    stats = t.mean_stats()
    assert stats.shape == (3,)
    torch.testing.assert_close(stats[STAT["node"]], want.mean())
    torch.testing.assert_close(stats[STAT["path"]], t.path_logp.exp().mean())
    assert DraftTree.empty().mean_stats().isnan().all()


def _check_tree(t: DraftTree):
    """Parents precede children, depth = parent's depth + 1."""
    for i, (p, d) in enumerate(zip(t.parents.tolist(), t.depths.tolist())):
        assert p < i and d == (1 if p < 0 else t.depths[p] + 1)


def _paths(t: DraftTree) -> list[tuple]:
    out = []
    for i in range(t.size):
        path, j = [], i
        while j >= 0:
            path.append(int(t.tokens[j]))
            j = int(t.parents[j])
        out.append(tuple(path[::-1]))
    return out


def test_graft_keeps_mixed_shallow_levels_and_grafts_the_specialist_below():
    mixed = _tree([[1, 2, 3, 4], [1, 5, 6], [7, 8]], 0)  # depth 3-4 nodes: fillers only
    spec = _tree([[1, 2, 9, 10], [1, 5, 11], [7, 12, 13], [14, 15, 16]], 1)
    assert match_paths(spec, mixed, 2).tolist() == [0, 1, -1, 2, 3, -1, -1, -1, -1, -1, -1, -1]
    t = graft_trees(mixed, spec, 2, 20)
    _check_tree(t)
    got = dict(zip(_paths(t), zip(t.owner.tolist(), t.owner_mask.tolist())))
    # (7, 12, 13): 12 is not a mixed node; (14, ...): not in mixed; mixed's 3, 6, 4 lose to the grafted
    assert got == {(1,): (0, 3), (7,): (0, 3), (1, 2): (0, 3), (1, 5): (0, 3), (7, 8): (0, 1),
                   (1, 2, 9): (1, 2), (1, 5, 11): (1, 2), (1, 2, 9, 10): (1, 2)}
    assert t.size == mixed.size  # budget: min(n, the mixed tree's size)
    assert t.max_depth == 4
    # a tight budget keeps the best by score, ancestor-closed
    small = graft_trees(mixed, spec, 2, 5)
    _check_tree(small)
    assert set(_paths(small)) == {(1,), (7,), (1, 2), (1, 5), (7, 8)}


def test_graft_scores_chain_the_specialist_below_the_mixed_anchor():
    mixed = _tree([[1, 2], [3]], 0, [-0.1, -1.0, -0.4])  # nodes 1, 3, 2
    spec = _tree([[1, 2, 5]], 1, [-2.0, -2.5, -2.6])  # the specialist is unsure of the prefix, sure of 5
    t = graft_trees(mixed, spec, 2, 3)  # budget 3 of 4 candidates: the grafted 5 (-0.4 - 0.1) beats 3 (-1.0)
    assert _paths(t) == [(1,), (1, 2), (1, 2, 5)]
    torch.testing.assert_close(t.path_logp, torch.tensor([-0.1, -0.4, -0.5]))
    torch.testing.assert_close(t.node_confidence[2], torch.tensor(-0.1).exp())  # the specialist's own c(5)


def test_graft_fills_the_budget_with_mixed_deep_nodes_when_nothing_grafts():
    mixed = _tree([[1, 2, 3], [4, 5]], 0)
    spec = _tree([[9, 9, 9]], 1)
    t = graft_trees(mixed, spec, 1, 4)
    _check_tree(t)
    assert t.size == 4 and bool((t.owner == 0).all()) and {(1,), (4,)} <= set(_paths(t))


def test_graft_on_random_tries_is_valid_deterministic_and_budgeted():
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        def rand_tree(owner):
            paths = [torch.randint(0, 3, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
                     for _ in range(6)]
            t = chain_tree(paths, owner)
            t.path_logp[:] = -torch.rand(t.size, generator=g).cumsum(0)  # parents first: non-increasing
            t.path_logp[:] = torch.minimum(t.path_logp, t.path_logp[t.parents.clamp(min=0)])
            return t

        mixed, spec, s = rand_tree(0), rand_tree(1), 1 + trial % 3
        n = 1 + trial % 9
        t = graft_trees(mixed, spec, s, n)
        assert t.size == min(n, mixed.size)
        _check_tree(t)
        mixed_paths, spec_paths = set(_paths(mixed)), set(_paths(spec))
        for path, owner, d in zip(_paths(t), t.owner.tolist(), t.depths.tolist()):
            if owner == 1:  # grafted: below the switch depth, its prefix to depth s is a mixed node
                assert d > s and path in spec_paths and path[:s] in mixed_paths
            else:
                assert path in mixed_paths
        for i, p in enumerate(t.parents.tolist()):  # a child never outscores its parent
            assert p < 0 or t.path_logp[i] <= t.path_logp[p] + 1e-6
        again = graft_trees(mixed, spec, s, n)
        assert all(torch.equal(getattr(t, f), getattr(again, f)) for f in DraftTree._INT + DraftTree._FLOAT)


# -- strategies on scripted trees ----------------------------------------------------------------
class Scripted:
    """A proposer whose tree is a fixed path set with scripted path scores."""

    def __init__(self, paths, owner, logp=None):
        self.paths, self.owner, self.logp, self.name = paths, owner, logp, f"s{owner}"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        return _tree(self.paths, self.owner, self.logp)


def _drive(strategy, props, depths):
    """Chosen drafter per step, each step followed by observe(accepted depth)."""
    strategy.start_prompt()
    strategy.start_turn()
    out = []
    for d in depths:
        out.append(strategy.propose(props, None, None, TREE, 0.0).chosen)
        strategy.observe(d)
    return out


def test_switching_to_the_other_specialist_and_back():
    a, b = Scripted([[1, 2]], 0, [-0.1, -0.2]), Scripted([[3, 4]], 1, [-1.0, -2.0])  # routing picks a
    s = make_strategy("switching", 2, switch_after=2)
    # a, a (2 empty: switch) -> b; b accepts, b, b (2 empty) -> a; a ...
    assert _drive(s, [a, b], [0, 0, 1, 0, 0, 0, 3]) == [0, 0, 1, 1, 1, 0, 0]
    s.start_turn()  # a new turn starts routed again
    assert _drive(s, [a, b], [0]) == [0]
    k3 = make_strategy("switching", 2, switch_after=3)
    assert _drive(k3, [a, b], [0, 0, 1, 0, 0, 0, 0]) == [0, 0, 0, 0, 0, 0, 1]


def test_switching_to_merged_trees_stays_merged_for_the_turn():
    a, b = Scripted([[1, 2]], 0, [-0.1, -0.2]), Scripted([[3, 4]], 1, [-1.0, -2.0])
    s = make_strategy("switching", 2, switch_after=1, switch_to="merged")
    s.start_prompt()
    s.start_turn()
    first = s.propose([a, b], None, None, TREE, 0.0)
    assert first.chosen == 0 and first.tree.size == 2
    s.observe(0)
    for d in (0, 0, 2):
        p = s.propose([a, b], None, None, TREE, 0.0)
        assert p.chosen == -1 and sorted(p.tree.tokens.tolist()) == [1, 2, 3, 4]
        s.observe(d)
    s.start_turn()
    assert s.propose([a, b], None, None, TREE, 0.0).chosen == 0


def test_switched_specialist_drafts_alone():
    a, b = Scripted([[1, 2]], 0, [-0.1, -0.2]), Scripted([[3, 4]], 1, [-1.0, -2.0])
    s = make_strategy("switching", 2, switch_after=1)
    s.start_turn()
    s.propose([a, b], None, None, TREE, 0.0)
    s.observe(0)
    p = s.propose([a, b], None, None, TREE, 0.0)
    assert p.chosen == 1 and p.tree.tokens.tolist() == [3, 4]
    assert p.stats[0].isnan().all() and not p.stats[1].isnan().any()


def test_node_score_routes_by_conditional_confidence():
    # a: high path confidence at depth 1, a sure second token... b: two unsure siblings
    a = Scripted([[1, 2]], 0, [-0.05, -2.0])  # V mean 0.54, c mean (0.95 + 0.15) / 2 = 0.55
    b = Scripted([[3], [4]], 1, [-0.5, -0.6])  # V mean 0.58, c mean 0.58
    c = Scripted([[5, 6]], 2, [-0.7, -0.75])  # V mean 0.48, c mean (0.50 + 0.95) / 2 = 0.72
    for score, want in (("path", 1), ("node", 2)):
        s = make_strategy("confidence", 3, "prompt", score=score)
        assert _drive(s, [a, b, c], [0, 0]) == [want, want]


def test_depth_adaptive_routes_between_the_specialists_and_grafts():
    mixed = Scripted([[1, 2, 7], [3]], 0)
    a = Scripted([[1, 2, 5]], 1, [-2.0, -2.1, -2.2])
    b = Scripted([[1, 2, 6]], 2, [-0.1, -0.2, -0.3])  # more confident: chosen
    s = make_strategy("depth_adaptive", 3, switch_depth=2)
    s.start_turn()
    p = s.propose([mixed, a, b], None, None, TreeConfig(2, 3, 5), 0.0)
    assert p.chosen == 2 and set(_paths(p.tree)) == {(1,), (3,), (1, 2), (1, 2, 6)}
    assert p.tree.owner.tolist() == [0, 0, 0, 2]
    with pytest.raises(ValueError, match=r"switch_depth must be an int in 1..tree.depth - 1 \(tree depth 3"):
        make_strategy("depth_adaptive", 3, switch_depth=3).propose([mixed, a, b], None, None, TreeConfig(2, 3,
                5), 0.0)


@pytest.mark.parametrize("kw,match", [
    ({"score": "mean"}, "route score"), ({"switch_after": 0}, "switch_after"), ({"switch_after": 6},
            "switch_after"),
    ({"switch_to": "oracle"}, "switch_to"), ({"switch_depth": 0}, "switch_depth"),
])
def test_make_strategy_rejects_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        make_strategy("confidence", 2, **kw)


def test_drafter_counts_and_config_checks():
    with pytest.raises(ValueError, match="at least 3"):
        make_strategy("depth_adaptive", 2)
    with pytest.raises(ValueError, match="at most 2"):
        make_strategy("switching", 3)
    with pytest.raises(ValueError, match="switch_depth must be an int in 1..tree.depth - 1"):
        DecodeConfig(strategy="depth_adaptive", switch_depth=4, tree=TreeConfig(3, 4, 10))
    DecodeConfig(strategy="merged", switch_depth=4, tree=TreeConfig(3, 4, 10))  # unused elsewhere: no error
    for kw, name in (({"route_score": "x"}, "route_score"), ({"switch_after": 9}, "switch_after"),
                     ({"switch_to": "x"}, "switch_to")):
        with pytest.raises(ValueError, match=name):
            DecodeConfig(**kw)


# -- T = 0 on real prompts: every new strategy equals generate ------------------------------------
@pytest.fixture(scope="module")
def refs(verifier, bench_prompts):
    """GSM8K's first prompt and MT-Bench's first (two turns), with generate's greedy outputs."""
    model, tok = verifier
    return [(p, greedy_reference(model, tok, p, MAX_NEW)) for p in (bench_prompts["gsm8k"][0],
                                                                     bench_prompts["mt_bench"][0])]


@pytest.fixture(scope="module")
def four_proposers(verifier, random_drafter_dirs, tmp_path_factory):
    """Four random heads (the study's math, chat, mixed, averaged) and, for depth_adaptive, a mixed
    drafter whose first specialist shares its weights (so grafts happen)."""
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from tests.conftest import VERIFIER

    model, _ = verifier
    root = tmp_path_factory.mktemp("four")
    extra = [str(save_checkpoint(init_drafter(DrafterConfig.for_verifier(model, VERIFIER, "hass", seed=s)),
                                 root / f"random-{s}")) for s in (2, 3)]
    dirs = random_drafter_dirs + extra
    return {"four": load_proposers(model, dirs, VERIFIER),
            "graft": load_proposers(model, [dirs[0], dirs[0], dirs[1]], VERIFIER)}


CASES = {  # id: (proposers, DecodeConfig fields)
    "confidence-node-prompt": ("four", 2, dict(strategy="confidence", route_score="node",
                                               routing_granularity="prompt")),
    "entropy-turn-4": ("four", 4, dict(strategy="entropy", routing_granularity="turn")),
    "switching-k1": ("four", 2, dict(strategy="switching", switch_after=1)),
    "switching-merged-prompt": ("four", 2, dict(strategy="switching", switch_after=2, switch_to="merged",
                                               routing_granularity="prompt", merge_dedup=True)),
    "depth_adaptive-s1": ("graft", 3, dict(strategy="depth_adaptive", switch_depth=1)),
    "depth_adaptive-s2-node": ("graft", 3, dict(strategy="depth_adaptive", switch_depth=2,
                                                route_score="node")),
    # hedge (tests/test_hedge.py): its weights carried across MT-Bench's turns; over four heads, the first
    # ahead
    "hedge-carry": ("four", 2, dict(strategy="hedge", hedge_reset="carry")),
    "hedge-mixed-first-4": ("four", 4, dict(strategy="hedge", hedge_prior="mixed-first", hedge_eta=2.0)),
    # issue 64's learners: NormalHedge on counterfactual acceptance (a seeded draw from its weights, ties
    # stay),
    # Hedge with eta carried across turns, and the bandit (the chosen drafter's acceptance only)
    "hedge-normalhedge-acceptance-3": ("four", 3, dict(strategy="hedge", hedge_learner="normalhedge",
                                                       hedge_feedback="acceptance", hedge_ties="stay")),
    "hedge-hedge-acceptance-carry": ("four", 2, dict(strategy="hedge", hedge_learner="hedge", hedge_eta=2.0,
                                                     hedge_feedback="acceptance", hedge_reset="carry")),
    "hedge-ucb": ("four", 2, dict(strategy="hedge", hedge_learner="ucb", hedge_ties="stay")),
}
FULL_CASES = ("switching-k1", "depth_adaptive-s1", "hedge-mixed-first-4", "hedge-hedge-acceptance-carry")


@pytest.mark.slow  # (FULL_CASES: the other cases cover their code, make test-full runs them)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.full) if c in FULL_CASES else c
                                  for c in CASES])
def test_new_strategies_match_generate(verifier, eos, four_proposers, refs, case):
    model, tok = verifier
    group, n, fields = CASES[case]
    dec = SpeculativeDecoder(model, four_proposers[group][:n], DecodeConfig(max_new_tokens=MAX_NEW, tree=TREE,
                                                                            **fields), eos)
    steps = []
    for prompt, ref in refs:
        results = decode_prompt(dec, tok, prompt)
        assert [res.output_token_ids for _, res,
                _ in results] == ref, f"{case} differs from generate on {prompt.id}"
        steps += [s for _, res, _ in results for s in res.steps]
    for s in steps:  # the new trace columns, one value per accepted node, one per drafter
        assert len(s["accepted_draft_confidence"]) == s["accepted_depth"]
        assert all(0 < c <= 1 for c in s["accepted_draft_confidence"])
        assert len(s["drafter_mean_node_confidence"]) == n
        assert (s["rejected_draft_confidence"] is None) == (s["rejected_draft_entropy"] is None)
    chosen = {s["chosen_drafter"] for s in steps}
    if fields["strategy"] == "switching":  # random drafters are rarely accepted: it switches
        assert chosen == {0, 1} if fields.get("switch_to", "specialist") == "specialist" else -1 in chosen
    if fields["strategy"] == "depth_adaptive":
        assert chosen <= {1, 2} and all(s["tree_size"] == TREE.total_tokens - 1 for s in steps)
    if fields["strategy"] == "hedge":  # one drafter drafts; every drafter is scored on every step (reset
        #                                 per turn: but the turn's last, 3 turns in all); the bandit on none
        scored = [s for s in steps if s["drafter_agreement"]]
        unscored = len(steps) if fields.get("hedge_learner") == "ucb" else \
            0 if fields.get("hedge_reset") == "carry" else 3
        assert len(steps) - len(scored) == unscored
        assert chosen <= set(range(n)) and all(len(s["drafter_agreement"]) == n for s in scored)
        most = (lambda s: min(s["committed"], TREE.depth)) if fields.get("hedge_feedback") == "acceptance" \
            else (lambda s: s["committed"])
        assert all(0 <= a <= most(s) for s in scored for a in s["drafter_agreement"])
    else:
        assert all(s["drafter_agreement"] == [] for s in steps)


@pytest.mark.slow
def test_depth_adaptive_commits_grafted_specialist_paths(verifier, eos, refs):
    """Mixed knows the answer's next s tokens, the specialists all of it: the verified tree has the
    answer only through the graft, and long accepted paths end in the specialist's nodes."""
    model, tok = verifier
    prompt, ref = refs[0]
    ids = benchmark_prompt_ids(tok, prompt, 0, [])
    s = 2

    class Shallow(OracleProposer):
        def draft(self, tokens, features, cfg, temperature):
            done = tokens.shape[0] - self.prompt_len
            truth = self.ref[done : done + s]
            return chain_tree([truth, [t + 1 for t in truth] + [5, 6]] if truth else [[5]], self.owner)

    props = [Shallow(len(ids), ref[0], 0), OracleProposer(len(ids), ref[0], 1), OracleProposer(len(ids),
            ref[0], 2)]
    cfg = DecodeConfig(strategy="depth_adaptive", max_new_tokens=MAX_NEW, switch_depth=s, tree=TreeConfig(3,
            5, 12))
    res = SpeculativeDecoder(model, props, cfg, eos).generate(ids, seed_key=prompt.id)
    assert res.output_token_ids == ref[0]
    deep = [st for st in res.steps if st["accepted_depth"] > s]
    assert deep and all(st["accepted_owner"] == st["chosen_drafter"] == 1 for st in deep)
    assert res.acceptance_length > s + 1


# -- T = 1: the verifier's own sampling distribution ---------------------------------------------
@pytest.fixture(scope="module")
def joint(verifier):
    return exact_joint(*verifier)


class Paths:
    """Drafts after t1, from the table of (c1 best child, g1 its best child, c2 second child),
    ``make(c1, g1, c2)`` paths."""

    def __init__(self, table, owner, make):
        self.table, self.owner, self.make, self.name = table, owner, make, f"paths{owner}"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        return chain_tree(self.make(*self.table.get(int(tokens[-1]), (1000, 1001, 1002))), self.owner)


def _samples(model, eos, ids, props, n_tokens, **fields):
    """N seeds of the prompt, 8 at a time with one verifier pass for their trees (decoding/batch.py, as
    tests/test_sampling_e2e.py); each row its own strategy state, the stateless proposers shared."""
    from decoding.batch import decode_turns

    cfg = DecodeConfig(temperature=1.0, max_new_tokens=n_tokens, tree=TreeConfig(2, 2, 8), **fields)
    rows = [SpeculativeDecoder(model, props, cfg, eos, prompt_cache=True) for _ in range(8)]
    runs = decode_turns(rows, [(ids, f"s{i}") for i in range(N)])
    return [tuple(r.output_token_ids[:n_tokens]) for r in runs], runs


T1_CASES = {
    "confidence-node-prompt": (2, dict(strategy="confidence", route_score="node",
                                       routing_granularity="prompt")),
    "entropy-turn-4": (4, dict(strategy="entropy", routing_granularity="turn")),
    # mixed: c2, c1 and two fillers; the specialists: c1 -> g1 (grafted below the mixed c1)
    "depth_adaptive": (3, dict(strategy="depth_adaptive", switch_depth=1)),
}


# the two routers pick one drafter's tree, as confidence(step) does in tests/test_sampling_e2e.py
@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.full) if c != "depth_adaptive" else c
                                  for c in T1_CASES])
def test_first_step_samples_the_verifier_distribution(verifier, eos, joint, case):
    model, _ = verifier
    ids, pairs, table = joint
    n, fields = T1_CASES[case]
    if fields["strategy"] == "depth_adaptive":
        props = [Paths(table, 0, lambda c1, g1, c2: [[c2, 7], [c1, 8]])] + [
            Paths(table, i, lambda c1, g1, c2: [[c1, g1]]) for i in (1, 2)]
    else:
        props = [TableProposer(table, i) for i in range(n)]
    outs, runs = _samples(model, eos, ids, props, 2, **fields)
    stat, bound = chi2(outs, pairs)
    assert stat <= bound, (f"{case}: chi-square {stat:.1f} > {bound:.1f} "
                           "against the verifier's joint distribution")
    if fields["strategy"] == "depth_adaptive":  # the grafted g1 was verified and accepted in some runs
        assert any(r.steps and r.steps[0]["accepted_depth"] == 2 and r.steps[0]["accepted_owner"] == 1
                   for r in runs)


@pytest.fixture(scope="module")
def joint3(verifier, joint):
    """The exact joint of the first three tokens over the likely ones, and, per (t1, t2), the
    verifier's two most likely children of t2 and the best child of the first."""
    from decoding.accept import logits_to_probs

    model, _ = verifier
    ids, pairs, _ = joint
    prefixes = [(t1, t2) for (t1, t2), p in sorted(pairs.items(), key=lambda kv: -kv[1])[:24] if p >= 0.005]
    with torch.no_grad():
        # (P, V)
        p3 = logits_to_probs(model(torch.tensor([ids + list(pr) for pr in prefixes])).logits[:, -1], 1.0)
        top2 = p3.topk(2).indices
        seqs = [ids + list(pr) + [int(c[0])] for pr, c in zip(prefixes, top2)]
        g = logits_to_probs(model(torch.tensor(seqs)).logits[:, -1], 1.0).argmax(-1)
    table = {pr: (int(top2[i, 0]), int(g[i]), int(top2[i, 1])) for i, pr in enumerate(prefixes)}
    triples = {(*pr, c): pairs[pr] * float(p3[i, c]) for i, pr in enumerate(prefixes)
               for c in p3[i].topk(6).indices.tolist()}
    return ids, triples, table


class Garbage:
    """Confident and always wrong: drafts tokens the verifier (almost) never samples."""

    def __init__(self, owner):
        self.owner, self.name = owner, "garbage"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        return _tree([[1000, 1001]], self.owner, [-0.01, -0.02])


class Table2:
    """After (t1, t2): the chain (c1, g1) and the sibling c2 from ``joint3``'s table."""

    def __init__(self, table, owner):
        self.table, self.owner, self.name = table, owner, "table2"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        c1, g1, c2 = self.table.get(tuple(tokens[-2:].tolist()), (1002, 1003, 1004))
        return chain_tree([[c2], [c1, g1]], self.owner)


@pytest.mark.slow
def test_switching_samples_the_verifier_distribution_after_a_switch(verifier, eos, joint3):
    """Routing picks the confident garbage drafter at the first step; nothing is accepted, so the
    second step verifies the other specialist: three tokens, the third after the switch. (Switching
    to merged verifies ``merged``'s tree, whose T=1 law tests/test_sampling_e2e.py checks; the
    accelerator harness runs that variant at T=1 against the plain CPU path.)"""
    model, _ = verifier
    ids, triples, table = joint3
    outs, runs = _samples(model, eos, ids, [Garbage(0), Table2(table, 1)], 3, strategy="switching",
                          switch_after=1)
    stat, bound = chi2(outs, triples)
    assert stat <= bound, f"switching: chi-square {stat:.1f} > {bound:.1f} against the verifier's joint law"
    assert all(r.steps[0]["chosen_drafter"] == 0 and r.steps[0]["accepted_depth"] == 0 for r in runs)
    after = [r.steps[1] for r in runs if len(r.steps) > 1]
    assert len(after) > N // 2 and all(st["chosen_drafter"] == 1 for st in after)
    assert any(st["accepted_depth"] > 0 for st in after)  # the switched-to tree was accepted from
