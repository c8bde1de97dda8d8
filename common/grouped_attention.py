"""The verifier's grouped-query attention in masked multi-token passes, on accelerators.

A tree pass feeds N+1 tokens with an explicit 4-D mask. transformers' SDPA path then copies every
key/value head ``num_key_value_groups`` times per layer (``repeat_kv``: with a mask, ``enable_gqa``
would send CUDA's SDPA to its math kernel): for Llama-3-8B, 4 copies of the whole KV cache per layer
per pass. Here the query heads of a group are folded into the query length instead,
(B, nkv, g*T, hd) against the (B, nkv, S, hd) cache with the mask tiled g times, the drafter's own
form (``drafters.model.grouped_attention``): no head copied, equal head counts, the
memory-efficient kernel eligible. Other passes (no mask, one query token, a per-head mask) go to
transformers' SDPA function unchanged.

``install(model)`` switches a loaded model to it (``decoding.verifiers`` does, on non-CPU devices;
the CPU keeps its own lean pass, decoding/cpu/lean_pass.py).
"""
from __future__ import annotations

import torch.nn.functional as F

NAME = "taskspec_grouped_sdpa"


def grouped_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """transformers' attention-function signature: (B, nh, T, hd) query, (B, nkv, S, hd) key/value,
    a (B or 1, 1, T, S) mask; returns ((B, T, nh, hd), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, nh, t, hd = query.shape
    nkv = key.shape[1]
    g = nh // nkv
    plain = (g == 1 or t == 1 or attention_mask is None or attention_mask.dim() != 4
             or attention_mask.shape[1] != 1
             or dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    mask = attention_mask[..., : key.shape[-2]].repeat(1, 1, g, 1)  # (Bm, 1, g*T, S): row j*T + t is mask[t]
    out = F.scaled_dot_product_attention(query.reshape(b, nkv, g * t, hd), key, value, attn_mask=mask,
                                         scale=scaling)
    return out.reshape(b, nh, t, hd).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make NAME an attention implementation (and its masks SDPA's), once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def install(model) -> bool:
    """Switch a grouped-query SDPA model to NAME; False (unchanged) for other models."""
    cfg = model.config
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or not kv or heads == kv:
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
