"""The serving formats a one-layer EAGLE-2/HASS drafter exports to, as data: weight names and
shapes, required config keys, and how each carries a reduced draft vocabulary.

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
  (N,) int64 offsets, ``t2d`` (V,) bool, ``draft_vocab_size`` in the config.

EAGLE-3 (``backbone: eagle3``, drafters/eagle3.py) exports to speculators 0.9's Eagle3 layout, read
from its ``models/eagle3`` (``Eagle3SpeculatorConfig``, ``Eagle3DraftModel``) and the layout vLLM's
EAGLE-3 loader reads: ``fc`` (H, A*H), ``layers.0.*`` a Llama decoder layer whose q/k/v read 2H and
which has a ``hidden_norm`` beside its ``input_layernorm``, the drafter's own ``norm`` and ``lm_head``
(N, H), and ``d2t``/``t2d`` when the vocabulary is reduced (``EAGLE3_WEIGHTS`` below); the verifier's
embedding is not written (speculators loads it from the verifier the config names).

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
              "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
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
                    'vLLM: speculative_config={"method": "eagle", "model": DIR, "num_speculative_tokens": K}'),
    "sglang": Format("sglang", "fc", "layers.0.", True, ("LlamaForCausalLMEagle",), "token_map",
                     "SGLang: --speculative-algorithm EAGLE --speculative-draft-model-path DIR"),
    "speculators": Format("speculators", "fusion_fc", "transformer.", False, ("EagleSpeculator", "LlamaDecoderLayer"),
                          "d2t_t2d", "vLLM: vllm serve DIR (a speculators-format EAGLE drafter names its verifier)"),
}


def dims(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int,
         draft_vocab: int | None) -> dict[str, int]:
    return {"H": hidden, "2H": 2 * hidden, "Q": heads * head_dim, "KV": kv_heads * head_dim,
            "I": intermediate, "V": vocab, "N": draft_vocab or vocab}


def shape_of(symbols: tuple[str, ...], d: dict[str, int]) -> tuple[int, ...]:
    return tuple(d[s] for s in symbols)


# EAGLE-3 (speculators 0.9 ``speculators_model_type: eagle3``): our name (Eagle3Drafter) -> theirs, shape
EAGLE3_WEIGHTS = {
    "fc.weight": ("fc.weight", ("H", "AH")),
    "layer.input_layernorm.weight": ("layers.0.input_layernorm.weight", ("H",)),
    "layer.hidden_norm.weight": ("layers.0.hidden_norm.weight", ("H",)),
    "layer.q_proj.weight": ("layers.0.self_attn.q_proj.weight", ("Q", "2H")),
    "layer.k_proj.weight": ("layers.0.self_attn.k_proj.weight", ("KV", "2H")),
    "layer.v_proj.weight": ("layers.0.self_attn.v_proj.weight", ("KV", "2H")),
    "layer.o_proj.weight": ("layers.0.self_attn.o_proj.weight", ("H", "Q")),
    "layer.post_attention_layernorm.weight": ("layers.0.post_attention_layernorm.weight", ("H",)),
    "layer.gate_proj.weight": ("layers.0.mlp.gate_proj.weight", ("I", "H")),
    "layer.up_proj.weight": ("layers.0.mlp.up_proj.weight", ("I", "H")),
    "layer.down_proj.weight": ("layers.0.mlp.down_proj.weight", ("H", "I")),
    "norm.weight": ("norm.weight", ("H",)),
    "lm_head.weight": ("lm_head.weight", ("N", "H")),
}
EAGLE3_VOCAB = {"d2t": ("N",), "t2d": ("V",)}  # only with a reduced draft vocabulary (N < V)

# top-level keys of an eagle3 export's config.json (speculators' Eagle3SpeculatorConfig fields vLLM reads)
EAGLE3_KEYS = ("speculators_model_type", "architectures", "transformer_layer_config", "draft_vocab_size",
               "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
               "speculators_config", "speculators_version")

EAGLE3_SERVE = ('vLLM: vllm serve VERIFIER --speculative-config \'{"model": "DIR", "num_speculative_tokens": K}\' '
                "(a speculators eagle3 drafter; its config names the verifier)")


def eagle3_weights(reduced: bool) -> dict[str, tuple[str, ...]]:
    """Exported weight name -> symbolic shape: the exact key set of an eagle3 export."""
    out = {theirs: shape for theirs, shape in EAGLE3_WEIGHTS.values()}
    return {**out, **EAGLE3_VOCAB} if reduced else out
