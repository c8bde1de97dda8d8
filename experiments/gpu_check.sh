#!/usr/bin/env bash
# The GPU check, as is, on a machine with one GPU and only this repository (docs/gpu-check.md):
#   bash experiments/gpu_check.sh          # one CUDA GPU: Llama-3-8B-shaped verifier, bf16 training, every strategy
#   bash experiments/gpu_check.sh --dry    # the same code path on the CPU, small shape (what the test suite runs)
#   ... --no-train                          # no Ray Train/DeepSpeed: the drafter trains in this process (torch only)
# Extra arguments go to experiments/gpu_check.py (e.g. --layers 16, --max-new-tokens 32).
# It runs with the project's .venv where there is one, else PYTHON, else python3 (named before anything
# is installed into it: experiments/gpu_env.sh), installs what is missing with pip (torch from the
# package index's default build, which is CUDA on Linux; the project with the GPU image's pins,
# docker/constraints.txt), then builds the verifier and the data on the spot: no GGUF file, no
# ../shared, no Hugging Face download.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
if [[ "${1:-}" == "--dry" ]]; then
  mode=dry
  shift
fi
source experiments/gpu_env.sh
gpu_env_setup "$mode"
# what decoding imports (torch, transformers and the project's own packages), and what the Ray Train row adds
DECODE_NEEDS="import transformers, safetensors, tokenizers, yaml, decoding, drafters"
TRAIN_NEEDS="import ray.train, deepspeed, accelerate, pyarrow, workers"
trainer=ray
for a in "$@"; do
  [[ "$a" == "--no-train" || "$a" == "torch" || "$a" == "--trainer=torch" ]] && trainer=torch
done
if ! "$PY" -c "$DECODE_NEEDS" 2>/dev/null; then
  echo "[gpu-check] installing the project and its pinned dependencies"
  gpu_install_project || {
    echo "[gpu-check] error: transformers or the project's packages cannot be imported and pip could not" \
      "install them (no package index here?). Make wheels where pip works (bash experiments/gpu_wheels.sh .whl)," \
      "carry .whl, and run GPU_CHECK_WHEELS=.whl bash experiments/gpu_check.sh" >&2
    exit 2
  }
fi
extra=()
if [[ "$trainer" == ray ]] && ! "$PY" -c "$TRAIN_NEEDS" 2>/dev/null; then
  echo "[gpu-check] installing Ray Train and DeepSpeed (the project's pins)"
  if ! gpu_install_project || ! "$PY" -c "$TRAIN_NEEDS" 2>/dev/null; then
    echo "[gpu-check] Ray Train or DeepSpeed cannot be imported and pip could not install them: training" \
      "in this process with torch alone (--trainer torch); the Ray Train + DeepSpeed row is not run"
    extra=(--trainer torch)
  fi
fi

if [[ "$mode" == dry ]]; then
  # small shape, few steps, CPU; the CPU matmul tuner stays off (a GPU never runs it)
  export TASKSPEC_CPU_SPEED=0
  exec "$PY" experiments/gpu_check.py --standalone --device cpu --shape small --n-prompts 1 \
    --max-new-tokens 32 --train-examples 32 --train-batch 2 --train-steps 32 --train-lr 3e-3 "${extra[@]}" "$@"
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "[gpu-check] error: torch sees no CUDA device (nvidia-smi? a CPU build of torch?); --dry runs on the CPU" >&2
  exit 2
fi
exec "$PY" experiments/gpu_check.py --standalone --device cuda --shape llama3-8b --n-prompts 2 "${extra[@]}" "$@"
