"""The verifier's tree passes on accelerators fold grouped query heads into the query length instead of
copying key/value heads (common/grouped_attention.py): the same logits as transformers' SDPA path, and
SDPA sees equal head counts and no ``enable_gqa``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from common import grouped_attention
from decoding.tree import chain_tree
from decoding.verifier_pass import new_cache, prefill, tree_forward


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8,
                      num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def _tree_pass(model):
    cache = new_cache()
    prompt = list(range(3, 20))
    prefill(model, cache, prompt)
    t = chain_tree([[30, 31, 32], [40, 41]])  # two branches: a mask that is not causal
    return tree_forward(model, cache, len(prompt), prompt[-1], t.tokens, t.parents, t.depths)


def test_grouped_tree_pass_equals_transformers_sdpa_and_copies_no_head(monkeypatch):
    monkeypatch.setenv("TASKSPEC_LEAN_PASS", "0")  # transformers' own layers on both sides
    model = _model()
    ref_h, ref_logits = _tree_pass(model)
    assert grouped_attention.install(model)
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], q.shape[2], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    h, logits = _tree_pass(model)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, ref_h, atol=1e-5, rtol=1e-5)
    # the tree pass: 6 tokens x 4 heads per group folded = 24 rows
    tree_calls = [c for c in calls if c[2] > 17]
    assert tree_calls == [(2, 2, 24, False)] * 2, calls  # both layers: 2 kv heads each side, none copied


def test_models_without_grouped_heads_keep_their_attention():
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4,
                      num_key_value_heads=4, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    assert not grouped_attention.install(model) and model.config._attn_implementation == "sdpa"
