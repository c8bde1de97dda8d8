"""The drafter's grouped-query attention: the same result as SDPA's ``enable_gqa``, computed without
copying key/value heads and without the flag that, with an explicit mask, sends CUDA's SDPA to its
math kernel (the memory-efficient kernel needs equal head counts and no ``enable_gqa``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import drafters.model as model_mod
from drafters.config import DrafterConfig
from drafters.model import DecoderLayer, causal_mask, grouped_attention


@pytest.mark.parametrize("b,nh,nkv,t,s", [(2, 9, 3, 5, 12), (1, 8, 2, 1, 7), (3, 4, 4, 6, 6)])
def test_grouped_attention_equals_enable_gqa(b, nh, nkv, t, s):
    g = torch.Generator().manual_seed(b * 100 + t)
    q, k, v = (torch.randn(b, n, length, 16, generator=g) for n, length in ((nh, t), (nkv, s), (nkv, s)))
    mask = torch.rand(t, s, generator=g) > 0.3
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=nh != nkv)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), ref, atol=1e-6, rtol=1e-5)


def test_the_drafter_layer_passes_sdpa_equal_head_counts_and_no_enable_gqa(monkeypatch):
    cfg = DrafterConfig(verifier="v", backbone="eagle2", hidden_size=96, vocab_size=64, num_attention_heads=6,
                        num_key_value_heads=2, intermediate_size=128)
    layer = DecoderLayer(cfg)
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], v.shape[1], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", spy)
    x = torch.randn(2, 5, 96)
    layer(x, torch.arange(5), causal_mask(5))
    assert calls == [(2, 2, 2, False)]  # query heads folded into their 2 groups; no head copied
