#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (Python 3.12, x86-64 Linux) into .gpu/wheels.
#   bench/gpu/download.sh            both lists: MLX with its CUDA backend, and the suite's
# The GPU machine's image already holds numpy, transformers, tokenizers, pytest and the
# NVIDIA libraries; these lists name only what it lacks (versions as in a local venv).
# Any Python with pip does: PYTHON, else the repository's .venv, else python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python=python3
fi
"$python" -m pip --version >/dev/null 2>&1 || {
    echo "Error: $python has no pip. Hint: PYTHON=/path/to/python-with-pip $0" >&2
    exit 1
}
dest=.gpu/wheels
mkdir -p "$dest"
platforms=()
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
    manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64 linux_x86_64; do
    platforms+=(--platform "$p")
done
failed=()
for spec in $(cat bench/gpu/requirements-mlx.txt bench/gpu/requirements-suite.txt); do
    if ! "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$dest" "$spec" >/dev/null 2>&1; then
        failed+=("$spec")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "Error: no Python 3.12 x86-64 Linux wheel for: ${failed[*]}" >&2
    exit 1
fi
echo "$(ls "$dest" | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1))"
