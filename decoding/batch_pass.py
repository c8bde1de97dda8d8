"""One verifier pass over several prompts' trees: verification batched across prompts.

Each prompt keeps its own KV cache (its own length) and its own tree. The pass packs the trees'
tokens into one sequence, so every weight (projections, MLP, LM head) is read once for all of them,
and attends per prompt: each prompt's queries see its own cache and its own tree under its own
mask, and its new keys/values go to its own cache. No padding: a prompt's rows are never computed
for another's. The same modules and ops as the lean pass (decoding/cpu/lean_pass.py), so a prompt's
features and logits are what its pass alone computes, up to the rounding of matmuls over a different
number of rows (tests/test_batch_decoding.py holds the tokens to ``generate``'s).

Device-agnostic for the Llama-family layout the lean pass knows (``lean_pass.layout_error``); on
CUDA grouped-query heads are repeated before attention (as transformers' SDPA path does), so SDPA
keeps a fused kernel under a mask. Another model takes ``tree_forward`` prompt by prompt.
"""
from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

from decoding.cpu import lean_pass
from decoding.verifier_pass import tree_mask

log = logging.getLogger(__name__)
_PACKABLE: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def packable(model) -> bool:
    """Whether ``forward_many`` packs this model's passes (decided once per model, one log line if not)."""
    if model not in _PACKABLE:
        cfg = getattr(model, "config", None)
        why = ("not a Llama-family model" if getattr(cfg, "model_type", None) != "llama"
               else lean_pass.layout_error(model))
        if why:
            log.warning("verification batched across prompts runs prompt by prompt for this model (%s)", why)
        _PACKABLE[model] = why is None
    return _PACKABLE[model]


def _attend(q, keys, values, mask, scale: float) -> torch.Tensor:
    """(1, heads, T, D) attention of one prompt's tree rows over its cache and tree."""
    if q.device.type == "cpu":
        return lean_pass._attend(q, keys, values, mask, False, scale)
    groups = q.shape[1] // keys.shape[1]
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)


@torch.no_grad()
def packed_forward(model, ids: torch.Tensor, pos: torch.Tensor, sizes: list[int], masks: list, caches: list,
                   taps: dict | None = None) -> torch.Tensor:
    """Last hidden states (1, sum(sizes), H), post final norm, of prompts packed one after another.

    ``ids``/``pos``: (1, sum(sizes)) every prompt's tree rows in turn; ``masks[b]``: prompt b's additive
    mask (1, 1, sizes[b], its cache length + sizes[b]); ``caches[b]``: its DynamicCache, which gets its
    rows' keys and values. ``taps``: as ``lean_pass.forward``'s (hidden states of the packed rows)."""
    inner = model.model
    t = ids.shape[1]
    h = inner.embed_tokens(ids)  # (1, T, H)
    cos, sin = inner.rotary_emb(h, pos)  # (1, T, D) each
    cos, sin = cos[:, None], sin[:, None]
    for i, layer in enumerate(inner.layers):
        if taps is not None and i in taps:
            taps[i] = h
        attn = layer.self_attn
        q, k, v = lean_pass.rotated_qkv(layer, h, cos, sin)
        outs = []
        for qb, kb, vb, mask, cache in zip(q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2), masks,
                                           caches):
            keys, values = cache.update(kb, vb, i)  # (1, kv heads, its length + rows, D)
            outs.append(_attend(qb, keys, values, mask, attn.scaling))
        o = torch.cat(outs, dim=2)  # (1, heads, T, D)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, t, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    if taps is not None and len(inner.layers) in taps:
        taps[len(inner.layers)] = h
    return h


@torch.no_grad()
def forward_many(model, requests: list, layers: tuple[int, ...] | None = None) -> list[tuple]:
    """Each request's (features (N+1, F), logits (N+1, V)), as ``tree_forward`` gives them, from ONE
    pass over every request's [root] + tree. ``requests``: decoding.engine.VerifyRequest (the cache,
    its length, the root on the model's device, the tree). ``layers``: the features the drafters read
    (None: the last hidden state; else those output_hidden_states indices, concatenated: EAGLE-3)."""
    if len(requests) == 1 or not packable(model):
        return [r.run(model, layers) for r in requests]
    dev, dtype = model.device, model.dtype
    ids, pos = [], []
    masks, sizes = [], []
    for r in requests:
        tree = r.tree
        ids += [r.root.reshape(1).to(dev), tree.tokens.to(dev)]
        depths = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), tree.depths.to(dev)])
        pos.append(r.prefix_len + depths)
        masks.append(tree_mask(tree.parents, r.prefix_len, dtype, dev))
        sizes.append(tree.tokens.shape[0] + 1)
    taps = None if layers is None else dict.fromkeys(layers)
    h = packed_forward(model, torch.cat(ids)[None], torch.cat(pos)[None], sizes, masks,
                       [r.cache for r in requests], taps)
    feats = h[0] if taps is None else torch.cat([taps[i][0] for i in layers], dim=-1)  # (T, F)
    logits = model.lm_head(h)[0].float()  # (T, V)
    return list(zip(feats.split(sizes), logits.split(sizes)))
