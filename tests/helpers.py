"""Test-only proposers (real Proposer implementations with scripted draft trees)."""
from __future__ import annotations

import torch

from decoding.tree import DraftTree, TreeConfig


def chain_tree(paths: list[list[int]], owner: int = 0) -> DraftTree:
    """A draft tree from token paths below the root (shared prefixes become shared nodes)."""
    index, toks, pars, deps = {}, [], [], []
    for path in paths:
        parent = -1
        for d, t in enumerate(path, 1):
            key = (parent, t)
            if key not in index:
                index[key] = len(toks)
                toks.append(t), pars.append(parent), deps.append(d)
            parent = index[key]
    # parents-first order: sort by depth (stable)
    order = sorted(range(len(toks)), key=lambda i: deps[i])
    pos = {o: i for i, o in enumerate(order)}
    n = len(toks)
    L = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return DraftTree(
        L([toks[o] for o in order]), L([pos[pars[o]] if pars[o] >= 0 else -1 for o in order]),
        L([deps[o] for o in order]), -0.1 * L([deps[o] for o in order]).float(), torch.full((n,), 0.5),
        torch.full((n,), owner, dtype=torch.long), torch.full((n,), 1 << owner, dtype=torch.long),
    )


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
