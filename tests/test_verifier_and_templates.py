"""The embedded verifier, the registry, chat templating and assistant-only loss masks."""
from __future__ import annotations

import warnings

import pytest
import torch

from common.verifiers import known_verifiers, resolve
from drafters.data.sources import load_corpus
from drafters.data.templating import benchmark_prompt_ids, tokenize_conversation


def test_registry_names_and_errors(tmp_path):
    assert {"smollm2-135m-instruct", "llama3-8b-instruct"} <= set(known_verifiers())
    assert resolve("llama3-8b-instruct").path == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert resolve(str(tmp_path)).path == str(tmp_path)
    assert resolve("Qwen/Qwen2.5-0.5B-Instruct").path == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ValueError, match="unknown verifier"):
        resolve("no-such-model")
    src = resolve("smollm2-135m-instruct")
    assert src.gguf_file and src.gguf_file.endswith(".gguf")


@pytest.mark.slow
def test_verifier_loads_once_and_answers_a_gsm8k_prompt(verifier, bench_prompts):
    from decoding.verifiers import load_verifier

    model, tok = verifier
    assert load_verifier("smollm2-135m-instruct") is verifier  # loaded once per process
    # however spelled
    assert load_verifier("smollm2-135m-instruct", dtype="float32", device="cpu") is verifier
    assert model.dtype == torch.float32
    assert model.config.hidden_size == 576 and model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=40)
    text = tok.decode(out[0, len(ids):], skip_special_tokens=True)
    assert "egg" in text.lower() and any(ch.isdigit() for ch in text), text



def test_a_training_load_has_no_inference_matmul_forms(verifier):
    """Ray Train workers load the verifier with ``matmul_forms=False``: no tables tuned (a minute of a
    cold machine per process), the same weights, the same logits up to the forms' rounding."""
    from decoding.cpu.matmul import installed
    from decoding.verifiers import load_verifier

    model, _ = verifier
    plain, _ = load_verifier("smollm2-135m-instruct", matmul_forms=False)
    assert plain is not model and installed(plain) == {} and installed(model)
    assert load_verifier("smollm2-135m-instruct", matmul_forms=False)[0] is plain  # once per process too
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), model.state_dict().values()))
    x = torch.tensor([[1, 504, 3101, 314, 260, 1789, 30]])
    with torch.no_grad():
        # float32 over 30 layers: the forms sum in another order. 1e-4 failed once (1 of 344,064 logits
        # off by 1.15e-4, the tables timed on loaded cores, 2026-12-06); a wrong form is off by far more
        torch.testing.assert_close(plain(x).logits, model(x).logits, rtol=1e-4, atol=5e-4)

def _masked_spans(ids, mask):
    spans, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append(ids[start:i])
            start = None
    return spans


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["sharegpt", "mathinstruct"])
def test_loss_mask_covers_exactly_the_assistant_turns(verifier, eos, corpus):
    _, tok = verifier
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convs, _ = load_corpus(corpus)
    for conv in convs[:20]:
        ex = tokenize_conversation(tok, conv, max_length=100_000, eos_ids=eos)
        spans = _masked_spans(ex.input_ids, ex.loss_mask)
        answers = [c for r, c in conv.turns if r == "assistant"]
        assert len(spans) == len(answers)
        for span, answer in zip(spans, answers):
            assert span[-1] in eos  # the end-of-turn token carries loss
            assert tok.decode(span[:-1]).strip() == answer.strip()
        assert 0 < sum(ex.loss_mask) < len(ex.input_ids)


@pytest.mark.slow
def test_truncation_keeps_mask_aligned(verifier, eos):
    _, tok = verifier
    convs, _ = load_corpus("mathinstruct")
    ex = tokenize_conversation(tok, convs[0], max_length=64, eos_ids=eos)
    assert len(ex.input_ids) == len(ex.loss_mask) == 64


def test_a_local_verifier_loads_straight_to_its_device(tmp_path, monkeypatch):
    """from_pretrained gets ``device_map=<device>``: the weights are materialized where they run (an 8B
    verifier on a GPU never passes through 16 GB of host memory), not loaded on the host and moved."""
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from decoding.verifiers import load_verifier

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2,
                      num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(32)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                            eos_token="t1").save_pretrained(tmp_path)
    seen = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    monkeypatch.setenv("TASKSPEC_CPU_SPEED", "0")  # no matmul tuning: the load is what is tested
    model, _ = load_verifier(str(tmp_path), dtype="bfloat16", device="cpu")
    assert seen == ["cpu"]
    assert model.dtype == torch.bfloat16 and model.device.type == "cpu"
    # no dtype asked: on an accelerator the dtype the weights were saved in, on a CPU float32
    from common.verifiers import _dtype

    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert _dtype(None, resolve(str(tmp_path / "bf16")), "cuda") == torch.bfloat16
    assert _dtype(None, resolve(str(tmp_path / "bf16")), "cpu") == torch.float32
    assert _dtype(None, resolve("llama3-8b-instruct"), "cuda") == torch.bfloat16


@pytest.mark.slow
def test_a_system_prompt_replaces_the_templates_default_system_turn(verifier, bench_prompts):
    """eval.system_prompt: a system turn before the first user turn; without one the template's own default
    (SmolLM2's names the model) stays, as before the setting existed."""
    _, tok = verifier
    prompt = bench_prompts["gsm8k"][0]
    plain = tok.decode(benchmark_prompt_ids(tok, prompt, 0, []))
    system = tok.decode(benchmark_prompt_ids(tok, prompt, 0, [], "You are a careful math tutor."))
    assert "SmolLM" in plain and "SmolLM" not in system
    assert system.index("You are a careful math tutor.") < system.index(prompt.turns[0][:30])
    assert plain.endswith(system[system.index(prompt.turns[0][:30]):])  # the rest is the same text
