"""EAGLE-3's part of drafters/trainer.py (its entry in drafters/backbones.py): its batches,
objective, initial drafter and held-out agreement. The loop, the runners (plain AdamW or DeepSpeed,
fp32 or bf16), step checkpoints and resume are the trainer's, shared by every backbone.

Data: an EAGLE-3 feature cache (drafters/features.py with ``aux_layers``) holds per token the
verifier's hidden states at the aux layers, the LM head's input (whose distribution over the draft
vocabulary is the target) and the verifier's top-1. The objective is drafters/eagle3_loss.py's
training-time test; no feature noise (the EAGLE-3 reference adds none).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3
from .eagle3_loss import shifted, ttt_hidden, ttt_loss_targets
from .features import FeatureStore
from .train_config import ONLINE_ROOTS


@dataclass
class Eagle3Batch:
    input_ids: torch.Tensor  # (B, L) right-padded with 0
    aux: torch.Tensor  # (B, L, A*H) the aux layers' hidden states, concatenated
    features: torch.Tensor  # (B, L, H) the verifier's LM-head input: its distribution is the target
    top1: torch.Tensor  # (B, L) the verifier's argmax next token at each position
    loss_mask: torch.Tensor  # (B, L) bool: assistant token (False on padding)
    lengths: torch.Tensor  # (B,)

    @property
    def mask(self) -> torch.Tensor:
        """(B, L-1) rows whose input token is the assistant's (step 0's; the trainer's token count,
        the same rows EAGLE-2's batches count)."""
        return self.loss_mask[:, 1:]

    def to(self, device, dtype: torch.dtype | None = None) -> "Eagle3Batch":
        cast = {"dtype": dtype} if dtype is not None else {}
        return Eagle3Batch(self.input_ids.to(device), self.aux.to(device, **cast),
                           self.features.to(device, **cast), self.top1.to(device), self.loss_mask.to(device),
                           self.lengths.to(device))


def collate(examples: list, mask_mode: str = "next") -> Eagle3Batch:
    """Right-pad FeatureExamples of an EAGLE-3 cache into a batch."""
    if mask_mode != "next":
        raise ValueError(f"eagle3 trains with loss_mask 'next' only, got {mask_mode!r}")
    if any(e.aux is None for e in examples):
        raise ValueError("eagle3 needs features with the aux layers' hidden states; this cache has none "
                         "(an EAGLE-2/HASS cache: extract with ensure_features(..., aux_layers=...))")
    B, L = len(examples), max(len(e.input_ids) for e in examples)
    A, H = examples[0].aux.shape[-1], examples[0].features.shape[-1]
    ids = torch.zeros(B, L, dtype=torch.long)
    aux = torch.zeros(B, L, A, dtype=examples[0].aux.dtype)
    feats = torch.zeros(B, L, H, dtype=examples[0].features.dtype)
    top1 = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        ids[b, :n], aux[b, :n], feats[b, :n] = e.input_ids, e.aux, e.features
        top1[b, :n], mask[b, :n] = e.top_ids[:, 0].long(), e.loss_mask
    return Eagle3Batch(ids, aux, feats, top1, mask, torch.tensor([len(e.input_ids) for e in examples]))


def drafter_config(cfg, verifier_model, draft_ids: torch.Tensor | None) -> Eagle3Config:
    """The drafter a TrainConfig trains: ``cfg.aux_layers`` (None: the reference's three layers)."""
    return Eagle3Config.for_verifier(verifier_model, cfg.verifier, seed=cfg.init_seed,
                                     draft_vocab_size=None if draft_ids is None else int(draft_ids.shape[0]),
                                     aux_layers=cfg.aux_layers)


def init_drafter(ecfg: Eagle3Config, verifier_model, draft_ids: torch.Tensor | None) -> Eagle3Drafter:
    """The seeded initial drafter, its LM head the verifier's rows of the draft vocabulary (every
    variant of the backbone starts from it: merging needs one initialisation)."""
    return init_eagle3(ecfg, draft_ids, verifier_model.get_output_embeddings().weight)


def check_data(data: list, ecfg: Eagle3Config) -> None:
    """Refuse, before training, a cached entry whose features are not the drafter's aux layers."""
    for root, key, _ in data:
        if root in ONLINE_ROOTS:
            continue
        have = FeatureStore(root, key).manifest().get("aux_layers")
        if have is None or tuple(have) != ecfg.aux_layers:
            raise ValueError(f"feature cache {key} holds aux layers {have} but the eagle3 drafter fuses "
                             f"{list(ecfg.aux_layers)}: extract with ensure_features(..., aux_layers="
                             f"{list(ecfg.aux_layers)})")


@torch.no_grad()
def targets(head, batch: Eagle3Batch):
    """The verifier's distribution over the draft vocabulary at each position, renormalised (B, L, N),
    and the positions that count (B, L): assistant tokens whose verifier top-1 is in the vocabulary."""
    probs = head(batch.features.float()).float().softmax(-1)
    if head.ids is None:
        return probs, batch.loss_mask
    return probs, batch.loss_mask & (head.t2d.to(batch.top1.device)[batch.top1] >= 0)


def loss(cfg, model, embed, head, batch: Eagle3Batch, generator, use_topk: bool, dtype):
    """The TTT loss (``ttt_steps`` steps weighted ``ttt_decay ** k``) and its per-step parts. No
    feature noise and no top-K stage (``generator`` and ``use_topk`` go unused), as in the reference."""
    batch = batch.to(embed.weight.device, dtype)
    probs, counted = targets(head, batch)
    total, stats = ttt_loss_targets(model, embed, batch.aux, batch.input_ids, probs, counted)
    parts = {f"ttt_loss_{k}": v for k, v in enumerate(stats["loss"])}
    return total, {**parts, "topk_total": 0.0}


@torch.no_grad()
def agreement_counts(model, embed, head, batch_iter, depths: int = 3, dtype=None) -> tuple[list, list]:
    """Top-1 agreement counts (hits, positions per depth) with the verifier's next token at TTT
    depths 1..D: depth j is step j-1 of the unroll, i.e. the j-th token drafted past a verified
    prefix, on the rows EAGLE-2's agreement counts (assistant input token). A verifier token
    outside the draft vocabulary is a miss (the drafter's own head and d2t decide; ``head`` goes
    unused)."""
    hits, counts = [0] * depths, [0] * depths
    dtype = dtype or next(model.parameters()).dtype
    ids = model.draft_ids()
    model.eval()
    for batch in batch_iter:
        batch = batch.to(embed.weight.device, dtype)
        for k, hidden in enumerate(ttt_hidden(model, embed, batch.aux, batch.input_ids, steps=depths)):
            bi, ti = shifted(batch.loss_mask[:, 1:], k, fill=False).nonzero(as_tuple=True)
            pred = model.logits(hidden[bi, ti]).argmax(-1)
            pred = pred if ids is None else ids[pred]
            hits[k] += int((pred == batch.top1[bi, ti + 1 + k]).sum())
            counts[k] += int(bi.numel())
    model.train()
    return hits, counts  # per depth: top-1 hits, positions counted (drafters/backbones.py top1_rates)

