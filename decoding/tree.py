"""Draft trees as tensors, and the pure functions that build, merge and mask them.

A tree's nodes exclude the root (the last committed token). Node i has ``parents[i]`` = index of
its parent node, or -1 for a child of the root; parents always precede children, and siblings
appear in descending draft score, so "try children in order" = "try in index order".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.device import to_device


@dataclass
class DraftTree:
    tokens: torch.Tensor  # (N,) long
    parents: torch.Tensor  # (N,) long, -1 = child of root
    depths: torch.Tensor  # (N,) long, 1-based
    path_logp: torch.Tensor  # (N,) cumulative log draft probability along the path
    draft_entropy: torch.Tensor  # (N,) entropy of the draft distribution the node was drawn from
    owner: torch.Tensor  # (N,) long: which drafter proposed the node (first one, for a deduped node)
    owner_mask: torch.Tensor  # (N,) long bitmask of every drafter that proposed the node
    max_depth: int | None = None  # a host-side bound on depths (loops over levels need no sync); None = N

    _INT = ("tokens", "parents", "depths", "owner", "owner_mask")
    _FLOAT = ("path_logp", "draft_entropy")

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def depth_bound(self) -> int:
        return self.size if self.max_depth is None else min(self.max_depth, self.size)

    @property
    def confidence(self) -> torch.Tensor:
        """Per-node path confidence V = prod of draft confidences (EAGLE-2's score)."""
        return self.path_logp.exp()

    @property
    def node_confidence(self) -> torch.Tensor:
        """Per-node conditional confidence c(v) = p(token | path prefix) = V(v) / V(parent(v)), the
        study's routing score (V(root) = 1). In a trie-merged tree V is the best owner's, so c(v) is
        the ratio of the two maxima there."""
        parent = self.path_logp[self.parents.clamp(min=0)]  # (N,)
        return (self.path_logp - torch.where(self.parents >= 0, parent, torch.zeros_like(parent))).exp()

    def mean_stats(self) -> torch.Tensor:
        """(3,) [mean path confidence V, mean draft entropy, mean node confidence c] on the tree's
        device (NaN if empty): the columns of ``strategies.STAT``."""
        if not self.size:
            return torch.full((3,), float("nan"), device=self.device)
        means = [self.confidence.mean(), self.draft_entropy.mean(), self.node_confidence.mean()]
        return torch.stack(means).float()

    def mean_confidence(self) -> float:
        return float(self.confidence.mean()) if self.size else float("nan")

    def mean_entropy(self) -> float:
        return float(self.draft_entropy.mean()) if self.size else float("nan")

    def to(self, device) -> DraftTree:
        """The tree on ``device`` in one copy (every field packed into one float64 tensor)."""
        device = torch.device(device)
        if self.device == device:
            return self
        return DraftTree.unpack(self.pack().to(device), self.max_depth)

    def pack(self) -> torch.Tensor:
        """(7, N) float64: the integer fields (exact below 2^53) then the float ones."""
        return torch.stack([getattr(self, f).double() for f in self._INT + self._FLOAT])

    @staticmethod
    def unpack(packed: torch.Tensor, max_depth: int | None = None) -> DraftTree:
        ints = [packed[i].long() for i in range(5)]
        return DraftTree(*ints[:3], packed[5].float(), packed[6].float(), *ints[3:], max_depth=max_depth)

    @staticmethod
    def empty(device=None) -> DraftTree:
        z = torch.zeros(0, dtype=torch.long, device=device)
        f = torch.zeros(0, dtype=torch.float32, device=device)
        return DraftTree(z, z.clone(), z.clone(), f, f.clone(), z.clone(), z.clone(), 0)


def chain_tree(paths: list[list[int]], owner: int = 0) -> DraftTree:
    """A draft tree from token paths below the root (shared prefixes become shared nodes), nodes
    parents-first; path scores fall with depth so reranking keeps shallow nodes first."""
    index = {}
    toks = []
    pars = []
    deps = []
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
        max(deps, default=0),
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


def select_nodes(cand_scores: torch.Tensor, cand_parents: torch.Tensor, cand_depths: torch.Tensor, n: int,
                 tier: torch.Tensor | None = None):
    """Keep the best n candidates (ancestor-closed) and order them parents-first.

    Candidates are in creation order (a parent is created before its children) and a child's score
    is <= its parent's, so a stable descending sort keeps every selected node's parent selected.
    ``tier`` (N,), if given, ranks first (lower tier first, then score); a child's tier must be >= its
    parent's. Returns (keep (n',) candidate indices in output order, new parent indices (n',)).
    """
    order = torch.sort(cand_scores, descending=True, stable=True).indices  # (N,)
    if tier is not None:
        order = order[torch.sort(tier[order], stable=True).indices]  # (tier, -score) lexicographic
    order = order[:n]  # (n',)
    # output order: by depth, then by score (siblings in descending score)
    keep = order[torch.sort(cand_depths[order], stable=True).indices]
    dev = cand_scores.device
    pos = torch.full((cand_scores.shape[0],), -1, dtype=torch.long, device=dev)
    pos[keep] = torch.arange(keep.shape[0], device=dev)
    par = cand_parents[keep]
    new_par = torch.where(par >= 0, pos[par.clamp(min=0)], par)  # ancestor-closed: no -1 below a node
    return keep, new_par


def rerank(tree: DraftTree, n: int) -> DraftTree:
    """The best ``n`` nodes of a (merged) tree by path score, ancestor-closed, parents first: the
    budget-matched merged tree (the union of the drafters' candidates reranked globally)."""
    if tree.size <= n:
        return tree
    keep, new_par = select_nodes(tree.path_logp, tree.parents, tree.depths, n)
    return DraftTree(tree.tokens[keep], new_par, tree.depths[keep], tree.path_logp[keep],
                     tree.draft_entropy[keep],
                     tree.owner[keep], tree.owner_mask[keep], tree.max_depth)


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """(N+1, N+1) bool with the root at index 0: [i, j] = node j is node i or an ancestor of it.

    Pointer doubling on the tensors' own device: after r rounds each row holds every ancestor
    within 2^(r+1) - 1 levels, so ceil(log2(N+1)) rounds of one gather each, and no host sync."""
    n = parents.shape[0]
    dev = parents.device
    # (N+1,) root -> root
    par1 = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), parents.long() + 1])
    idx = torch.arange(n + 1, device=dev)
    anc = (idx[:, None] == idx[None, :]) | (idx[None, :] == par1[:, None])  # self and parent
    anc[:, 0] = True
    jump = par1
    for _ in range(max(1, n.bit_length())):
        anc = anc | anc[jump]  # ancestors of my 2^r-th ancestor
        jump = jump[jump]
    return anc


def merge_trees(trees: list[DraftTree], dedup: bool = False) -> DraftTree:
    """Merged-tree verification: one shared root, every tree's nodes below it.

    ``dedup=False`` concatenates (the study); ``dedup=True`` builds a trie so a token that two
    drafters propose under the same parent is verified once (its owner_mask has both bits).
    Output keeps parents-before-children order, on the trees' device. The trie is built on the
    host: one copy of all trees there and one copy of the result back, whatever their number.
    """
    bound = max((t.depth_bound for t in trees), default=0)
    if not dedup:
        out, offset = [], 0
        for t in trees:
            out.append(torch.where(t.parents >= 0, t.parents + offset, t.parents))
            offset += t.size
        cat = lambda f: torch.cat([getattr(t, f) for t in trees])  # noqa: E731
        return DraftTree(cat("tokens"), torch.cat(out), cat("depths"), cat("path_logp"),
                         cat("draft_entropy"), cat("owner"), cat("owner_mask"), bound)
    dev = trees[0].device
    cols = torch.cat([t.pack() for t in trees], 1).tolist()  # one device -> host copy
    sizes = [t.size for t in trees]
    # trie: process nodes depth by depth so parents are placed first
    rows: list[list] = []  # [token, parent, depth, owner, mask, logp, entropy] (DraftTree.pack order)
    index: dict[tuple[int, int], int] = {}
    remaps = [dict() for _ in trees]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for d in range(1, bound + 1):
        for ti, (start, size) in enumerate(zip(starts, sizes)):
            for i in range(size):
                tok, parent, depth, owner, mask, logp, ent = (cols[f][start + i] for f in range(7))
                if int(depth) != d:
                    continue
                mparent = -1 if parent < 0 else remaps[ti][int(parent)]
                key = (mparent, int(tok))
                if key in index:
                    j = index[key]
                    rows[j][4] = int(rows[j][4]) | int(mask)
                    rows[j][5] = max(rows[j][5], logp)
                else:
                    j = index[key] = len(rows)
                    rows.append([tok, mparent, d, owner, mask, logp, ent])
                remaps[ti][i] = j
    if not rows:
        return DraftTree.empty(dev)
    packed = torch.tensor(rows, dtype=torch.float64).T.contiguous()  # (7, N')
    return DraftTree.unpack(to_device(packed, dev), bound)  # one host -> device copy


def match_paths(tree: DraftTree, ref: DraftTree, max_depth: int) -> torch.Tensor:
    """(N,) for each node of ``tree`` at depth <= max_depth: the index of the node of ``ref`` with
    the same token path below the root, or -1. ``ref`` is a trie (one drafter's tree: distinct
    sibling tokens). One (N, M) comparison per level, on the trees' device, no host sync."""
    same = (tree.tokens[:, None] == ref.tokens[None, :]) & (tree.depths[:, None] == ref.depths[None, :])
    same &= (tree.depths <= max_depth)[:, None]  # (N, M)
    top = (tree.parents[:, None] < 0) & (ref.parents[None, :] < 0)  # (N, M) both children of the root
    match = torch.full_like(tree.tokens, -1)  # (N,)
    for _ in range(max_depth):  # after r rounds every node at depth <= r is matched
        up = match[tree.parents.clamp(min=0)]  # (N,) the ref node of each node's parent
        hit = same & (top | ((tree.parents >= 0) & (up >= 0))[:, None] & (up[:, None] == ref.parents[None,
                :]))
        match = torch.where(hit.any(1), hit.to(torch.int8).argmax(1), torch.full_like(match, -1))
    return match


def graft_trees(shallow: DraftTree, deep: DraftTree, switch_depth: int, n: int) -> DraftTree:
    """Depth-adaptive composition: levels 1..s (s = ``switch_depth``) from ``shallow`` (the mixed
    drafter), levels below from ``deep`` (a specialist), budget ``n`` nodes.

    A node of ``deep`` below depth s is grafted when the token path of its depth-s ancestor (its
    anchor) is a node of ``shallow``; it hangs under that node, its score is the anchor's path score
    in ``shallow`` plus ``deep``'s log-probability of the path from the anchor down (so a child never
    outscores its parent), and its owner is ``deep``'s. Shallow nodes that ``deep`` also proposed
    carry both owner bits. ``deep``'s own nodes at depth <= s and its subtrees under anchors that
    ``shallow`` lacks are dropped. The result keeps the best ``min(n, shallow.size)`` nodes:
    ``shallow``'s nodes at depth <= s and the grafted ones by score, then, only if they are fewer,
    ``shallow``'s own deeper nodes (tier 1) fill the budget. Ancestor-closed, parents first, static
    shapes: no host sync. Any such tree is lossless under the tree attention mask.
    """
    m, s = shallow.size, switch_depth  # shapes below: k = deep.size
    if m == 0:
        return shallow
    match = match_paths(deep, shallow, s)  # (k,)
    anc = ancestor_matrix(deep.parents)[1:, 1:] & (deep.depths == s)[None, :]  # (k, k) the depth-s ancestor
    anchor = torch.where(anc.any(1), anc.to(torch.int8).argmax(1), torch.full_like(match, -1))  # (k,)
    home = torch.where(anchor >= 0, match[anchor.clamp(min=0)], torch.full_like(match, -1))  # (k,) in shallow
    grafted = (deep.depths > s) & (home >= 0)  # (k,)
    # (k,)
    score = deep.path_logp - deep.path_logp[anchor.clamp(min=0)] + shallow.path_logp[home.clamp(min=0)]
    # candidates: shallow's nodes (0..m-1), then deep's (m..m+k-1); tier 0 = composed tree, 1 = filler, 2 =
    # out
    tier = torch.cat([(shallow.depths > s).long(), torch.where(grafted, 0, 2)])  # (m + k,)
    par = torch.where(deep.depths == s + 1, home, deep.parents + m)  # (k,) parent among the candidates
    extra = torch.zeros(m + 1, dtype=torch.long, device=shallow.device)  # deep's bits on the nodes it matched
    extra.scatter_(0, torch.where(match >= 0, match, m), deep.owner_mask)
    cat = lambda a, b: torch.cat([a, b])  # noqa: E731
    keep, new_par = select_nodes(cat(shallow.path_logp, score), cat(shallow.parents, par),
                                 cat(shallow.depths, deep.depths), min(n, m), tier)
    pick = lambda a, b: cat(a, b)[keep]  # noqa: E731
    return DraftTree(pick(shallow.tokens, deep.tokens), new_par, pick(shallow.depths, deep.depths),
                     pick(shallow.path_logp, score), pick(shallow.draft_entropy, deep.draft_entropy),
                     pick(shallow.owner, deep.owner), pick(shallow.owner_mask | extra[:m], deep.owner_mask),
                     max(shallow.depth_bound, deep.depth_bound))
