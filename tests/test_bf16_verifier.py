"""A bf16 verifier on the CPU (`python -m decoding bench --dtype bfloat16`, a profile's
`verifier_dtype: bfloat16`): with every matmul form the tuner can choose for its weights (the
kernel's bf16 path, F.linear, W @ x.T, and the tuned mix), speculative decoding reproduces bf16
`generate` on real prompts. `generate` runs the same bf16 model with the same forms installed.

Where an output parts from `generate`'s, the verifier's top-2 logit gap there must be a near-tie
in bf16 (at most 0.5, the gpu_check rule): a tree pass and a one-row step sum in a different
order, and bf16 keeps 8 significant bits. Anything else is a mismatch and fails."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch import nn

from common.verifiers import TIE_GAP as TIE_GAPS
from common.verifiers import compare_greedy, eos_token_ids
from decoding.config import TreeConfig
from decoding.cpu import matmul as cpu_matmul
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import decode_prompt, load_proposers
from decoding.verifiers import load_verifier
from drafters.data.templating import benchmark_prompt_ids
from tests.conftest import VERIFIER
from tests.helpers import OracleProposer

pytestmark = pytest.mark.slow
MAX_NEW = 10
TIE_GAP = TIE_GAPS["bfloat16"]  # bf16: within its rounding noise (decoding.verifiers.TIE_GAP)


@pytest.fixture(scope="module")
def bf16():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(VERIFIER, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    return model, tok, eos_token_ids(model, tok)


@contextlib.contextmanager
def every_row_count_in(model: nn.Module, form: str):
    """Every installed linear layer of ``model`` takes ``form`` at every row count ("tuned": as
    installed)."""
    layers = [m.forward for m in model.modules()
              if isinstance(getattr(m, "forward", None), cpu_matmul.RowAwareLinear)]
    assert layers, "no row-aware linear layers installed"
    saved = [layer.table for layer in layers]
    if form != "tuned":
        for layer in layers:
            layer.table = {b: form for b in cpu_matmul.BUCKETS}
    try:
        yield
    finally:
        for layer, table in zip(layers, saved):
            layer.table = table


def _greedy(model, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW)
    return out[0, len(ids):].tolist()


# the kernel and the BLAS forms at every row count: make test-full (tuned, the default, mixes them)
# (the kernel's two forms differ only in a prefetch hint: test_cpu_matmul shows them bit-identical)
@pytest.mark.parametrize("form", ["tuned"] + [pytest.param(f, marks=pytest.mark.full)
                                              for f in cpu_matmul.FORMS])
def test_bf16_decoding_reproduces_bf16_generate_with_every_form(bf16, random_drafter_dirs, bench_prompts,
                                                                 form):
    model, tok, eos = bf16
    if form in cpu_matmul.KERNEL_FORMS:  # the kernel's bf16 path must be what runs here, not a fallback
        from decoding.cpu import kernel as cpu_kernel

        assert cpu_kernel.available(), cpu_kernel.status()
    proposers = load_proposers(model, random_drafter_dirs, VERIFIER)
    assert all(next(p.drafter.parameters()).dtype == torch.bfloat16 for p in proposers)
    tree = TreeConfig(top_k=3, depth=3, total_tokens=10)
    prompts = [bench_prompts["gsm8k"][0], bench_prompts["mt_bench"][0]]
    kinds = []
    with every_row_count_in(model, form):
        for prompt in prompts:
            ids = benchmark_prompt_ids(tok, prompt, 0, [])
            ref = _greedy(model, ids)
            decoders = {
                "single": SpeculativeDecoder(model, proposers[:1],
                                             DecodeConfig(max_new_tokens=MAX_NEW, tree=tree), eos),
                "merged dedup": SpeculativeDecoder(model, proposers, DecodeConfig(
                    strategy="merged", merge_dedup=True, max_new_tokens=MAX_NEW, tree=tree), eos),
                "oracle depth 5": SpeculativeDecoder(model, [OracleProposer(len(ids), ref)], DecodeConfig(
                    max_new_tokens=MAX_NEW, tree=TreeConfig(3, 5, 16)), eos),
            }
            for name, dec in decoders.items():
                got = dec.generate(ids, seed_key=prompt.id).output_token_ids
                kind, gap = compare_greedy(model, ids, got, ref, TIE_GAP)
                kinds.append(kind)
                assert kind != "MISMATCH", \
                    f"{form}/{name} on {prompt.benchmark} {prompt.id}: top-2 gap {gap:.3f}"
    print(f"bf16, {form} at every row count: {kinds.count('equal')}/{len(kinds)} equal to generate, "
          f"{kinds.count('near-tie')} near-ties")
    assert kinds.count("equal") >= len(kinds) / 2, kinds  # a near-tie is the exception, not the rule


def test_a_bf16_turn_two_sees_a_bf16_answer(bf16, random_drafter_dirs, bench_prompts):
    """Both turns of an MT-Bench prompt, the tuned forms, through the runner's decode_prompt."""
    model, tok, eos = bf16
    prompt = bench_prompts["mt_bench"][1]
    dec = SpeculativeDecoder(model, load_proposers(model, random_drafter_dirs[:1], VERIFIER),
                             DecodeConfig(max_new_tokens=MAX_NEW, tree=TreeConfig(3, 3, 10)), eos)
    answers = []
    for turn, (_, res, _) in enumerate(decode_prompt(dec, tok, prompt)):
        ids = benchmark_prompt_ids(tok, prompt, turn, answers)
        ref = _greedy(model, ids)
        kind, gap = compare_greedy(model, ids, res.output_token_ids, ref, TIE_GAP)
        assert kind != "MISMATCH", (turn, gap)
        answers.append(tok.decode(res.output_token_ids, skip_special_tokens=True))
    assert len(answers) == 2
