"""hedge's learners and its acceptance feedback (decoding/hedge.py, decoding/accept.py, issue 64).

The counterfactual acceptance is checked as pure tensor functions on hand-made distributions (and
against a simulation of speculative sampling); the learners (NormalHedge, Hedge with eta, FTL, UCB)
and the tie rules as pure functions; the strategy with scripted proposers; the rollout of a real
drafter against the tree it drafts. Exactness against ``generate`` at T=0 and the verifier's law at
T=1 for the new learners: tests/test_strategies_next.py (CASES) and tests/test_hedge.py.
"""
from __future__ import annotations

import math

import pytest
import torch

from decoding.accept import expected_accepted, position_acceptance
from decoding.config import DecodeConfig, TreeConfig
from decoding.hedge import (
    HedgeConfig,
    acceptance_gains,
    choose,
    learn,
    learn_chosen,
    normalhedge_scale,
    normalhedge_weights,
    start_state,
    ucb_scores,
    weights,
)
from decoding.strategies import make_strategy
from tests.test_hedge import Scripted

TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)


# -- counterfactual acceptance on hand-made distributions ------------------------------------------
def test_t0_counts_the_committed_tokens_matched_in_sequence():
    q = torch.tensor([[0.1, 0.9, 0.0], [0.2, 0.1, 0.7], [0.6, 0.3, 0.1]])  # top-1: 1, 2, 0
    ids = torch.arange(3).expand(3, 3)
    beta = position_acceptance(q, ids, torch.tensor([1, 2, 1]), None)
    assert beta.tolist() == [1.0, 1.0, 0.0] and float(expected_accepted(beta)) == 2.0
    beta = position_acceptance(q, ids, torch.tensor([0, 2, 0]), None)  # a miss first: nothing after it counts
    assert beta.tolist() == [0.0, 1.0, 1.0] and float(expected_accepted(beta)) == 0.0


def test_t1_sums_min_p_q_and_multiplies_along_the_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    beta = position_acceptance(q, torch.arange(3).expand(2, 3), torch.tensor([0, 1]), p)
    assert beta.tolist() == pytest.approx([0.5, 0.7])  # min(.5, 1) + min(.5, 0); min(.2, .5) + min(.8, .5)
    assert float(expected_accepted(beta)) == pytest.approx(0.5 + 0.5 * 0.7)
    # a point mass on x (a scripted proposer, K = 1): beta = p(x), one deterministic candidate's acceptance
    point = position_acceptance(torch.ones(2, 1), torch.tensor([[1], [0]]), torch.tensor([0, 1]), p)
    assert point.tolist() == pytest.approx([0.5, 0.2])
    # a reduced draft vocabulary: q over verifier ids (2, 0) only
    red = position_acceptance(torch.tensor([[0.7, 0.3]]), torch.tensor([[2, 0]]), torch.tensor([0]),
                              torch.tensor([[0.4, 0.1, 0.5]]))
    assert red.tolist() == pytest.approx([0.5 + 0.3])
    assert expected_accepted(torch.ones(3, 4)).tolist() == [4.0] * 3  # batched over drafters


def test_beta_is_the_acceptance_rate_of_speculative_sampling_from_q():
    """E_{x~q}[min(1, p(x)/q(x))] by simulation: draws from q accepted with probability min(1, p/q)."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.1, 0.6, 0.3]), torch.tensor([0.5, 0.25, 0.25])
    x = torch.multinomial(q, 200_000, replacement=True, generator=g)
    accepted = torch.rand(x.shape, generator=g) < (p[x] / q[x]).clamp(max=1)
    beta = position_acceptance(q[None], torch.arange(3)[None], torch.tensor([1]), p[None])
    assert float(accepted.double().mean()) == pytest.approx(float(beta), abs=0.005)  # 0.1 + 0.25 + 0.25


# -- the learners ---------------------------------------------------------------------------------
def test_normalhedge_solves_its_scale_and_weighs_only_positive_regret():
    for regret in ([0.3, -0.1, 0.0], [1.0, 2.0, 0.5, 3.0], [5.0, 5.0]):
        c = normalhedge_scale(regret)
        mean = sum(math.exp(max(0.0, r) ** 2 / (2 * c)) for r in regret) / len(regret)
        assert mean == pytest.approx(math.e, rel=1e-9)
    w = normalhedge_weights([1.0, 2.0, -1.0])
    c = normalhedge_scale([1.0, 2.0, -1.0])
    raw = [r / c * math.exp(r * r / (2 * c)) for r in (1.0, 2.0)]
    assert w == pytest.approx([raw[0] / sum(raw), raw[1] / sum(raw), 0.0])
    assert normalhedge_weights([0.0, -0.5]) is None and normalhedge_weights([0.2, -0.5]) == [1.0, 0.0]


def test_normalhedge_regret_is_the_learners_expected_loss_minus_each_drafters():
    cfg = HedgeConfig(learner="normalhedge", ties="stay")
    s = learn(start_state(2, cfg), cfg, [0.8, 0.2])  # uniform weights: expected loss 0.5; losses 0.2, 0.8
    assert s.regret == pytest.approx((0.3, -0.3)) and weights(s, cfg) == [1.0, 0.0]
    s = learn(s, cfg, [0.0, 1.0])  # all weight on 0 (loss 1): drafter 1 gains 1 of regret
    assert s.regret == pytest.approx((0.3, 0.7))
    assert weights(s, cfg)[1] > weights(s, cfg)[0] > 0
    assert choose(s, cfg, 0.999) == 1 and choose(s, cfg, 0.0) == 0  # a draw from the weights


def test_hedge_draws_from_its_weights_and_eta_sets_them():
    for eta in (0.5, 3.0):
        cfg = HedgeConfig(learner="hedge", eta=eta)
        s = learn(start_state(2, cfg), cfg, [1.0, 0.0])  # losses 0, 1
        w = weights(s, cfg)
        assert w[0] == pytest.approx(1 / (1 + math.exp(-eta)))
        assert choose(s, cfg, w[0] - 1e-9) == 0 and choose(s, cfg, w[0] + 1e-9) == 1


def test_ftl_is_the_least_cumulative_loss_and_ties_follow_the_rule():
    lower, stay = HedgeConfig(), HedgeConfig(ties="stay")
    s = start_state(3, lower)
    assert choose(s, lower, 0.9) == 0  # the first router: every tie to the lower index
    assert choose(s, stay, 0.9) == 2 and choose(s, stay, 0.1) == 0  # nothing drafted yet: a seeded draw
    assert choose(s.__class__(**{**s.__dict__, "current": 1}), stay, 0.9) == 1  # stay with the current one
    s = learn(s, stay, [0.5, 1.0, 1.0])
    assert choose(s, stay, 0.0) in (1, 2) and choose(s, lower, 0.0) == 1
    s = learn(s, stay, [1.0, 0.0, 1.0])
    assert choose(s, stay, 0.5) == 2 and choose(s, lower, 0.5) == 2  # a clear leader: no tie


def test_ucb_tries_each_drafter_then_trades_mean_against_visits():
    cfg = HedgeConfig(learner="ucb", ties="lower")
    s = start_state(2, cfg)
    assert ucb_scores([0, 0], [0.0, 0.0]) == [math.inf, math.inf] and choose(s, cfg, 0.5) == 0
    s = learn_chosen(s, 0, 0.5)
    assert choose(s, cfg, 0.5) == 1  # untried first
    s = learn_chosen(s, 1, 0.25)
    t = 2
    assert ucb_scores(list(s.pulls), list(s.gains)) == pytest.approx(
        [0.5 + math.sqrt(2 * math.log(t)), 0.25 + math.sqrt(2 * math.log(t))])
    assert choose(s, cfg, 0.5) == 0


def test_gains_and_options_are_checked_by_name():
    assert acceptance_gains([0.0, 1.5, 3.0], 3) == pytest.approx([0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        acceptance_gains([3.5], 3)
    for kw, match in (({"learner": "exp4"}, "hedge_learner"), ({"feedback": "tf"}, "hedge_feedback"),
                      ({"ties": "random"}, "hedge_ties"),
                      ({"learner": "normalhedge", "prior": "mixed-first"}, "has no prior")):
        with pytest.raises(ValueError, match=match):
            HedgeConfig(**kw)
        with pytest.raises(ValueError, match=match):
            DecodeConfig(strategy="hedge", **{f"hedge_{k}": v for k, v in kw.items()})
    assert HedgeConfig().label == ""
    assert HedgeConfig(learner="normalhedge", feedback="acceptance",
                       ties="stay").label == "normalhedge, acceptance, ties=stay"
    assert DecodeConfig(strategy="hedge",
                        hedge_learner="ucb").columns()["hedge_spec"] == "ucb, bandit, ties=lower"


# -- the strategy with scripted proposers ----------------------------------------------------------
# Scripted (tests/test_hedge.py): drafts a fixed chain; its own draft along the committed tokens
# predicts ``guess`` everywhere


def _step(s, props, committed, accepted=0, target=None):
    prop = s.propose(props, torch.tensor([0, 0, 0]), None, TREE, 0.0 if target is None else 1.0)
    s.observe(accepted)
    fb = s.feedback(props, torch.tensor([0, 0, 0] + committed), None, 3, False, target)
    if fb is not None:
        s.learn(fb.tolist(), len(committed))
    return prop, fb


def test_acceptance_feedback_scores_each_drafter_on_the_verified_path():
    props = [Scripted(0, 5), Scripted(1, 7)]
    s = make_strategy("hedge", 2, hedge=HedgeConfig(feedback="acceptance"))
    s.start_prompt()
    s.start_turn()
    first, fb = _step(s, props, [7, 7, 7, 7])  # 4 committed, tree depth 3: 3 positions scored
    assert first.chosen == 0 and fb.tolist() == [0.0, 3.0]
    second, fb = _step(s, props, [5, 7])
    assert second.chosen == 1 and fb.tolist() == [1.0, 0.0]
    # T > 0: beta = p(its token) at each position, the product along the path
    p = torch.zeros(2, 10)
    p[0, 7], p[0, 5], p[1, 7] = 0.5, 0.25, 0.4
    _, fb = _step(s, props, [7, 7], target=p)
    assert fb.tolist() == pytest.approx([0.25, 0.5 + 0.5 * 0.4])


def test_the_bandit_learns_from_the_chosen_drafters_acceptance_alone():
    props = [Scripted(0, 5), Scripted(1, 7)]
    s = make_strategy("hedge", 2, hedge=HedgeConfig(learner="ucb"))
    s.start_prompt()
    s.start_turn()
    first, fb = _step(s, props, [7], accepted=0)
    assert fb is None and first.chosen == 0 and s.state.pulls == (1, 0)
    second, _ = _step(s, props, [7, 7, 7], accepted=2)
    assert second.chosen == 1 and s.state.gains == pytest.approx((0.0, 2 / 3))


def test_ties_stay_draws_from_the_turns_seed_and_then_stays():
    props = [Scripted(0, 5), Scripted(1, 7)]
    firsts = set()
    for seed in range(12):
        s = make_strategy("hedge", 2, hedge=HedgeConfig(feedback="acceptance", ties="stay"))
        s.seed_turn(seed)
        s.start_prompt()
        s.start_turn()
        prop, _ = _step(s, props, [1])  # nobody agrees: still tied
        again, _ = _step(s, props, [1])
        assert again.chosen == prop.chosen  # a tie stays with the current drafter
        firsts.add(prop.chosen)
    assert firsts == {0, 1}  # no built-in favourite


# -- a real drafter's rollout is the chain its tree drafts ----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle2-hass", pytest.param("reduced-vocab", marks=pytest.mark.full),
                                  pytest.param("eagle3", marks=pytest.mark.full)])
def test_rollout_is_the_drafters_own_multi_step_draft(verifier, random_drafter_dirs, random_eagle3_dirs,
                                                      tmp_path_factory, kind):
    """Along a committed path that follows the drafter's own tree (its best depth-1 node, then that
    node's best child), the rollout's distributions are the tree's: depth 1's top-k log-probs are the
    depth-1 nodes' scores, depth 2's are the children's scores under the committed node (one tree
    keeping every candidate). Both drafters share one head matmul per level, and the next draft equals
    a draft from scratch (the rollout leaves the drafter's cache as its own catch-up would)."""
    from decoding.drafting import rollout_together
    from decoding.verifier_pass import new_cache, prefill
    from tests.test_hedge import _props

    model, _ = verifier
    props = _props(kind, verifier, random_drafter_dirs, random_eagle3_dirs, tmp_path_factory)
    toks = torch.arange(100, 130)
    feats, _ = prefill(model, new_cache(), toks.tolist(), props[0].feature_layers)
    full = TreeConfig(top_k=3, depth=3, total_tokens=3 + 9 + 9 + 1)  # keeps every candidate
    n = 24  # the root is toks[n]; features of toks[:n]
    for p in props:
        p.reset()
        tree = p.draft(toks[: n + 1], feats[:n], full, 0.0)
        d1 = tree.depths == 1
        best = int(tree.path_logp.masked_fill(~d1, -1e9).argmax())
        kids = tree.parents == best
        child = int(tree.path_logp.masked_fill(~kids, -1e9).argmax())
        path = torch.cat([toks[: n + 1], tree.tokens[[best, child]], torch.tensor([0])])
        calls = []  # this iteration's: the hook is removed before the next
        hook = p.head.register_forward_hook(lambda m, a, out, calls=calls: calls.append(out.shape[0]))
        try:
            (q, ids), = rollout_together([p], path, feats[:n], n + 1, 2, 0.0)
        finally:
            hook.remove()
        assert calls == [1, 1]
        logq = q.log()
        top1 = logq[0].topk(3).values
        torch.testing.assert_close(top1.sort().values, tree.path_logp[d1].sort().values, atol=1e-4, rtol=1e-4)
        under = tree.path_logp[kids] - tree.path_logp[best]
        torch.testing.assert_close(logq[1].topk(3).values.sort().values, under.sort().values, atol=1e-4,
                                   rtol=1e-4)
        assert int(ids[1, logq[1].argmax()]) == int(tree.tokens[child])
        after = p.draft(toks[: n + 1], feats[:n], TREE, 0.0)
        p.reset()
        fresh = p.draft(toks[: n + 1], feats[:n], TREE, 0.0)
        assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.parents, fresh.parents)
    calls = []
    hook = props[0].head.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    try:
        rollout_together(props, toks[: n + 4], feats[: n + 3], n + 1, 3, 1.0)
    finally:
        hook.remove()
    shared = props[0].head is props[1].head
    assert calls == ([2, 2, 2] if shared else [1, 1, 1]), calls


# -- the bench's rows that choose between finished generations ------------------------------------
def test_bench_keeps_the_higher_scored_generation_and_pays_both():
    """``posthoc`` keeps the generation of the higher mean path score V, ``hindsight`` the higher tau;
    both pay every decoder's wall time (the decoders here return finished turns)."""
    from decoding.bench import hindsight_score, posthoc_score, time_posthoc
    from decoding.engine import TurnResult

    def step(committed, v):
        return {"committed": committed, "accepted_path_confidence": [v] * (committed - 1),
                "offpath_confidence_sum":
                0.0, "offpath_nodes": 0, "tree_size": 4, "t_draft_s": 0.0}

    class Fixed:
        def __init__(self, out, steps):
            self.res = TurnResult(out, len(steps), sum(s["committed"] for s in steps), 0.0, steps)

        def generate(self, ids, seed_key=""):
            return self.res

    sure_short = Fixed([1, 2, 3], [step(2, 0.9), step(1, 0.9)])  # tau 1.5, V 0.9
    long_unsure = Fixed([1, 2, 3, 4, 5], [step(3, 0.2), step(2, 0.2)])  # tau 2.5, V 0.2
    inputs, base = [("p", [0])], (lambda ids: ([1, 2], 1.0))
    assert posthoc_score(sure_short.res.steps) == pytest.approx(0.9)
    assert hindsight_score(long_unsure.res.steps) == pytest.approx(2.5)
    post = time_posthoc([sure_short, long_unsure], inputs, base)
    hind = time_posthoc([sure_short, long_unsure], inputs, base, score=hindsight_score)
    assert (post.toks, hind.toks) == (3, 5) and post.prompts == hind.prompts == 1
