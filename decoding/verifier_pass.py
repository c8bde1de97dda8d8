"""The verifier side: prefill, one pass over a packed tree, and KV-cache compaction.

Works with stock Hugging Face causal LMs of the Llama family: the committed prefix lives in a
``DynamicCache``; a tree pass feeds only [root, nodes] with a float 4-D mask (0 = attend,
-inf = masked) where each node sees the whole prefix, the root, its ancestors and itself, and
``position_ids = prefix_len + depth``.
"""
from __future__ import annotations

import contextlib

import torch

from decoding import cpu
from decoding.tree import ancestor_matrix


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the cache argument ``cache``; older versions ``past_key_values``."""
    import inspect

    params = inspect.signature(model.model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _features_and_logits(model, input_ids, position_ids, mask, cache, last_only: bool = False,
                         layers: tuple[int, ...] | None = None):
    """(features (T, F), logits (T or 1, V)). Features: the last hidden state (F = H, post final
    norm, the feature the LM head consumes: EAGLE-2/HASS), or with ``layers`` the hidden states at
    those ``output_hidden_states`` indices concatenated in that order (F = len(layers) * H: EAGLE-3).
    Only the named layers are kept (no list of every layer's states)."""
    taps = None if layers is None else dict.fromkeys(layers)
    if cpu.use_lean(model):  # the same computation without transformers' per-layer overhead
        h = cpu.lean_forward(model, input_ids, position_ids, mask, cache, taps)
    else:
        kw = {_cache_kwarg(model): cache}
        with _tapped(model, taps):
            h = model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                            use_cache=True,
                            **kw).last_hidden_state
        if taps is not None and len(model.model.layers) in taps:
            taps[len(model.model.layers)] = h
    # h: (1, T, H), post final-norm
    feats = h[0] if taps is None else torch.cat([taps[i][0] for i in layers], dim=-1)
    return feats, model.lm_head(h[:, -1:] if last_only else h)[0].float()  # (T, F), (T or 1, V)


@contextlib.contextmanager
def _tapped(model, taps: dict | None):
    """Forward pre-hooks on the decoder layers named in ``taps`` (output_hidden_states index i = the
    input of layer i) that store their input hidden states there, removed on exit."""
    handles = []

    def tap(i):
        def hook(module, args, kwargs):
            taps[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    try:
        for i in taps or ():
            if i < len(model.model.layers):
                handles.append(model.model.layers[i].register_forward_pre_hook(tap(i), with_kwargs=True))
        yield
    finally:
        for hd in handles:
            hd.remove()


def _grow_layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose keys/values live in a buffer with spare capacity (doubling when
        full): appending t rows copies t rows, where DynamicLayer's torch.cat copies the whole
        cache on every call. ``keys``/``values`` are views of the first ``length`` rows."""

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            self.buf_k = self.buf_v = None
            self.length = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            need = self.length + key_states.shape[-2]
            if self.buf_k is None or need > self.buf_k.shape[-2]:
                cap = max(need, 2 * (0 if self.buf_k is None else self.buf_k.shape[-2]), 256)
                shape = (*key_states.shape[:-2], cap, key_states.shape[-1])
                nk, nv = key_states.new_empty(shape), value_states.new_empty(shape)
                if self.length:
                    nk[..., : self.length, :] = self.buf_k[..., : self.length, :]
                    nv[..., : self.length, :] = self.buf_v[..., : self.length, :]
                self.buf_k, self.buf_v = nk, nv
            self.buf_k[..., self.length : need, :] = key_states
            self.buf_v[..., self.length : need, :] = value_states
            self.set_length(need)
            return self.keys, self.values

        def set_length(self, m: int) -> None:
            self.length = m
            self.keys, self.values = self.buf_k[..., :m, :], self.buf_v[..., :m, :]

        def get_seq_length(self) -> int:
            return self.length if self.is_initialized else 0

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove < 0 and self.is_initialized:
                self.set_length(max(0, self.length + tokens_to_remove))

    return GrowingLayer


_GROWING = None


def new_cache():
    """A DynamicCache whose layers grow in place (see GrowingLayer)."""
    global _GROWING
    from transformers import DynamicCache

    _GROWING = _GROWING or _grow_layer_class()
    cache = DynamicCache()
    cache.layer_class_to_replicate = _GROWING
    return cache


@torch.no_grad()
def prefill(model, cache, input_ids: list[int], layers: tuple[int, ...] | None = None):
    """Feed a prompt into an empty cache. Returns features (T, F) and the LAST position's logits
    (1, V): only the next token needs them. Projecting every prompt position through the LM head
    would cost a prefill what transformers' generate does not pay (it keeps the last position's
    logits only; docs/performance.md). ``layers``: see
    ``_features_and_logits``."""
    ids = torch.tensor([input_ids], device=model.device)  # (1, T)
    pos = torch.arange(len(input_ids), device=model.device)[None]  # (1, T)
    return _features_and_logits(model, ids, pos, None, cache, last_only=True, layers=layers)


def tree_mask(parents: torch.Tensor, prefix_len: int, dtype, device) -> torch.Tensor:
    """(1, 1, N+1, prefix_len+N+1) float mask for [root, nodes] after a cached prefix, built on
    ``device`` (parents are moved there first if they are not)."""
    anc = ancestor_matrix(parents.to(device))  # (N+1, N+1)
    mask = torch.zeros(anc.shape[0], prefix_len + anc.shape[1], dtype=dtype, device=device)  # prefix: attend
    mask[:, prefix_len:].masked_fill_(~anc, torch.finfo(dtype).min)
    return mask[None, None]


@torch.no_grad()
def tree_forward(model, cache, prefix_len: int, root, tokens: torch.Tensor, parents: torch.Tensor,
                 depths: torch.Tensor, layers: tuple[int, ...] | None = None):
    """Verify [root] + tree nodes in one pass. Returns features (N+1, F), logits (N+1, V)
    (``layers``: see ``_features_and_logits``).

    root: the last committed token (an int, or a 1-element tensor already on the model's device);
    the tree's tensors should be on the model's device (a host tree costs one copy per field)."""
    dev = model.device
    root_t = root.reshape(1) if isinstance(root, torch.Tensor) else torch.tensor([root], device=dev)
    tokens = tokens.to(dev)
    parents = parents.to(dev)
    depths = depths.to(dev)
    ids = torch.cat([root_t, tokens])[None]  # (1, N+1)
    pos = (prefix_len + torch.cat([torch.zeros(1, dtype=torch.long, device=dev), depths]))[None]  # (1, N+1)
    mask = tree_mask(parents, prefix_len, model.dtype, dev)
    return _features_and_logits(model, ids, pos, mask, cache, layers=layers)


def _layers(cache):
    if hasattr(cache, "layers"):
        return [(layer, "keys", "values") for layer in cache.layers]
    raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers DynamicCache")


@torch.no_grad()
def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep only cache rows ``keep`` (in that order): the prefix plus the accepted path."""
    for layer, k, v in _layers(cache):
        idx = keep.to(getattr(layer, k).device)
        if hasattr(layer, "set_length"):  # a GrowingLayer: gather (copies), write back, shrink
            layer.buf_k[..., : idx.shape[0], :] = layer.keys.index_select(-2, idx)
            layer.buf_v[..., : idx.shape[0], :] = layer.values.index_select(-2, idx)
            layer.set_length(idx.shape[0])
            continue
        setattr(layer, k, getattr(layer, k).index_select(-2, idx))
        setattr(layer, v, getattr(layer, v).index_select(-2, idx))


@torch.no_grad()
def commit_path(cache, prefix_len: int, path: list[int], path_index: torch.Tensor | None = None) -> None:
    """Keep the prefix and the rows ``prefix_len + path`` (the root and the accepted nodes, in
    order) without touching the prefix: a crop when the path is the first rows, else only the
    accepted rows move, with ONE index tensor for every layer (``path_index``, the path on the
    cache's device, if the caller has it). Falls back to keep_positions for other caches."""
    m = prefix_len + len(path)
    layers = _layers(cache)
    if not layers:
        return
    if not hasattr(layers[0][0], "set_length"):
        keep_positions(cache, torch.cat([torch.arange(prefix_len), prefix_len + torch.tensor(path,
                dtype=torch.long)]))
        return
    idx = None
    if path != list(range(len(path))):
        dev = layers[0][0].buf_k.device
        idx = (torch.tensor(path, dtype=torch.long, device=dev) if path_index is None
               else path_index) + prefix_len
    for layer, _, _ in layers:
        if idx is not None:
            layer.buf_k[..., prefix_len:m, :] = layer.buf_k[..., idx, :]  # gather copies first: no aliasing
            layer.buf_v[..., prefix_len:m, :] = layer.buf_v[..., idx, :]
        layer.set_length(m)
