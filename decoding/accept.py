"""Lossless acceptance walks over a verified tree (pure tensor functions).

Notation as in the study: p = draft distribution, q = verifier distribution. Index 0 is the root
(last committed token); tree node i is index i + 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None):
    """Verifier logits (..., V) -> sampling distribution q (..., V) after temperature/top-k/top-p.

    temperature must be > 0 here (temperature 0 is greedy and never samples).
    """
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, idx = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from an unnormalised distribution (V,) by inverse CDF (faster than multinomial)."""
    cdf = probs.double().cumsum(0)  # (V,)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[0] - 1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dim."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


class LazyRows:
    """``rows[i]`` = ``fn(logits[i])``, computed on first use: the acceptance walk at T > 0 reads
    q only at the root and the nodes it reaches, not at all N+1 rows."""

    def __init__(self, fn, logits: torch.Tensor):
        self.fn, self.logits, self._rows = fn, logits, {}

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self._rows:
            self._rows[i] = self.fn(self.logits[i])
        return self._rows[i]


@dataclass
class Acceptance:
    path: list[int]  # accepted tree indices (1-based, root excluded), root to leaf
    next_token: int  # the verifier's own token after the last accepted node (bonus/correction)
    rejected: int | None  # tree index (1-based) of the first rejected child at the stop node, if any


def _children(parents: torch.Tensor) -> list[list[int]]:
    """children[i] = tree indices (1-based) of node i's children, in order; i = 0 is the root."""
    kids: list[list[int]] = [[] for _ in range(parents.shape[0] + 1)]
    for i, p in enumerate(parents.tolist()):
        kids[p + 1].append(i + 1)
    return kids


def greedy_match(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N,) bool: node i and all its ancestors equal the verifier's argmax at their parents.

    tokens, parents (N,); target (N+1,) argmax of q at the root and at every node.
    """
    n = tokens.shape[0]
    ok = torch.zeros(n + 1, dtype=torch.bool)
    ok[0] = True
    par = parents + 1  # (N,) 1-based parent index
    match = tokens == target[par]  # (N,) node equals its parent's argmax
    for i in range(n):  # parents precede children
        ok[i + 1] = match[i] & ok[par[i]]
    return ok[1:]


def accept_greedy(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, target: torch.Tensor) -> Acceptance:
    """Temperature 0: the deepest node whose whole path equals the verifier's argmax chain.

    tokens, parents, depths (N,); target (N+1,) argmax of q at the root and at every node.
    Searching the whole tree (not only the first matching child) makes merged trees with duplicate
    siblings take the longest accepted path from any subtree, as the study's Prop. A.2 requires.
    """
    n = tokens.shape[0]
    ok = greedy_match(tokens, parents, target)
    par = parents + 1
    depth_ok = torch.where(ok, depths, torch.zeros_like(depths))
    if n == 0 or int(depth_ok.max()) == 0:
        path = []
    else:
        leaf = int(depth_ok.argmax()) + 1  # first node of maximal depth
        path = []
        while leaf > 0:
            path.append(leaf)
            leaf = int(par[leaf - 1])
        path.reverse()
    last = path[-1] if path else 0
    kids = [i + 1 for i in range(n) if int(par[i]) == last]
    return Acceptance(path, int(target[last]), kids[0] if kids else None)


def accept_sampling(tokens: torch.Tensor, parents: torch.Tensor, q, generator: torch.Generator) -> Acceptance:
    """Temperature > 0: multi-candidate rejection sampling for deterministic proposals.

    q (N+1, V) (or :class:`LazyRows`) verifier distributions at the root and every node. At a
    node, the distinct tokens of its children are tried in order; token x is accepted with
    probability q'(x), where q' is q with previously rejected tokens zeroed and renormalised; if
    all are rejected, the next token is sampled from q'. Lossless: the committed token at every
    position is distributed exactly as q.

    Same-token siblings are pooled (as EAGLE matches candidates by token prefix): a merged tree
    without dedup holds one copy of a token per drafter, each with its own subtree; after x is
    accepted the walk continues among the children of every copy of x, so no subtree is lost.
    The copies share their token path, hence their verifier context, KV rows and q.
    """
    kids = _children(parents)
    group, last = [0], 0  # copies of the current node (the same token path); the last accepted node
    while True:
        q_node = q[group[0]]  # (V,)
        order: list[int] = []
        copies: dict[int, list[int]] = {}
        for g in group:
            for c in kids[g]:
                x = int(tokens[c - 1])
                if x not in copies:
                    copies[x] = []
                    order.append(x)
                copies[x].append(c)
        removed: list[int] = []  # rejected tokens: q' = q with these zeroed, renormalised
        removed_mass = 0.0
        accepted, first_rejected = None, None
        for x in order:
            qx = float(q_node[x])
            u = float(torch.rand((), generator=generator))
            if u * (1.0 - removed_mass) < qx:  # accept with probability q'(x) = q(x) / (1 - removed)
                accepted = x
                break
            first_rejected = copies[x][0] if first_rejected is None else first_rejected
            removed.append(x)
            removed_mass += qx
        if accepted is None:
            residual = q_node.clone()
            if removed:
                residual[torch.tensor(removed)] = 0.0
            nxt = sample(residual, generator)
            return Acceptance(_path_to(last, parents), nxt, first_rejected)
        group = copies[accepted]
        last = group[0]


def _path_to(node: int, parents: torch.Tensor) -> list[int]:
    """Tree indices (1-based) from the root's child down to ``node`` (0 = the root: empty)."""
    path = []
    while node > 0:
        path.append(node)
        node = int(parents[node - 1]) + 1
    return path[::-1]
