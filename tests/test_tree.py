"""Pure tensor functions of the tree and the acceptance walks, on hand-made inputs."""
from __future__ import annotations

import torch

from decoding.accept import accept_greedy, accept_sampling, logits_to_probs
from decoding.tree import ancestor_matrix, expand_frontier, merge_trees, select_nodes
from tests.helpers import chain_tree


def test_ancestor_matrix_sees_root_ancestors_and_self_only():
    # root -> 0 -> 2 ; root -> 1
    parents = torch.tensor([-1, -1, 0])
    anc = ancestor_matrix(parents)
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(anc, expected)


def test_expand_frontier_scores_are_cumulative():
    scores = torch.tensor([-0.1, -1.0])
    logp = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1]]))
    tok, child, best = expand_frontier(scores, logp, 2)
    assert tok.tolist() == [[0, 1], [0, 1]]
    torch.testing.assert_close(child, scores[:, None] + logp.topk(2).values)
    assert best.tolist()[0] == 0  # -0.1 + log 0.7 is the best child overall


def test_select_nodes_is_ancestor_closed_and_parents_first():
    scores = torch.tensor([-0.1, -0.2, -0.3, -0.15, -0.5])
    parents = torch.tensor([-1, -1, 0, 0, 3])
    depths = torch.tensor([1, 1, 2, 2, 3])
    keep, new_par = select_nodes(scores, parents, depths, 4)
    assert sorted(keep.tolist()) == [0, 1, 2, 3]
    for i, p in enumerate(new_par.tolist()):
        assert p < i
    # ties: child equal to parent's score never drops the parent
    keep, _ = select_nodes(torch.tensor([0.0, 0.0, 0.0]), torch.tensor([-1, 0, 1]), torch.tensor([1, 2, 3]),
                           2)
    assert keep.tolist() == [0, 1]


def test_merge_concat_and_dedup():
    a = chain_tree([[5, 6], [7]], owner=0)
    b = chain_tree([[5, 8], [9]], owner=1)
    cat = merge_trees([a, b])
    assert cat.size == a.size + b.size
    assert cat.owner.tolist() == [0, 0, 0, 1, 1, 1]
    assert cat.parents.tolist()[3:] == [-1, -1, 3]  # b's nodes shifted by a.size
    trie = merge_trees([a, b], dedup=True)
    assert trie.size == 5  # the shared first token 5 is verified once
    shared = (trie.tokens == 5).nonzero().item()
    assert trie.owner_mask[shared] == 0b11
    kids = trie.tokens[trie.parents == shared].tolist()
    assert sorted(kids) == [6, 8]


def test_accept_greedy_takes_longest_path_from_any_subtree():
    # concatenated duplicate: subtree 1's token 5 matches but stops; subtree 2's 5 -> 8 goes deeper
    a = chain_tree([[5, 6]], owner=0)
    b = chain_tree([[5, 8, 9]], owner=1)
    t = merge_trees([a, b])
    target = torch.zeros(t.size + 1, dtype=torch.long)
    target[0] = 5  # argmax at root
    target[1 + 0] = 99  # after a's 5: verifier wants 99 (a's 6 rejected)
    target[1 + 2] = 8  # after b's 5: 8
    target[1 + 3] = 9
    target[1 + 4] = 42  # bonus
    acc = accept_greedy(t.tokens, t.parents, t.depths, target)
    assert [int(t.tokens[i - 1]) for i in acc.path] == [5, 8, 9]
    assert acc.next_token == 42
    assert int(t.owner[acc.path[-1] - 1]) == 1


def test_accept_greedy_rejects_all_gives_argmax():
    t = chain_tree([[3], [4]])
    acc = accept_greedy(t.tokens, t.parents, t.depths, torch.tensor([7, 0, 0]))
    assert acc.path == [] and acc.next_token == 7 and acc.rejected == 1


def _first_token_freqs(tree, q, n, rule=accept_sampling):
    counts = torch.zeros(q.shape[-1])
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        acc = rule(tree.tokens, tree.parents, q, g)
        first = int(tree.tokens[acc.path[0] - 1]) if acc.path else acc.next_token
        counts[first] += 1
    return counts / n


def test_accept_sampling_is_unbiased_on_a_toy_distribution():
    """N = 20,000 walks; each frequency within 5 binomial sigmas of q (fails w.p. < 1e-5 each)."""
    q_root = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tree = chain_tree([[1], [0], [1]])  # children 1, 0, and a duplicate 1
    q = torch.stack([q_root, q_root, q_root, q_root])
    n = 20_000
    freq = _first_token_freqs(tree, q, n)
    sigma = (q_root * (1 - q_root) / n).sqrt()
    assert ((freq - q_root).abs() <= 5 * sigma).all(), (freq, q_root)


def test_logits_to_probs_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = logits_to_probs(logits, 1.0, top_k=2)
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    p = logits_to_probs(logits, 1.0, top_p=0.7)  # smallest prefix with mass >= 0.7: {0, 1}
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))


class _Scripted:
    """A proposer whose tree's mean confidence follows a script (one value per call)."""

    def __init__(self, confs, owner):
        self.confs, self.owner, self.calls = list(confs), owner, 0

    def reset(self):
        pass

    def draft(self, tokens, features, cfg, temperature):
        c = self.confs[min(self.calls, len(self.confs) - 1)]
        self.calls += 1
        t = chain_tree([[5]], self.owner)
        t.path_logp[:] = torch.tensor(c).log()
        return t


def _route(granularity, decide_steps, turns):
    """Chosen drafter per call; ``turns`` = calls per turn of one prompt."""
    from decoding.strategies import make_strategy

    a, b = _Scripted([0.9, 0.1, 0.1, 0.1, 0.1, 0.1], 0), _Scripted([0.2, 0.6, 0.6, 0.6, 0.6, 0.6], 1)
    s = make_strategy("confidence", 2, granularity, decide_steps=decide_steps)
    s.start_prompt()
    out = []
    for n in turns:
        s.start_turn()
        out.append([s.propose([a, b], None, None, None, 0.0).chosen for _ in range(n)])
    return out


def test_prompt_routing_decides_once_per_prompt_from_the_first_k_steps():
    assert _route("step", 1, [3, 3]) == [[0, 1, 1], [1, 1, 1]]
    assert _route("prompt", 1, [3, 3]) == [[0, 0, 0], [0, 0, 0]]  # locked for every turn of the prompt
    # K = 3: running means pick a, a (0.5 > 0.4), then b (0.37 < 0.47), which is locked from then on
    assert _route("prompt", 3, [4, 2]) == [[0, 0, 1, 1], [1, 1]]
    # turn: decided afresh at each turn's first call
    assert _route("turn", 1, [2, 2]) == [[0, 0], [1, 1]]


def _two_token_freqs(tree, q, q_next, n, rule=accept_sampling):
    """Empirical joint distribution of the first two committed tokens (q rows: root, then nodes;
    q_next[x]: the verifier's distribution after token x, for a walk that commits one token)."""
    V = q.shape[-1]
    counts = torch.zeros(V, V)
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        acc = rule(tree.tokens, tree.parents, q, g)
        toks = [int(tree.tokens[i - 1]) for i in acc.path] + [acc.next_token]
        if len(toks) >= 2:
            counts[toks[0], toks[1]] += 1
        else:  # the second token would come from the next step's q at the first: sample it exactly
            counts[toks[0], int(torch.multinomial(q_next[toks[0]], 1, generator=g))] += 1
    return counts / n


def test_pooled_copies_keep_every_subtree_and_stay_lossless():
    """A merged tree without dedup: token 1 twice under the root (two drafters), copy A with child
    2, copy B with child 3. After 1 is accepted both 2 and 3 are tried (the old walk saw only A's
    subtree), and the joint law of the first two tokens is q(x1) q(x2 | x1) within 5 sigma."""
    q_root = torch.tensor([0.1, 0.6, 0.2, 0.1])
    q_after = {0: torch.tensor([0.25, 0.25, 0.25, 0.25]), 1: torch.tensor([0.05, 0.05, 0.2, 0.7]),
               2: torch.tensor([0.4, 0.3, 0.2, 0.1]), 3: torch.tensor([0.1, 0.1, 0.1, 0.7])}
    a, b = chain_tree([[1, 2]], 0), chain_tree([[1, 3]], 1)
    tree = merge_trees([a, b], dedup=False)  # nodes: 1(A), 2(A), 1(B), 3(B) in some parents-first order
    q = torch.stack([q_root] + [q_after[int(t)] for t in tree.tokens])
    n = 20_000
    freq = _two_token_freqs(tree, q, q_after, n)
    exact = q_root[:, None] * torch.stack([q_after[i] for i in range(4)])
    sigma = (exact * (1 - exact) / n).sqrt()
    assert ((freq - exact).abs() <= 5 * sigma + 1e-9).all(), (freq, exact)
    # the walk reaches B's child 3 (under the second copy of 1): x1=1, x2=3 is committed in one step
    g = torch.Generator().manual_seed(0)
    deep = [accept_sampling(tree.tokens, tree.parents, q, g) for _ in range(2000)]
    assert any(len(d.path) == 2 and int(tree.tokens[d.path[1] - 1]) == 3 for d in deep)
    for d in deep:  # every committed path is a real parent -> child chain
        for i, j in zip(d.path, d.path[1:]):
            assert int(tree.parents[j - 1]) + 1 == i


def test_rerank_keeps_the_best_nodes_ancestor_closed():
    from decoding.tree import rerank

    a, b = chain_tree([[1, 2, 3]], 0), chain_tree([[4, 5]], 1)
    a.path_logp[:] = torch.tensor([-0.1, -0.5, -2.0])
    b.path_logp[:] = torch.tensor([-0.2, -0.3])
    t = rerank(merge_trees([a, b]), 3)
    assert sorted(t.tokens.tolist()) == [1, 4, 5] and t.size == 3
    for i, p in enumerate(t.parents.tolist()):  # parents first, ancestors kept
        assert p < i
    assert rerank(t, 10) is t
