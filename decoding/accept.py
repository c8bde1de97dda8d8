"""Lossless acceptance walks over a verified tree, and a drafter's counterfactual acceptance on the
verified path (hedge's feedback) (pure tensor functions).

Notation as in the study: p = draft distribution, q = verifier distribution. Index 0 is the root
(last committed token); tree node i is index i + 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decoding.tree import ancestor_matrix


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                    top_p: float | None = None):
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


@dataclass
class Acceptance:
    path: list[int]  # accepted tree indices (1-based, root excluded), root to leaf
    next_token: int  # the verifier's own token after the last accepted node (bonus/correction)
    rejected: int | None  # tree index (1-based) of the first rejected child at the stop node, if any
    path_tokens: list[int] = field(default_factory=list)  # the tokens of ``path`` (read with it)


def _host(path_buf: torch.Tensor, next_token: torch.Tensor, rejected: torch.Tensor,
          tokens: torch.Tensor) -> Acceptance:
    """The one device -> host read of an acceptance walk: path slots (D,) (0 = empty), their
    tokens, the next token and the first rejected child (-1 = none)."""
    d = path_buf.shape[0]
    toks = tokens[(path_buf - 1).clamp(min=0)] if tokens.shape[0] else torch.zeros_like(path_buf)
    vals = torch.cat([path_buf.long(), toks.long(), next_token.long().reshape(1),
                      rejected.long().reshape(1)]).tolist()
    path = [i for i in vals[:d] if i > 0]
    rej = vals[-1]
    return Acceptance(path, vals[-2], None if rej < 0 else rej, vals[d : d + len(path)])


def _first(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True in ``mask`` (..., N), or -1 where there is none (no host sync)."""
    hit = mask.any(-1)
    if mask.shape[-1] == 0:  # no candidates at all (an empty tree)
        return torch.full_like(hit, -1, dtype=torch.long)
    return torch.where(hit, mask.to(torch.int8).argmax(-1), torch.full_like(hit, -1, dtype=torch.long))


def greedy_match(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                 anc: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) bool: node i and all its ancestors equal the verifier's argmax at their parents.

    tokens, parents (N,); target (N+1,) argmax of q at the root and at every node; anc the tree's
    ancestor matrix if the caller has it."""
    anc = ancestor_matrix(parents) if anc is None else anc  # (N+1, N+1)
    match = tokens == target[parents + 1]  # (N,) node equals its parent's argmax
    return ~(anc[1:, 1:] & ~match[None, :]).any(-1)  # no mismatch among a node's ancestors or itself


def accept_greedy(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, target: torch.Tensor,
                  max_depth: int | None = None) -> Acceptance:
    """Temperature 0: the deepest node whose whole path equals the verifier's argmax chain.

    tokens, parents, depths (N,); target (N+1,) argmax of q at the root and at every node.
    Searching the whole tree (not only the first matching child) makes merged trees with duplicate
    siblings take the longest accepted path from any subtree, as the study's Prop. A.2 requires.
    Computed on the tensors' device; one host read at the end.
    """
    n = tokens.shape[0]
    dev = tokens.device
    if n == 0:
        return Acceptance([], int(target[0]), None, [])
    anc = ancestor_matrix(parents)  # (N+1, N+1)
    ok = greedy_match(tokens, parents, target, anc)  # (N,)
    depth_ok = torch.where(ok, depths, torch.zeros_like(depths))  # (N,)
    # (1,), not 0-dim: indexing with a 0-dim device tensor reads it on the host (a sync per step)
    leaf = torch.where(depth_ok.max() > 0, depth_ok.argmax() + 1, torch.zeros((), dtype=torch.long,
            device=dev))
    leaf = leaf.reshape(1)
    d = max_depth if max_depth is not None else n
    path = _path_slots(anc.index_select(0, leaf)[0, 1:] & (leaf > 0), parents, d)  # the root -> leaf path
    rejected = _first(parents + 1 == leaf)  # the first child of the last accepted node
    return _host(path, target[leaf], torch.where(rejected >= 0, rejected + 1, rejected), tokens)


def _path_slots(on_path: torch.Tensor, parents: torch.Tensor, d: int) -> torch.Tensor:
    """(d,) the 1-based indices of the nodes in ``on_path`` (one root -> leaf chain), shallowest
    first, 0 in unused slots. A node's slot is its number of path ancestors."""
    n = on_path.shape[0]
    level = on_path.long().cumsum(0) - 1  # parents precede children: the k-th path node is at depth k
    slot = torch.where(on_path, level, torch.full_like(level, d)).clamp(max=d)
    return torch.zeros(d + 1, dtype=torch.long, device=on_path.device).scatter_(
        0, slot, torch.arange(1, n + 1, device=on_path.device))[:d]


def _children(parents: list[int]) -> list[list[int]]:
    """children[i] = tree indices (1-based) of node i's children, in order; i = 0 is the root."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i + 1)
    return kids


def accept_sampling(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor, generator: torch.Generator,
                    max_depth: int | None = None) -> Acceptance:
    """Temperature > 0: multi-candidate rejection sampling for deterministic proposals.

    q (N+1, V) verifier distributions at the root and every node. At a node, the distinct tokens
    of its children are tried in order; token x is accepted with probability q'(x), where q' is q
    with previously rejected tokens zeroed and renormalised; if all are rejected, the next token
    is sampled from q'. Lossless: the committed token at every position is distributed exactly
    as q.

    Same-token siblings are pooled (as EAGLE matches candidates by token prefix): a merged tree
    without dedup holds one copy of a token per drafter, each with its own subtree; after x is
    accepted the walk continues among the children of every copy of x, so no subtree is lost.
    The copies share their token path, hence their verifier context, KV rows and q.

    Host round trips: one read of the tree and of q(x) at every node's parent (gathered on q's
    device), then the walk runs on the host with the host ``generator``; if every child at the
    stop node is rejected, one copy of the rejected tokens to the device and one read of the
    residual sample. Never one per child. (``max_depth`` is accepted for symmetry with
    ``accept_greedy``; the walk needs no bound.)
    """
    n = tokens.shape[0]
    qx = q[parents + 1, tokens] if n else q.new_zeros(0)  # (N,) q(x) at the node's parent (copies share q)
    host = torch.cat([tokens.double(), parents.double(), qx.double()]).tolist() if n else []  # the one read
    toks = [int(t) for t in host[:n]]
    pars = [int(p) for p in host[n : 2 * n]]
    qxs = host[2 * n :]
    kids = _children(pars)
    group, last = [0], 0  # copies of the current node (the same token path); the last accepted node
    while True:
        order: list[int] = []
        copies: dict[int, list[int]] = {}
        for g in group:
            for c in kids[g]:
                x = toks[c - 1]
                if x not in copies:
                    copies[x] = []
                    order.append(x)
                copies[x].append(c)
        removed: list[int] = []  # rejected tokens: q' = q with these zeroed, renormalised
        removed_mass = 0.0
        accepted, first_rejected = None, None
        for x in order:
            qx_ = qxs[copies[x][0] - 1]
            u = float(torch.rand((), generator=generator))
            if u * (1.0 - removed_mass) < qx_:  # accept with probability q'(x) = q(x) / (1 - removed)
                accepted = x
                break
            first_rejected = copies[x][0] if first_rejected is None else first_rejected
            removed.append(x)
            removed_mass += qx_
        if accepted is None:
            residual = q[group[0]].clone()  # (V,)
            if removed:
                residual[torch.tensor(removed, device=q.device)] = 0.0
            path = _path_to(last, pars)
            return Acceptance(path, sample(residual, generator), first_rejected, [toks[i - 1] for i in path])
        group = copies[accepted]
        last = group[0]


def _path_to(node: int, parents: list[int]) -> list[int]:
    """Tree indices (1-based) from the root's child down to ``node`` (0 = the root: empty)."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node - 1] + 1
    return path[::-1]


# -- counterfactual acceptance on the verified path (hedge's ``acceptance`` feedback) ----------------
# Notation here as HedgeSpec's (the reverse of the walks above): p = the verifier's (target's)
# distribution, q = the drafter's.
def position_acceptance(q_probs: torch.Tensor, q_ids: torch.Tensor, committed: torch.Tensor,
                        target: torch.Tensor | None) -> torch.Tensor:
    """(d,) beta_k: the probability that a drafter's proposal at committed position k is accepted,
    given the verified prefix before it (HedgeSpec's token acceptance).

    q_probs, q_ids (d, K): the drafter's distribution at each position over K tokens (its draft
    vocabulary, or a point mass: K = 1, probability 1) and their verifier ids; committed (d,) the
    committed tokens; target (d, V) the verifier's sampling distribution p at each position, or None
    at T=0. T > 0: beta_k = sum_x min(p_k(x), q_k(x)) = E_{x ~ q_k}[min(1, p_k(x) / q_k(x))], the
    acceptance probability of a draft sampled from q_k (for a point mass on x: p_k(x), this engine's
    rule for one deterministic candidate). T = 0: beta_k = 1 when the drafter's top-1 token is the
    committed one (p_k is a point mass on it), else 0."""
    if target is None:
        top = q_ids.gather(1, q_probs.argmax(-1, keepdim=True))[:, 0]  # (d,)
        return (top == committed).to(torch.float64)
    p = target.gather(1, q_ids)  # (d, K)
    return torch.minimum(p.double(), q_probs.double()).sum(-1)


def expected_accepted(beta: torch.Tensor) -> torch.Tensor:
    """sum_d prod_{k <= d} beta_k: the expected number of positions accepted in sequence (at T=0, how
    many committed tokens the draft matched before its first miss). beta (..., d) -> (...). A position
    past the scored ones (past the committed path or the tree's depth) counts 0: the verifier's
    distribution there was never computed (right-censored: a lower bound for every drafter alike)."""
    return beta.cumprod(-1).sum(-1)
