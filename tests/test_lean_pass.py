"""The lean verifier pass computes exactly what transformers' LlamaModel computes (real verifier):
prefill, one-token steps, chains and branching trees give bit-identical features, logits and
cache rows; models it does not know take transformers' forward."""
from __future__ import annotations

import contextlib
import types

import pytest
import torch

from decoding.cpu import lean_pass
from decoding.tree import chain_tree
from decoding.verifier_pass import commit_path, new_cache, prefill, tree_forward
from drafters.data.templating import benchmark_prompt_ids

pytestmark = pytest.mark.slow

TREES = ([], [[11, 12, 13, 14, 15]], [[11, 12, 13], [11, 21], [31, 32, 33, 34], [41]])


def _run(model, ids, lean: bool):
    """Prefill, then each tree of TREES after it (each pass committing its root), with one path."""
    with contextlib.nullcontext() if lean else lean_pass.disabled(model):
        cache = new_cache()
        outs = [prefill(model, cache, ids)]
        n = len(ids) - 1
        commit_path(cache, n, [])
        root = ids[-1]
        for paths in TREES:
            tree = chain_tree(paths)
            outs.append(tree_forward(model, cache, n, root, tree.tokens, tree.parents, tree.depths))
            commit_path(cache, n, [0])  # keep the root: the next pass sees a longer prefix
            n, root = n + 1, int(outs[-1][1][0].argmax())
        return outs, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def test_lean_pass_is_bit_identical_to_transformers(verifier, bench_prompts):
    model, tok = verifier
    assert lean_pass.supported(model)  # the embedded verifier takes the lean pass
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    ref, ref_kv = _run(model, ids, lean=False)
    got, got_kv = _run(model, ids, lean=True)
    for (f_ref, l_ref), (f_got, l_got) in zip(ref, got):
        assert torch.equal(f_ref, f_got) and torch.equal(l_ref, l_got)
    for (k_ref, v_ref), (k_got, v_got) in zip(ref_kv, got_kv):
        assert torch.equal(k_ref, k_got) and torch.equal(v_ref, v_got)


def test_lean_pass_without_a_mask_after_a_prefix_is_causal(verifier, bench_prompts):
    """mask=None with cached rows: each new token sees the prefix and the new tokens up to itself."""
    model, tok = verifier
    ids = benchmark_prompt_ids(tok, bench_prompts["svamp"][0], 0, [])
    full = torch.tensor([ids])
    with torch.no_grad():
        want = model.model(input_ids=full).last_hidden_state[0, -4:]
    cache = new_cache()
    prefill(model, cache, ids[:-4])
    got = lean_pass.forward(model, full[:, -4:], torch.arange(len(ids) - 4, len(ids))[None], None, cache)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_models_it_does_not_know_take_transformers_forward(verifier, monkeypatch):
    model, _ = verifier

    def fake(model_type, attn):
        cfg = types.SimpleNamespace(model_type=model_type, _attn_implementation=attn)
        return types.SimpleNamespace(config=cfg, model=model.model)

    assert not lean_pass.supported(fake("qwen3", "sdpa"))
    assert not lean_pass.supported(fake("llama", "eager"))
    assert lean_pass.supported(fake("llama", "sdpa"))  # the same modules under a llama/sdpa config do
    monkeypatch.setenv("TASKSPEC_LEAN_PASS", "0")
    assert not lean_pass.supported(model)


def test_the_lean_pass_is_for_cpu_models_only(verifier):
    """On an accelerator (the CPU stand-in says cuda:0) the model takes transformers' forward."""
    from tests.accelerator import FakeCuda

    model, _ = verifier
    assert lean_pass.supported(model)
    with FakeCuda() as acc:
        acc.place(model)
        assert model.device.type == "cuda" and not lean_pass.supported(model)
