"""Composition strategies, looked up by name. The decoding loop never branches on a strategy.

Each strategy turns the drafters' proposals into ONE tree to verify. Routing rules use only
draft-side quantities (confidence, entropy), so they are lossless (the study's Prop. A.1); merged
trees are lossless by masked cross-subtree attention and depth positions (Prop. A.2). The study's
proposed next experiments are here too: ``switching`` (acceptance history: a tree chosen from past
steps' outcomes is fixed before its verification) and ``depth_adaptive`` (one composed tree with
correct parents and depths: lossless under the tree mask like any tree). ``hedge`` is an online
router: it scores drafters against the tokens each verification committed and drafts the next step
from the one its learner chooses (decoding/hedge.py), so it too reads only verified tokens (and a
seeded draw independent of the verifier's sampler).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

import torch

from decoding.config import STRATEGY_NAMES, DecodeConfig, TreeConfig, switch_depth_error
from decoding.drafting import (
    Proposer,
    acceptance_together,
    agreement_together,
    can_agree,
    can_roll_out,
    draft_together_steps,
)
from decoding.hedge import (
    BANDITS,
    HedgeConfig,
    acceptance_gains,
    choose,
    learn,
    learn_chosen,
    start_state,
    step_losses,
)
from decoding.rounds import drive
from decoding.tree import DraftTree, graft_trees, merge_trees, rerank

STAT = {"path": 0, "entropy": 1, "node": 2}  # the columns of Proposal.stats


@dataclass
class Proposal:
    tree: DraftTree
    chosen: int  # drafter whose tree is verified; -1 = none (autoregressive) or all (merged)
    stats: torch.Tensor | None = None  # (drafters, 3) per drafter, columns STAT, NaN = did not draft;
    #                                   on the trees' device (the engine reads it with its step)


def switch_rule(fails: int, accepted_depth: int, k: int) -> tuple[int, bool]:
    """Acceptance-history switching: (consecutive steps with no draft token accepted, switch now?).
    An accepted draft token resets the count; the k-th empty step in a row switches and resets it."""
    fails = 0 if accepted_depth > 0 else fails + 1
    return (0, True) if fails >= k else (fails, False)


class Strategy:
    name = ""
    min_drafters = 0
    max_drafters: int | None = None

    def __init__(self, cfg: DecodeConfig):
        """``cfg``: the options, checked once by DecodeConfig; those a strategy does not use are ignored."""
        self.granularity, self.decide_steps = cfg.routing_granularity, cfg.routing_decide_steps
        self.dedup = cfg.merge_dedup
        self.budget = cfg.merge_budget
        self.route_score = cfg.route_score
        self.switch_after = cfg.switch_after
        self.switch_to = cfg.switch_to
        self.switch_depth = cfg.switch_depth
        self.hedge = cfg.hedge
        self.rng = random.Random(cfg.seed)  # a strategy's own draws (hedge); the engine reseeds it per turn

    def seed_turn(self, seed: int) -> None:
        """Called before every turn with a seed of the decode seed and the prompt turn (engine.prompt_seed),
        for a strategy's own draws: never the verifier's sampler."""
        self.rng = random.Random(seed)

    def check(self, drafters: list[Proposer]) -> None:
        """Refuse drafters the strategy cannot use (called once, before any decoding)."""

    def start_prompt(self) -> None:
        """Called before the first turn of every prompt."""

    def start_turn(self) -> None:
        """Called at the first verifier call of every turn."""

    def observe(self, accepted_depth: int) -> None:
        """Called once per verifier step with the number of draft tokens it accepted (a host value
        the engine already has: no extra device read)."""

    needs_target = False  # feedback reads the verifier's distributions on the committed path (T > 0)

    def feedback(self, drafters: list[Proposer], tokens, features, start: int, last: bool, target=None):
        """After a step's tokens are committed (``tokens[start:]``; tokens and features as ``propose``
        gets them, the new root included; ``last``: the turn ends with this step; ``target`` (c, V): the
        verifier's sampling distribution at each committed position when ``needs_target`` and T > 0,
        else None): device values the engine reads with the step record (no read of its own), or None.
        Timed as drafting."""
        return None

    def learn(self, values: list[float], committed: int) -> None:
        """The host copy of ``feedback``'s values, and the number of tokens the step committed."""

    def propose(self, drafters: list[Proposer], tokens, features, cfg: TreeConfig,
                temperature: float) -> Proposal:
        """The step's tree, drafted here (``propose_steps`` run by ``rounds.drive``)."""
        return drive(self.propose_steps(drafters, tokens, features, cfg, temperature))

    def propose_steps(self, drafters: list[Proposer], tokens, features, cfg: TreeConfig, temperature: float):
        """``propose`` as a generator of ``rounds.DraftRound``s, answered by whoever drives it (the
        engine's turn, or several prompts' turns at once: decoding/batch.py); returns the Proposal."""
        raise NotImplementedError

    @staticmethod
    def _draft(drafters, tokens, features, cfg, temperature, only: list[int] | None = None):
        """The trees of ``drafters[i]`` for i in ``only`` (default: all; None for the others), on the
        features' device, and the (drafters, 3) mean stats there (NaN rows for those that did not draft).
        A generator of draft rounds (``yield from``)."""
        only = list(range(len(drafters))) if only is None else only
        got = yield from draft_together_steps([drafters[i] for i in only], tokens, features, cfg, temperature)
        if features is not None:
            got = [t.to(features.device) for t in got]  # host-built trees (chains, oracles): one copy
        trees: list[DraftTree | None] = [None] * len(drafters)
        for i, t in zip(only, got):
            trees[i] = t
        nan = torch.full((3,), float("nan"), device=got[0].device)
        return trees, torch.stack([nan if t is None else t.mean_stats() for t in trees])

    def _merged(self, trees: list[DraftTree], cfg: TreeConfig) -> DraftTree:
        tree = merge_trees(trees, dedup=self.dedup)
        return rerank(tree, cfg.total_tokens - 1) if self.budget else tree


class Autoregressive(Strategy):
    name, max_drafters = "autoregressive", 0

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        return Proposal(DraftTree.empty(None if features is None else features.device), -1)
        yield  # a generator that drafts nothing


class Single(Strategy):
    name = "single"
    min_drafters = 1
    max_drafters = 1

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature)
        return Proposal(trees[0], 0, stats)


class _Routed(Strategy):
    """Routing at one of three granularities: ``step`` (every verifier call), ``turn`` (decided
    from the first ``decide_steps`` calls of each turn, then locked for the turn) or ``prompt``
    (decided from the first ``decide_steps`` calls of the prompt's first turn, then locked for
    every turn of the prompt). While deciding, every drafter drafts and the mean scores so far pick.
    The candidates are ``drafters[routed_from:]``; the ones before them always draft."""

    min_drafters = 2
    routed_from = 0

    def pick(self, rows: list[list[float]]) -> int:
        """The chosen candidate (index into ``rows``) from its stats rows (candidates x 3)."""
        raise NotImplementedError

    def start_prompt(self):
        self.locked, self.seen = None, []

    def start_turn(self):
        if self.granularity == "turn" or not hasattr(self, "seen"):
            self.start_prompt()

    def _route(self, drafters, tokens, features, cfg, temperature):
        """(trees, (drafters, 3) stats, chosen drafter); one host read while the route is open."""
        if self.granularity != "step" and getattr(self, "locked", None) is not None:
            only = [*range(self.routed_from), self.locked]
            trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature, only)
            return trees, stats, self.locked
        trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature)
        rows = stats.tolist()[self.routed_from:]  # the route's one host read
        if self.granularity == "step":
            return trees, stats, self.routed_from + self.pick(rows)
        self.seen.append(rows)
        mean = torch.tensor(self.seen).nanmean(0).tolist()  # (candidates, 3) over the deciding steps so far
        choice = self.routed_from + self.pick(mean)
        if len(self.seen) >= self.decide_steps:
            self.locked = choice
        return trees, stats, choice

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        trees, stats, choice = yield from self._route(drafters, tokens, features, cfg, temperature)
        return Proposal(trees[choice], choice, stats)


class Confidence(_Routed):
    """Verify the tree with the higher mean confidence: path confidence V (``score="path"``, EAGLE-2's
    path score) or node confidence c (``score="node"``, the study's text)."""

    name = "confidence"

    def pick(self, rows):
        return int(torch.tensor([r[STAT[self.route_score]] for r in rows]).nan_to_num(-1.0).argmax())


class Entropy(_Routed):
    """Verify the tree with the lower mean node draft entropy (``score`` does not apply)."""

    name = "entropy"

    def pick(self, rows):
        return int(torch.tensor([r[STAT["entropy"]] for r in rows]).nan_to_num(float("inf")).argmin())


class Merged(Strategy):
    """Shared root, every drafter's nodes below it, one verifier pass. ``budget``: the union is
    reranked globally by path score to ``total_tokens`` - 1 nodes (the same verification budget
    as one drafter's tree); otherwise the study's plain concatenation (N x (total_tokens - 1))."""

    name, min_drafters = "merged", 2

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature)
        return Proposal(self._merged(trees, cfg), -1, stats)


class Switching(Confidence):
    """Acceptance-history switching between two specialists (the study's proposed next experiment).

    Each turn starts as ``confidence`` routing (granularity, decide steps and score as set; a
    prompt-level route carries over to later turns). After ``switch_after`` (k) consecutive verifier
    steps that accept no draft token (``switch_rule``), it switches: ``switch_to="specialist"``
    verifies the other specialist than the one verified at that step, and only that one drafts; the
    count restarts, and k empty steps of that one switch back, and so on. ``switch_to="merged"``
    verifies merged trees of both (``dedup``/``budget`` as set) for the rest of the turn. The rule
    reads only past steps' outcomes, so each tree is fixed before its verification (lossless as any
    draft-side routing). ``chosen`` is the drafter verified, -1 for merged trees.
    """

    name = "switching"
    min_drafters = 2
    max_drafters = 2

    def start_turn(self):
        super().start_turn()
        self.active = None  # None = routed; a drafter index; or "merged"
        self.fails = 0
        self.last = 0

    def observe(self, accepted_depth):
        if not hasattr(self, "active"):
            self.start_turn()
        self.fails, switch = switch_rule(self.fails, accepted_depth, self.switch_after)
        if switch and self.active != "merged":
            self.active = "merged" if self.switch_to == "merged" else 1 - self.last

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        active = getattr(self, "active", None)
        if active is None:
            prop = yield from super().propose_steps(drafters, tokens, features, cfg, temperature)
        elif active == "merged":
            trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature)
            prop = Proposal(self._merged(trees, cfg), -1, stats)
        else:
            trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature, [active])
            prop = Proposal(trees[active], active, stats)
        self.last = prop.chosen
        return prop


class DepthAdaptive(Confidence):
    """Depth-adaptive composition: drafters (mixed, specialist a, specialist b). Levels 1..
    ``switch_depth`` come from the mixed drafter's tree (coverage), deeper levels from the
    specialist chosen by confidence routing between a and b (precision; granularity, decide steps
    and score as set), grafted under the mixed nodes with the same token path, budget-matched to
    one tree (``tree.graft_trees``, ``total_tokens`` - 1 nodes). ``chosen`` is that specialist.
    Needs 1 <= switch_depth <= tree depth - 1."""

    name = "depth_adaptive"
    min_drafters = 3
    max_drafters = 3
    routed_from = 1

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        why = switch_depth_error(self.switch_depth, cfg.depth)  # (the tree handed at this step)
        if why:
            raise ValueError(why)
        trees, stats, choice = yield from self._route(drafters, tokens, features, cfg, temperature)
        tree = graft_trees(trees[0], trees[choice], self.switch_depth, cfg.total_tokens - 1)
        return Proposal(tree, choice, stats)


class Hedge(Strategy):
    """Online routing (decoding/hedge.py): only the drafter its learner chooses drafts; after every
    verification the learner takes the step's feedback. Full-information learners (ftl, hedge,
    normalhedge) score every drafter: ``agreement``, the committed tokens its teacher-forced pass
    predicts as its top-1 (``drafting.agreement_together``), or ``acceptance``, its counterfactual
    expected accepted length over the first min(c, tree depth) committed positions from its own
    multi-step draft along them (``drafting.acceptance_together``; at T > 0 with the verifier's
    distributions there). The bandit (ucb) sees only the chosen drafter's realised acceptance and runs
    no feedback pass. Weights restart at every turn (``reset="turn"``), every prompt (``"carry"``) or
    never while this strategy lives (``"stream"``: one decoder's prompts, an eval shard).
    The tree is fixed before its verification."""

    name, min_drafters = "hedge", 2

    @property
    def needs_target(self) -> bool:
        return self.hedge.feedback == "acceptance" and self.hedge.learner not in BANDITS

    def check(self, drafters):
        if self.hedge.learner in BANDITS:
            return
        ok, what = (can_agree, "a teacher-forced pass (agree_steps or predict)") if self.hedge.feedback == \
            "agreement" else (can_roll_out,
                              "its own draft along the committed tokens (rollout_steps or predict)")
        bad = [getattr(p, "name", repr(p)) for p in drafters if not ok(p)]
        if bad:
            raise ValueError(f"strategy 'hedge' with {self.hedge.feedback} feedback scores every drafter by "
                             f"{what}; {bad} cannot be scored")

    def start_prompt(self):
        if self.hedge.reset != "stream" or not hasattr(self, "state"):
            self.state = None  # set from the number of drafters at the first proposal

    def start_turn(self):
        if self.hedge.reset == "turn" or not hasattr(self, "state"):
            self.state = None

    def _state(self, n: int):
        if getattr(self, "state", None) is None:
            self.state = start_state(n, self.hedge)
        return self.state

    def observe(self, accepted_depth):
        if self.hedge.learner in BANDITS and getattr(self, "state", None) is not None:
            self.state = learn_chosen(self.state, self.state.current, accepted_depth / self.depth)

    def feedback(self, drafters, tokens, features, start, last, target=None):
        if self.hedge.learner in BANDITS or (last and self.hedge.reset == "turn"):  # (the weights restart)
            return None
        if self.hedge.feedback == "agreement":
            return agreement_together(drafters, tokens, features, start)  # (D,) on the device
        # scored positions: committed, within the tree's depth
        depth = min(tokens.shape[0] - start, self.depth)
        return acceptance_together(drafters, tokens, features, start, depth, target, self.temperature)

    def learn(self, values, committed):
        state = self._state(len(values))
        if self.hedge.feedback == "agreement":
            step_losses(values, committed)  # (checks the counts)
            gains = [a / committed for a in values]  # loss 1 - a/c, the same floats as the first router's
        else:
            gains = acceptance_gains(values, self.depth)
        self.state = learn(state, self.hedge, gains)

    def propose_steps(self, drafters, tokens, features, cfg, temperature):
        self.depth, self.temperature = cfg.depth, temperature
        state = self._state(len(drafters))
        choice = choose(state, self.hedge, self.rng.random())
        self.state = replace(state, current=choice)
        trees, stats = yield from self._draft(drafters, tokens, features, cfg, temperature, [choice])
        return Proposal(trees[choice], choice, stats)


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Autoregressive, Single, Confidence, Entropy,
                                                             Merged,
                                                             Switching, DepthAdaptive, Hedge)}
assert tuple(STRATEGIES) == STRATEGY_NAMES, "decoding/config.py names every strategy registered here"


def strategy_for(cfg: DecodeConfig, n_drafters: int) -> Strategy:
    """The strategy ``cfg`` names, for ``n_drafters`` drafters (a count it cannot use is refused)."""
    cls = STRATEGIES[cfg.strategy]
    if n_drafters < cls.min_drafters:
        raise ValueError(f"strategy {cfg.strategy!r} needs at least {cls.min_drafters} drafter(s), got "
                         f"{n_drafters}")
    if cls.max_drafters is not None and n_drafters > cls.max_drafters:
        raise ValueError(f"strategy {cfg.strategy!r} takes at most {cls.max_drafters} drafter(s), got "
                         f"{n_drafters}")
    return cls(cfg)


_D = DecodeConfig  # make_strategy's defaults are DecodeConfig's
_HEDGE = HedgeConfig()  # make_strategy's hedge default (frozen: one instance serves every call)


def make_strategy(name: str, n_drafters: int, granularity: str = _D.routing_granularity,
                  dedup: bool = _D.merge_dedup, decide_steps: int = _D.routing_decide_steps,
                  budget: bool = _D.merge_budget, score: str = _D.route_score,
                  switch_after: int = _D.switch_after, switch_to: str = _D.switch_to,
                  switch_depth: int = _D.switch_depth, hedge: HedgeConfig = _HEDGE) -> Strategy:
    """A strategy by name and options, without a decoder (tests, the CLI's early check): the options
    are checked by DecodeConfig whatever the strategy. No tree is known here, so DecodeConfig gets one
    deep enough for ``switch_depth``; DepthAdaptive checks it against the tree each step hands it."""
    if not isinstance(hedge, HedgeConfig):
        raise ValueError(f"hedge options must be a HedgeConfig, got {type(hedge).__name__}")
    deep = switch_depth + 1 if isinstance(switch_depth,
                                          int) and switch_depth >= TreeConfig.depth else TreeConfig.depth
    cfg = DecodeConfig(strategy=name, routing_granularity=granularity, merge_dedup=dedup,
                       routing_decide_steps=decide_steps, merge_budget=budget, route_score=score,
                       switch_after=switch_after, switch_to=switch_to, switch_depth=switch_depth,
                       tree=TreeConfig(depth=deep), **{f"hedge_{k}": v for k, v in asdict(hedge).items()})
    return strategy_for(cfg, n_drafters)
