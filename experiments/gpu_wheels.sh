#!/usr/bin/env bash
# Wheels for a GPU machine that has torch but no package index (docs/gpu-check.md, "How it ran"):
#   bash experiments/gpu_wheels.sh [DIR]     # here, where pip reaches the index; DIR defaults to .whl
# then, on the GPU machine, with DIR carried along in the repository:
#   GPU_CHECK_WHEELS=DIR bash experiments/gpu_check.sh
# What the GPU check imports beyond such an image (Python 3.12, torch, transformers, accelerate,
# pyarrow, yaml): Ray (its 79 MB wheel repacked without the Java jar, RLlib and the dashboard's source
# maps, as ray.tar.xz, ~30 MB), DeepSpeed (built here: PyPI has only its source), transformers at the
# pinned version, and their pure-Python needs. Versions: docker/constraints.txt where it pins them,
# else this environment's. Polars stays behind (the check does not import it; its runtime is 54 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
PYVER="${GPU_PYTHON_VERSION:-3.12}"  # the GPU machine's Python
mkdir -p "${1:-.whl}"
DIR=$(cd "${1:-.whl}" && pwd)

pin() {  # NAME -> NAME==VERSION from docker/constraints.txt, else from this environment
  local v
  v=$(grep -i "^$1==" docker/constraints.txt | cut -d= -f3 || true)
  [[ -z "$v" ]] && v=$("$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/ {print $2}')
  [[ -z "$v" ]] && { echo "gpu_wheels: no version of $1 in docker/constraints.txt or $PY" >&2; exit 2; }
  echo "$1==$v"
}

pkgs=()
for p in transformers pydantic pydantic-core annotated-types typing-inspection typing-extensions jsonschema \
         jsonschema-specifications referencing rpds-py hjson colorful tensorboardX; do
  pkgs+=("$(pin "$p")")
done
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux2014_x86_64 "${platforms[@]}" -d "$DIR" "${pkgs[@]}" "$(pin ray)"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$(pin deepspeed)"

ray_whl=$(ls "$DIR"/ray-*.whl)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && unzip -q "$ray_whl" && rm -rf ray/jars ray/rllib ray/llm \
  && rm -f ray/dashboard/client/build/static/js/*.map && tar cf - . | xz -T0 -6 > ray.tar.xz)
mv "$tmp/ray.tar.xz" "$DIR/ray.tar.xz"
rm -f "$ray_whl"
du -ch "$DIR"/* | tail -1
echo "gpu_wheels: $DIR is ready; carry it and run: GPU_CHECK_WHEELS=$DIR bash experiments/gpu_check.sh"
