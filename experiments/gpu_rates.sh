#!/usr/bin/env bash
# The paper plan's GPU rates on a machine with one GPU and only this repository (docs/cluster.md,
# "GPU rates"): experiments/gpu_rates.py on the full Llama-3-8B shape, its rates file for
#   python experiments/full_grid.py --profile paper --dry-run --rates FILE
#   bash experiments/gpu_rates.sh [--out FILE]     # one CUDA GPU; <= 8 minutes on one H100, installs included
#   bash experiments/gpu_rates.sh --dry [...]      # the same code on the CPU at a tiny shape (the test suite's)
# Without a package index: make wheels where pip works (bash experiments/gpu_wheels.sh .whl), carry .whl,
# and run GPU_CHECK_WHEELS=.whl bash experiments/gpu_rates.sh. The interpreter: PYTHON, else the
# project's .venv, else python3, named before anything is installed into it (experiments/gpu_env.sh).
# Extra arguments go to experiments/gpu_rates.py (e.g. --parts eval,train --budgets eval=120).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
if [[ "${1:-}" == "--dry" ]]; then
  mode=dry
  shift
fi
source experiments/gpu_env.sh
gpu_env_setup "$mode"
NEEDS="import transformers, safetensors, tokenizers, yaml, deepspeed, decoding, drafters, orchestrator"
if ! "$PY" -c "$NEEDS" 2>/dev/null; then
  echo "[gpu-rates] installing the project and its pinned dependencies into $PY"
  gpu_install_project && "$PY" -c "$NEEDS" || {
    echo "[gpu-rates] error: transformers, DeepSpeed or the project's packages cannot be imported and pip could" \
      "not install them (no package index here?). Make wheels where pip works (bash experiments/gpu_wheels.sh" \
      ".whl), carry .whl, and run GPU_CHECK_WHEELS=.whl bash experiments/gpu_rates.sh" >&2
    exit 2
  }
fi
export PYTHONUNBUFFERED=1
if [[ "$mode" == dry ]]; then
  # a tiny shape and few steps on the CPU; the CPU matmul tuner stays off (a GPU never runs it)
  export TASKSPEC_CPU_SPEED=0
  exec "$PY" experiments/gpu_rates.py --device cpu --shape small --n-prompts 1 --max-new-tokens 4 \
    --tree 4 4 16 --packing 1,2 --train-tokens 8,16 --train-steps 1 --feature-examples 6 "$@"
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "[gpu-rates] error: torch sees no CUDA device (nvidia-smi? a CPU build of torch?); --dry runs on the CPU" >&2
  exit 2
fi
exec "$PY" experiments/gpu_rates.py --device cuda --shape llama3-8b "$@"
