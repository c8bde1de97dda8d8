"""``hedge``: an online router by Hedge with full information (decoding/hedge.py, strategies.Hedge).

Unit tests drive the weight update as pure functions with hand-made inputs and the strategy with
scripted proposers; the real-model tests check that a drafter's teacher-forced pass predicts
exactly what it would draft as its top-1 token (EAGLE-2/HASS, a reduced vocabulary, EAGLE-3), that
hedge reproduces transformers' greedy ``generate`` while it switches to the drafter that knows the
answer, and that at T=1 it samples the verifier's own distribution when its choice depends on the
sampled tokens. The generic exactness lists (tests/test_lossless.py, test_strategies_next.py) and
the device budget (tests/test_accelerator.py) run hedge beside the other strategies.
"""
from __future__ import annotations

import math

import pytest
import torch

from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.hedge import PRIOR_LEAD, HedgeConfig, hedge_choice, hedge_update, prior_log_weights, step_losses
from decoding.strategies import make_strategy
from decoding.tree import chain_tree
from drafters.data.templating import benchmark_prompt_ids
from orchestrator.grid import KEY_DEFAULTS
from orchestrator.keys import key_of
from tests.helpers import ConstantProposer, OracleProposer
from tests.test_lossless import greedy_reference
from tests.test_sampling_e2e import chi2
from tests.test_strategies_next import _samples, joint, joint3  # noqa: F401 (joint, joint3: fixtures)

TREE = TreeConfig(top_k=3, depth=3, total_tokens=10)


# -- the weight update, pure functions ----------------------------------------------------------
def _w(log_w):
    return [math.exp(x) for x in log_w]


def test_priors_are_normalised_and_mixed_first_leads_by_prior_lead():
    assert _w(prior_log_weights(3, "uniform")) == pytest.approx([1 / 3] * 3)
    lw = prior_log_weights(3, "mixed-first")
    assert sum(_w(lw)) == pytest.approx(1.0)
    assert lw[0] - lw[1] == pytest.approx(PRIOR_LEAD) and lw[1] == lw[2]


def test_one_update_by_hand():
    # two drafters, 4 committed tokens: a predicted 3, b 1 -> losses 0.25, 0.75; eta 2
    assert step_losses([3, 1], 4) == [0.25, 0.75]
    lw = hedge_update(prior_log_weights(2, "uniform"), [3, 1], 4, eta=2.0)
    want = [math.exp(-0.5), math.exp(-1.5)]  # w_i exp(-eta l_i), normalised
    assert _w(lw) == pytest.approx([x / sum(want) for x in want])
    assert hedge_choice(lw) == 0
    lw = hedge_update(lw, [0, 4], 4, eta=2.0)  # b all right, a all wrong: cumulative 1.25 vs 0.75
    assert hedge_choice(lw) == 1 and _w(lw)[1] == pytest.approx(1 / (1 + math.exp(-1.0)))


def test_ties_go_to_the_lower_index_and_equal_histories_stay_tied():
    assert hedge_choice([0.0, 0.0, 0.0]) == 0 and hedge_choice([-1.0, -0.5, -0.5]) == 1
    lw = prior_log_weights(3, "uniform")
    for agreed in ([1, 2, 2], [0, 3, 3], [2, 1, 1]):
        lw = hedge_update(lw, agreed, 3, eta=0.7)
    assert lw[1] == lw[2] and hedge_choice(lw) == 1


def test_uniform_argmax_follows_the_least_cumulative_loss_whatever_eta():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        steps = [(torch.randint(1, 6, (1,), generator=g).item(),) for _ in range(8)]
        agreed = [[int(torch.randint(0, c + 1, (1,), generator=g)) for _ in range(3)] for (c,) in steps]
        cum = [sum(1 - a[i] / c for a, (c,) in zip(agreed, steps)) for i in range(3)]
        best = min(range(3), key=lambda i: (round(cum[i], 9), i))
        for eta in (0.01, 1.0, 30.0):
            lw = prior_log_weights(3, "uniform")
            for a, (c,) in zip(agreed, steps):
                lw = hedge_update(lw, a, c, eta)
            if sorted(cum)[0] + 1e-9 < sorted(cum)[1]:  # a clear leader (float ties aside)
                assert hedge_choice(lw) == best, (agreed, steps, eta)


def test_mixed_first_keeps_the_first_drafter_until_prior_lead_over_eta_of_loss():
    # drafter 1 beats drafter 0 by a whole loss every step; eta 0.5: 0.5 behind, level (a tie: 0), then ahead
    lw, chosen = prior_log_weights(2, "mixed-first"), []
    for _ in range(3):
        lw = hedge_update(lw, [0, 2], 2, eta=0.5)
        chosen.append(hedge_choice(lw))
    assert chosen == [0, 0, 1]
    lw = hedge_update(prior_log_weights(2, "mixed-first"), [0, 2], 2, eta=5.0)  # a fast learner: one step
    assert hedge_choice(lw) == 1


@pytest.mark.parametrize("args,match", [
    (([1, 2], 0), "at least one committed token"), (([3, 1], 2), r"\[0, 2\]"), (([-1, 0], 2), r"\[0, 2\]"),
])
def test_step_losses_refuse_impossible_counts(args, match):
    with pytest.raises(ValueError, match=match):
        step_losses(*args)


@pytest.mark.parametrize("kw,match", [
    ({"eta": 0}, "hedge_eta"), ({"eta": -1.0}, "hedge_eta"), ({"eta": float("nan")}, "hedge_eta"),
    ({"eta": True}, "hedge_eta"), ({"eta": "0.5"}, "hedge_eta"), ({"prior": "mixed"}, "hedge_prior"),
    ({"reset": "prompt"}, "hedge_reset"),
])
def test_bad_options_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        HedgeConfig(**kw)
    fields = {f"hedge_{k}": v for k, v in kw.items()}
    with pytest.raises(ValueError, match=match):
        DecodeConfig(strategy="hedge", **fields)


def test_drafter_count_and_unscorable_proposers_are_refused(verifier, eos):
    with pytest.raises(ValueError, match="at least 2"):
        make_strategy("hedge", 1)

    class NoFeedback:
        name = "blind"

        def reset(self):
            pass

    with pytest.raises(ValueError, match=r"\['blind'\] cannot be scored"):
        SpeculativeDecoder(verifier[0], [ConstantProposer(), NoFeedback()], DecodeConfig(strategy="hedge"),
                           eos)


# -- the strategy with scripted proposers -------------------------------------------------------
class Scripted:
    """Drafts a fixed chain; predicts ``guess`` for every committed token."""

    def __init__(self, owner, guess):
        self.owner, self.guess, self.name = owner, guess, f"s{owner}"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        return chain_tree([[self.guess, self.guess]], self.owner)

    def predict(self, tokens, features, start):
        return torch.full((tokens.shape[0] - start,), self.guess, dtype=torch.long)


def _step(s, props, committed):
    """One proposal, then the feedback on ``committed`` (appended after a 3-token prompt)."""
    prop = s.propose(props, torch.tensor([0, 0, 0]), None, TREE, 0.0)
    tokens = torch.tensor([0, 0, 0] + committed)
    s.learn(s.feedback(props, tokens, None, 3, False).tolist(), len(committed))
    return prop


def test_drafts_only_from_the_chosen_drafter_and_moves_to_the_one_that_agrees():
    props = [Scripted(0, 5), Scripted(1, 7)]
    s = make_strategy("hedge", 2)
    s.start_prompt()
    s.start_turn()
    first = _step(s, props, [7, 7])  # drafter 1 predicted both committed tokens
    assert first.chosen == 0 and first.tree.tokens.tolist() == [5, 5]
    assert first.stats[1].isnan().all() and not first.stats[0].isnan().any()  # only the chosen one drafted
    second = _step(s, props, [5, 7, 7])
    assert second.chosen == 1 and second.tree.tokens.tolist() == [7, 7]
    assert _step(s, props, [1]).chosen == 1  # cumulative losses: s0 1 + 2/3, s1 0 + 1/3


@pytest.mark.parametrize("reset,second_turn,next_prompt", [("turn", 0, 0), ("carry", 1, 0), ("stream", 1, 1)])
def test_weights_restart_every_turn_or_carry_across_turns_or_prompts(reset, second_turn, next_prompt):
    props = [Scripted(0, 5), Scripted(1, 7)]
    s = make_strategy("hedge", 2, hedge=HedgeConfig(reset=reset))
    s.start_prompt()
    s.start_turn()
    _step(s, props, [7, 7])
    assert _step(s, props, [7]).chosen == 1
    s.start_turn()  # the prompt's second turn
    assert _step(s, props, [7]).chosen == second_turn
    s.start_prompt()  # a new prompt starts afresh, except in a stream
    s.start_turn()
    assert _step(s, props, [7]).chosen == next_prompt


# -- teacher-forced feedback equals what the drafter drafts --------------------------------------
@pytest.fixture(scope="module")
def committed_path(verifier, bench_prompts):
    """A real GSM8K prompt and 12 greedy tokens after it, with the verifier's features of all of them."""
    from decoding.verifier_pass import new_cache, prefill

    model, tok = verifier
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12)[0].tolist()
    feats, _ = prefill(model, new_cache(), out)
    return len(ids), torch.tensor(out), feats


def _props(kind, verifier, random_drafter_dirs, random_eagle3_dirs, tmp_path_factory):
    from decoding.runner import load_proposers
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from tests.conftest import VERIFIER

    model, _ = verifier
    if kind == "reduced-vocab":  # random drafters over a 512-token draft vocabulary (the d2t map)
        ids = torch.arange(0, 1024, 2)
        root = tmp_path_factory.mktemp("hedge-vocab")
        dirs = [str(save_checkpoint(init_drafter(DrafterConfig.for_verifier(
            model, VERIFIER, "hass", seed=s, draft_vocab_size=512), ids), root / f"v{s}")) for s in (0, 1)]
    else:
        dirs = random_eagle3_dirs if kind == "eagle3" else random_drafter_dirs
    return load_proposers(model, dirs, VERIFIER)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle2-hass", "reduced-vocab", "eagle3"])
def test_teacher_forced_predictions_are_the_drafters_top1(verifier, committed_path, random_drafter_dirs,
                                                          random_eagle3_dirs, tmp_path_factory, kind):
    """At every committed position, a drafter's teacher-forced prediction equals the top-1 root
    child of the tree it drafts from scratch at that prefix; one head matmul serves both drafters of
    a shared head per feedback; and a draft right after the feedback equals a draft from scratch
    (the feedback leaves the drafter's KV cache as its own catch-up would)."""
    from decoding.drafting import agreement_together, predict_together

    model, _ = verifier
    props = _props(kind, verifier, random_drafter_dirs, random_eagle3_dirs, tmp_path_factory)
    p_len, toks, feats = committed_path
    if kind == "eagle3":
        from decoding.verifier_pass import new_cache, prefill

        feats, _ = prefill(model, new_cache(), toks.tolist(), props[0].feature_layers)
    end = toks.shape[0] - 1  # tokens[:end + 1] committed, tokens[end] the root
    top1 = {}  # (drafter, position j) -> its top-1 guess for tokens[j] drafted at the prefix tokens[:j]
    for d, p in enumerate(props):
        for j in range(p_len + 1, end + 1):
            p.reset()
            tree = p.draft(toks[:j], feats[: j - 1], TREE, 0.0)
            top1[d, j] = int(tree.tokens[tree.depths == 1][tree.path_logp[tree.depths == 1].argmax()])
    for p in props:
        p.reset()
    calls = []
    hook = props[0].head.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))
    try:
        for start, stop in ((p_len + 1, p_len + 4), (p_len + 4, end + 1)):  # two steps: 3, then the rest
            got = predict_together(props, toks[:stop], feats[: stop - 1], start)
            want = [[top1[d, j] for j in range(start, stop)] for d in range(len(props))]
            assert [g.tolist() for g in got] == want, (kind, start)
    finally:
        hook.remove()
    shared = props[0].head is props[1].head
    assert calls == ([6, 2 * (end - p_len - 3)] if shared else [3, end - p_len - 3]), calls
    agreed = agreement_together(props, toks, feats[:end], end)  # the last token alone
    assert agreed.tolist() == [int(top1[d, end] == int(toks[end])) for d in range(len(props))]
    for p in props:  # the next draft, after the feedback, equals a draft from scratch
        after = p.draft(toks, feats[:end], TREE, 0.0)
        p.reset()
        fresh = p.draft(toks, feats[:end], TREE, 0.0)
        assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.parents, fresh.parents)
        torch.testing.assert_close(after.path_logp, fresh.path_logp, atol=1e-5, rtol=1e-5)


# -- T = 0: equal to generate while it switches ---------------------------------------------------
@pytest.mark.slow
def test_hedge_switches_to_the_drafter_that_knows_the_answer_and_matches_generate(verifier, eos,
        bench_prompts):
    """Drafter 0 always guesses one wrong token, drafter 1 knows generate's answer: hedge starts on
    drafter 0 (uniform prior, tie to the lower index), learns from the first step's committed token
    that drafter 1 would have proposed it, and drafts from drafter 1 for the rest; the output equals
    generate's and the feedback's time is inside ``t_draft_s``."""
    model, tok = verifier
    prompt = bench_prompts["gsm8k"][0]
    ref = greedy_reference(model, tok, prompt, 24)[0]
    ids = benchmark_prompt_ids(tok, prompt, 0, [])
    props = [ConstantProposer(1000, 0), OracleProposer(len(ids), ref, 1)]
    cfg = DecodeConfig(strategy="hedge", max_new_tokens=24, tree=TreeConfig(3, 5, 16))
    res = SpeculativeDecoder(model, props, cfg, eos).generate(ids, seed_key=prompt.id)
    assert res.output_token_ids == ref
    chosen = [s["chosen_drafter"] for s in res.steps]
    assert chosen[0] == 0 and set(chosen[1:]) == {1}, chosen
    first = res.steps[0]
    assert first["accepted_depth"] == 0 and first["drafter_agreement"] == [0.0, 1.0]
    assert res.acceptance_length > 3.0, res.acceptance_length
    for s in res.steps[:-1]:
        assert len(s["drafter_agreement"]) == 2 and s["drafter_agreement"][1] == s["committed"]
        assert 0 < s["t_feedback_s"] <= s["t_draft_s"]
    last = res.steps[-1]  # the turn ends there and the weights restart with the next: not scored
    assert last["drafter_agreement"] == [] and last["t_feedback_s"] < 1e-3


# -- T = 1: the verifier's distribution when the choice depends on sampled tokens -------------------
class Garbage:
    """Confident and always wrong (drafts and predicts tokens the verifier almost never samples)."""

    name = "garbage"

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        return chain_tree([[1000, 1001]], 0)

    def predict(self, tokens, features, start):
        return torch.full((tokens.shape[0] - start,), 1000, dtype=torch.long)


class Likely:
    """Predicts, after t1, the verifier's most likely child c1 of t1; drafts, after (t1, t2), the chain
    (c1, g1) and the sibling c2 of ``joint3``'s table (its verifier's likely continuations)."""

    name = "likely"

    def __init__(self, first: dict, second: dict):
        self.first, self.second = first, second

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        c1, g1, c2 = self.second.get(tuple(tokens[-2:].tolist()), (1002, 1003, 1004))
        return chain_tree([[c2], [c1, g1]], 1)

    def predict(self, tokens, features, start):
        prev = tokens[start - 1 : -1].tolist()
        return torch.tensor([self.first.get(t, (1005,))[0] for t in prev], dtype=torch.long)


@pytest.mark.slow
def test_hedge_samples_the_verifier_distribution_when_its_choice_follows_the_samples(
        verifier, eos, joint, joint3):  # noqa: F811 (joint, joint3: the fixtures imported above)
    """Step 1 drafts from the garbage drafter (a tie at the start goes to it); the feedback on its
    committed token t2 moves hedge to drafter 1 exactly when t2 is the verifier's most likely child
    of t1, so step 2's tree depends on a sampled token. The first three tokens over N seeds follow
    the verifier's exact joint (chi-square, as tests/test_sampling_e2e.py)."""
    model, _ = verifier
    ids, triples, second = joint3
    first = joint[2]
    outs, runs = _samples(model, eos, ids, [Garbage(), Likely(first, second)], 3, strategy="hedge")
    stat, bound = chi2(outs, triples)
    assert stat <= bound, f"hedge: chi-square {stat:.1f} > {bound:.1f} against the verifier's joint law"
    assert all(r.steps[0]["chosen_drafter"] == 0 for r in runs)
    later = [(r.output_token_ids, r.steps[1]["chosen_drafter"]) for r in runs if len(r.steps) > 1]
    assert {c for _, c in later} == {0, 1}  # both branches of the choice were taken
    assert all((c == 1) == (out[1] == first.get(out[0], (None,))[0]) for out, c in later)


@pytest.mark.slow
def test_normalhedge_on_acceptance_samples_the_verifier_distribution(
        verifier, eos, joint, joint3):  # noqa: F811 (joint, joint3: the fixtures imported above)
    """NormalHedge on counterfactual acceptance (issue 64): the first step's drafter is a seeded draw
    (ties stay, nothing known yet), later ones a draw from weights that read the verifier's
    distributions on the committed path. The first three tokens over N seeds follow the verifier's
    exact joint, and both drafters draft a first step somewhere (no built-in favourite)."""
    model, _ = verifier
    ids, triples, second = joint3
    outs, runs = _samples(model, eos, ids, [Garbage(), Likely(joint[2], second)], 3, strategy="hedge",
                          hedge_learner="normalhedge", hedge_feedback="acceptance", hedge_ties="stay")
    stat, bound = chi2(outs, triples)
    assert stat <= bound, f"normalhedge: chi-square {stat:.1f} > {bound:.1f} against the verifier's joint law"
    assert {r.steps[0]["chosen_drafter"] for r in runs} == {0, 1}
    scored = [s for r in runs for s in r.steps if s["drafter_agreement"]]
    assert scored and all(0 <= a <= min(s["committed"], 2) for s in scored for a in s["drafter_agreement"])


# -- the grid: a profile asks for hedge by name -----------------------------------------------------
def test_a_profile_asks_for_hedge_and_gets_one_cell_over_the_route_pair():
    from orchestrator.grid import eval_cells
    from orchestrator.plan.sizing import load_profile
    from orchestrator.profile import ProfileError

    p = load_profile("smoke", ["eval.strategies=[autoregressive, single, hedge]"])
    cells = [c for c in eval_cells(p) if c.strategy == "hedge"]
    per = len(p.eval.benchmarks) * len(p.eval.temperatures) * len(p.train.backbones)
    assert len(cells) == per and {c.drafter for c in cells} == {"+".join(p.eval.route_pair)}
    assert all(c.drafters == tuple(f"{c.backbone}-{v}" for v in p.eval.route_pair) for c in cells)
    with pytest.raises(ProfileError, match=r"\['hedge'\] need two drafters"):
        load_profile("smoke", ["eval.strategies=[hedge]", "train.variants=[math]", "merge.kinds=[]"])


def test_a_profile_names_its_learners_and_the_first_routers_keys_stay():
    """One cell per learner x reset, each with the profile's feedback, ties and eta; the first router's
    cell (ftl on agreement, ties lower, reset turn) keeps the key and label it had."""
    from orchestrator.grid import eval_cells
    from orchestrator.plan.sizing import load_profile
    from orchestrator.profile import ProfileError

    plain = load_profile("smoke", ["eval.strategies=[single, hedge]"])
    base = [c for c in eval_cells(plain) if c.strategy == "hedge"]
    p = load_profile("smoke", ["eval.strategies=[single, hedge]",
                               "eval.hedge_learners=[ftl, normalhedge, ucb]",
                               "eval.hedge_resets=[turn, carry]", "eval.hedge_feedback=acceptance",
                               "eval.hedge_ties=stay"])
    cells = [c for c in eval_cells(p) if c.strategy == "hedge"]
    assert len(cells) == 6 * len(base)
    assert {(c.decode.hedge_learner, c.decode.hedge_reset) for c in cells} == {
        (a, b) for a in ("ftl", "normalhedge", "ucb") for b in ("turn", "carry")}
    assert all(c.decode.hedge_feedback == "acceptance" and c.decode.hedge_ties == "stay" for c in cells)
    first = base[0]
    assert first.decode.hedge == HedgeConfig() and ":hedge:" in first.label
    kept = {k: v for k, v in first.record.items() if KEY_DEFAULTS.get(k, ...) != v}  # what its key hashes
    assert first.key == key_of(kept) and not any(k.startswith("hedge_") for k in kept)
    assert len({c.key for c in cells}) == len(cells)
    for bad, match in (("eval.hedge_learners=[exp4]", "hedge_learners"), ("eval.hedge_ties=first",
            "hedge_ties"),
                       ("eval.hedge_eta=0", "hedge_eta")):
        with pytest.raises(ProfileError, match=match):
            load_profile("smoke", ["eval.strategies=[single, hedge]", bad])
