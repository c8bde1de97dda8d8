"""The EAGLE-style feature drafter: fc(cat(embed(x_{t+1}), f_t)) -> one Llama decoder layer -> f_{t+1}.

The layer has no input layernorm (EAGLE) and no final norm; the verifier's embedding and LM head
are passed in at run time, never stored. Attention takes an explicit boolean mask so one module
serves causal training, HASS's aligned passes and tree drafting, with an optional KV cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.dtypes import torch_dtypes
from drafters.config import DrafterBase, DrafterConfig
from drafters.vocab import ids_of

# dtype names the verifier loader and the exporter accept (one table for both)
DTYPES = torch_dtypes()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype):
    """positions (T,) -> cos, sin (T, head_dim)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                        dtype=torch.float32) / head_dim))
    ang = positions.float()[:, None] * inv[None, :]  # (T, hd/2)
    emb = torch.cat([ang, ang], dim=-1)  # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class KVCache:
    """The drafter's own cache: keys/values (B, n_kv, L, hd), cropped back after each tree."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def crop(self, n: int):
        if self.k is not None:
            self.k, self.v = self.k[..., :n, :], self.v[..., :n, :]


def grouped_attention(q, k, v, mask):
    """SDPA of (B, nh, T, hd) queries over (B, nkv, S, hd) keys/values with a (T, S) boolean mask,
    query head h reading key/value head h // (nh / nkv), as ``enable_gqa`` does. The heads of a group
    are folded into the query length, (B, nkv, g*T, hd) with the mask repeated per head, so no key or
    value head is copied and no ``enable_gqa`` is passed: with an explicit mask that flag sends CUDA's
    SDPA to its math kernel, while this form keeps the memory-efficient kernel eligible."""
    b, nh, t, hd = q.shape
    g = nh // k.shape[1]
    if g == 1 or mask is None or mask.dim() != 2:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=g != 1)
    out = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], g * t, hd), k, v, attn_mask=mask.repeat(g,
            1))
    return out.reshape(b, nh, t, hd)


def seeded(seed: int, build):
    """``build()`` with torch's global generator seeded by ``seed``, the caller's state restored after:
    a drafter's initial weights depend on its config's seed alone."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return build()
    finally:
        torch.random.set_rng_state(state)


def rotated_qkv(layer, x, positions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, nh, T, hd), k and v (B, nkv, T, hd) of x (B, T, in) by the layer's projections, q and k
    rotated (RoPE) at ``positions`` (T,)."""
    b, t, _ = x.shape
    q = layer.q_proj(x).view(b, t, layer.nh, layer.hd).transpose(1, 2)
    k = layer.k_proj(x).view(b, t, layer.nkv, layer.hd).transpose(1, 2)
    v = layer.v_proj(x).view(b, t, layer.nkv, layer.hd).transpose(1, 2)
    cos, sin = rope_cos_sin(positions, layer.hd, layer.theta, x.dtype)  # (T, hd)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def self_attention(layer, x, positions, mask, cache: KVCache | None = None, extra_kv=None):
    """A drafter layer's attention before ``o_proj``: q/k/v of x (B, T, in) by the layer's projections,
    RoPE at ``positions``, the cache (or ``extra_kv``) before this call's keys, grouped-query SDPA.
    Returns ((B, T, nh * hd), (k, v) of this call)."""
    b, t, _ = x.shape
    q, k, v = rotated_qkv(layer, x, positions)
    new_k, new_v = k, v
    if cache is not None:
        k, v = cache.append(k, v)
    elif extra_kv is not None:
        k, v = torch.cat([extra_kv[0], k], dim=-2), torch.cat([extra_kv[1], v], dim=-2)
    attn = grouped_attention(q, k, v, mask)
    return attn.transpose(1, 2).reshape(b, t, layer.nh * layer.hd), (new_k, new_v)  # (B, T, H)


class DecoderLayer(nn.Module):
    """One Llama decoder layer past its input: attention whose q/k/v read ``in_width`` features
    (default H), ``o_proj`` back to the residual stream, the post-attention norm and the SwiGLU MLP.
    EAGLE-2/HASS read the fc output and have no input layernorm; EAGLE-3's layer (drafters/eagle3.py)
    reads 2H and adds its input norms through ``_input_norms``, registered first."""

    def __init__(self, cfg: DrafterBase, in_width: int | None = None):
        super().__init__()
        h = cfg.hidden_size
        nh = cfg.num_attention_heads
        nkv = cfg.num_key_value_heads
        hd = cfg.head_dim
        self.nh = nh
        self.nkv = nkv
        self.hd = hd
        self.theta = cfg.rope_theta
        self._input_norms(cfg)
        w = in_width or h
        self.q_proj = nn.Linear(w, nh * hd, bias=False)
        self.k_proj = nn.Linear(w, nkv * hd, bias=False)
        self.v_proj = nn.Linear(w, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def _input_norms(self, cfg) -> None:
        """Norms applied before attention (none here: EAGLE has no input layernorm)."""

    def attend(self, x, residual, positions, mask, cache: KVCache | None = None, extra_kv=None):
        """Attention of x (B, T, in_width) added to ``residual`` (B, T, H), then the MLP block.
        Returns ((B, T, H), this call's (k, v))."""
        attn, new_kv = self_attention(self, x, positions, mask, cache, extra_kv)
        return self.finish(residual, attn), new_kv

    def attend_packed(self, x, residual, positions, sizes: list[int], masks: list, caches: list[KVCache]):
        """``attend`` over several independent passes packed along T (x (1, T, in_width), residual
        (1, T, H), positions (T,)): pass b's ``sizes[b]`` rows attend over its own ``caches[b]`` under
        its own ``masks[b]`` and append their keys and values there; every weight is read once.
        Returns (1, T, H)."""
        q, k, v = rotated_qkv(self, x, positions)
        outs = []
        for qb, kb, vb, mask, cache in zip(q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2), masks,
                                           caches):
            keys, values = cache.append(kb, vb)
            outs.append(grouped_attention(qb, keys, values, mask))
        return self.finish(residual, torch.cat(outs, dim=2).transpose(1, 2).reshape(1, x.shape[1], -1))

    def finish(self, residual, attn):
        """``o_proj`` of the attention (B, T, nh * hd) added to ``residual``, then the MLP block."""
        h = residual + self.o_proj(attn)
        y = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def forward(self, x, positions, mask, cache: KVCache | None = None, extra_kv=None):
        """x (B, T, H); positions (T,); mask (T, S) bool, True = may attend; S = cached + T.

        extra_kv: optional (k, v) of shape (B, n_kv, P, hd) prepended instead of a cache (HASS).
        """
        return self.attend(x, x, positions, mask, cache, extra_kv)  # no input layernorm (EAGLE)


class Drafter(nn.Module):
    """What every drafter shares: its config and an optional reduced draft vocabulary, stored as
    ``d2t`` (EAGLE-3's map: draft id i -> verifier id i + d2t[i])."""

    def _register_draft_vocab(self, size: int | None) -> None:
        if size is not None:
            self.register_buffer("d2t", torch.zeros(size, dtype=torch.long))

    def draft_ids(self) -> torch.Tensor | None:
        """Verifier ids of the draft vocabulary (sorted), or None for the full vocabulary."""
        if getattr(self, "d2t", None) is None:
            return None
        return ids_of(self.d2t)


class FeatureDrafter(Drafter):
    """Predicts the verifier's next feature from (embedding of next token, current feature)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = DecoderLayer(cfg)
        self._register_draft_vocab(cfg.draft_vocab_size)

    def forward(self, token_embeds, features, positions, mask, cache: KVCache | None = None, extra_kv=None):
        """token_embeds, features (B, T, H) -> predicted features (B, T, H), new (k, v)."""
        x = self.fc(torch.cat([token_embeds, features], dim=-1))  # (B, T, H)
        return self.layer(x, positions, mask, cache=cache, extra_kv=extra_kv)

    def forward_packed(self, token_embeds, features, positions, sizes: list[int], masks: list,
                       caches: list[KVCache]) -> torch.Tensor:
        """Several independent passes packed into one: ``token_embeds``, ``features`` (T, H) and
        ``positions`` (T,) hold each pass's rows in turn (``sizes``); pass b attends over its own
        ``caches[b]`` under its own ``masks[b]`` (sizes[b], len(cache) + sizes[b]) and appends its keys
        and values there. Every weight is read once for all passes; each pass's rows are what
        ``forward`` gives it alone, up to the rounding of matmuls over more rows. Returns (T, H)."""
        x = self.fc(torch.cat([token_embeds, features], dim=-1))[None]  # (1, T, H)
        return self.layer.attend_packed(x, x, positions, sizes, masks, caches)[0]


def causal_mask(t: int, past: int = 0, device=None) -> torch.Tensor:
    """(t, past + t) bool: row i sees all past entries and new entries <= i."""
    new = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return torch.cat([torch.ones(t, past, dtype=torch.bool, device=device), new], dim=1)
