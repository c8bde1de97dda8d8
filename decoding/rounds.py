"""Drafting in rounds: the work of a draft level as data, answered together.

A drafting coroutine (``drafting.FeatureDrafterProposer.draft_steps`` and the like) yields each
drafter pass as a :class:`LayerCall` and each set of hidden rows for its head as a tensor;
:func:`lock_step_rounds` gathers every coroutine's pending request into one :class:`DraftRound`, and
whoever drives the round answers it with :func:`run_round`: rows of proposers that share a head
through ONE head matmul, and the passes of one drafter module (one row's, or the rows of several
prompts' decoders: decoding/batch.py) through ONE packed pass. :func:`drive` runs such a
generator on the spot (one prompt alone).
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch

from drafters.model import KVCache


@dataclass
class LayerCall:
    """A drafter's pass over ``emb``/``ctx`` (T, H) at ``pos`` (T,) under ``mask`` (T, len(cache) + T),
    appending to ``cache``: what a drafting coroutine yields to be sent the pass's output (T, H)."""
    drafter: torch.nn.Module
    emb: torch.Tensor
    ctx: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    cache: KVCache

    def run(self) -> torch.Tensor:
        return self.drafter(self.emb[None], self.ctx[None], self.pos, self.mask, cache=self.cache)[0][0]


@dataclass
class DraftRound:
    """One round of lock-step drafting: (proposer, request) pairs, a request being a :class:`LayerCall`
    or hidden rows (r, H) for the proposer's head. ``run_round`` answers it; decoding/batch.py answers
    the rounds of several prompts' decoders with one call."""
    calls: list


def run_round(calls: list) -> list:
    """Each (proposer, request)'s answer, in order: head rows of proposers sharing a head go through ONE
    head matmul; layer calls of one drafter module (its rows for several prompts) through ONE packed
    pass (its ``forward_packed``: EAGLE-2/HASS's and EAGLE-3's); a drafter without one pass by pass."""
    out: list = [None] * len(calls)
    groups: dict[tuple, list[int]] = {}
    for j, (p, req) in enumerate(calls):
        key = ("layer", id(req.drafter)) if isinstance(req, LayerCall) else ("head", id(p.head))
        groups.setdefault(key, []).append(j)
    with torch.no_grad():
        for (kind, _), idx in groups.items():
            reqs = [calls[j][1] for j in idx]
            if kind == "head":
                logits = calls[idx[0]][0].head(torch.cat(reqs) if len(reqs) > 1 else reqs[0])
                parts = logits.split([r.shape[0] for r in reqs])
            elif len(reqs) > 1 and hasattr(reqs[0].drafter, "forward_packed"):
                sizes = [r.emb.shape[0] for r in reqs]
                parts = reqs[0].drafter.forward_packed(
                    torch.cat([r.emb for r in reqs]), torch.cat([r.ctx for r in reqs]),
                    torch.cat([r.pos for r in reqs]), sizes, [r.mask for r in reqs],
                    [r.cache for r in reqs]).split(sizes)
            else:
                parts = [r.run() for r in reqs]
            for j, part in zip(idx, parts):
                out[j] = part
    return out


def drive(steps: Generator):
    """Run a generator of :class:`DraftRound`s here, each round by ``run_round``; its return value."""
    try:
        rnd = next(steps)
        while True:
            rnd = steps.send(run_round(rnd.calls))
    except StopIteration as done:
        return done.value


def lock_step_rounds(proposers: list, gens: dict[int, Generator]) -> Generator[DraftRound, list,
                                                                              dict[int, object]]:
    """Drive coroutines that yield hidden rows (r, H), sent their head logits (r, N), or
    :class:`LayerCall`s, sent the pass's output: every round, every coroutine's request goes out in
    one :class:`DraftRound` (``run_round`` stacks the rows of proposers that share a head into ONE head
    matmul: its weights stream once per round, not once per drafter). Returns each coroutine's value."""
    out: dict[int, object] = {}
    pending = {i: next(g) for i, g in gens.items()}  # proposer index -> its request
    while pending:
        idx = list(pending)
        answers = yield DraftRound([(proposers[i], pending[i]) for i in idx])
        for i, answer in zip(idx, answers):
            try:
                pending[i] = gens[i].send(answer)
            except StopIteration as stop:
                del pending[i]
                out[i] = stop.value
    return out
