"""The verifier side: prefill, one pass over a packed tree, and KV-cache compaction.

Works with stock Hugging Face causal LMs of the Llama family: the committed prefix lives in a
``DynamicCache``; a tree pass feeds only [root, nodes] with a float 4-D mask (0 = attend,
-inf = masked) where each node sees the whole prefix, the root, its ancestors and itself, and
``position_ids = prefix_len + depth``.
"""
from __future__ import annotations

import torch

from .tree import ancestor_matrix


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the cache argument ``cache``; older versions ``past_key_values``."""
    import inspect

    params = inspect.signature(model.model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _features_and_logits(model, input_ids, position_ids, mask, cache):
    kw = {_cache_kwarg(model): cache}
    out = model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True, **kw)
    h = out.last_hidden_state  # (1, T, H): post final-norm, the feature the LM head consumes
    return h[0], model.lm_head(h)[0].float()  # (T, H), (T, V)


def new_cache():
    from transformers import DynamicCache

    return DynamicCache()


@torch.no_grad()
def prefill(model, cache, input_ids: list[int]):
    """Feed a prompt into an empty cache. Returns features (T, H) and logits (T, V)."""
    ids = torch.tensor([input_ids], device=model.device)  # (1, T)
    pos = torch.arange(len(input_ids), device=model.device)[None]  # (1, T)
    return _features_and_logits(model, ids, pos, None, cache)


def tree_mask(parents: torch.Tensor, prefix_len: int, dtype, device) -> torch.Tensor:
    """(1, 1, N+1, prefix_len+N+1) float mask for [root, nodes] after a cached prefix."""
    anc = ancestor_matrix(parents.cpu())  # (N+1, N+1)
    n1 = anc.shape[0]
    allowed = torch.cat([torch.ones(n1, prefix_len, dtype=torch.bool), anc], dim=1)  # (N+1, P+N+1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


@torch.no_grad()
def tree_forward(model, cache, prefix_len: int, root: int, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor):
    """Verify [root] + tree nodes in one pass. Returns features (N+1, H), logits (N+1, V)."""
    dev = model.device
    ids = torch.cat([torch.tensor([root]), tokens.cpu()])[None].to(dev)  # (1, N+1)
    pos = (prefix_len + torch.cat([torch.zeros(1, dtype=torch.long), depths.cpu()]))[None].to(dev)  # (1, N+1)
    mask = tree_mask(parents, prefix_len, model.dtype, dev)
    return _features_and_logits(model, ids, pos, mask, cache)


def _layers(cache):
    if hasattr(cache, "layers"):
        return [(layer, "keys", "values") for layer in cache.layers]
    raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers DynamicCache")


@torch.no_grad()
def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep only cache rows ``keep`` (in that order): the prefix plus the accepted path."""
    for layer, k, v in _layers(cache):
        idx = keep.to(getattr(layer, k).device)
        setattr(layer, k, getattr(layer, k).index_select(-2, idx))
        setattr(layer, v, getattr(layer, v).index_select(-2, idx))


def cache_length(cache) -> int:
    return cache.get_seq_length()
