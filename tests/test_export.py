"""Exports of eagle2/hass drafters to vLLM EAGLE / SGLang EAGLE: the contract, refusals, and the round
trip (an export read back drafts exactly the trees the original drafts, on a real prompt). The old
speculators ``eagle`` layout is refused as an export (speculators 0.9 no longer ships it) and still
read back from the files people have."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.verifiers import verifier_config
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import decode_prompt, load_proposers
from drafters.__main__ import main as drafters_main
from drafters.checkpoint import init_drafter, load_checkpoint, save_checkpoint
from drafters.config import DrafterConfig
from drafters.export import ContractError, check_export, export, load_export
from drafters.formats import TOKEN_MAP_FILE
from drafters.merge import merge_checkpoints
from tests.conftest import VERIFIER

H, Q, KV, FF, V = 576, 576, 192, 1536, 49152  # SmolLM2-135M: 9 heads, 3 kv heads, head_dim 64
LAYER = {"self_attn.q_proj.weight": (Q, H), "self_attn.k_proj.weight": (KV, H),
         "self_attn.v_proj.weight": (KV, H),
         "self_attn.o_proj.weight": (H, Q), "mlp.gate_proj.weight": (FF, H), "mlp.up_proj.weight": (FF, H),
         "mlp.down_proj.weight": (H, FF), "post_attention_layernorm.weight": (H,)}


@pytest.fixture(scope="module")
def vcfg():
    return verifier_config(VERIFIER)


@pytest.fixture(scope="module")
def ckpts(verifier, tmp_path_factory):
    """A full-vocabulary drafter, two reduced-vocabulary ones (seeds 0/1, one vocabulary), their average."""
    model, _ = verifier
    root = tmp_path_factory.mktemp("export-src")
    ids = torch.arange(0, 2 * 1024, 2)  # 1,024 verifier ids, every other one
    full = DrafterConfig.for_verifier(model, VERIFIER, "eagle2", seed=3)
    out = {"full": str(save_checkpoint(init_drafter(full), root / "full"))}
    for seed in (0, 1):
        cfg = DrafterConfig.for_verifier(model, VERIFIER, "hass", seed=seed, draft_vocab_size=1024)
        out[f"r{seed}"] = str(save_checkpoint(init_drafter(cfg, ids), root / f"r{seed}"))
    out["merged"] = str(merge_checkpoints("linear", [out["r0"], out["r1"]], str(root / "avg"), lam=0.5))
    return out, ids


def _exported(path):
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def test_eagle_export_is_the_vllm_layout(ckpts, vcfg, tmp_path):
    (paths, _), (config, ref) = ckpts, vcfg
    out = export(paths["full"], "eagle", tmp_path / "e", config, ref)
    cfg, w = _exported(out)
    want = {"fc.weight": (H, 2 * H), **{f"layers.0.{k}": s for k, s in LAYER.items()}}
    assert {k: tuple(v.shape) for k, v in w.items()} == want  # no input layernorm, embedding or LM head
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    assert cfg["max_position_embeddings"] == 8192 == config["max_position_embeddings"]  # the verifier's
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rope_theta"]) == (H, 3, 64,
            100000.0)
    src = load_checkpoint(paths["full"]).state_dict()
    assert torch.equal(w["layers.0.mlp.down_proj.weight"], src["layer.down_proj.weight"])


def test_reduced_vocabulary_cannot_go_to_vllm_eagle_silently(ckpts, vcfg, tmp_path):
    (paths, _), (config, ref) = ckpts, vcfg
    with pytest.raises(ContractError, match="reduced draft vocabulary"):
        export(paths["r0"], "eagle", tmp_path / "e", config, ref)
    assert not (tmp_path / "e").exists()
    out = export(paths["r0"], "eagle", tmp_path / "e", config, ref, full_vocab_head=True)
    assert load_export(out).draft_ids() is None  # stated: it drafts over the full vocabulary


def test_sglang_carries_the_vocabulary(ckpts, vcfg, tmp_path):
    (paths, ids), (config, ref) = ckpts, vcfg
    s = export(paths["r0"], "sglang", tmp_path / "s", config, ref)
    cfg, w = _exported(s)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"]
    assert torch.equal(w["fc.bias"], torch.zeros(H))  # SGLang's fc has a bias: zeros, never left random
    assert torch.load(s / TOKEN_MAP_FILE, weights_only=True) == ids.tolist()


def test_the_old_speculators_eagle_export_is_refused_naming_what_serves_instead(ckpts, vcfg, tmp_path,
        capsys):
    """speculators 0.9 refuses `speculators_model_type: eagle`; writing it would hand users a directory
    nothing current loads. One message, before any work: --format speculators is for eagle3."""
    (paths, _), (config, ref) = ckpts, vcfg
    with pytest.raises(ContractError) as e:
        export(paths["r0"], "speculators", tmp_path / "p", config, ref)
    msg = str(e.value)
    assert "speculators 0.9 no longer ships" in msg and "'speculators_model_type: eagle'" in msg
    assert "--format speculators is for eagle3 checkpoints" in msg and "'eagle' (vLLM) or 'sglang'" in msg
    assert not (tmp_path / "p").exists()
    with pytest.raises(SystemExit, match="speculators 0.9 no longer ships"):
        drafters_main(["export", paths["full"], "--format", "speculators", "--out", str(tmp_path / "q")])
    assert not (tmp_path / "q").exists()
    with pytest.raises(ContractError, match="export it to one of \\['eagle', 'sglang'\\]"):
        export(paths["full"], "sglang-eagle3", tmp_path / "g", config, ref)  # the EAGLE-3 layout
    assert not (tmp_path / "g").exists()


def _old_speculators_export(src: str, out) -> None:
    """A directory as `--format speculators` wrote it for eagle2/hass before speculators 0.9 (the layout
    speculators 0.4's EagleSpeculator loads), written here by hand from its names."""
    d = load_checkpoint(src)
    cfg, state, ids = d.config, d.state_dict(), d.draft_ids()
    w = {"fusion_fc.weight": state["fc.weight"],
         **{f"transformer.{k}": state["layer." + ".".join(k.split(".")[-2:])] for k in LAYER}}
    if ids is not None:
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        w.update({"d2t": ids - torch.arange(ids.shape[0]), "t2d": t2d})
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
             "hidden_size": H, "intermediate_size": FF, "num_attention_heads": 9, "num_key_value_heads": 3,
             "head_dim": 64, "vocab_size": V, "max_position_embeddings": 8192,
             "rms_norm_eps": cfg.rms_norm_eps,
             "rope_theta": cfg.rope_theta, "hidden_act": "silu", "tie_word_embeddings": False,
             "torch_dtype": "float32"}
    config = {"speculators_model_type": "eagle", "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
              "transformer_layer_architecture": "LlamaDecoderLayer", "transformer_layer_config": layer,
              "layernorms": False, "fusion_bias": False, "speculators_version": "0.4.0",
              "torch_dtype": "float32",
              "speculators_config": {"algorithm": "eagle", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy",
                                                           "speculative_tokens": 5}],
                                     "verifier": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}},
              "taskspec": {"backbone": cfg.backbone, "verifier": cfg.verifier, "seed": cfg.seed,
                           "training": {}}}
    if ids is not None:
        config["draft_vocab_size"] = int(ids.shape[0])
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config))


def test_an_old_speculators_export_is_still_read_back(ckpts, tmp_path):
    (paths, ids), old = ckpts, tmp_path / "old"
    _old_speculators_export(paths["r0"], old)
    assert check_export(old).name == "speculators"
    back = load_export(old)
    assert torch.equal(back.draft_ids(), ids) and back.config.backbone == "hass"
    for k, v in load_checkpoint(paths["r0"]).state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    w = load_file(str(old / "model.safetensors"))
    w["d2t"] = w["d2t"] + 1  # no longer the vocabulary t2d names
    save_file(w, str(old / "model.safetensors"))
    with pytest.raises(ContractError, match="d2t and t2d describe different draft vocabularies"):
        load_export(old)


def test_check_export_names_every_broken_key(ckpts, vcfg, tmp_path):
    (paths, _), (config, ref) = ckpts, vcfg
    out = export(paths["full"], "eagle", tmp_path / "e", config, ref)
    w = load_file(str(out / "model.safetensors"))
    w.pop("layers.0.self_attn.k_proj.weight")
    w["layers.0.input_layernorm.weight"] = torch.ones(H)
    w["fc.weight"] = w["fc.weight"][:, :H].contiguous()
    save_file(w, str(out / "model.safetensors"))
    with pytest.raises(ContractError) as e:
        check_export(out)
    msg = str(e.value)
    assert "missing weights ['layers.0.self_attn.k_proj.weight']" in msg
    assert "unexpected weights ['layers.0.input_layernorm.weight']" in msg
    assert "fc.weight has shape (576, 576)" in msg


def test_export_refuses_a_drafter_of_another_verifier(ckpts, vcfg, tmp_path):
    (paths, _), (config, ref) = ckpts, vcfg
    with pytest.raises(ContractError, match="hidden_size 576 != the verifier's 4096"):
        export(paths["full"], "sglang", tmp_path / "x", {**config, "hidden_size": 4096}, ref)
    with pytest.raises(ContractError, match="RoPE scaling"):
        export(paths["full"], "sglang", tmp_path / "x",
               {**config, "rope_parameters": {"rope_type": "llama3"}}, ref)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fmt,src", [("eagle", "full"), ("sglang", "r0"), ("old-speculators", "merged")])
def test_round_trip_drafts_the_same_trees(verifier, eos, bench_prompts, ckpts, vcfg, tmp_path, fmt, src):
    """Export -> `python -m drafters import` -> decode: the same draft trees (tokens and scores) and
    the same output as the original checkpoint, on a real GSM8K prompt (merged checkpoint included;
    old-speculators: a file in the layout this project wrote before speculators 0.9, read back)."""
    model, tok = verifier
    (paths, _), (config, ref) = ckpts, vcfg
    if fmt == "old-speculators":
        _old_speculators_export(paths[src], out := tmp_path / fmt)
    else:
        out = export(paths[src], fmt, tmp_path / fmt, config, ref)
    assert drafters_main(["import", str(out), "--out", str(tmp_path / "back")]) == 0
    back, orig = load_checkpoint(tmp_path / "back"), load_checkpoint(paths[src])
    assert back.config.draft_vocab_size == orig.config.draft_vocab_size
    assert back.config.backbone == orig.config.backbone
    for k, v in orig.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    runs = []
    for path in (paths[src], str(tmp_path / "back")):
        trees = []
        dec = SpeculativeDecoder(model, load_proposers(model, [path], VERIFIER),
                                 DecodeConfig(strategy="single", max_new_tokens=12, tree=TreeConfig(3, 3, 8)),
                                 eos)

        def observe(tree, target, prop, trees=trees):  # called by this iteration's decode_prompt only
            trees.append((tree.tokens.clone(), tree.path_logp.clone()))

        dec.observer = observe
        outs = [res.output_token_ids for _, res, _ in decode_prompt(dec, tok, bench_prompts["gsm8k"][0])]
        runs.append((outs, trees))
    (o1, t1), (o2, t2) = runs
    assert o1 == o2 and len(t1) == len(t2) > 0
    for (a, sa), (b, sb) in zip(t1, t2):
        assert torch.equal(a, b) and torch.equal(sa, sb)


def test_the_train_command_moved_to_workers_with_one_line():
    """`python -m drafters train` (before the train command moved where nothing imports up) refuses in one
    line naming `python -m workers train`; `python -m workers train --help` lists the same flags."""
    with pytest.raises(SystemExit) as e:
        drafters_main(["train", "--backbone", "hass", "--variant", "math", "--out", "x"])
    assert str(e.value).startswith("error: `python -m drafters train` is now `python -m workers train`")
    from workers.train_cli import main as workers_main

    with pytest.raises(SystemExit) as e:
        workers_main(["train", "--help"])
    assert e.value.code == 0
