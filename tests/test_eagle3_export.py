"""EAGLE-3 exports: speculators 0.9's eagle3 layout (what vLLM serves) and SGLang's EAGLE-3 layout
(``LlamaForCausalLMEagle3``, what SpecForge writes): the contracts, refusals, the round trips, SGLang's
forward computed from the exported tensors, and the real speculators package loading its export and
drafting the same logits.

The project does not depend on ``speculators``: the last test installs speculators 0.9.0 with
pip into a scratch directory of its own (``--no-deps --target``: its audio/vision requirements and
CUDA torch are not needed to load the model; cached under ``$TASKSPEC_CACHE``), imports it from
there, and is skipped, saying so, only when pip cannot reach a package index that has it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.atomic import atomic_dir
from common.caches import cache_dir
from common.verifiers import verifier_config
from drafters.__main__ import main as drafters_main
from drafters.data.templating import prompt_ids
from drafters.eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3, load_eagle3, save_eagle3
from drafters.export import ContractError, check_export, export, load_export
from drafters.model import causal_mask
from drafters.train.eagle3 import ttt_unroll
from tests.conftest import VERIFIER

H, Q, KV, FF, V, N = 576, 576, 192, 1536, 49152, 1024  # SmolLM2-135M: 9 heads, 3 kv heads, head_dim 64
WEIGHTS = {"fc.weight": (H, 3 * H), "layers.0.input_layernorm.weight": (H,),
           "layers.0.hidden_norm.weight": (H,),
           "layers.0.self_attn.q_proj.weight": (Q, 2 * H), "layers.0.self_attn.k_proj.weight": (KV, 2 * H),
           "layers.0.self_attn.v_proj.weight": (KV, 2 * H), "layers.0.self_attn.o_proj.weight": (H, Q),
           "layers.0.post_attention_layernorm.weight": (H,), "layers.0.mlp.gate_proj.weight": (FF, H),
           "layers.0.mlp.up_proj.weight": (FF, H), "layers.0.mlp.down_proj.weight": (H, FF),
           "norm.weight": (H,)}


@pytest.fixture(scope="module")
def e3(verifier, tmp_path_factory):
    """A reduced-vocabulary eagle3 checkpoint (1,024 ids, every other one), a full-vocabulary one, and a
    reduced one with every weight moved off its initial value."""
    model, _ = verifier
    root = tmp_path_factory.mktemp("eagle3-src")
    head = model.get_output_embeddings().weight
    ids = torch.arange(0, 2 * N, 2)
    reduced = init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, seed=1, draft_vocab_size=N), ids, head)
    full = init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, seed=2), None, head)
    # norms start at ones, so a swapped norm name would go unseen: every weight moved, as training does
    shaken = init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, seed=3, draft_vocab_size=N), ids, head)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for w in shaken.parameters():
            w.add_(0.2 * w.abs().mean() * torch.randn(w.shape, generator=g))
    return {"reduced": str(save_eagle3(reduced, root / "reduced")), "full": str(save_eagle3(full,
            root / "full")),
            "shaken": str(save_eagle3(shaken, root / "shaken"))}


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
    with pytest.raises(ContractError, match="--format speculators") as e:
        export(e3["reduced"], "eagle", tmp_path / "e", config, ref)
    assert "--format sglang-eagle3" in str(e.value)
    for fmt in ("speculators", "sglang-eagle3"):
        with pytest.raises(ContractError, match="30-layer verifier"):
            export(e3["reduced"], fmt, tmp_path / "x", {**config, "num_hidden_layers": 32}, ref)
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


# what `import speculators.models.eagle3` needs beside this project's environment (issue #40), at the
# versions the test was written against (2026-12-04: transformers 5.24.0, pydantic 2.14.4 here)
SPECULATORS = ("speculators==0.9.0", "hs-connectors==0.9.0", "loguru==0.7.3", "pydantic-settings==2.16.3",
               "openai==3.60.0", "sniffio==1.3.1")
UNREACHABLE = ("No matching distribution", "Could not find a version", "NewConnectionError",
               "ConnectionError",
               "Max retries exceeded", "Temporary failure in name resolution", "Network is unreachable",
               "ProxyError", "timed out")


@pytest.fixture(scope="module")
def speculators_site() -> str:
    """A directory holding SPECULATORS (pip --no-deps --target), installed once per machine, atomically."""
    pins = hashlib.sha256(" ".join(SPECULATORS).encode()).hexdigest()[:8]  # another pin: another directory
    site = cache_dir() / f"site-{SPECULATORS[0].replace('==', '-')}-{pins}"
    if (site / "speculators" / "models" / "eagle3").is_dir():
        return str(site)
    with atomic_dir(site) as tmp:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
        r = subprocess.run([*pip, "--target", str(tmp), *SPECULATORS], capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            if any(m in err for m in UNREACHABLE):
                last = err.splitlines()[-1]
                pytest.skip(f"the package index is unreachable or lacks {SPECULATORS[0]}: {last}")
            raise AssertionError(f"pip install --target failed (rc {r.returncode}):\n{err[-3000:]}")
    return str(site)


def test_the_real_speculators_loads_the_export_and_drafts_the_same_logits(verifier, bench_prompts, e3,
        tmp_path,
                                                                         speculators_site, monkeypatch):
    monkeypatch.syspath_prepend(speculators_site)
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    model, tok = verifier
    # speculators resolves the verifier the config names: a local copy (no hub here)
    vdir = tmp_path / "verifier"
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
    x = torch.tensor([prompt_ids(tok, [{"role": "user", "content": bench_prompts["gsm8k"][0].turns[0]}])])[:,
            :48]
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


# ---------------------------------------------------------------- SGLang EAGLE-3 (--format sglang-eagle3)

SGL = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "midlayer.input_layernorm.weight": (H,),
       "midlayer.hidden_norm.weight": (H,), "midlayer.self_attn.q_proj.weight": (Q, 2 * H),
       "midlayer.self_attn.k_proj.weight": (KV, 2 * H), "midlayer.self_attn.v_proj.weight": (KV, 2 * H),
       "midlayer.self_attn.o_proj.weight": (H, Q), "midlayer.post_attention_layernorm.weight": (H,),
       "midlayer.mlp.gate_proj.weight": (FF, H), "midlayer.mlp.up_proj.weight": (FF, H),
       "midlayer.mlp.down_proj.weight": (H, FF)}


@pytest.fixture(scope="module")
def sgl(e3, tmp_path_factory):
    """The shaken drafter exported to sglang-eagle3 once (mutations work on copies)."""
    config, ref = verifier_config(VERIFIER)
    return export(e3["shaken"], "sglang-eagle3", tmp_path_factory.mktemp("sgl") / "out", config, ref)


def test_cli_export_writes_sglangs_eagle3_layout(e3, tmp_path, capsys):
    out = tmp_path / "sgl"
    assert drafters_main(["export", e3["reduced"], "--format", "sglang-eagle3", "--out", str(out),
                          "--dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "--speculative-algorithm EAGLE3" in said and f"--speculative-draft-model-path {out}" in said
    cfg, w = _exported(out)
    assert {k: tuple(v.shape) for k, v in w.items()} == {**SGL, "lm_head.weight": (N, H), "d2t": (N,),
                                                         "t2d": (V,)}
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.bfloat16 for k, v in w.items() if k not in ("d2t", "t2d"))
    assert torch.equal(w["d2t"] + torch.arange(N), torch.arange(0, 2 * N, 2))  # SGLang's hot token ids
    assert torch.equal(w["t2d"].nonzero().flatten(), torch.arange(0, 2 * N, 2))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["draft_vocab_size"], cfg["vocab_size"]) == (1, N, V)
    # SmolLM2 ties; SGLang would then use the embedding as the head
    assert cfg["tie_word_embeddings"] is False
    # SGLang counts layer outputs (it captures the input of layer id + 1): ours 2, 15, 27 -> 1, 14, 26
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 14, 26],
                                   "use_aux_hidden_state": True}
    assert (cfg["head_dim"], cfg["rope_theta"], cfg["max_position_embeddings"]) == (64, 100000.0, 8192)
    assert cfg["torch_dtype"] == "bfloat16" and "speculators_config" not in cfg and "bias" not in cfg
    src = load_eagle3(e3["reduced"]).state_dict()
    assert torch.equal(w["midlayer.hidden_norm.weight"], src["layer.hidden_norm.weight"].bfloat16())


def test_sglang_full_vocabulary_export_writes_identity_maps(e3, tmp_path):
    """SpecForge's exporter requires d2t/t2d, so they are written at the full vocabulary too."""
    config, ref = verifier_config(VERIFIER)
    cfg, w = _exported(export(e3["full"], "sglang-eagle3", tmp_path / "f", config, ref))
    assert {k: tuple(v.shape) for k, v in w.items()} == {**SGL, "lm_head.weight": (V, H), "d2t": (V,),
                                                         "t2d": (V,)}
    assert cfg["draft_vocab_size"] == V and not w["d2t"].any() and bool(w["t2d"].all())
    back = load_export(tmp_path / "f")
    assert back.draft_ids() is None and back.config == load_eagle3(e3["full"]).config


def _sglang_logits(w: dict, cfg: dict, embeds, hidden3):
    """What SGLang's LlamaForCausalLMEagle3 computes from the exported tensors for one extend pass
    (python/sglang/srt/models/llama_eagle3.py, read for this; written here): fc fuses the three
    layers, q/k/v read [input_layernorm(embeds) ; hidden_norm(hidden)], neox RoPE, causal GQA,
    residual on the fused hidden state, the fused add-norm, the drafter's head. -> (logits over the
    draft vocabulary, hot token ids)."""
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg[
            "head_dim"]
    m = {k[len("midlayer."):]: v.float() for k, v in w.items() if k.startswith("midlayer.")}

    def rms(x, g):
        return g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x, pos):  # x (B, heads, T, hd)
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], dim=-1)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()

    b, t, _ = embeds.shape
    h = hidden3 @ w["fc.weight"].float().T
    x = torch.cat([rms(embeds, m["input_layernorm.weight"]), rms(h, m["hidden_norm.weight"])], dim=-1)
    pos = torch.arange(t).float()
    q = rope((x @ m["self_attn.q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2), pos)
    k = rope((x @ m["self_attn.k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2), pos)
    v = (x @ m["self_attn.v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    att = (q @ k.transpose(-1, -2)) / hd ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
    a = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, nh * hd) @ m["self_attn.o_proj.weight"].T
    r = h + a
    y = rms(r, m["post_attention_layernorm.weight"])
    r = r + (torch.nn.functional.silu(y @ m["mlp.gate_proj.weight"].T) * (y @ m["mlp.up_proj.weight"].T)) \
        @ m["mlp.down_proj.weight"].T
    logits = rms(r, w["norm.weight"].float()) @ w["lm_head.weight"].float().T
    return logits, w["d2t"] + torch.arange(w["d2t"].shape[0])


def test_sglangs_forward_on_the_export_drafts_our_logits(verifier, bench_prompts, e3, sgl):
    """SGLang is not installable here (CUDA kernels); its EAGLE-3 forward, computed from the exported
    file by name and with its aux-layer rule (capture the input of layer id + 1), gives this drafter's
    logits and draft-to-verifier ids on a real GSM8K prompt's features."""
    model, tok = verifier
    cfg, w = _exported(sgl)
    ours = load_eagle3(e3["shaken"])
    x = torch.tensor([prompt_ids(tok, [{"role": "user", "content": bench_prompts["gsm8k"][0].turns[0]}])])[:,
            :48]
    t = x.shape[1] - 1
    with torch.no_grad():
        hs = model(x, output_hidden_states=True).hidden_states
        captured = [hs[j + 1] for j in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        embeds = model.get_input_embeddings()(x[:, 1:]).float()
        theirs, hot = _sglang_logits(w, cfg, embeds, torch.cat(captured, dim=-1)[:, :-1].float())
        aux = torch.cat([hs[i] for i in ours.config.aux_layers], dim=-1)[:, :-1]
        mine, _ = ours.draft_step(embeds, ours.fuse(aux), torch.arange(t), causal_mask(t))
    assert torch.equal(hot, ours.draft_ids())
    torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)
    assert torch.equal(hot[theirs.argmax(-1)], ours.draft_ids()[mine.argmax(-1)])


def test_sglang_round_trip_gives_the_same_drafter(verifier, bench_prompts, e3, tmp_path):
    """export -> `python -m drafters import` -> the same config, state dict and draft logits; an
    export without this project's `taskspec` block (as SpecForge writes it) reads back the same."""
    model, tok = verifier
    out = tmp_path / "sgl"
    assert drafters_main(["export", e3["shaken"], "--format", "sglang-eagle3", "--out", str(out)]) == 0
    assert drafters_main(["import", str(out), "--out", str(tmp_path / "back")]) == 0
    src, back = load_eagle3(e3["shaken"]), load_eagle3(tmp_path / "back")
    assert back.config == src.config
    assert set(back.state_dict()) == set(src.state_dict())
    for k, v in src.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    cfg = json.loads((out / "config.json").read_text())
    del cfg["taskspec"]
    (out / "config.json").write_text(json.dumps(cfg))
    bare = load_export(out)
    assert bare.config.aux_layers == src.config.aux_layers and bare.config.num_verifier_layers == 30
    x = torch.tensor([prompt_ids(tok, [{"role": "user", "content": bench_prompts["gsm8k"][1].turns[0]}])])[:,
            :40]
    t = x.shape[1] - 1
    with torch.no_grad():
        hs = model(x, output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i] for i in src.config.aux_layers], dim=-1)[:, :-1]
        emb = model.get_input_embeddings()(x[:, 1:])
        logits = [d.draft_step(emb, d.fuse(aux), torch.arange(t), causal_mask(t))[0] for d in (src, back,
                bare)]
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])


def _cfg(fn):
    def mutate(path):
        c = json.loads((path / "config.json").read_text())
        fn(c)
        (path / "config.json").write_text(json.dumps(c))
    return mutate


def _weights(fn):
    def mutate(path):
        w = load_file(str(path / "model.safetensors"))
        fn(w)
        save_file(w, str(path / "model.safetensors"))
    return mutate


MUTATIONS = {  # one broken export per problem -> what the refusal must name
    "missing": (_weights(lambda w: w.pop("midlayer.hidden_norm.weight")),
                "missing weights ['midlayer.hidden_norm.weight'] (a loader would leave them at random"),
    "extra": (_weights(lambda w: w.update({"embed_tokens.weight": torch.zeros(V, H)})),
              "unexpected weights ['embed_tokens.weight']"),
    "shape": (_weights(lambda w: w.update({"fc.weight": w["fc.weight"][:, : 2 * H].contiguous()})),
              "fc.weight has shape (576, 1152), expected (576, 1728)"),
    "dtype": (_weights(lambda w: w.update({"d2t": w["d2t"].int()})),
              "d2t is torch.int32, expected torch.int64"),
    "maps": (_weights(lambda w: w.update({"d2t": w["d2t"] + 1})), "d2t and t2d describe different"),
    "torch_dtype": (_cfg(lambda c: c.update(torch_dtype="bfloat16")),
                    "fc.weight is torch.float32, expected torch.bfloat16"),
    "architectures": (_cfg(lambda c: c.update(architectures=["LlamaForCausalLMEagle"])),
                      "architectures ['LlamaForCausalLMEagle'] != ['LlamaForCausalLMEagle3']"),
    "layers": (_cfg(lambda c: c.update(num_hidden_layers=2)), "num_hidden_layers is 2, this drafter has 1"),
    "tied": (_cfg(lambda c: c.update(tie_word_embeddings=True)),
             "tie_word_embeddings is true, must be false"),
    "fc_bias": (_cfg(lambda c: c.update(bias=True)), "bias is true, must be false"),
    "fc_norm": (_cfg(lambda c: c.update(fc_norm=True)), "fc_norm is true, must be false"),
    "norm_output": (_cfg(lambda c: c.update(norm_output=False)), "norm_output is false, must be true"),
    "no_aux": (_cfg(lambda c: c["eagle_config"].update(use_aux_hidden_state=False)),
               "eagle_config.use_aux_hidden_state is false, must be true"),
    "eagle_config": (_cfg(lambda c: c.pop("eagle_config")), "config misses 'eagle_config'"),
    "aux_count": (_cfg(lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 14])),
                  "has 2 ids, the loader's fc reads 3 layers"),
    "aux_ids": (_cfg(lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[-1, 14, 26])),
                "must be a non-empty list of distinct layer ids >= 0, got [-1, 14, 26]"),
    "draft_vocab": (_cfg(lambda c: c.pop("draft_vocab_size")), "config misses 'draft_vocab_size'"),
    "target_hidden": (_cfg(lambda c: c.update(target_hidden_size=1024)),
                      "target_hidden_size 1024 != hidden_size 576"),
    "llama_key": (_cfg(lambda c: c.pop("rms_norm_eps")), "config misses 'rms_norm_eps'"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_broken_sglang_export_is_refused_naming_the_problem(sgl, tmp_path, case):
    mutate, message = MUTATIONS[case]
    broken = shutil.copytree(sgl, tmp_path / "broken")
    check_export(broken, "sglang-eagle3")  # the untouched copy passes
    mutate(broken)
    with pytest.raises(ContractError, match="sglang-eagle3 contract") as e:
        check_export(broken, "sglang-eagle3")
    assert message in str(e.value)
    with pytest.raises(ContractError):
        load_export(broken)  # the importer checks first


def test_sglang_export_refuses_aux_layers_it_cannot_capture(verifier, tmp_path):
    """SGLang's fc reads exactly three layers, and it captures only inputs of layers 1..L-1."""
    model, _ = verifier
    config, ref = verifier_config(VERIFIER)
    for aux, message in (((2, 15), "fuses exactly 3 verifier layers"), ((0, 15, 27),
            "include the embeddings (0)"),
                         ((2, 15, 30), "or the final output (30)")):
        ckpt = save_eagle3(init_eagle3(Eagle3Config.for_verifier(model, VERIFIER, aux_layers=aux)),
                           tmp_path / "c")
        with pytest.raises(ContractError, match="sglang-eagle3") as e:
            export(ckpt, "sglang-eagle3", tmp_path / "x", config, ref)
        assert message in str(e.value) and not (tmp_path / "x").exists()
