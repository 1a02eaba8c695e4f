#!/usr/bin/env bash
# The first GPU run, on the device machine, in one call (prepared here by
# tools/gpu_prepare.sh; see the README's GPU section):
#
#   run(command="bash tools/gpu_run.sh", carry=[".gpu"], timeout_s=600)
#
# 1. installs the carried wheels into a target directory put on PYTHONPATH, and
#    shm's compiled module into the checkout (it is git-ignored: it does not travel);
# 2. records the machine (env.txt);
# 3. runs tools/gpu_check's sections in order of value, each in a process of its
#    own with its own timeout, inside GPU_BUDGET_S seconds in all (the suite last,
#    bounded by what is left), gpu.json rewritten after each;
# and writes everything under $OUT: run.log, env.txt, gpu.json, sections.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${GPU_PREPARE_DIR:-.gpu}
SITE=${GPU_SITE:-/tmp/rte-site}
BUDGET=${GPU_BUDGET_S:-540} # of the call's 600 s: the rest for install and the transfers
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
start=$SECONDS

echo "== install ($DIR -> $SITE)"
if ! compgen -G "$DIR/wheels/*.whl" >/dev/null; then
    echo "no wheels in $DIR/wheels: run bash tools/gpu_prepare.sh here and carry $DIR"
    exit 3
fi
if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$DIR"/wheels/*.whl; then
    echo "installing the carried wheels failed"
    exit 3
fi
if ! compgen -G "shm/_native*.so" >/dev/null; then
    cp "$DIR"/shm/_native*.so shm/ || { echo "no shm module in $DIR/shm"; exit 3; }
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

echo "== machine"
{
    "$PY" - <<'EOF'
import platform
print("python", platform.python_version())
for name in ("numpy", "torch", "posix_ipc", "cffi", "msgspec", "psutil", "pytest"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", getattr(module, "VERSION", "?")))
    except Exception as exc:  # noqa: BLE001 - a report, not a check
        print(name, "MISSING:", exc)
try:
    import shm.native  # noqa: F401
    print("shm native: loads")
except Exception as exc:  # noqa: BLE001
    print("shm native: FAILS:", exc)
import torch
if torch.cuda.is_available():
    print("cuda", torch.version.cuda, torch.cuda.get_device_name(0))
else:
    print("cuda: not available")
EOF
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
        --format=csv 2>&1
} | tee "$OUT/env.txt"

left=$((BUDGET - (SECONDS - start)))
echo "== gpu_check (${left} s)"
timeout -k 10 "$left" "$PY" -m tools.gpu_check --isolate --budget $((left - 10)) \
    --out "$OUT/gpu.json" --log "$OUT/sections.log"
code=$?
echo "== summary (gpu_check exit $code, $((SECONDS - start)) s in all)"
"$PY" -m tools.gpu_check --summary "$OUT/gpu.json" || true
exit $code
