"""EAGLE-3's training: its training-time test as pure tensor functions and its part of the loop.

EAGLE-3's training-time test (TTT) as pure functions: the drafter is unrolled ``steps`` drafting
steps over every training position at once, step k conditioning on its own step k-1 output.

Alignment (this project's, drafters/train/eagle2.py): a sequence x_0..x_{L-1} with verifier features at
every position gives T = L-1 rows. Row t at step k reads the token x_{t+1+k} and, at step 0, the
fused verifier features of position t, at step k > 0 the drafter's own step k-1 output of row t;
it predicts x_{t+2+k}, whose target is the verifier's distribution at position t+1+k. Its RoPE
position is t+k, the position that draft takes at decode time.

Attention (the reference's TTT mask): a step-k query of row t sees the step-0 keys of rows 0..t
(the causal prefix the verifier's features made) and its own row's keys of steps 1..k (its own
drafts), exactly what a drafter with a KV cache of the prefix sees when it drafts k tokens past
row t (tests/test_eagle3.py checks that equality).

Loss (the reference's): soft cross-entropy against the verifier's distribution restricted to the
draft vocabulary and renormalised, on rows whose token x_{t+1+k} is an assistant token and whose
verifier top-1 lies inside the draft vocabulary; step k weighted ``decay ** k``; no feature
regression. Each step's loss is the mean over its counted rows.

EAGLE-3's part of drafters/train/loop.py (its entry in drafters/train/backbones.py): its batches,
objective, initial drafter and held-out agreement. The loop, the runners (plain AdamW or DeepSpeed,
fp32 or bf16), step checkpoints and resume are the trainer's, shared by every backbone.

Data: an EAGLE-3 feature cache (drafters/features.py with ``aux_layers``) holds per token the
verifier's hidden states at the aux layers, the LM head's input (whose distribution over the draft
vocabulary is the target) and the verifier's top-1. The objective is drafters/train/eagle3.py's
training-time test; no feature noise (the EAGLE-3 reference adds none)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drafters.eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3
from drafters.features import FeatureStore
from drafters.train.config import ONLINE_ROOTS


def ttt_mask(t: int, step: int, device=None) -> torch.Tensor:
    """(t, t * (step + 1)) bool over the keys [step 0 | step 1 | ... | step]: causal on step 0's
    block, the diagonal on every later one."""
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([torch.ones(t, t, dtype=torch.bool, device=device).tril()] + [eye] * step, dim=1)


def shifted(x: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """x[:, k:] right-padded with ``fill`` to x's length (dim 1)."""
    if k == 0:
        return x
    pad = x.new_full((x.shape[0], k, *x.shape[2:]), fill)
    return torch.cat([x[:, k:], pad], dim=1)


def ttt_unroll(drafter: Eagle3Drafter, embed, aux: torch.Tensor, input_ids: torch.Tensor,
               steps: int | None = None) -> list[torch.Tensor]:
    """Draft logits of each step, [(B, T, N)] * steps, T = L - 1 (rows past the sequence at step k,
    t > T - 1 - k, read a padding token and are never counted).

    embed: the verifier's token embedding (a module or callable ids -> (B, L, H)); aux (B, L, A*H)
    the concatenated aux-layer features; input_ids (B, L)."""
    return [drafter.logits(h) for h in ttt_hidden(drafter, embed, aux, input_ids, steps)]


def ttt_hidden(drafter: Eagle3Drafter, embed, aux: torch.Tensor, input_ids: torch.Tensor,
               steps: int | None = None) -> list[torch.Tensor]:
    """``ttt_unroll`` before the LM head: each step's hidden states [(B, T, H)] * steps (the loss
    takes the head of the counted rows only)."""
    steps = drafter.config.ttt_steps if steps is None else steps
    b, L = input_ids.shape
    t = L - 1
    if L < 2:
        raise ValueError("ttt_unroll needs sequences of at least 2 tokens")
    hidden = drafter.fuse(aux[:, :t])
    prev_k = prev_v = None
    out = []
    for k in range(steps):
        tokens = shifted(input_ids[:, 1:], k)
        positions = torch.arange(t, device=input_ids.device) + k
        mask = ttt_mask(t, k, device=input_ids.device)
        extra = None if prev_k is None else (prev_k, prev_v)
        hidden, (kk, vv) = drafter(embed(tokens), hidden, positions, mask, extra_kv=extra)
        prev_k = kk if prev_k is None else torch.cat([prev_k, kk], dim=-2)
        prev_v = vv if prev_v is None else torch.cat([prev_v, vv], dim=-2)
        out.append(hidden)
    return out


def draft_targets(verifier_logits: torch.Tensor, draft_ids: torch.Tensor | None):
    """(B, L, V) verifier logits -> (probabilities over the draft vocabulary, renormalised (B, L, N),
    whether the verifier's top-1 lies inside the draft vocabulary (B, L))."""
    logits = verifier_logits.float()
    if draft_ids is None:
        return logits.softmax(-1), torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device)
    inside = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    inside[draft_ids.to(logits.device)] = True
    return logits[..., draft_ids.to(logits.device)].softmax(-1), inside[logits.argmax(-1)]


def ttt_loss(drafter: Eagle3Drafter, embed, aux, input_ids, verifier_logits, loss_mask,
             steps: int | None = None, decay: float | None = None):
    """The weighted TTT loss and per-step stats {"loss": [...], "top1": [...], "rows": [...]}
    (top1: agreement of the drafter's argmax with the verifier's restricted argmax on counted rows).

    verifier_logits (B, L, V); loss_mask (B, L), 1 on assistant tokens (0 on padding)."""
    b, L = input_ids.shape
    if verifier_logits.shape[:2] != (b, L) or loss_mask.shape != (b, L):
        raise ValueError(f"verifier_logits {tuple(verifier_logits.shape)} and loss_mask "
                         f"{tuple(loss_mask.shape)} "
                         f"must start with input_ids' (B, L) = {(b, L)}")
    probs, inside = draft_targets(verifier_logits, drafter.draft_ids())
    return ttt_loss_targets(drafter, embed, aux, input_ids, probs, loss_mask.bool() & inside, steps, decay)


def ttt_loss_targets(drafter: Eagle3Drafter, embed, aux, input_ids, probs, counted,
                     steps: int | None = None, decay: float | None = None):
    """``ttt_loss`` from the targets themselves: ``probs`` (B, L, N) the verifier's distribution over
    the draft vocabulary at each position, ``counted`` (B, L) bool: the position's token is an
    assistant token and the verifier's top-1 there lies inside the draft vocabulary."""
    cfg = drafter.config
    steps = cfg.ttt_steps if steps is None else steps
    decay = cfg.ttt_decay if decay is None else decay
    b, L = input_ids.shape
    if aux.shape[:2] != (b, L) or probs.shape[:2] != (b, L) or counted.shape != (b, L):
        raise ValueError(f"aux {tuple(aux.shape)}, targets {tuple(probs.shape)} and loss mask "
                         f"{tuple(counted.shape)} must all start with input_ids' (B, L) = {(b, L)}")
    total = aux.new_zeros((), dtype=torch.float32)
    stats = {"loss": [], "top1": [], "rows": []}
    for k, hidden in enumerate(ttt_hidden(drafter, embed, aux, input_ids, steps)):
        # row t: input token x_{t+1+k}, target the verifier's distribution at position t+1+k; the LM
        # head runs on the counted rows only
        bi, ti = shifted(counted[:, 1:], k, fill=False).nonzero(as_tuple=True)
        target = probs[bi, ti + 1 + k].float()  # (M, N)
        logits = drafter.logits(hidden[bi, ti]).float()
        n = int(bi.numel())
        step_loss = -(target * F.log_softmax(logits, dim=-1)).sum(-1).sum() / max(n, 1)
        total = total + (decay ** k) * step_loss
        with torch.no_grad():
            stats["loss"].append(float(step_loss))
            stats["top1"].append(float((logits.argmax(-1) == target.argmax(-1)).sum()) / max(n, 1))
            stats["rows"].append(n)
    return total, stats


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

    def to(self, device, dtype: torch.dtype | None = None) -> Eagle3Batch:
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
        ids[b, :n] = e.input_ids
        aux[b, :n] = e.aux
        feats[b, :n] = e.features
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
    return hits, counts  # per depth: top-1 hits, positions counted (drafters/train/backbones.py top1_rates)
