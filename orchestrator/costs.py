"""The dry run's stated assumptions: verifier sizes, GPU throughput, decoding constants, and the
FLOPs per training token they imply. Used where nothing measured is at hand (orchestrator/rates.py)."""
from __future__ import annotations

# Per-verifier constants: parameters, hidden size, vocabulary.
VERIFIERS = {
    "llama3-8b-instruct": {"params": 8.0e9, "hidden": 4096, "vocab": 128256},
    "smollm2-135m-instruct": {"params": 0.135e9, "hidden": 576, "vocab": 49152},
}
ASSUMPTIONS = {
    "tokens_per_example": {"mathinstruct": 350, "sharegpt": 900},  # after the chat template, capped by max_length
    "gpu_peak_flops": 312e12,  # A100 bf16 dense
    "mfu": 0.35,  # achieved fraction of peak in training / extraction
    "verify_step_seconds": 0.030,  # one tree pass of the 8B verifier on one A100 (memory-bound)
    "assumed_tau": 3.5,  # acceptance length used to turn generated tokens into verifier calls
    "generated_tokens_per_turn": 400,
    "feature_bytes_per_token": None,  # hidden * 2 (fp16) + top-10 ids/probs (60 bytes)
}


def drafter_params(v: dict) -> int:
    """Parameters of a one-layer drafter for verifier ``v``: fc + one decoder layer (approx.)."""
    return 2 * v["hidden"] ** 2 + 12 * v["hidden"] ** 2


EAGLE3_TTT_STEPS = 7  # drafters.eagle3.Eagle3Config.ttt_steps (kept torch-free here)


def train_flops_per_token(v: dict, backbone: str, hass_steps: int) -> float:
    """Training FLOPs per token of a drafter (forward + backward, the LM head included);
    HASS repeats the forward/backward ``hass_steps`` times. EAGLE-3 runs its fc (3H x H) once and
    its layer and head ``EAGLE3_TTT_STEPS`` times; its layer (q/k/v read 2H) is about 14H^2, as
    many as ``drafter_params``'s fc + layer, so one step costs what one EAGLE-2 pass does."""
    one = 6 * drafter_params(v) + 3 * 2 * v["hidden"] * v["vocab"]
    if backbone == "eagle3":
        return 6 * 3 * v["hidden"] ** 2 + EAGLE3_TTT_STEPS * one
    return hass_steps * one if backbone == "hass" else one
