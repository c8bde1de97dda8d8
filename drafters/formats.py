"""The serving formats a drafter exports to, as data: weight names and shapes, required config
keys, and how each carries a reduced draft vocabulary.

Read from the real loaders (for understanding; nothing here is copied):
- vLLM ``llama_eagle.py`` (``EagleLlamaForCausalLM``; vLLM's EAGLE config rewrites the drafter's
  ``architectures: [LlamaForCausalLM]`` to it): ``fc`` is ``Linear(2H, H, bias=False)``, layer 0
  has no ``input_layernorm``, embedding and LM head come from the target. Its ``load_weights``
  skips names it does not know and leaves parameters missing from the file at their random
  initialisation, so the key set below is exact: nothing missing, nothing extra. EAGLE-1 has no
  draft-to-target map in vLLM, so it cannot carry a reduced draft vocabulary.
- SGLang ``llama_eagle.py`` (``LlamaForCausalLMEagle``): the same names under ``model.``, but its
  ``fc`` has a bias (written as zeros; a missing one would stay random). A reduced vocabulary
  travels as ``--speculative-token-map FILE``: ``torch.load(FILE, weights_only=True)`` of the hot
  (verifier) token ids, to which SGLang slices the LM head (``hot_vocab_size``).
- speculators ``models/eagle.py`` (``EagleSpeculatorConfig`` / ``EagleSpeculator``): ``fusion_fc.*``
  and ``transformer.*`` (a ``LlamaDecoderLayer`` whose ``input_layernorm`` is Identity), config
  ``speculators_model_type: eagle`` with ``transformer_layer_config`` (a Llama config),
  ``layernorms``/``fusion_bias`` flags and ``speculators_config`` (algorithm, proposal methods,
  verifier). A reduced vocabulary is stored as speculators' EAGLE-3 class stores it: ``d2t``
  (N,) int64 offsets, ``t2d`` (V,) bool, ``draft_vocab_size`` in the config. speculators 0.5 and
  later (0.9 is current) no longer ship this type, so nothing writes it any more; the contract
  stays so that the exports people have are still read back (``python -m drafters import``).

EAGLE-3 (``backbone: eagle3``, drafters/eagle3.py) has two layouts (``EAGLE3_LAYOUTS``), one
decoder layer whose q/k/v read 2H and which has a ``hidden_norm`` beside its ``input_layernorm``
(``EAGLE3_LAYER``), ``fc`` (H, A*H), the drafter's own ``norm`` and ``lm_head`` (N, H), and
``d2t``/``t2d``; the verifier's embedding is never written (the servers take the verifier's):
- speculators 0.9's Eagle3 layout, read from its ``models/eagle3`` (``Eagle3SpeculatorConfig``,
  ``Eagle3DraftModel``), which vLLM's EAGLE-3 loader reads too: ``layers.0.*``, a nested
  ``transformer_layer_config``, ``eagle_aux_hidden_state_layer_ids`` (output_hidden_states
  indices, as ours), ``d2t``/``t2d`` only for a reduced vocabulary.
- SGLang's ``LlamaForCausalLMEagle3`` (``models/llama_eagle3.py``; SpecForge's ``to_sglang`` export
  writes the same): ``midlayer.*``, a flat Llama config with ``architectures:
  [LlamaForCausalLMEagle3]``, ``draft_vocab_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``
  counted as layer outputs (SGLang's ``set_eagle3_layers_to_capture`` adds 1), an ``fc`` reading
  exactly three layers, ``d2t``/``t2d`` always (SpecForge requires them). Where each was read:
  docs/export.md.

Shapes are symbolic: H hidden, Q = heads x head_dim, KV = kv heads x head_dim, I intermediate,
N draft vocabulary, V verifier vocabulary, AH the aux layers' concatenated features (A x H).
"""
from __future__ import annotations

from dataclasses import dataclass

# the decoder layer: our name (FeatureDrafter.layer.*) -> the Llama name, symbolic shape
LAYER = {
    "q_proj.weight": ("self_attn.q_proj.weight", ("Q", "H")),
    "k_proj.weight": ("self_attn.k_proj.weight", ("KV", "H")),
    "v_proj.weight": ("self_attn.v_proj.weight", ("KV", "H")),
    "o_proj.weight": ("self_attn.o_proj.weight", ("H", "Q")),
    "gate_proj.weight": ("mlp.gate_proj.weight", ("I", "H")),
    "up_proj.weight": ("mlp.up_proj.weight", ("I", "H")),
    "down_proj.weight": ("mlp.down_proj.weight", ("H", "I")),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", ("H",)),
}

# keys every Llama config of a one-layer drafter must have (vLLM/SGLang build a LlamaConfig from it)
LLAMA_KEYS = ("model_type", "architectures", "num_hidden_layers", "hidden_size", "intermediate_size",
              "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
              "max_position_embeddings",
              "rms_norm_eps", "rope_theta", "hidden_act", "tie_word_embeddings", "torch_dtype")


@dataclass(frozen=True)
class Format:
    name: str
    fc: str  # prefix of the fusion layer
    layer: str  # prefix of the decoder layer's weights
    fc_bias: bool  # the loader's fc has a bias (written as zeros)
    architectures: tuple[str, ...]
    vocab_map: str | None  # how a reduced vocabulary travels: None (cannot), "token_map" file, "d2t_t2d"
    serve: str  # how to serve it (README and the export's own message)

    def weights(self, reduced: bool) -> dict[str, tuple[str, ...]]:
        """Exported weight name -> symbolic shape: the exact key set of this format."""
        out = {f"{self.fc}.weight": ("H", "2H")}
        if self.fc_bias:
            out[f"{self.fc}.bias"] = ("H",)
        out.update({self.layer + name: shape for name, shape in LAYER.values()})
        if reduced and self.vocab_map == "d2t_t2d":
            out.update({"d2t": ("N",), "t2d": ("V",)})
        return out

    def rename(self) -> dict[str, str]:
        """Our checkpoint name -> exported name (float weights only)."""
        out = {"fc.weight": f"{self.fc}.weight"}
        out.update({f"layer.{ours}": self.layer + theirs for ours, (theirs, _) in LAYER.items()})
        return out


TOKEN_MAP_FILE = "hot_token_map.pt"

FORMATS = {
    "eagle": Format("eagle", "fc", "layers.0.", False, ("LlamaForCausalLM",), None,
                    'vLLM: speculative_config={"method": "eagle", "model": DIR, '
                    '"num_speculative_tokens": K}'),
    "sglang": Format("sglang", "fc", "layers.0.", True, ("LlamaForCausalLMEagle",), "token_map",
                     "SGLang: --speculative-algorithm EAGLE --speculative-draft-model-path DIR"),
    # read only (exports written before speculators 0.9): see the module docstring
    "speculators": Format("speculators", "fusion_fc", "transformer.", False, ("EagleSpeculator",
            "LlamaDecoderLayer"),
                          "d2t_t2d", "speculators <= 0.4 only (no longer written)"),
}
WRITTEN = ("eagle", "sglang")  # what an eagle2/hass drafter exports to; an eagle3 one: EAGLE3_LAYOUTS


def dims(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int,
         draft_vocab: int | None) -> dict[str, int]:
    return {"H": hidden, "2H": 2 * hidden, "Q": heads * head_dim, "KV": kv_heads * head_dim,
            "I": intermediate, "V": vocab, "N": draft_vocab or vocab}


def shape_of(symbols: tuple[str, ...], d: dict[str, int]) -> tuple[int, ...]:
    return tuple(d[s] for s in symbols)


# EAGLE-3: the decoder layer, our name (Eagle3Layer) -> the Llama name, symbolic shape. Both EAGLE-3
# layouts below use these names; only the prefix differs.
EAGLE3_LAYER = {
    "input_layernorm.weight": ("input_layernorm.weight", ("H",)),
    "hidden_norm.weight": ("hidden_norm.weight", ("H",)),
    "q_proj.weight": ("self_attn.q_proj.weight", ("Q", "2H")),
    "k_proj.weight": ("self_attn.k_proj.weight", ("KV", "2H")),
    "v_proj.weight": ("self_attn.v_proj.weight", ("KV", "2H")),
    "o_proj.weight": ("self_attn.o_proj.weight", ("H", "Q")),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", ("H",)),
    "gate_proj.weight": ("mlp.gate_proj.weight", ("I", "H")),
    "up_proj.weight": ("mlp.up_proj.weight", ("I", "H")),
    "down_proj.weight": ("mlp.down_proj.weight", ("H", "I")),
}
# outside the layer: fusion, final norm, the drafter's own LM head over the draft vocabulary
EAGLE3_OUTER = {"fc.weight": ("H", "AH"), "norm.weight": ("H",), "lm_head.weight": ("N", "H")}
EAGLE3_VOCAB = {"d2t": ("N",), "t2d": ("V",)}  # d2t int64 offsets (draft id + d2t = verifier id), t2d bool


@dataclass(frozen=True)
class Eagle3Layout:
    """One serving layout of an EAGLE-3 drafter: weight names, config keys, where the aux layers go."""
    name: str  # the --format
    architectures: tuple[str, ...]
    layer: str  # prefix of the decoder layer's weights
    keys: tuple[str, ...]  # top-level config keys the loader needs
    llama: str | None  # key of the nested Llama config; None: config.json is the Llama config itself
    aux: str  # where the aux layer ids are in config.json (dotted path)
    aux_offset: int  # our output_hidden_states index = the stored id + aux_offset
    aux_count: int | None  # the loader's fc reads exactly this many layers (None: any number)
    fixed: tuple[tuple[str, object, str], ...]  # (dotted path, value this drafter needs, why); absent is fine
    maps_always: bool  # d2t/t2d are written at the full vocabulary too
    serve: str  # how to serve it (the export's own message; DIR and VERIFIER are filled in)

    def rename(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Our Eagle3Drafter name -> (exported name, symbolic shape), float weights only."""
        out = {k: (k, s) for k, s in EAGLE3_OUTER.items()}
        out.update({f"layer.{ours}": (self.layer + theirs, s) for ours, (theirs, s) in EAGLE3_LAYER.items()})
        return out

    def weights(self, reduced: bool) -> dict[str, tuple[str, ...]]:
        """Exported weight name -> symbolic shape: the exact key set of this layout."""
        out = dict(self.rename().values())
        return {**out, **EAGLE3_VOCAB} if reduced or self.maps_always else out


EAGLE3_LAYOUTS = {
    # speculators 0.9 ``speculators_model_type: eagle3`` (Eagle3SpeculatorConfig; vLLM reads it too)
    "speculators": Eagle3Layout(
        "speculators", ("Eagle3Speculator",), "layers.0.",
        ("speculators_model_type", "architectures", "transformer_layer_config", "draft_vocab_size",
         "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
         "speculators_config", "speculators_version"),
        "transformer_layer_config", "eagle_aux_hidden_state_layer_ids", 0, None,
        tuple((k, False, "this drafter's layer has the reference's norms, not speculators' variant")
              for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")),
        False,
        "vLLM: vllm serve VERIFIER --speculative-config "
        "'{\"model\": \"DIR\", \"num_speculative_tokens\": K}' "
        "(a speculators eagle3 drafter; its config names the verifier)"),
    # SGLang ``LlamaForCausalLMEagle3`` (models/llama_eagle3.py), what SpecForge's to_sglang export writes.
    # The loader prefixes ``model.`` itself and fuses q/k/v and gate/up; ``d2t`` becomes its hot token
    # ids, ``t2d`` is skipped. It captures aux layer id j as the input of decoder layer j + 1.
    "sglang-eagle3": Eagle3Layout(
        "sglang-eagle3", ("LlamaForCausalLMEagle3",), "midlayer.",
        ("draft_vocab_size", "eagle_config"), None, "eagle_config.eagle_aux_hidden_state_layer_ids", 1, 3,
        (("tie_word_embeddings", False, "SGLang would use the verifier's embedding as the LM head"),
         ("bias", False, "this drafter's fc has no bias"),
         ("fc_norm", False, "this drafter does not norm the fused layers (SpecForge's option)"),
         ("norm_output", True, "this drafter norms before its LM head"),
         ("eagle_config.use_aux_hidden_state", True, "the drafter reads the verifier's aux layers")),
        True,
        "SGLang: python -m sglang.launch_server --model-path VERIFIER --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path DIR"),
}


def config_at(config: dict, path: str, default=None):
    """config.json's value at a dotted path (``eagle_config.eagle_aux_hidden_state_layer_ids``)."""
    for part in path.split("."):
        if not isinstance(config, dict) or part not in config:
            return default
        config = config[part]
    return config
