"""The decoding settings, each declared and checked once (torch-free): the tree shape
(``TreeConfig``) and the strategy's options (``DecodeConfig``), with the values each may take.

These frozen dataclasses are the settings themselves all the way down: the profile's
``eval.tree`` section is a ``TreeConfig``, the grid builds one ``DecodeConfig`` per evaluation
cell, it crosses Ray to the eval actor as it is, and the decode loop reads it. The profile
imports the allowed values from here and adds only what spans its stages.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

from common.rules import check, integer
from decoding.hedge import HedgeConfig

# one strategy class per name (decoding/strategies.py's registry); the grid names them as strings
STRATEGY_NAMES = ("autoregressive", "single", "confidence", "entropy", "merged", "switching",
                  "depth_adaptive",
                  "hedge")
GRANULARITIES = ("step", "turn", "prompt")  # routing: per verifier call, per turn, per prompt
# confidence routing: mean path confidence V, or mean node confidence c (the study's)
SCORES = ("path", "node")
SWITCH_TO = ("specialist", "merged")
SWITCH_AFTER = range(1, 6)
# the strategy options every trace row carries (report columns), in this order
OPTION_COLUMNS = ("route_score", "switch_after", "switch_to", "switch_depth")
HEDGE_FIELDS = tuple(f.name for f in dataclasses.fields(HedgeConfig))  # DecodeConfig's hedge_<name> fields
# how a run picks its tree: fixed, the TreeConfig given; auto, fitted to the machine and drafters
# (decoding/autotree.py). The mode is ``tree_mode`` in code; the trace column keeps its first name, "tree"
TREE_MODES = ("fixed", "auto")
AUTOREGRESSIVE_BUDGET = 1  # nodes an autoregressive step verifies: the root alone (no tree)


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 dynamic tree. ``depth`` = max draft tokens on a path (EAGLE-2's depth + 1)."""

    top_k: int = 4
    depth: int = 4
    # nodes verified per call, root included (EAGLE's total_token): the root + >= 1 node
    total_tokens: int = 16

    SMALLEST = 2  # total_tokens' least value: the root and one node (the tree an autoregressive config holds)
    RULES = {"top_k": integer(1), "depth": integer(1), "total_tokens": integer(SMALLEST)}

    def __post_init__(self):
        check(self, "tree ")

    @property
    def shape(self) -> str:
        """top_k/depth/total_tokens (the trace column ``tree_shape``)."""
        return f"{self.top_k}/{self.depth}/{self.total_tokens}"


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def switch_depth_error(switch_depth, depth: int) -> str | None:
    """Why depth_adaptive cannot split a tree of ``depth`` levels at ``switch_depth`` (None: it can):
    levels 1..switch_depth come from the mixed drafter, the deeper ones from a specialist (the one
    statement of this rule: DecodeConfig, the profile's check and DepthAdaptive each ask it)."""
    if _positive_int(switch_depth) and switch_depth < depth:
        return None
    return f"switch_depth must be an int in 1..tree.depth - 1 (tree depth {depth}), got {switch_depth!r}"


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "single"
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 42
    routing_granularity: str = "step"  # step | turn | prompt (see strategies._Routed)
    routing_decide_steps: int = 1  # turn/prompt granularity: verifier calls whose scores decide the route
    merge_dedup: bool = False  # merged trees: plain concatenation (study) or trie (deduplicated)
    merge_budget: bool = False  # merged trees: rerank the union to tree.total_tokens (budget-matched)
    top_k_sampling: int | None = None  # optional verifier top-k filter (temperature > 0)
    top_p: float | None = None  # optional verifier top-p filter (temperature > 0)
    route_score: str = "path"  # confidence routing score: path (mean V) | node (mean c, the study's text)
    switch_after: int = 2  # switching: k consecutive steps with nothing accepted switch (SWITCH_AFTER)
    switch_to: str = "specialist"  # switching: to the other specialist | to merged trees
    switch_depth: int = 2  # depth_adaptive: deepest level from the mixed drafter (1..tree.depth - 1)
    # hedge: decoding/hedge.py's HedgeConfig field by field (``.hedge``), at its defaults (the first router's)
    hedge_eta: float = HedgeConfig.eta  # learning rate (> 0)
    hedge_prior: str = HedgeConfig.prior  # uniform | mixed-first (the first drafter starts ahead)
    hedge_reset: str = HedgeConfig.reset  # fresh every turn | per prompt (carry) | per decoder (stream)
    hedge_learner: str = HedgeConfig.learner  # ftl | hedge | normalhedge | ucb (decoding/hedge.py LEARNERS)
    hedge_feedback: str = HedgeConfig.feedback  # agreement (depth-1 top-1) | acceptance (counterfactual)
    hedge_ties: str = HedgeConfig.ties  # ties of ftl/ucb to the lower index | stay with the current drafter
    tree: TreeConfig = field(default_factory=TreeConfig)

    def __post_init__(self):
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {sorted(STRATEGY_NAMES)}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.routing_granularity not in GRANULARITIES:
            raise ValueError(f"routing_granularity must be one of {list(GRANULARITIES)}, "
                             f"got {self.routing_granularity!r}")
        if not isinstance(self.routing_decide_steps, int) or self.routing_decide_steps < 1:
            raise ValueError("routing_decide_steps must be a positive int, "
                             f"got {self.routing_decide_steps!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.route_score not in SCORES:
            raise ValueError(f"route_score must be one of {list(SCORES)} (the route score: mean path "
                             "confidence "
                             f"V or mean node confidence c), got {self.route_score!r}")
        if not isinstance(self.switch_after, int) or self.switch_after not in SWITCH_AFTER:
            raise ValueError(f"switch_after must be an int in {SWITCH_AFTER[0]}..{SWITCH_AFTER[-1]}, "
                             f"got {self.switch_after!r}")
        if self.switch_to not in SWITCH_TO:
            raise ValueError(f"switch_to must be one of {list(SWITCH_TO)}, got {self.switch_to!r}")
        why = switch_depth_error(self.switch_depth, self.tree.depth)  # the other strategies: any positive int
        if why and (self.strategy == "depth_adaptive" or not _positive_int(self.switch_depth)):
            raise ValueError(why)
        _ = self.hedge  # refuses a bad hedge_* field by name

    @cached_property
    def hedge(self) -> HedgeConfig:
        """The hedge_* fields as decoding/hedge.py's HedgeConfig (built once, on the first read)."""
        return HedgeConfig(**{k: getattr(self, f"hedge_{k}") for k in HEDGE_FIELDS})

    @property
    def budget(self) -> int:
        """Nodes verified per call (the trace's and the cell key's ``total_tokens``): the tree's
        total_tokens; autoregressive verifies the root alone (its tree, unused, is the smallest)."""
        return AUTOREGRESSIVE_BUDGET if self.strategy == "autoregressive" else self.tree.total_tokens

    def columns(self) -> dict:
        """The strategy options as trace columns (OPTION_COLUMNS, every one; ``hedge_spec``: the hedge
        options away from their defaults, "" at them)."""
        return {k: getattr(self, k) for k in OPTION_COLUMNS} | {"hedge_spec": self.hedge.label}

