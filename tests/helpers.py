"""Test-only proposers (real Proposer implementations with scripted draft trees)."""
from __future__ import annotations

from decoding.tree import TreeConfig, chain_tree


class ConstantProposer:
    """Adversarial: always proposes the same (wrong) tokens, whatever the context."""

    def __init__(self, token: int = 1000, owner: int = 0, name: str = "adversarial"):
        self.token, self.owner, self.name = token, owner, name

    def reset(self):
        pass

    def draft(self, tokens, features, cfg: TreeConfig, temperature):
        t = self.token
        return chain_tree([[t] * cfg.depth, [t + 1, t + 2]], self.owner)


class OracleProposer:
    """Knows the verifier's greedy continuation; proposes a wrong branch first, then the truth.

    Exercises deep acceptance, a non-first accepted child and cache compaction over gaps.
    """

    def __init__(self, prompt_len: int, reference: list[int], owner: int = 0, name: str = "oracle", wrong_first: bool = True):
        self.prompt_len, self.ref, self.owner, self.name, self.wrong_first = prompt_len, reference, owner, name, wrong_first

    def reset(self):
        pass

    def draft(self, tokens, features, cfg: TreeConfig, temperature):
        done = tokens.shape[0] - self.prompt_len  # committed output tokens incl. the root
        truth = self.ref[done : done + cfg.depth]
        wrong = [(t + 7) % 49152 for t in truth[:2]] or [5]
        paths = ([wrong] if self.wrong_first else []) + ([truth] if truth else [])
        return chain_tree(paths, self.owner)
