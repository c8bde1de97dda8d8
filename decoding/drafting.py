"""Proposers: what a strategy asks for a draft tree.

``Proposer.draft(tokens, features, cfg, temperature)`` gets every committed token (the last one is
the root, not yet seen by the verifier) and the verifier features of all tokens before the root,
and returns a :class:`DraftTree`. ``FeatureDrafterProposer`` runs EAGLE-2's dynamic tree with a
trained (or random) drafter and keeps the drafter's KV cache across steps. ``Eagle3Proposer`` runs
the same tree with an EAGLE-3 drafter: its features are the verifier's hidden states at the
drafter's ``aux_layers`` (concatenated), fused by the drafter's ``fc``; deeper levels read its own
previous hidden state; its own norm and LM head give the draft distribution.

``draft_together`` drafts with several proposers in lock step: at every level, the rows of all
drafters that share a draft head (the same verifier LM head and draft vocabulary) go through ONE
head matmul, so routing and merged trees stream the head's weights once per level, not once per
drafter. Each drafter's tree is exactly the tree it drafts alone. The lock step is a generator of
:class:`rounds.DraftRound`s (every coroutine's pending drafter pass or head rows), answered here by
:func:`rounds.run_round`, or by decoding/batch.py for the rows of several prompts at once (one packed pass
per drafter module, one matmul per head, for every row).
"""
from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import Protocol

import torch

from decoding.accept import entropy, expected_accepted, position_acceptance
from decoding.config import TreeConfig
from decoding.cpu import row_aware
from decoding.rounds import DraftRound, LayerCall, drive, lock_step_rounds
from decoding.tree import DraftTree, expand_frontier, select_nodes
from drafters.eagle3 import Eagle3Drafter
from drafters.model import FeatureDrafter, KVCache, causal_mask
from drafters.vocab import DraftHead


class Proposer(Protocol):
    name: str

    def reset(self) -> None: ...

    def draft(self, tokens: torch.Tensor, features: torch.Tensor, cfg: TreeConfig,
              temperature: float) -> DraftTree: ...


_HEADS: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def shared_head(lm_head: torch.nn.Module, ids: torch.Tensor | None) -> DraftHead:
    """One :class:`DraftHead` per (LM head, draft vocabulary), in a registry keyed by the LM head
    module, so drafters of one backbone share its weight slice (and ``draft_together`` can stack
    their rows)."""
    heads = _HEADS.setdefault(lm_head, {})
    key = None if ids is None else ids.cpu().long().numpy().tobytes()
    if key not in heads:
        heads[key] = DraftHead(lm_head, ids)
        # the slice's own matmul; a full-vocabulary head is the verifier's installed lm_head
        if ids is not None:
            heads[key].matmul = row_aware(heads[key].weight)
    return heads[key]


def draft_together_steps(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor,
                         cfg: TreeConfig, temperature: float) -> Generator[DraftRound, list, list[DraftTree]]:
    """``draft_together`` as a generator of :class:`DraftRound`s (the engine's turn yields them)."""
    out: list[DraftTree | None] = [None] * len(proposers)
    gens: dict[int, Generator] = {}
    for i, p in enumerate(proposers):
        if hasattr(p, "draft_steps"):
            gens[i] = p.draft_steps(tokens, features, cfg, temperature)
        else:
            out[i] = p.draft(tokens, features, cfg, temperature)
    for i, tree in (yield from lock_step_rounds(proposers, gens)).items():
        out[i] = tree
    return out  # type: ignore[return-value]


def draft_together(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor, cfg: TreeConfig,
                   temperature: float) -> list[DraftTree]:
    """Every proposer's tree, drafted in lock step with one head matmul per level per shared head.
    Proposers without ``draft_steps`` (oracle, chains) draft on their own."""
    return drive(draft_together_steps(proposers, tokens, features, cfg, temperature))


def predict_together(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor,
                     start: int) -> list[torch.Tensor]:
    """Per proposer, (c,) its top-1 draft token for each committed token ``tokens[start:]`` when
    teacher-forced on every committed token before it. tokens (n+1,) committed incl. the new root;
    features (n, F) of tokens[:n]. Feature drafters run ``agree_steps`` in lock step (one head
    matmul per shared head for all of them); scripted proposers give ``predict(tokens, features, start)``."""
    preds: list[torch.Tensor | None] = [None] * len(proposers)
    gens: dict[int, Generator] = {}
    for i, p in enumerate(proposers):
        if hasattr(p, "agree_steps"):
            gens[i] = p.agree_steps(tokens, features, start)
        else:
            preds[i] = p.predict(tokens, features, start).to(tokens.device)
    for i, pred in drive(lock_step_rounds(proposers, gens)).items():
        preds[i] = pred
    return preds  # type: ignore[return-value]


def agreement_together(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor,
                       start: int) -> torch.Tensor:
    """(D,) long, on the tokens' device: how many of the committed tokens ``tokens[start:]`` each
    proposer would have proposed as its top-1 token (``predict_together``; hedge's feedback)."""
    target = tokens[start:]  # (c,)
    preds = predict_together(proposers, tokens, features, start)
    return torch.stack([(pred == target).sum() for pred in preds])


def can_agree(proposer: Proposer) -> bool:
    """Whether ``agreement_together`` can score the proposer (teacher-forced pass or a scripted one)."""
    return hasattr(proposer, "agree_steps") or hasattr(proposer, "predict")


def rollout_together(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor, start: int,
                     depth: int, temperature: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per proposer, its draft distribution at each of the first ``depth`` committed positions
    ``tokens[start : start + depth]`` when it drafts along them from the step's root (its own multi-step
    draft with those tokens as its choices: ``rollout_steps``, in lock step, one head matmul per level
    per shared head), as (q_probs, q_ids) (depth, K) at ``temperature`` (T=0: at 1; only the argmax is
    read). A scripted proposer (``predict``) is a point mass on its predictions (K = 1)."""
    out: list[tuple | None] = [None] * len(proposers)
    gens: dict[int, Generator] = {}
    for i, p in enumerate(proposers):
        if hasattr(p, "rollout_steps"):
            gens[i] = p.rollout_steps(tokens, features, start, depth, temperature)
        else:
            pred = p.predict(tokens, features, start)[:depth].to(tokens.device)
            out[i] = (torch.ones(depth, 1, device=tokens.device), pred[:, None].long())
    for i, logp in drive(lock_step_rounds(proposers, gens)).items():
        # (N,) verifier ids
        ids = proposers[i].head.to_verifier(torch.arange(logp.shape[-1], device=logp.device))
        out[i] = (logp.exp(), ids.expand(logp.shape[0], -1))
    return out  # type: ignore[return-value]


def acceptance_together(proposers: list[Proposer], tokens: torch.Tensor, features: torch.Tensor, start: int,
                        depth: int, target: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """(D,) float64 on the tokens' device: each proposer's counterfactual expected accepted length on
    the verified path over its first ``depth`` positions (``accept.position_acceptance``,
    ``accept.expected_accepted``); target (>= depth, V) the verifier's distributions there, None at T=0."""
    committed = tokens[start : start + depth]
    tgt = None if target is None else target[:depth]
    return torch.stack([expected_accepted(position_acceptance(q, ids, committed, tgt))
                        for q, ids in rollout_together(proposers, tokens, features, start, depth,
                                                       temperature)])


def can_roll_out(proposer: Proposer) -> bool:
    """Whether ``acceptance_together`` can score the proposer (its own draft, or a scripted one)."""
    return hasattr(proposer, "rollout_steps") or hasattr(proposer, "predict")


def composition_features(readers: list[tuple[str, tuple[int, ...] | None]]) -> tuple[int, ...] | None:
    """The verifier features a composition of feature drafters reads, from (name, aux layers or None)
    per drafter: None = the last hidden state (EAGLE-2/HASS, or no feature drafter at all), a tuple =
    the hidden states at those ``output_hidden_states`` indices, concatenated (EAGLE-3). One verifier
    pass serves every drafter, so EAGLE-3 drafters cannot be composed with EAGLE-2/HASS ones, nor
    with EAGLE-3 drafters of other aux layers: refused here, before anything decodes."""
    e3 = [(n, tuple(a)) for n, a in readers if a is not None]
    e2 = [n for n, a in readers if a is None]
    if e3 and e2:
        raise ValueError(f"cannot compose EAGLE-3 drafters {[n for n, _ in e3]} with EAGLE-2/HASS drafters "
                         f"{e2}: "
                         "they read different verifier features (three fused layers vs the last hidden "
                         "state); "
                         "decode them in separate runs")
    if len({a for _, a in e3}) > 1:
        raise ValueError("cannot compose EAGLE-3 drafters with different aux_layers "
                         f"({', '.join(f'{n}: {list(a)}' for n, a in e3)}): one verifier pass captures one "
                         "set")
    return e3[0][1] if e3 else None


def feature_layers(proposers: list[Proposer]) -> tuple[int, ...] | None:
    """``composition_features`` of the proposers that read verifier features (those with a
    ``feature_layers`` attribute; scripted proposers read none and fit any composition)."""
    return composition_features([(p.name, p.feature_layers) for p in proposers if hasattr(p,
            "feature_layers")])


class FeatureDrafterProposer:
    """EAGLE-2 dynamic draft tree from a feature drafter + the verifier's embedding and LM head
    (or, for a reduced draft vocabulary, the slice of the LM head the drafter was trained with)."""

    feature_layers: tuple[int, ...] | None = None  # verifier features it reads: None = the last hidden state

    def __init__(self, drafter: FeatureDrafter, embed: torch.nn.Module, lm_head: torch.nn.Module, name: str,
                 index: int = 0):
        self.drafter, self.embed = drafter, embed
        self.head = shared_head(lm_head, drafter.draft_ids())
        self.name, self.index = name, index
        self.reset()

    def reset(self) -> None:
        self.cache = KVCache()  # holds pairs (f_i, x_{i+1}) for i < len(cache)

    def _context(self, features: torch.Tensor) -> torch.Tensor:
        """(r, F) verifier features of committed tokens -> (r, H) the hidden state the drafter reads."""
        return features

    @staticmethod
    def _logp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
        logits = logits.float()  # (k, N) over the draft vocabulary
        return (logits / (temperature if temperature > 0 else 1.0)).log_softmax(-1)

    def draft(self, tokens: torch.Tensor, features: torch.Tensor, cfg: TreeConfig,
              temperature: float) -> DraftTree:
        """tokens (n+1,) committed incl. root; features (n, H) verifier features of tokens[:n]."""
        return draft_together([self], tokens, features, cfg, temperature)[0]

    @torch.no_grad()
    def agree_steps(self, tokens: torch.Tensor, features: torch.Tensor,
                    start: int) -> Generator[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced top-1 predictions of the committed tokens ``tokens[start:]`` (c,) as a
        coroutine (yields the c hidden rows, is sent their head logits, returns verifier ids).

        The pair (f_i, x_{i+1}) predicts x_{i+2}, so tokens[start:] come from pairs start-2 .. n-2
        (features (n, F) of tokens[:n]; tokens[n] is the new root). The pass feeds the pairs its KV
        cache lacks up to n-2 (re-feeding pair start-2 for the drafter that just drafted from it: its
        cache was cropped after the tree), which is the catch-up the next draft would feed anyway:
        that draft then feeds only the root's pair."""
        n = features.shape[0]
        first = start - 2  # the pair that predicts tokens[start]
        if not 0 <= first <= n - 2:
            raise ValueError(f"committed tokens start at {start}: need 2 <= start <= {n} "
                             f"(features of {n} tokens)")
        if len(self.cache) > first:
            self.cache.crop(first)
        m = len(self.cache)
        dev = features.device
        emb = self.embed(tokens[m + 1 : n].to(dev))  # (n-1-m, H): x_{i+1} for pairs i = m..n-2
        pos = torch.arange(m, n - 1, device=dev)
        h, _ = self.drafter(emb[None], self._context(features[m : n - 1])[None], pos,
                            causal_mask(n - 1 - m, m, dev), cache=self.cache)
        logits = yield h[0, first - m :]  # (c, H) -> (c, N) over the draft vocabulary
        return self.head.to_verifier(logits.argmax(-1))  # (c,) verifier ids

    @torch.no_grad()
    def rollout_steps(self, tokens: torch.Tensor, features: torch.Tensor, start: int, depth: int,
                      temperature: float) -> Generator[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Its chain draft along the committed tokens ``tokens[start : start + depth]`` from the step's
        root ``tokens[start - 1]``, as a coroutine (yields one hidden row (1, H) per position, is sent
        its head logits, returns (depth, N) log-probs over the draft vocabulary): the root's row as its
        tree's level 1, then each committed token fed with its own previous output, as its tree's
        deeper levels feed a node (its own features, not the verifier's: the drift tau measures).

        It feeds the committed pairs its KV cache lacks up to the root's (the catch-up its next draft
        feeds anyway; the drafter that drafted re-feeds the root's pair), and drops the chain's rows."""
        n = start - 1  # committed tokens before the root: pairs 0..n-1 are the draft's context
        if not 1 <= n <= features.shape[0] or depth < 1 or start + depth > tokens.shape[0]:
            raise ValueError(f"a rollout from start {start} over {depth} positions needs 2 <= start <= "
                             f"{features.shape[0] + 1} and start + depth <= {tokens.shape[0]}")
        if len(self.cache) > n - 1:
            self.cache.crop(n - 1)
        m = len(self.cache)
        dev = features.device
        emb = self.embed(tokens[m + 1 : n + 1].to(dev))  # (n-m, H): x_{i+1} for pairs i = m..n-1
        h, _ = self.drafter(emb[None], self._context(features[m:n])[None], torch.arange(m, n, device=dev),
                            causal_mask(n - m, m, dev), cache=self.cache)
        h = h[0, -1:]  # (1, H): the predicted feature at the root -> the distribution at tokens[start]
        rows = []
        for d in range(depth):
            rows.append(self._logp((yield h), temperature))  # (1, N)
            # feed the committed token at this position with its own output (tree level d + 2)
            if d + 1 < depth:
                x = self.embed(tokens[start + d : start + d + 1].to(dev))  # (1, H)
                h, _ = self.drafter(x[None], h[None], torch.full((1,), n + d, device=dev),
                                    causal_mask(1, len(self.cache), dev), cache=self.cache)
                h = h[0]
        self.cache.crop(n)  # the committed context only
        return torch.cat(rows)

    @torch.no_grad()
    def draft_steps(self, tokens: torch.Tensor, features: torch.Tensor, cfg: TreeConfig,
                    temperature: float) -> Generator[torch.Tensor, torch.Tensor, DraftTree]:
        """The dynamic tree as a coroutine: yields hidden rows (r, H), is sent their head logits
        (r, N), returns the tree. ``draft_together`` drives it."""
        n = features.shape[0]
        dev = features.device
        # 1. catch up on committed context
        h_last = yield from self._catch_up(tokens, features)  # (1, H): predicted feature at the root
        # 2. level 1: top-k of the root's draft distribution
        logp = self._logp((yield h_last), temperature)  # (1, V)
        ent = entropy(logp.exp())  # (1,)
        k = min(cfg.top_k, logp.shape[-1])
        top_val, top_idx = logp[0].topk(k)
        top_tok = self.head.to_verifier(top_idx)  # draft ids -> verifier ids
        cand_tok = [top_tok]
        cand_par = [torch.full((k,), -1, device=dev)]
        cand_score = [top_val]
        cand_depth, cand_ent = [torch.ones(k, dtype=torch.long, device=dev)], [ent.expand(k)]
        frontier = torch.arange(k, device=dev)  # candidate indices of the frontier
        frontier_feat = h_last.expand(k, -1)  # (k, H): feature each frontier node conditions on
        frontier_tok, frontier_score = top_tok, top_val
        # ancestry among tree nodes fed to the drafter
        fed_anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)
        frontier_rows = None  # row of each frontier node's parent in fed_anc
        n_cand = k
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        # 3. levels 2..depth: feed the frontier, expand k children each, keep the best k (EAGLE-2)
        for d in range(2, cfg.depth + 1):
            base = fed_anc.shape[0]
            # (k, base)
            above = fed_anc[frontier_rows] if frontier_rows is not None else fed_anc.new_zeros(k, 0)
            rows = torch.cat([above, eye], 1)  # (k, base + k): ancestors fed so far, and itself
            fed_anc = torch.cat([torch.cat([fed_anc, fed_anc.new_zeros(base, k)], 1), rows], 0)
            mask = torch.cat([torch.ones(k, n, dtype=torch.bool, device=dev), rows], dim=1)  # (k, n + fed)
            pos = torch.full((k,), n - 2 + d, device=dev)  # all nodes at one depth share a position
            h = yield LayerCall(self.drafter, self.embed(frontier_tok), frontier_feat, pos, mask, self.cache)
            logp = self._logp((yield h), temperature)  # (k, V)
            ent = entropy(logp.exp())  # (k,)
            child_tok, child_score, best = expand_frontier(frontier_score, logp, k)  # (k,k),(k,k),(k,)
            child_tok = self.head.to_verifier(child_tok)  # draft ids -> verifier ids
            cand_tok.append(child_tok.flatten())
            cand_par.append(frontier.repeat_interleave(k))
            cand_score.append(child_score.flatten())
            cand_depth.append(torch.full((k * k,), d, dtype=torch.long, device=dev))
            cand_ent.append(ent.repeat_interleave(k))
            parent_slot = best // k  # which frontier node each new frontier node hangs under
            frontier = n_cand + best
            frontier_tok = child_tok.flatten()[best]
            frontier_score = child_score.flatten()[best]
            frontier_feat = h[parent_slot]
            frontier_rows = base + parent_slot
            n_cand += k * k
        self.cache.crop(n)  # drop the tree nodes, keep the committed context
        # 4. rerank: best total_tokens - 1 nodes over all depths (all on the drafter's device)
        return _ranked_tree(torch.cat(cand_tok), torch.cat(cand_par), torch.cat(cand_score),
                            torch.cat(cand_depth),
                            torch.cat(cand_ent), cfg, self.index, dev)

    def _catch_up(self, tokens: torch.Tensor, features: torch.Tensor) -> Generator[LayerCall, torch.Tensor,
                                                                                  torch.Tensor]:
        """Feed the drafter the committed pairs (f_i, x_{i+1}) its KV cache lacks, i = m..n-1 at
        positions i (starting over when the context shrank, re-feeding the root pair when drafting
        again from the same state), as one :class:`LayerCall`. tokens (n+1,), features (n, F) ->
        (1, H) the predicted feature at the root."""
        n = features.shape[0]
        dev = features.device
        m = len(self.cache)
        if m > n:  # the context shrank (a new turn/prompt): start over
            self.reset()
            m = 0
        elif m == n:  # drafting again from the same state: re-feed the root pair
            self.cache.crop(n - 1)
            m = n - 1
        emb = self.embed(tokens[m + 1 : n + 1].to(dev))  # (n-m, H); the engine passes tokens on dev
        pos = torch.arange(m, n, device=dev)
        h = yield LayerCall(self.drafter, emb, self._context(features[m:n]), pos, causal_mask(n - m, m, dev),
                            self.cache)
        return h[-1:]  # (1, H)


def _ranked_tree(tok: torch.Tensor, par: torch.Tensor, score: torch.Tensor, dep: torch.Tensor,
                 ent: torch.Tensor,
                 cfg: TreeConfig, index: int, dev: torch.device) -> DraftTree:
    """The draft tree of the best ``cfg.total_tokens - 1`` of all candidates (C,) over all depths
    (tokens, parent candidate indices, path scores, depths, entropies), drafted by drafter ``index``."""
    keep, new_par = select_nodes(score, par, dep, cfg.total_tokens - 1)
    owner = torch.full((keep.shape[0],), index, dtype=torch.long, device=dev)
    return DraftTree(tok[keep], new_par, dep[keep], score[keep].float(), ent[keep].float(), owner,
                     torch.ones_like(owner) << index, cfg.depth)


class Eagle3Head(torch.nn.Module):
    """An EAGLE-3 drafter's own head: ``norm`` then ``lm_head`` over its draft vocabulary, and the map
    of draft ids to verifier ids (``d2t``). Each drafter has its own, so ``draft_together`` runs one
    head matmul per drafter per level (nothing to stack across drafters)."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter
        self.ids = drafter.draft_ids()  # (N,) on the drafter's device, or None for the whole vocabulary

    @property
    def size(self) -> int:
        return self.drafter.config.head_size

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.drafter.logits(h)

    def to_verifier(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.ids is None else self.ids[draft_ids]


class Eagle3Proposer(FeatureDrafterProposer):
    """EAGLE-2's dynamic tree with an EAGLE-3 drafter. The features it is given are the verifier's
    hidden states at ``drafter.config.aux_layers``, concatenated (F = 3H; the engine captures them
    when a composition holds EAGLE-3 drafters); each committed token's row is ``fuse``d, and every
    deeper level reads the drafter's own previous output, as training's unrolled steps do. Only the
    token embedding comes from the verifier."""

    def __init__(self, drafter: Eagle3Drafter, embed: torch.nn.Module, name: str, index: int = 0):
        self.drafter, self.embed = drafter, embed
        self.feature_layers = tuple(drafter.config.aux_layers)
        self.head = Eagle3Head(drafter)
        self.name, self.index = name, index
        self.reset()

    def _context(self, features: torch.Tensor) -> torch.Tensor:
        return self.drafter.fuse(features)
