"""Draft trees as tensors, and the pure functions that build, merge and mask them.

A tree's nodes exclude the root (the last committed token). Node i has ``parents[i]`` = index of
its parent node, or -1 for a child of the root; parents always precede children, and siblings
appear in descending draft score, so "try children in order" = "try in index order".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 dynamic tree. ``depth`` = max draft tokens on a path (EAGLE-2's depth + 1)."""

    top_k: int = 4
    depth: int = 4
    total_tokens: int = 16  # nodes verified per call, root included (EAGLE's total_token)

    def __post_init__(self):
        for f in ("top_k", "depth", "total_tokens"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"tree {f} must be a positive int, got {getattr(self, f)!r}")
        if self.total_tokens < 2:
            raise ValueError("tree total_tokens must be >= 2 (the root plus at least one draft node)")


@dataclass
class DraftTree:
    tokens: torch.Tensor  # (N,) long
    parents: torch.Tensor  # (N,) long, -1 = child of root
    depths: torch.Tensor  # (N,) long, 1-based
    path_logp: torch.Tensor  # (N,) cumulative log draft probability along the path
    draft_entropy: torch.Tensor  # (N,) entropy of the draft distribution the node was drawn from
    owner: torch.Tensor  # (N,) long: which drafter proposed the node (first one, for a deduped node)
    owner_mask: torch.Tensor  # (N,) long bitmask of every drafter that proposed the node

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def confidence(self) -> torch.Tensor:
        """Per-node path confidence V = prod of draft confidences (EAGLE-2's score)."""
        return self.path_logp.exp()

    def mean_confidence(self) -> float:
        return float(self.confidence.mean()) if self.size else float("nan")

    def mean_entropy(self) -> float:
        return float(self.draft_entropy.mean()) if self.size else float("nan")

    @staticmethod
    def empty(device=None) -> "DraftTree":
        z = torch.zeros(0, dtype=torch.long, device=device)
        f = torch.zeros(0, dtype=torch.float32, device=device)
        return DraftTree(z, z.clone(), z.clone(), f, f.clone(), z.clone(), z.clone())


def chain_tree(paths: list[list[int]], owner: int = 0) -> DraftTree:
    """A draft tree from token paths below the root (shared prefixes become shared nodes), nodes
    parents-first; path scores fall with depth so reranking keeps shallow nodes first."""
    index, toks, pars, deps = {}, [], [], []
    for path in paths:
        parent = -1
        for d, t in enumerate(path, 1):
            key = (parent, t)
            if key not in index:
                index[key] = len(toks)
                toks.append(t), pars.append(parent), deps.append(d)
            parent = index[key]
    order = sorted(range(len(toks)), key=lambda i: deps[i])  # parents first (stable)
    pos = {o: i for i, o in enumerate(order)}
    n = len(toks)
    L = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return DraftTree(
        L([toks[o] for o in order]), L([pos[pars[o]] if pars[o] >= 0 else -1 for o in order]),
        L([deps[o] for o in order]), -0.1 * L([deps[o] for o in order]).float(), torch.full((n,), 0.5),
        torch.full((n,), owner, dtype=torch.long), torch.full((n,), 1 << owner, dtype=torch.long),
    )


def expand_frontier(scores: torch.Tensor, logp: torch.Tensor, top_k: int):
    """One EAGLE-2 expansion step.

    scores (k,) path log-probs of the frontier; logp (k, V) draft log-probs of each node's children.
    Returns child tokens (k, k'), child scores (k, k'), and the flat indices (k',) of the best
    k' children over all k*k' candidates (the next frontier), k' = min(top_k, V).
    """
    top = logp.topk(top_k, dim=-1)  # (k, k')
    child_scores = scores[:, None] + top.values  # (k, k')
    best = child_scores.flatten().topk(min(top_k, child_scores.numel())).indices  # (k',)
    return top.indices, child_scores, best


def select_nodes(cand_scores: torch.Tensor, cand_parents: torch.Tensor, cand_depths: torch.Tensor, n: int):
    """Keep the best n candidates (ancestor-closed) and order them parents-first.

    Candidates are in creation order (a parent is created before its children) and a child's score
    is <= its parent's, so a stable descending sort keeps every selected node's parent selected.
    Returns (keep (n',) candidate indices in output order, new parent indices (n',)).
    """
    order = torch.sort(cand_scores, descending=True, stable=True).indices[:n]  # (n',)
    # output order: by depth, then by score (siblings in descending score)
    keep = order[torch.sort(cand_depths[order], stable=True).indices]
    pos = torch.full((cand_scores.shape[0],), -1, dtype=torch.long)
    pos[keep] = torch.arange(keep.shape[0])
    par = cand_parents[keep]
    new_par = torch.where(par >= 0, pos[par.clamp(min=0)], par)
    assert bool((new_par[par >= 0] >= 0).all()), "selected tree is not ancestor-closed"
    return keep, new_par


def rerank(tree: DraftTree, n: int) -> DraftTree:
    """The best ``n`` nodes of a (merged) tree by path score, ancestor-closed, parents first: the
    budget-matched merged tree (the union of the drafters' candidates reranked globally)."""
    if tree.size <= n:
        return tree
    keep, new_par = select_nodes(tree.path_logp, tree.parents, tree.depths, n)
    return DraftTree(tree.tokens[keep], new_par, tree.depths[keep], tree.path_logp[keep], tree.draft_entropy[keep],
                     tree.owner[keep], tree.owner_mask[keep])


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """(N+1, N+1) bool with the root at index 0: [i, j] = node j is node i or an ancestor of it."""
    n = parents.shape[0]
    anc = torch.eye(n + 1, dtype=torch.bool)
    anc[:, 0] = True
    for i in range(n):  # parents precede children, so each row copies a finished row
        p = int(parents[i]) + 1
        anc[i + 1] |= anc[p]
    return anc


def merge_trees(trees: list[DraftTree], dedup: bool = False) -> DraftTree:
    """Merged-tree verification: one shared root, every tree's nodes below it.

    ``dedup=False`` concatenates (the study); ``dedup=True`` builds a trie so a token that two
    drafters propose under the same parent is verified once (its owner_mask has both bits).
    Output keeps parents-before-children order.
    """
    if not dedup:
        out, offset = [], 0
        for t in trees:
            out.append(torch.where(t.parents >= 0, t.parents + offset, t.parents))
            offset += t.size
        cat = lambda f: torch.cat([getattr(t, f) for t in trees])  # noqa: E731
        return DraftTree(cat("tokens"), torch.cat(out), cat("depths"), cat("path_logp"),
                         cat("draft_entropy"), cat("owner"), cat("owner_mask"))
    # trie: process nodes depth by depth so parents are placed first
    rows: list[list] = []  # [token, parent, depth, logp, entropy, owner, mask]
    index: dict[tuple[int, int], int] = {}
    remaps = [dict() for _ in trees]
    max_depth = max((int(t.depths.max()) for t in trees if t.size), default=0)
    for d in range(1, max_depth + 1):
        for ti, t in enumerate(trees):
            for i in (t.depths == d).nonzero().flatten().tolist():
                parent = int(t.parents[i])
                mparent = -1 if parent < 0 else remaps[ti][parent]
                key = (mparent, int(t.tokens[i]))
                if key in index:
                    j = index[key]
                    rows[j][6] |= int(t.owner_mask[i])
                    rows[j][3] = max(rows[j][3], float(t.path_logp[i]))
                else:
                    j = index[key] = len(rows)
                    rows.append([key[1], mparent, d, float(t.path_logp[i]), float(t.draft_entropy[i]),
                                 int(t.owner[i]), int(t.owner_mask[i])])
                remaps[ti][i] = j
    if not rows:
        return DraftTree.empty()
    cols = list(zip(*rows))
    L = lambda c: torch.tensor(c, dtype=torch.long)  # noqa: E731
    F = lambda c: torch.tensor(c, dtype=torch.float32)  # noqa: E731
    return DraftTree(L(cols[0]), L(cols[1]), L(cols[2]), F(cols[3]), F(cols[4]), L(cols[5]), L(cols[6]))
