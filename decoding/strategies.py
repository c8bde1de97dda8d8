"""Composition strategies, looked up by name. The decoding loop never branches on a strategy.

Each strategy turns the drafters' proposals into ONE tree to verify. Routing rules use only
draft-side quantities (confidence, entropy), so they are lossless (the study's Prop. A.1); merged
trees are lossless by masked cross-subtree attention and depth positions (Prop. A.2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafting import Proposer, draft_together
from .tree import DraftTree, TreeConfig, merge_trees, rerank

GRANULARITIES = ("step", "turn", "prompt")


@dataclass
class Proposal:
    tree: DraftTree
    chosen: int  # drafter whose tree is verified; -1 = none (autoregressive) or all (merged)
    stats: torch.Tensor | None = None  # (drafters, 2) [mean confidence, mean entropy] per drafter, NaN = did
    #                                   not draft; on the trees' device (the engine reads it with its step)


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
        """Every drafter's tree (on the features' device) and their (drafters, 2) mean stats there."""
        trees = draft_together(drafters, tokens, features, cfg, temperature)
        if features is not None:
            trees = [t.to(features.device) for t in trees]  # host-built trees (chains, oracles): one copy
        return trees, torch.stack([t.mean_stats() for t in trees])


class Autoregressive(Strategy):
    name, max_drafters = "autoregressive", 0

    def propose(self, drafters, tokens, features, cfg, temperature):
        return Proposal(DraftTree.empty(None if features is None else features.device), -1)


class Single(Strategy):
    name, min_drafters, max_drafters = "single", 1, 1

    def propose(self, drafters, tokens, features, cfg, temperature):
        trees, stats = self._all(drafters, tokens, features, cfg, temperature)
        return Proposal(trees[0], 0, stats)


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
            if features is not None:
                tree = tree.to(features.device)
            stats = torch.full((len(drafters), 2), float("nan"), device=tree.device)
            stats[self.locked] = tree.mean_stats()
            return Proposal(tree, self.locked, stats)
        trees, stats = self._all(drafters, tokens, features, cfg, temperature)
        conf, ent = (list(col) for col in zip(*stats.tolist()))  # the route's one host read
        if self.granularity == "step":
            choice = self.score(conf, ent)
            return Proposal(trees[choice], choice, stats)
        self.seen.append((conf, ent))  # mean scores over the deciding steps so far
        mean = lambda xs: [float(torch.tensor(col).nanmean()) for col in zip(*xs)]  # noqa: E731
        choice = self.score(mean([c for c, _ in self.seen]), mean([e for _, e in self.seen]))
        if len(self.seen) >= self.decide_steps:
            self.locked = choice
        return Proposal(trees[choice], choice, stats)


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
        trees, stats = self._all(drafters, tokens, features, cfg, temperature)
        tree = merge_trees(trees, dedup=self.dedup)
        return Proposal(rerank(tree, cfg.total_tokens - 1) if self.budget else tree, -1, stats)


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
