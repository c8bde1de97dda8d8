"""EAGLE-3 export to speculators 0.9's eagle3 layout (what vLLM serves): the contract, refusals, the
round trip, and the real speculators package loading the export and drafting the same logits.

The last test needs ``speculators`` importable; the project does not depend on it. Run it for real
from a scratch environment (docs/eagle3.md):
    /tmp/spec-venv/bin/python -m pytest -q tests/test_eagle3_export.py
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from decoding.verifiers import verifier_config
from drafters.__main__ import main as drafters_main
from drafters.data.templating import prompt_ids
from drafters.eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3, load_eagle3, save_eagle3
from drafters.eagle3_loss import ttt_unroll
from drafters.export import ContractError, check_export, export, load_export
from tests.conftest import VERIFIER

H, Q, KV, I, V, N = 576, 576, 192, 1536, 49152, 1024  # SmolLM2-135M: 9 heads, 3 kv heads, head_dim 64
WEIGHTS = {"fc.weight": (H, 3 * H), "layers.0.input_layernorm.weight": (H,), "layers.0.hidden_norm.weight": (H,),
           "layers.0.self_attn.q_proj.weight": (Q, 2 * H), "layers.0.self_attn.k_proj.weight": (KV, 2 * H),
           "layers.0.self_attn.v_proj.weight": (KV, 2 * H), "layers.0.self_attn.o_proj.weight": (H, Q),
           "layers.0.post_attention_layernorm.weight": (H,), "layers.0.mlp.gate_proj.weight": (I, H),
           "layers.0.mlp.up_proj.weight": (I, H), "layers.0.mlp.down_proj.weight": (H, I), "norm.weight": (H,)}


@pytest.fixture(scope="module")
def e3(verifier, tmp_path_factory):
    """A reduced-vocabulary eagle3 checkpoint (1,024 ids, every other one) and a full-vocabulary one."""
    model, _ = verifier
    root = tmp_path_factory.mktemp("eagle3-src")
    head = model.get_output_embeddings().weight
    ids = torch.arange(0, 2 * N, 2)
    reduced = init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, seed=1, draft_vocab_size=N), ids, head)
    full = init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, seed=2), None, head)
    return {"reduced": str(save_eagle3(reduced, root / "reduced")), "full": str(save_eagle3(full, root / "full"))}


def _exported(path):
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def test_cli_export_writes_the_speculators_eagle3_layout(e3, tmp_path, capsys):
    out = tmp_path / "spec"
    assert drafters_main(["export", e3["reduced"], "--format", "speculators", "--out", str(out)]) in (0, None)
    assert "vllm serve" in capsys.readouterr().out
    cfg, w = _exported(out)
    want = {**WEIGHTS, "lm_head.weight": (N, H), "d2t": (N,), "t2d": (V,)}
    assert {k: tuple(v.shape) for k, v in w.items()} == want
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool and int(w["t2d"].sum()) == N
    assert torch.equal(w["t2d"].nonzero().flatten(), torch.arange(0, 2 * N, 2))
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["draft_vocab_size"] == N and cfg["target_hidden_size"] == H
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and cfg["norm_before_residual"] is False
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    layer = cfg["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["vocab_size"]) == ("llama", 1, V)
    assert layer["head_dim"] == 64 and layer["tie_word_embeddings"] is False
    src = load_eagle3(e3["reduced"]).state_dict()
    assert torch.equal(w["layers.0.hidden_norm.weight"], src["layer.hidden_norm.weight"])
    assert torch.equal(w["lm_head.weight"], src["lm_head.weight"])


def test_full_vocabulary_export_has_no_maps(e3, tmp_path):
    config, ref = verifier_config(VERIFIER)
    cfg, w = _exported(export(e3["full"], "speculators", tmp_path / "f", config, ref, dtype="bfloat16"))
    assert {k: tuple(v.shape) for k, v in w.items()} == {**WEIGHTS, "lm_head.weight": (V, H)}
    assert cfg["draft_vocab_size"] == V and all(v.dtype == torch.bfloat16 for v in w.values())


def test_refusals_name_the_problem(e3, tmp_path):
    config, ref = verifier_config(VERIFIER)
    with pytest.raises(ContractError, match="--format speculators"):
        export(e3["reduced"], "eagle", tmp_path / "e", config, ref)
    with pytest.raises(ContractError, match="30-layer verifier"):
        export(e3["reduced"], "speculators", tmp_path / "x", {**config, "num_hidden_layers": 32}, ref)
    assert not (tmp_path / "e").exists() and not (tmp_path / "x").exists()
    out = export(e3["reduced"], "speculators", tmp_path / "s", config, ref)
    w = load_file(str(out / "model.safetensors"))
    del w["layers.0.hidden_norm.weight"]
    w["d2t"] = w["d2t"] + 1  # no longer the vocabulary t2d names
    save_file(w, str(out / "model.safetensors"))
    with pytest.raises(ContractError, match="hidden_norm") as e:
        check_export(out)
    assert "random initialisation" in str(e.value)


def test_round_trip_keeps_every_weight(e3, tmp_path):
    out = tmp_path / "spec"
    drafters_main(["export", e3["reduced"], "--format", "speculators", "--out", str(out)])
    drafters_main(["import", str(out), "--out", str(tmp_path / "back")])
    back, src = load_eagle3(tmp_path / "back"), load_eagle3(e3["reduced"])
    assert isinstance(load_export(out), Eagle3Drafter) and back.config == src.config
    for k, v in src.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_the_real_speculators_loads_the_export_and_drafts_the_same_logits(verifier, bench_prompts, e3, tmp_path):
    pytest.importorskip("speculators.models.eagle3", reason="speculators is not installed here (the project does "
                        "not depend on it); run this file from a venv with speculators==0.9.* (docs/eagle3.md)")
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    model, tok = verifier
    vdir = tmp_path / "verifier"  # speculators resolves the verifier the config names: a local copy (no hub here)
    model.save_pretrained(vdir)
    tok.save_pretrained(vdir)
    config, ref = verifier_config(VERIFIER)
    out = export(e3["reduced"], "speculators", tmp_path / "spec", config, {**ref, "name_or_path": str(vdir)})
    spec_cfg = SpeculatorModelConfig.from_pretrained(out)
    assert isinstance(spec_cfg, Eagle3SpeculatorConfig) and spec_cfg.draft_vocab_size == N
    assert list(spec_cfg.eagle_aux_hidden_state_layer_ids) == [2, 15, 27]
    spec_cfg.transformer_layer_config._attn_implementation = "eager"  # its flex-attention default needs a GPU
    theirs = Eagle3DraftModel.from_pretrained(out, config=spec_cfg).eval()
    # speculators 0.9 fills the verifier's embedding only where it is still NaN, and transformers'
    # loader has already initialised it: load it with speculators' own helper (docs/eagle3.md)
    theirs._load_verifier_weights(overwrite_embed_tokens=True)
    ours = load_eagle3(e3["reduced"])
    x = torch.tensor([prompt_ids(tok, [{"role": "user", "content": bench_prompts["gsm8k"][0].turns[0]}])])[:, :48]
    with torch.no_grad():
        hs = model(x, output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i] for i in ours.config.aux_layers], dim=-1)
        seen = []
        hook = theirs.lm_head.register_forward_hook(lambda mod, inp, o: seen.append(o.detach()))
        t = x.shape[1] - 1
        tokens = theirs(hidden_states=aux[:, :-1], input_ids=x[:, 1:],
                        document_ids=torch.zeros(1, t, dtype=torch.long), ttt_steps=3)
        hook.remove()
        mine = ttt_unroll(ours, model.get_input_embeddings(), aux, x, steps=3)
    for k in range(3):  # their training-time-test forward, step by step, on the rows inside the sequence
        torch.testing.assert_close(seen[k][:, : t - k], mine[k][:, : t - k], rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens[k][:, : t - k], mine[k][:, : t - k].argmax(-1))
