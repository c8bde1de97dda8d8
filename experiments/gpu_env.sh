# Sourced by experiments/gpu_check.sh and experiments/gpu_rates.sh (not run alone): picks the Python
# the GPU scripts run with and installs what it lacks, saying where before it installs anything.
#   PYTHON set     -> that interpreter, as the user asked;
#   ./.venv exists -> the project's own environment (make venv), never the system's;
#   otherwise      -> python3 on PATH, named (with its version and site) before anything goes into it.
# GPU_CHECK_WHEELS=DIR: a machine without a package index installs experiments/gpu_wheels.sh's wheels
# into a folder of its own ($TMPDIR/gpu-check-site) put first on PYTHONPATH, not into the interpreter.
# Reads $1 as the mode: "dry" (CPU) installs no torch from the index (a CPU one must be there).
# Sets PY; exits 2 with one line when something cannot be installed.
gpu_env_setup() {
  local mode="$1"
  if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
  elif [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
  else
    PY=python3
    local site
    site=$("$PY" -c 'import sys, sysconfig; print(sys.version.split()[0], sysconfig.get_paths()["purelib"])' \
      2>/dev/null || echo "?")
    echo "[gpu] no .venv here and PYTHON unset: using $(command -v "$PY") (Python $site); what is missing" \
      "is installed there (set PYTHON=... to choose another interpreter)"
  fi
  if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
    [[ -f "$GPU_CHECK_WHEELS/ray.tar.xz" ]] || { echo "[gpu-check] error: GPU_CHECK_WHEELS=$GPU_CHECK_WHEELS" \
      "has no ray.tar.xz (make it with: bash experiments/gpu_wheels.sh $GPU_CHECK_WHEELS)" >&2; exit 2; }
    local wheel_site="${TMPDIR:-/tmp}/gpu-check-site"
    echo "[gpu-check] installing the wheels in $GPU_CHECK_WHEELS into $wheel_site (no package index)"
    mkdir -p "$wheel_site"
    tar xJf "$GPU_CHECK_WHEELS/ray.tar.xz" -C "$wheel_site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$wheel_site" \
      "$GPU_CHECK_WHEELS"/*.whl
    export PYTHONPATH="$wheel_site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if ! "$PY" -c "import torch" 2>/dev/null; then
    [[ "$mode" == dry ]] && { echo "[gpu] error: $PY has no torch; the dry mode uses a CPU build" \
      "(make venv installs one)" >&2; exit 2; }
    echo "[gpu-check] installing torch into $PY"
    "$PY" -m pip install -q "torch>=2.6"
  fi
}

# the project and its pinned dependencies (docker/constraints.txt), editable, into $PY
gpu_install_project() {
  "$PY" -m pip install -q -c docker/constraints.txt -e . 2>/dev/null
}
