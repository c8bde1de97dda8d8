"""Reduced draft vocabulary (EAGLE-3 / FR-Spec): the drafter predicts over the N most frequent
target tokens only, through an (N, H) slice of the verifier's LM head.

- ``select_ids``: the N most frequent tokens at assistant positions of the training data, plus
  the end-of-turn ids (always in). Sorted ascending, so ``d2t = ids - arange(N)`` is EAGLE-3's
  offset vector (draft id i -> verifier id i + d2t[i]).
- ``DraftHead``: the one implementation that drafting, training and evaluation share. With
  ``ids=None`` it is the full LM head.

Probability mass outside the draft vocabulary: the soft-CE target is the verifier's distribution
restricted to the draft vocabulary and renormalised (softmax of the sliced head's logits, which is
exactly q(x) / q(V_draft)); HASS's top-K targets drop ids outside the vocabulary and keep the
others' probabilities (no renormalisation: the top-K term is a partial CE). A drafter can never
propose a token outside its vocabulary; verification is untouched, so decoding stays lossless.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn


def count_targets(examples: Iterable, vocab_size: int) -> torch.Tensor:
    """(V,) counts of tokens at assistant (loss) positions of tokenized or feature examples."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for e in examples:
        ids = torch.as_tensor(e.input_ids, dtype=torch.long)
        mask = torch.as_tensor(e.loss_mask, dtype=torch.bool)[: ids.shape[0]]
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def select_ids(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent ids (ties broken by the lower id), ``always`` included; sorted."""
    V = counts.shape[0]
    if not 1 <= size <= V:
        raise ValueError(f"draft vocabulary size must be in [1, {V}], got {size}")
    always = sorted({int(i) for i in always})
    if any(not 0 <= i < V for i in always):
        raise ValueError(f"always-in ids {always} fall outside the vocabulary of {V}")
    if len(always) > size:
        raise ValueError(f"draft vocabulary of {size} cannot hold the {len(always)} end-of-turn ids")
    score = counts.double() - torch.arange(V, dtype=torch.float64) / V  # stable: lower id first
    score[torch.tensor(always, dtype=torch.long)] = float("inf")
    ids = score.topk(size).indices
    return ids.sort().values


def d2t_of(ids: torch.Tensor) -> torch.Tensor:
    return ids.long() - torch.arange(ids.shape[0])


def ids_of(d2t: torch.Tensor) -> torch.Tensor:
    return d2t.long() + torch.arange(d2t.shape[0], device=d2t.device)


def save_vocab(ids: torch.Tensor, path: str | os.PathLike, meta: dict | None = None) -> Path:
    """A vocabulary file (safetensors ``ids``), written to a temp file and renamed."""
    import json

    from safetensors.torch import save_file

    from common.atomic import atomic_file

    out = Path(path)
    with atomic_file(out) as tmp:
        save_file({"ids": ids.long().contiguous()}, tmp, metadata={"meta": json.dumps(meta or {})})
    return out


def load_vocab(path: str | os.PathLike) -> torch.Tensor:
    from safetensors.torch import load_file

    ids = load_file(str(path))["ids"].long()
    if ids.ndim != 1 or not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError(f"{path}: draft vocabulary ids must be a strictly increasing 1-D tensor")
    return ids


class DraftHead(nn.Module):
    """Logits over the draft vocabulary: h @ W[ids].T, W the verifier's (frozen) LM head."""

    def __init__(self, lm_head: nn.Module, ids: torch.Tensor | None = None):
        super().__init__()
        W = lm_head.weight
        self.vocab_size = W.shape[0]  # the verifier's vocabulary
        self.ids = None if ids is None else ids.to(W.device).long()
        self.full = lm_head if ids is None else None
        w = None if ids is None else W.detach()[self.ids].contiguous()  # (N, H) copy, no grad
        self.register_buffer("weight", w, persistent=False)
        self.matmul = None  # optional h -> h @ weight.T for inference, installed by the decoder
        if ids is not None:
            t2d = torch.full((self.vocab_size,), -1, dtype=torch.long, device=W.device)
            t2d[self.ids] = torch.arange(self.ids.shape[0], device=W.device)
            self.register_buffer("t2d", t2d, persistent=False)  # verifier id -> draft id, -1 = outside

    @property
    def size(self) -> int:
        return self.vocab_size if self.ids is None else int(self.ids.shape[0])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            return self.full(h.to(self.full.weight.dtype))  # e.g. float32 loss features, a bf16 verifier
        if self.matmul is not None and not h.requires_grad and h.dtype == self.weight.dtype:
            return self.matmul(h)  # a decoder's row-count-aware form (decoding/cpu/), set on CPU
        return h @ self.weight.to(h.dtype).T

    def to_verifier(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> verifier ids."""
        return draft_ids if self.ids is None else self.ids.to(draft_ids.device)[draft_ids]

    def restrict_topk(self, top_ids: torch.Tensor, top_probs: torch.Tensor):
        """Verifier top-K (ids, probs) -> draft ids (0 where outside, harmless) and probs (0 there)."""
        if self.ids is None:
            return top_ids.long(), top_probs
        d = self.t2d.to(top_ids.device)[top_ids.long()]
        inside = d >= 0
        return d.clamp_min(0), torch.where(inside, top_probs, torch.zeros_like(top_probs))
