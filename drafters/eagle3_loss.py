"""EAGLE-3's training-time test (TTT) as pure functions: the drafter is unrolled ``steps`` drafting
steps over every training position at once, step k conditioning on its own step k-1 output.

Alignment (this project's, drafters/losses.py): a sequence x_0..x_{L-1} with verifier features at
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
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .eagle3 import Eagle3Drafter


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
        raise ValueError(f"verifier_logits {tuple(verifier_logits.shape)} and loss_mask {tuple(loss_mask.shape)} "
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
