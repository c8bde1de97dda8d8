"""The oracle proposer: the speed ceiling of the verification path.

It knows the verifier's own greedy continuation of the prompt and proposes its next ``depth``
tokens as a chain, so every draft token is accepted at T=0. What it measures is what a perfect
drafter at zero draft cost would buy on this machine (verify-pass cost against the number of
nodes, cache bookkeeping), which no trained drafter can beat.
"""
from __future__ import annotations

import torch

from decoding.config import TreeConfig
from decoding.tree import DraftTree, chain_tree


class OracleChainProposer:
    def __init__(self, prompt_len: int, reference: list[int], name: str = "oracle", index: int = 0):
        self.prompt_len = prompt_len
        self.ref = list(reference)
        self.name = name
        self.index = index

    def reset(self) -> None:
        pass

    def draft(self, tokens: torch.Tensor, features: torch.Tensor, cfg: TreeConfig,
              temperature: float) -> DraftTree:
        done = tokens.shape[0] - self.prompt_len  # committed output tokens incl. the root
        truth = self.ref[done : done + cfg.depth]
        return chain_tree([truth], self.index) if truth else DraftTree.empty()
