#!/usr/bin/env bash
# The GPU kit, one command on the GPU machine (benchmarks/gpu/README.md): install transformers and bitsandbytes from
# .gpu/ (no registry), then each step of steps.py in its own process with its own cap, cheapest first, within
# GPU_BUDGET_S (480 s). GPU_REHEARSAL=1: the same steps on the CPU with tiny models (caps x GPU_CAP_SCALE, 3);
# GPU_STEPS="env bf16": only those steps; GPU_NO_INSTALL=1: use what is installed.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # engine/ and benchmarks/ without an install
START=$(date +%s)
PY=${PYTHON:-python3}
if [ -n "${GPU_REHEARSAL:-}" ]; then
    MODE=--rehearsal
    BUDGET=${GPU_BUDGET_S:-1800}  # a busy 2-core CPU runs each step in minutes (imports mostly), not seconds
    SCALE=${GPU_CAP_SCALE:-3}
    SITE=${GPU_SITE:-$(mktemp -d)/site}
    OUT=${OUT:-./out/gpu-rehearsal}
else
    MODE=
    BUDGET=${GPU_BUDGET_S:-480}
    SCALE=${GPU_CAP_SCALE:-1}
    SITE=${GPU_SITE:-/tmp/site}
    OUT=${OUT:-./out/gpu}
fi
mkdir -p "$OUT"
LOGS=$(mktemp -d)
echo "gpu kit: results in $OUT, logs in $LOGS, budget ${BUDGET}s${MODE:+ (rehearsal on the CPU)}"

elapsed() { echo $(( $(date +%s) - START )); }

# -- install: the wheels with pip (no index, no dependencies), bitsandbytes' trimmed folder copied beside them ---
if [ -z "${GPU_NO_INSTALL:-}" ]; then
    if ! ls .gpu/transformers-*.whl >/dev/null 2>&1 || [ ! -d .gpu/bitsandbytes-site ]; then
        echo "gpu kit: .gpu/ is missing or incomplete: run bash benchmarks/gpu/prepare.sh and carry .gpu" >&2
    else
        mkdir -p "$SITE"
        for wheel in .gpu/*.whl; do  # one at a time: the cp312 regex wheel does not install on a rehearsal's 3.11
            "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$wheel" \
                >> "$LOGS/install.log" 2>&1 || echo "gpu kit: $wheel did not install" | tee -a "$LOGS/install.log"
        done
        cp -r .gpu/bitsandbytes-site/. "$SITE/" >> "$LOGS/install.log" 2>&1
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        "$PY" benchmarks/gpu/record.py install --rc 0 --wall "$(elapsed)" --cap 0 \
            --log "$LOGS/install.log" --out "$OUT"
    fi
fi

# -- the steps: each starts only with MIN_LEFT_S of the budget left (default: its cap), capped by what is left -----
run_step() {  # NAME CAP_S [MIN_LEFT_S]
    local name=$1 cap=$(( $2 * SCALE )) need=$(( ${3:-$2} * SCALE )) left started rc
    case " ${GPU_STEPS:-$name} " in *" $name "*) ;; *) return ;; esac
    left=$(( BUDGET - $(elapsed) ))
    if [ "$left" -lt "$need" ]; then
        echo "gpu kit: skip $name (${left}s left, needs ${need}s)"
        "$PY" benchmarks/gpu/record.py "$name" --rc -1 --wall 0 --cap 0 --out "$OUT"
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "gpu kit: $name (cap ${cap}s, $(elapsed)s elapsed)"
    started=$(date +%s)
    timeout -k 10 "$cap" "$PY" benchmarks/gpu/steps.py --step "$name" --out "$OUT" $MODE > "$LOGS/$name.log" 2>&1
    rc=$?
    echo "gpu kit: $name exit $rc after $(( $(date +%s) - started ))s"
    "$PY" benchmarks/gpu/record.py "$name" --rc "$rc" --wall "$(( $(date +%s) - started ))" --cap "$cap" \
        --log "$LOGS/$name.log" --out "$OUT"
}

run_step env 60 20
run_step preflight 90 40
run_step bf16 150 80
run_step 8bit 100 60
run_step 4bit 100 60
run_step static_tiny 120 60
run_step static_26b 300 120
echo "gpu kit: done in $(elapsed)s; files:"
ls -l "$OUT"
