"""The dry run's stated assumptions: verifier shapes, GPU throughput, decoding constants, the
drafters' parameter counts and training FLOPs per token, and the memory one training GPU needs.
Used where nothing measured is at hand (orchestrator/plan/rates/estimates.py). Torch-free: every count is
arithmetic on the shapes the modules are built from (drafters/model.py, drafters/eagle3.py), and
tests/test_costs.py checks it against the modules' own ``sum(p.numel())``."""
from __future__ import annotations

from drafters.train.config import weight_bytes

GIB = 1 << 30

# Per-verifier shapes (the Hugging Face config's hidden_size, vocab_size, num_attention_heads,
# num_key_value_heads, intermediate_size, num_hidden_layers) and its whole parameter count.
VERIFIERS = {
    "llama3-8b-instruct": {"params": 8.03e9, "hidden": 4096, "vocab": 128256, "heads": 32, "kv_heads": 8,
                           "intermediate": 14336, "layers": 32},
    "smollm2-135m-instruct": {"params": 0.135e9, "hidden": 576, "vocab": 49152, "heads": 9, "kv_heads": 3,
                              "intermediate": 1536, "layers": 30},
}
ASSUMPTIONS = {
    # after the chat template, capped by max_length
    "tokens_per_example": {"mathinstruct": 350, "sharegpt": 900},
    "gpu_peak_flops": 312e12,  # A100 bf16 dense
    "mfu": 0.35,  # achieved fraction of peak in training / extraction
    "verify_step_seconds": 0.030,  # one tree pass of the 8B verifier on one A100 (memory-bound)
    "assumed_tau": 3.5,  # acceptance length used to turn generated tokens into verifier calls
    "generated_tokens_per_turn": 400,
    "feature_bytes_per_token": None,  # hidden * 2 (fp16) + top-10 ids/probs (60 bytes)
    # ---- overheads (orchestrator/plan/rates/overheads.py), each from a stated source
    # per training trial: Ray Train's worker group, DeepSpeed's engine, the data plan. The rehearsal's
    # cached train stage, 335 s for 12 trials run one at a time whose training itself is negligible
    # (docs/cluster.md, "What the rehearsal covers"), per trial; not scaled (no faster on a GPU node)
    "train_startup_s": 28.0,
    # per features task: the rehearsal's slower features stage (31 s for its 3 tasks), taken whole per task
    "features_startup_s": 31.0,
    # per eval shard: drafter fetch and load, trace writes, records. The rehearsal's slowest eval stage per
    # unit and actor (865 s x 4 actors / 872 units; its decoding, 2 prompts x 8 tokens at width 64, counted
    # in)
    "eval_shard_overhead_s": 4.0,
    # per merge beside moving its bytes (two finals in, one out, at the object store's bandwidth): the
    # rehearsal's merge stage (at most 6 s for its 27 merges)
    "merge_overhead_s": 0.2,
    # one process loading the verifier (bf16 safetensors from the node's disk into GPU memory): a stated
    # figure, not measured here (an NVMe device reads 2.7 GB/s, AWS's P4d figures; a node's loaders share it)
    "verifier_load_bytes_per_s": 0.5e9,
    # a node uploading a step or epoch checkpoint to S3, synchronously in the training loop: one file per rank
    # in parallel, 8 connections at AWS's 85-90 MB/s per connection (S3 performance guidelines)
    "checkpoint_upload_bytes_per_s": 0.7e9,
    # the report on one CPU: 443 s at 5.0 M step rows in the paper's number of files (docs/report.md,
    # experiments/bench_report.py), scaled linearly in step rows (it reads them in passes)
    "report_s_per_step_row": 443.0 / 5.0e6,
    # GPU nodes idle this long go back (deploy/ray-cluster.yaml: idle_timeout_minutes 10, min_workers 0):
    # the report, on the driver's CPU after the eval actors are gone, bills the GPUs at most this long
    "idle_release_s": 600.0,
}
HELDOUT_DEPTHS = 3  # drafters.train.config.TrainConfig.eval_depths: drafter passes per held-out position
EAGLE3_TTT_STEPS = 7  # drafters.eagle3.Eagle3Config.ttt_steps (kept torch-free here)
EAGLE3_AUX_LAYERS = 3  # drafters.eagle3.default_aux_layers: three verifier layers fused by fc
TOPK_BYTES = 60  # a cached token's top-10 ids (int32) and probabilities (fp16): drafters/features.py


# ---------------------------------------------------------------- parameters (drafters/model.py, eagle3.py)
def _layer_params(v: dict, qkv_in: int) -> int:
    """A Llama decoder layer's projections, q/k/v reading ``qkv_in`` features (norms not included)."""
    h, hd = v["hidden"], v["hidden"] // v["heads"]
    attn = qkv_in * v["heads"] * hd + 2 * qkv_in * v["kv_heads"] * hd + v["heads"] * hd * h
    return attn + 3 * h * v["intermediate"]  # gate, up, down


def head_rows(v: dict, draft_vocab: int | None = None) -> int:
    """Rows of the LM head a drafter's loss runs over: the draft vocabulary, or the whole one."""
    return draft_vocab or v["vocab"]


def drafter_params(v: dict, backbone: str = "eagle2", draft_vocab: int | None = None) -> int:
    """Trainable parameters of a drafter for verifier ``v``. EAGLE-2/HASS (FeatureDrafter): fc
    (2H -> H) and one decoder layer with its post-attention RMSNorm; embedding and LM head are the
    verifier's. EAGLE-3 (Eagle3Drafter): fc (3H -> H), a layer whose q/k/v read 2H with three
    RMSNorms, the final norm and its own LM head (H x the draft vocabulary, or the whole one: 525 M
    parameters for Llama-3-8B's 128,256 x 4,096)."""
    h = v["hidden"]
    if backbone == "eagle3":
        return EAGLE3_AUX_LAYERS * h * h + _layer_params(v, 2 * h) + 4 * h + h * head_rows(v, draft_vocab)
    return 2 * h * h + _layer_params(v, h) + h


def train_flops_per_token(v: dict, backbone: str, hass_steps: int) -> float:
    """Training FLOPs per token of a drafter (forward + backward of its matmuls, 6 per parameter,
    and the LM head; attention's own products, about 2% at 1,024 tokens, are left out). EAGLE-2: the
    verifier's frozen head forward and back to its input (4HV) and once for the target (2HV); HASS
    repeats the pass ``hass_steps`` times. EAGLE-3: fc once, then its layer and its own trained head
    (6HV) ``EAGLE3_TTT_STEPS`` times, and the target distribution once."""
    h, n = v["hidden"], v["vocab"]
    if backbone == "eagle3":
        step = 6 * _layer_params(v, 2 * h) + 6 * h * n
        return 6 * EAGLE3_AUX_LAYERS * h * h + EAGLE3_TTT_STEPS * step + 2 * h * n
    one = 6 * (2 * h * h + _layer_params(v, h)) + 4 * h * n + 2 * h * n
    return hass_steps * one if backbone == "hass" else one


def checkpoint_bytes(v: dict, backbone: str, precision: str, deepspeed: bool,
                     draft_vocab: int | None = None) -> int:
    """One epoch checkpoint (drafters/train/loop.py ``RunCheckpoints.save``): the weights as
    trained (drafters/train/config.py ``weight_bytes``: 2 bytes a parameter in bf16 under DeepSpeed)
    plus DeepSpeed's state, its module copy and the float32 master weights and Adam's m and v (12
    bytes): 16 bytes a parameter in bf16, 20 in fp32 (about 13 GB for Llama-3-8B's EAGLE-3)."""
    return drafter_params(v, backbone, draft_vocab) * (2 * weight_bytes(precision, deepspeed) + 12)


def final_bytes(v: dict, backbone: str, precision: str, deepspeed: bool,
                draft_vocab: int | None = None) -> int:
    """A final or merged drafter: its weights only, as trained."""
    return drafter_params(v, backbone, draft_vocab) * weight_bytes(precision, deepspeed)


def feature_bytes_per_token(v: dict, eagle3: bool) -> int:
    """A cached token (drafters/features.py): the LM head's input (fp16), its top-10, and with
    EAGLE-3 in the run the three aux layers' hidden states (fp16) in the same cache."""
    return v["hidden"] * 2 + TOPK_BYTES + (EAGLE3_AUX_LAYERS * v["hidden"] * 2 if eagle3 else 0)


def read_bytes_per_token(v: dict, backbone: str) -> int:
    """Bytes of a cached token one backbone's training reads: EAGLE-2 and HASS the LM head's input and
    its top-10; EAGLE-3 also the three aux layers (drafters/train/eagle3.py)."""
    return feature_bytes_per_token(v, backbone == "eagle3")


def forward_flops_per_token(v: dict, backbone: str) -> float:
    """FLOPs of one drafter pass over a token without the backward (held-out evaluation): a third of one
    training pass (2 of 6 per parameter, the head forward only)."""
    if backbone == "eagle3":
        return (train_flops_per_token(v, backbone, 1) - 2 * v["hidden"] * v["vocab"]) / 3 / EAGLE3_TTT_STEPS
    return train_flops_per_token(v, "eagle2", 1) / 3
