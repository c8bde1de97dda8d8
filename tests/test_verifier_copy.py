"""The GGUF verifier's de-quantized copy (common/verifier_copy.py) is the GGUF model: the same
weights bit for bit (float32, and bfloat16 after the cast), config, generation config and
tokenizer (real benchmark prompts through the chat template); a broken copy is never used."""
from __future__ import annotations

import json

import pytest
import torch

from common import caches
from common.verifier_copy import FILES, copy_dir, load_copy, save_copy
from common.verifiers import SMOLLM2_GGUF, resolve
from drafters.data.sources import load_benchmark
from drafters.data.templating import benchmark_prompt_ids

pytestmark = pytest.mark.slow


def _gguf(dtype=torch.float32):
    """The verifier parsed from its GGUF file by transformers, as every load did before the copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = resolve("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
    return AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file, dtype=dtype), tok


def _prompts(tok) -> list[list[int]]:
    ids = [benchmark_prompt_ids(tok, load_benchmark(b)[0][i], 0, []) for b in ("gsm8k", "math500")
           for i in (0, 7)]
    mt = load_benchmark("mt_bench")[0][3]
    return ids + [benchmark_prompt_ids(tok, mt, 1, ["The answer is 42."])]  # a second turn after an answer


@pytest.fixture(scope="module")
def parsed_and_copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "verifiers" / "smollm2"
    model, tok = _gguf()
    assert save_copy(model, tok, out) and all((out / f).is_file() for f in FILES)
    return model, tok, out


def test_the_copy_is_the_gguf_model_bit_for_bit(parsed_and_copy):
    model, tok, out = parsed_and_copy
    copy, ctok = load_copy(out, torch.float32)
    a, b = model.state_dict(), copy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert copy.lm_head.weight.data_ptr() == copy.model.embed_tokens.weight.data_ptr()  # still tied
    ca, cb = model.config.to_dict(), copy.config.to_dict()
    assert {k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k)} <= {"_name_or_path",
            "quantization_config"}
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert model.generation_config.to_dict() == copy.generation_config.to_dict()
    assert _prompts(tok) == _prompts(ctok)
    assert tok.all_special_ids == ctok.all_special_ids and len(tok) == len(ctok)
    ids = torch.tensor([_prompts(tok)[0]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, copy(ids).logits)
    bf = load_copy(out, torch.bfloat16)[0].state_dict()  # a bf16 load casts the same float32 weights
    assert all(bf[k].dtype == torch.bfloat16 and torch.equal(bf[k], a[k].to(torch.bfloat16)) for k in a)


@pytest.mark.full
def test_a_bf16_load_equals_transformers_bf16_gguf_load(parsed_and_copy):
    _, _, out = parsed_and_copy
    direct, _ = _gguf(torch.bfloat16)
    a, b = direct.state_dict(), load_copy(out, torch.bfloat16)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_broken_or_partial_copy_is_not_used_and_a_first_copy_is_kept(parsed_and_copy, tmp_path):
    model, tok, out = parsed_and_copy
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((out / "config.json").read_text())
    assert load_copy(partial, torch.float32) is None  # no weights: load the GGUF file instead
    for f in FILES[1:]:
        (partial / f).write_text((out / f).read_text())
    (partial / "model.safetensors").write_bytes(b"not a safetensors file")
    assert load_copy(partial, torch.float32) is None
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert save_copy(model, tok, out) and (out / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="float32"):
        save_copy(model.to(torch.bfloat16), tok, tmp_path / "bf16")
    model.to(torch.float32)


def test_the_copy_is_keyed_by_the_files_content_and_shown_and_cleared_with_the_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_CACHE", str(tmp_path))
    src = tmp_path / "src"
    src.mkdir()
    (src / SMOLLM2_GGUF).write_bytes(b"x" * 10)
    first = copy_dir(str(src), SMOLLM2_GGUF, "smollm2")
    assert first.parent == tmp_path / "verifiers" and first == copy_dir(str(src), SMOLLM2_GGUF, "smollm2")
    for where, content, same in (("another-venv", b"x" * 10, True), ("another-model", b"y" * 10, False)):
        (tmp_path / where).mkdir()  # the same file elsewhere (a fresh clone's venv): the same copy;
        (tmp_path / where / SMOLLM2_GGUF).write_bytes(content)  # other content, the same size: another
        assert (copy_dir(str(tmp_path / where), SMOLLM2_GGUF, "smollm2") == first) is same
    first.mkdir(parents=True)
    assert f"verifiers/: 1 de-quantized copy\n  {first.name}" in caches.show()
    assert "verifiers/" in caches.clear() and not first.exists()


def test_the_verifiers_config_is_the_parsed_one_and_read_from_the_copy(verifier, monkeypatch, tmp_path):
    """verifier_config (grid preflight, exports) reads the copy's config.json when there is a copy
    (the session's, written by the first load) and gives exactly what parsing the GGUF file gives;
    without a copy it parses the file."""
    import transformers.integrations.gguf as hf_gguf
    from transformers import AutoConfig

    from common.verifiers import verifier_config

    src = resolve("smollm2-135m-instruct")
    parsed = AutoConfig.from_pretrained(src.path, gguf_file=src.gguf_file).to_dict()
    assert (copy_dir(src.path, src.gguf_file, src.name) / "config.json").is_file()
    read = hf_gguf.read_gguf_metadata

    def no_parsing(*a, **k):
        raise AssertionError("the GGUF file was parsed although a copy exists")

    monkeypatch.setattr(hf_gguf, "read_gguf_metadata", no_parsing)
    config, ref = verifier_config("smollm2-135m-instruct")
    assert config == parsed and ref["architectures"] == ["LlamaForCausalLM"]  # (GGUF names none)
    monkeypatch.setattr(hf_gguf, "read_gguf_metadata", read)
    monkeypatch.setenv("TASKSPEC_CACHE", str(tmp_path))  # no copy there: the file is parsed
    assert verifier_config("smollm2-135m-instruct")[0] == parsed
