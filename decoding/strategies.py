"""Composition strategies, looked up by name. The decoding loop never branches on a strategy.

Each strategy turns the drafters' proposals into ONE tree to verify. Routing rules use only
draft-side quantities (confidence, entropy), so they are lossless (the study's Prop. A.1); merged
trees are lossless by masked cross-subtree attention and depth positions (Prop. A.2).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .drafting import Proposer, draft_together
from .tree import DraftTree, TreeConfig, merge_trees, rerank

GRANULARITIES = ("step", "turn", "prompt")


@dataclass
class Proposal:
    tree: DraftTree
    chosen: int  # drafter whose tree is verified; -1 = none (autoregressive) or all (merged)
    mean_confidence: list[float] = field(default_factory=list)  # per drafter that drafted this step
    mean_entropy: list[float] = field(default_factory=list)


class Strategy:
    name = ""
    min_drafters = 0
    max_drafters: int | None = None

    def __init__(self, granularity: str = "step", dedup: bool = False, decide_steps: int = 1, budget: bool = False):
        if granularity not in GRANULARITIES:
            raise ValueError(f"routing granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
        if not isinstance(decide_steps, int) or decide_steps < 1:
            raise ValueError(f"routing decide_steps must be a positive int, got {decide_steps!r}")
        self.granularity, self.dedup, self.decide_steps, self.budget = granularity, dedup, decide_steps, budget

    def start_prompt(self) -> None:
        """Called before the first turn of every prompt."""

    def start_turn(self) -> None:
        """Called at the first verifier call of every turn."""

    def propose(self, drafters: list[Proposer], tokens, features, cfg: TreeConfig, temperature: float) -> Proposal:
        raise NotImplementedError

    @staticmethod
    def _all(drafters, tokens, features, cfg, temperature):
        trees = draft_together(drafters, tokens, features, cfg, temperature)
        return trees, [t.mean_confidence() for t in trees], [t.mean_entropy() for t in trees]


class Autoregressive(Strategy):
    name, max_drafters = "autoregressive", 0

    def propose(self, drafters, tokens, features, cfg, temperature):
        return Proposal(DraftTree.empty(), -1)


class Single(Strategy):
    name, min_drafters, max_drafters = "single", 1, 1

    def propose(self, drafters, tokens, features, cfg, temperature):
        trees, conf, ent = self._all(drafters, tokens, features, cfg, temperature)
        return Proposal(trees[0], 0, conf, ent)


class _Routed(Strategy):
    """Routing at one of three granularities: ``step`` (every verifier call), ``turn`` (decided
    from the first ``decide_steps`` calls of each turn, then locked for the turn) or ``prompt``
    (decided from the first ``decide_steps`` calls of the prompt's first turn, then locked for
    every turn of the prompt). While deciding, every drafter drafts and the scores so far pick."""

    min_drafters = 2

    def score(self, conf: list[float], ent: list[float]) -> int:
        raise NotImplementedError

    def start_prompt(self):
        self.locked, self.seen = None, []

    def start_turn(self):
        if self.granularity == "turn" or not hasattr(self, "seen"):
            self.start_prompt()

    def propose(self, drafters, tokens, features, cfg, temperature):
        if self.granularity != "step" and getattr(self, "locked", None) is not None:
            tree = drafters[self.locked].draft(tokens, features, cfg, temperature)
            conf = [float("nan")] * len(drafters)
            ent = [float("nan")] * len(drafters)
            conf[self.locked], ent[self.locked] = tree.mean_confidence(), tree.mean_entropy()
            return Proposal(tree, self.locked, conf, ent)
        trees, conf, ent = self._all(drafters, tokens, features, cfg, temperature)
        if self.granularity == "step":
            choice = self.score(conf, ent)
            return Proposal(trees[choice], choice, conf, ent)
        self.seen.append((conf, ent))  # mean scores over the deciding steps so far
        mean = lambda xs: [float(torch.tensor(col).nanmean()) for col in zip(*xs)]  # noqa: E731
        choice = self.score(mean([c for c, _ in self.seen]), mean([e for _, e in self.seen]))
        if len(self.seen) >= self.decide_steps:
            self.locked = choice
        return Proposal(trees[choice], choice, conf, ent)


class Confidence(_Routed):
    """Verify the tree with the higher mean node confidence."""

    name = "confidence"

    def score(self, conf, ent):
        return int(torch.tensor(conf).nan_to_num(-1.0).argmax())


class Entropy(_Routed):
    """Verify the tree with the lower mean node draft entropy."""

    name = "entropy"

    def score(self, conf, ent):
        return int(torch.tensor(ent).nan_to_num(float("inf")).argmin())


class Merged(Strategy):
    """Shared root, every drafter's nodes below it, one verifier pass. ``budget``: the union is
    reranked globally by path score to ``total_tokens`` - 1 nodes (the same verification budget
    as one drafter's tree); otherwise the study's plain concatenation (N x (total_tokens - 1))."""

    name, min_drafters = "merged", 2

    def propose(self, drafters, tokens, features, cfg, temperature):
        trees, conf, ent = self._all(drafters, tokens, features, cfg, temperature)
        tree = merge_trees(trees, dedup=self.dedup)
        return Proposal(rerank(tree, cfg.total_tokens - 1) if self.budget else tree, -1, conf, ent)


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Autoregressive, Single, Confidence, Entropy, Merged)}


def make_strategy(name: str, n_drafters: int, granularity: str = "step", dedup: bool = False,
                  decide_steps: int = 1, budget: bool = False) -> Strategy:
    """Build a strategy by name, checking the number of drafters it needs."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    cls = STRATEGIES[name]
    if n_drafters < cls.min_drafters:
        raise ValueError(f"strategy {name!r} needs at least {cls.min_drafters} drafter(s), got {n_drafters}")
    if cls.max_drafters is not None and n_drafters > cls.max_drafters:
        raise ValueError(f"strategy {name!r} takes at most {cls.max_drafters} drafter(s), got {n_drafters}")
    return cls(granularity=granularity, dedup=dedup, decide_steps=decide_steps, budget=budget)
