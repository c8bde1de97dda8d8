"""EAGLE-2's and HASS's training: their objectives as pure tensor functions and their part of the loop.

Training objectives (pure tensor functions): alignment, EAGLE-2 loss, HASS top-K and
harmonized context alignment masks.

Alignment (EAGLE): the drafter's input at position t is (f_t, x_{t+1}); its output predicts the
verifier feature f_{t+1}, whose LM-head distribution is the verifier's distribution of x_{t+2}.
Position t carries loss iff token t+1 is an assistant token (``mask_mode="next"``: exactly the
positions a drafter sees at decode time, whose input token is the assistant's). The EAGLE/HASS
data loaders put it one position earlier, iff token t is an assistant token
(``mask_mode="reference"``): that adds the last assistant position (input = the token after the
end-of-turn) and drops the first (input = the first answer token). Held-out agreement always
counts the ``next`` positions, so the two are compared on what decoding sees.

EAGLE-2's and HASS's part of drafters/train/loop.py: the feature drafter's initial weights, its
objective and its held-out agreement. Batches are drafters/train/eagle2.py's ``collate`` (aligned
feature pairs); the loop, runners, checkpoints and resume are the trainer's.

EAGLE-2: 1.0 SmoothL1 on the predicted feature + 0.1 soft CE against the verifier's distribution,
on input features with EAGLE's uniform noise. HASS: the same on each of ``hass_steps`` forward
alignment passes, plus 1.0 top-K distillation once the second stage of its schedule begins."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drafters import checkpoint
from drafters.config import DrafterConfig
from drafters.train.config import MASK_MODES


@dataclass
class AlignedBatch:
    tokens: torch.Tensor  # (B, T) x_{t+1}
    features: torch.Tensor  # (B, T, H) f_t (input)
    target: torch.Tensor  # (B, T, H) f_{t+1}
    top_ids: torch.Tensor  # (B, T, K) verifier top-K of x_{t+2} (from position t+1)
    top_probs: torch.Tensor  # (B, T, K)
    mask: torch.Tensor  # (B, T) bool: loss positions (assistant token at t+1, not padding)
    lengths: torch.Tensor  # (B,) each example's own token count L (the aligned rows are L-1)

    def to(self, device, dtype: torch.dtype | None = None) -> AlignedBatch:
        """The batch on ``device`` (collate builds it on the host; the drafter may live on a GPU),
        its features and targets in ``dtype`` (the training precision) when given."""
        cast = ("features", "target") if dtype is not None else ()
        return AlignedBatch(*(getattr(self, f.name).to(device, **({"dtype": dtype} if f.name in cast else {}))
                              for f in dataclasses.fields(self)))



def align(input_ids, features, loss_mask, top_ids=None, top_probs=None, mask_mode: str = "next") -> dict:
    """One sequence of length L -> drafter training pairs of length L-1 (see module doc)."""
    if mask_mode not in MASK_MODES:
        raise ValueError(f"loss mask mode must be one of {list(MASK_MODES)}, got {mask_mode!r}")
    out = {
        "tokens": input_ids[1:],  # x_{t+1}
        "features": features[:-1],  # f_t
        "target": features[1:],  # f_{t+1}
        "mask": (loss_mask[1:] if mask_mode == "next" else loss_mask[:-1]).bool(),
    }
    if top_ids is not None:
        out["top_ids"], out["top_probs"] = top_ids[1:], top_probs[1:]
    return out


def collate(examples: list, dtype=torch.float32, mask_mode: str = "next") -> AlignedBatch:
    """Right-pad aligned sequences from FeatureExamples into a batch."""
    al = [align(e.input_ids, e.features, e.loss_mask, e.top_ids, e.top_probs, mask_mode) for e in examples]
    T = max(a["tokens"].shape[0] for a in al)
    B = len(al)
    H = al[0]["features"].shape[-1]
    K = al[0]["top_ids"].shape[-1]
    tokens = torch.zeros(B, T, dtype=torch.long)
    feats = torch.zeros(B, T, H, dtype=dtype)
    target = torch.zeros(B, T, H, dtype=dtype)
    tid = torch.zeros(B, T, K, dtype=torch.long)
    tpr = torch.zeros(B, T, K, dtype=torch.float32)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, a in enumerate(al):
        n = a["tokens"].shape[0]
        tokens[b, :n] = a["tokens"]
        feats[b, :n] = a["features"].to(dtype)
        target[b, :n] = a["target"].to(dtype)
        tid[b, :n] = a["top_ids"].long()
        tpr[b, :n] = a["top_probs"].float()
        mask[b, :n] = a["mask"]
    lengths = torch.tensor([a["tokens"].shape[0] + 1 for a in al])
    return AlignedBatch(tokens, feats, target, tid, tpr, mask, lengths)


def noise(features: torch.Tensor, generator: torch.Generator | None, lengths: torch.Tensor,
          scale: float = 0.2) -> torch.Tensor:
    """EAGLE's uniform input-feature augmentation: (U[0,1) - 0.5) * 0.2 * 512 / L, with L each
    example's own length (B,), not the padded batch length (EAGLE trains unpadded sequences)."""
    u = torch.rand(features.shape, generator=generator, dtype=torch.float32,
                   device=features.device).to(features)
    per = scale * 512 / lengths.clamp_min(1).to(features.dtype)  # (B,)
    return features + (u - 0.5) * per[:, None, None]


def eagle_losses(pred: torch.Tensor, target: torch.Tensor, head, mask: torch.Tensor, top_ids=None,
                 top_probs=None):
    """Returns (feature SmoothL1, soft CE vs the verifier's distribution, top-K distillation, logp).

    pred, target (B, T, H); mask (B, T); ``head`` a :class:`drafters.vocab.DraftHead` (the full LM
    head or a reduced draft vocabulary: then q is renormalised over it and top-K ids outside it
    are dropped). Only masked positions go through the head.
    """
    sel = mask.nonzero(as_tuple=True)
    # (M, H); every loss in float32 (bf16 training too)
    p_feat, t_feat = pred[sel].float(), target[sel].float()
    vloss = F.smooth_l1_loss(p_feat, t_feat,
                             reduction="none").mean(-1).mean() if p_feat.numel() else pred.sum() * 0
    logp = head(p_feat).float().log_softmax(-1)  # (M, N) drafter log-probs over the draft vocabulary
    with torch.no_grad():
        q = head(t_feat.to(p_feat.dtype)).float().softmax(-1)  # (M, N) verifier distribution (renormalised)
    ploss = -(q * logp).sum(-1).mean() if logp.numel() else vloss * 0
    topk = vloss * 0
    if top_ids is not None and logp.numel():
        ids, pr = head.restrict_topk(top_ids[sel], top_probs[sel].float())  # (M, K) draft ids, 0-prob outside
        topk = -(pr * logp.gather(-1, ids)).sum(-1).mean()  # -sum_{x in topK(q)} q(x) log p(x)
    return vloss, ploss, topk, logp


def hass_mask(T: int, step: int, device=None) -> torch.Tensor:
    """Attention mask for HASS forward-alignment pass ``step`` (1-based) over keys [K^1 .. K^step].

    Query i attends target-feature keys K^1 at positions <= i - step + 1 and, for m = 2..step, the
    key of pass m at position exactly i - step + m: the last step-1 context positions are the
    drafter's own predictions, as at depth ``step`` of a draft tree. Returns (T, step*T) bool.
    """
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    blocks = [j <= i - step + 1]
    for m in range(2, step + 1):
        blocks.append(j == i - step + m)
    mask = torch.cat(blocks, dim=1)
    mask[:, 0] |= ~mask.any(dim=1)  # rows with nothing visible (i < step-1) attend key 0; no loss there
    return mask


def aligned_passes(drafter, embed, batch: AlignedBatch, steps: int,
                   input_features: torch.Tensor | None = None):
    """Run HASS's forward-alignment passes 1..steps. Returns a list of predictions (B, T, H).

    Pass 1 is the ordinary teacher-forced pass. In pass m >= 2, the input feature at position t is
    the previous pass's prediction at t-1 (the drafter's own estimate of f_t), detached. As in
    HASS, the keys and values of every pass keep their graph: the inputs are detached, but fc,
    k_proj and v_proj still get gradients through the keys that later passes attend to.
    """
    B, T, _ = batch.features.shape
    pos = torch.arange(T, device=batch.features.device)
    feats = batch.features if input_features is None else input_features
    emb = embed(batch.tokens).to(feats.dtype)  # (B, T, H); the verifier's dtype -> the training precision
    kv_k = []
    kv_v = []
    preds = []
    for m in range(1, steps + 1):
        if m > 1:
            prev = preds[-1].detach()
            feats = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)  # shift right by 1
        extra = None if m == 1 else (torch.cat(kv_k, dim=-2), torch.cat(kv_v, dim=-2))
        mask = hass_mask(T, m, batch.features.device)
        out, (k, v) = drafter(emb, feats, pos, mask, extra_kv=extra)
        kv_k.append(k)
        kv_v.append(v)
        preds.append(out)
    return preds


def step_mask(mask: torch.Tensor, step: int) -> torch.Tensor:
    """Loss positions of pass ``step``: position t needs t - step + 1 >= 0."""
    out = mask.clone()
    out[:, : step - 1] = False
    return out


def drafter_config(cfg, verifier_model, draft_ids: torch.Tensor | None) -> DrafterConfig:
    """The drafter a TrainConfig trains, sized by the verifier."""
    return DrafterConfig.for_verifier(verifier_model, cfg.verifier, cfg.backbone, seed=cfg.init_seed,
                                      draft_vocab_size=None if draft_ids is None else int(draft_ids.shape[0]))


def init_drafter(dcfg: DrafterConfig, verifier_model, draft_ids: torch.Tensor | None):
    """The seeded initial drafter (every variant of the backbone starts from it: merging needs one
    initialisation); the verifier's weights are not used."""
    return checkpoint.init_drafter(dcfg, draft_ids)


def check_data(data: list, dcfg: DrafterConfig) -> None:
    """Any feature cache serves (EAGLE-2 and HASS read the same features)."""


def loss(cfg, model, embed, head, batch, generator, use_topk: bool, dtype, *, hass: bool):
    """The objective summed over the alignment passes (1, or ``hass_steps`` with ``hass``) and its
    per-pass parts; the top-K term only with ``hass`` and ``use_topk``. ``topk_total``: that term's
    share of the loss (the trainer's train_base_loss leaves it out)."""
    batch = batch.to(embed.weight.device, dtype)  # host-built -> the drafter's device
    feats = noise(batch.features, generator, batch.lengths) if cfg.feature_noise else batch.features
    preds = aligned_passes(model, embed, batch, cfg.hass_steps if hass else 1, input_features=feats)
    topk_on = hass and use_topk
    total, parts = 0.0, {}
    for j, pred in enumerate(preds, 1):
        m = step_mask(batch.mask, j)
        topk = (batch.top_ids, batch.top_probs) if topk_on else (None, None)
        v, p, t, _ = eagle_losses(pred, batch.target, head, m, *topk)
        step_loss = cfg.vloss_weight * v + cfg.ploss_weight * p + (cfg.topk_weight * t if topk_on else 0.0)
        total = total + step_loss
        parts[f"vloss_{j}"], parts[f"ploss_{j}"] = float(v.detach()), float(p.detach())
        topk_part = cfg.topk_weight * float(t.detach()) if topk_on else 0.0
        parts["topk_total"] = parts.get("topk_total", 0.0) + topk_part
    return total, parts


def agreement_counts(model, embed, head, batch_iter, depths: int = 3, dtype=None) -> tuple[list, list]:
    """Top-1 agreement counts (hits, positions per depth) with the verifier's next token at depth 1
    (teacher-forced) and depths 2..D (rolled out on the drafter's own features), on assistant
    positions of held-out batches.
    With a reduced draft vocabulary a verifier token outside it counts as a miss. ``dtype``: the
    features' (the training precision; None: the drafter's own weights' dtype)."""
    hits, counts = [0] * depths, [0] * depths
    dtype = dtype or next(model.parameters()).dtype
    model.eval()
    for batch in batch_iter:
        batch = batch.to(embed.weight.device, dtype)
        preds = aligned_passes(model, embed, batch, depths)
        for j, pred in enumerate(preds):
            m = step_mask(batch.mask, j + 1)
            sel = m.nonzero(as_tuple=True)
            if not sel[0].numel():
                continue
            a = head.to_verifier(head(pred[sel]).argmax(-1))
            b = batch.top_ids[sel][:, 0]  # the verifier's argmax next token
            hits[j] += int((a == b).sum())
            counts[j] += int(sel[0].numel())
    model.train()
    return hits, counts  # per depth: top-1 hits, positions counted (drafters/train/backbones.py top1_rates)
