"""A lean forward pass of Llama-family verifiers for the decode loop.

transformers' ``LlamaModel.forward`` runs about 4,000 tensor ops per pass on SmolLM2 (30 layers):
mask and cache bookkeeping, the attention-interface dispatch, kwargs plumbing and views around each
of the ~25 ops a layer needs. On a 2-core CPU that overhead is a fifth of a one-token step. This
pass calls the same modules (embedding, RMSNorms, projections, MLP, rotary embedding, LM head left
to the caller) and the same ops in the same order, and nothing else: keys and values go into the
same ``DynamicCache`` (its layers' ``update``), attention is one ``scaled_dot_product_attention``
per layer. Its hidden states, logits and cache rows equal transformers' bit for bit on prefill,
one-token steps, chains and branching trees (tested), so greedy outputs do not change.

Attention takes the paths transformers' SDPA integration takes: with a mask, one query row per kv
head group (``pack_gqa``) for a one-token pass and ``enable_gqa`` otherwise (transformers repeats
the keys/values there, a copy of the whole cache per layer; the result is the same); without one,
``enable_gqa`` and ``is_causal``. Used only where it is known to be the same computation:
``model_type == "llama"`` with SDPA attention and the stock module layout. Anything else (other
architectures, attention backends, ``TASKSPEC_LEAN_PASS=0``) takes transformers' forward.
"""
from __future__ import annotations

import contextlib
import logging
import os
import weakref

import torch
import torch.nn.functional as F

_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")


_DECIDED: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
_OFF: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
log = logging.getLogger(__name__)


def supported(model) -> bool:
    """Whether ``forward`` computes what ``model.model`` computes for this model, on this device.

    CPU only: on CUDA, SDPA with ``enable_gqa`` and a mask drops to the math kernel (transformers
    repeats the kv heads there instead), and the per-layer dispatch this pass saves is cheap
    next to a GPU kernel launch. A Llama-family model this pass does not recognise (other
    transformers versions, other module layouts) falls back with one log line."""
    if os.environ.get("TASKSPEC_LEAN_PASS", "1") == "0" or os.environ.get("TASKSPEC_CPU_SPEED", "1") == "0":
        return False
    cfg, inner = getattr(model, "config", None), getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) != "llama":
        return False
    if next(inner.parameters()).device.type != "cpu":
        return False
    why = layout_error(model)
    if why:
        log.warning("lean verifier pass off for this model (%s): transformers' forward runs instead", why)
        return False
    return True


def layout_error(model) -> str | None:
    """Why a Llama-family model's modules are not the layout this pass (and decoding/batch_pass.py,
    on any device) calls one by one; None when they are."""
    cfg, inner = model.config, model.model
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or getattr(cfg, "pretraining_tp", 1) != 1:
        return (f"attention {getattr(cfg, '_attn_implementation', None)!r}, "
                f"pretraining_tp {getattr(cfg, 'pretraining_tp', 1)}")
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model lacks embed_tokens/layers/norm/rotary_emb"
    if not all(all(hasattr(layer, p) for p in _LAYER_PARTS) for layer in inner.layers):
        return f"a decoder layer lacks one of {_LAYER_PARTS}"
    if not all(hasattr(layer.self_attn, a) for a in ("scaling", "head_dim") for layer in inner.layers) or \
            _dynamic_layer() is None:
        return "attention modules lack scaling/head_dim (a transformers version this pass does not know)"
    return None


def _dynamic_layer():
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    return DynamicLayer


def use_lean(model) -> bool:
    """``supported(model)``, decided once per model and device type."""
    if model in _OFF:
        return False
    dev = next(model.model.parameters()).device.type
    decided = _DECIDED.setdefault(model, {})
    if dev not in decided:
        decided[dev] = supported(model)
    return decided[dev]


@contextlib.contextmanager
def disabled(model):
    """transformers' forward for this model inside the block (the bench's attribution row)."""
    was = model in _OFF
    _OFF.add(model)
    try:
        yield
    finally:
        if not was:
            _OFF.discard(model)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rotated_qkv(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """A decoder layer's queries, keys (both rotated) and values of hidden states ``h`` (1, T, H):
    (1, heads, T, D), (1, kv heads, T, D), (1, kv heads, T, D)."""
    attn, t = layer.self_attn, h.shape[1]
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(1, t, -1, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(1, t, -1, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(1, t, -1, attn.head_dim).transpose(1, 2)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _causal(t: int, past: int, device) -> torch.Tensor:
    """(t, past + t) boolean mask: query i sees every cached position and new positions <= i."""
    return torch.ones(t, past + t, dtype=torch.bool, device=device).tril(past)


def _attend(q, keys, values, mask, is_causal: bool, scale: float) -> torch.Tensor:
    """(1, heads, T, D) attention output; grouped-query heads as transformers' SDPA path runs them."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    if kv_heads == heads:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal,
                                              scale=scale)
    if mask is not None and q.shape[2] == 1:  # one query: the group's heads become query rows
        d = q.shape[-1]
        o = F.scaled_dot_product_attention(q.reshape(1, kv_heads, heads // kv_heads, d), keys, values,
                                           attn_mask=mask, scale=scale)
        return o.reshape(1, heads, 1, d)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=True)


@torch.no_grad()
def forward(model, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None,
            cache, taps: dict | None = None) -> torch.Tensor:
    """Last hidden states (1, T, H), post final norm, after writing the T new keys/values to ``cache``.

    ``input_ids``/``position_ids``: (1, T). ``mask``: None (causal after the cache) or an additive
    float mask (1, 1, T, past + T) as ``tree_forward`` builds it. ``taps``: {output_hidden_states
    index: None}, filled in place with those hidden states (i = the input of decoder layer i; the
    number of layers = the output, post final norm), as an EAGLE-3 drafter reads them."""
    inner = model.model
    t = input_ids.shape[1]
    past = cache.get_seq_length()
    h = inner.embed_tokens(input_ids)  # (1, T, H)
    cos, sin = inner.rotary_emb(h, position_ids)  # (1, T, D) each
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    causal = mask is None and t > 1
    if causal and past:
        mask = _causal(t, past, h.device)
    for i, layer in enumerate(inner.layers):
        if taps is not None and i in taps:
            taps[i] = h
        attn = layer.self_attn
        q, k, v = rotated_qkv(layer, h, cos, sin)
        keys, values = cache.update(k, v, i)  # (1, kv heads, past + T, D)
        o = _attend(q, keys, values, mask, causal and not past, attn.scaling)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, t, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    if taps is not None and len(inner.layers) in taps:
        taps[len(inner.layers)] = h
    return h
