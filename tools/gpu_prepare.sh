#!/usr/bin/env bash
# Prepare the first GPU run, here (a machine with PyPI), for the device machine
# (Python 3.12, torch with CUDA, no registry, none of the transport's packages).
#
#   bash tools/gpu_prepare.sh            # download and build into .gpu/, then say what to carry
#   bash tools/gpu_prepare.sh --dry-run  # print the plan; download and build nothing
#   bash tools/gpu_prepare.sh --check    # is .gpu/ complete? (exit 1 if not)
#
# What .gpu/ (git-ignored) holds:
#   wheels/  the cp312 manylinux wheels of what rte needs and that image lacks
#            (posix_ipc, cffi with pycparser, msgspec), one version each;
#   shm/     shm's compiled module for CPython 3.12: built with a python3.12 when
#            this machine has one, else the checkout's own (cffi builds it against
#            the stable ABI, `.abi3.so`, so one build loads on 3.11 and 3.12 alike);
#   PLAN     what was fetched and built, and how.
# Then: run(command="bash tools/gpu_run.sh", carry=[".gpu"], timeout_s=600).
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=${GPU_PREPARE_DIR:-.gpu}
PY_VERSION=3.12
# What the daemon path imports that the device image lacks (psutil, numpy, pytest,
# pytest-timeout and hypothesis are there; see the device tool's KINDS.md).
PACKAGES=(posix_ipc cffi pycparser msgspec)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)
PIP=${PIP:-python3 -m pip}
if [[ -x .venv/bin/python ]]; then PIP=${PIP_OVERRIDE:-.venv/bin/python -m pip}; fi

mode=${1:-prepare}
case "$mode" in
    prepare | --dry-run | --check) ;;
    *) echo "usage: $0 [--dry-run | --check]" >&2; exit 2 ;;
esac

platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
download=($PIP download --no-deps --only-binary=:all: --python-version "$PY_VERSION"
    --implementation cp "${platform_args[@]}" -d "$DIR/wheels" "${PACKAGES[@]}")

# A working CPython 3.12 here, to build shm's module with (PYTHON312 names one);
# empty when there is none (a pyenv shim that refuses does not count).
find_python312() {
    local candidate
    for candidate in ${PYTHON312:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
        if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
}
PY312=$(find_python312)

carry_line() {
    echo "carry: [\"$DIR\"]"
    echo "run:   bash tools/gpu_run.sh   (on the device; timeout_s=600; everything lands in \$OUT)"
}

check() {
    local missing=0 name count
    for name in "${PACKAGES[@]}"; do
        count=$(find "$DIR/wheels" -maxdepth 1 -iname "${name//_/[_-]}-*.whl" 2>/dev/null | wc -l)
        if [[ $count -ne 1 ]]; then
            echo "missing: $DIR/wheels/$name-*.whl ($count found; need exactly one)"
            missing=1
        fi
    done
    for wheel in "$DIR"/wheels/*.whl; do
        [[ -e $wheel ]] || continue
        case "$(basename "$wheel")" in
            *-cp312-*manylinux*x86_64*.whl | *-abi3-*manylinux*x86_64*.whl | *-py3-none-any.whl) ;;
            *) echo "wrong platform: $wheel (needs cp312 manylinux x86_64 or pure Python)"; missing=1 ;;
        esac
    done
    if ! compgen -G "$DIR/shm/_native*.so" >/dev/null; then
        echo "missing: $DIR/shm/_native.abi3.so (shm's compiled module)"
        missing=1
    fi
    return $missing
}

if [[ $mode == --dry-run ]]; then
    echo "plan (nothing is downloaded or built):"
    echo "  into: $DIR/wheels"
    echo "  download: ${download[*]}"
    if [[ -n $PY312 ]]; then
        echo "  build: shm/_build.py with $PY312, cffi from the wheel above -> $DIR/shm/"
    else
        echo "  build: no python$PY_VERSION here: copy shm/_native.abi3.so (stable ABI) -> $DIR/shm/"
    fi
    carry_line
    exit 0
fi

if [[ $mode == --check ]]; then
    if check; then echo "$DIR is complete"; carry_line; exit 0; fi
    echo "$DIR is incomplete: run bash tools/gpu_prepare.sh"
    exit 1
fi

rm -rf "$DIR/wheels" "$DIR/shm"
mkdir -p "$DIR/wheels" "$DIR/shm"
echo "downloading: ${PACKAGES[*]} (cp$PY_VERSION manylinux x86_64)"
"${download[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

built="copied from the checkout (stable ABI)"
if [[ -n $PY312 ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # setuptools only to build here (cffi needs it on 3.12; the device has its own)
    if $PIP download -q --no-deps --only-binary=:all: -d "$work/tools" setuptools >"$work/log" 2>&1 &&
        "$PY312" -m pip install -q --no-index --no-deps --target "$work/site" "$work"/tools/*.whl \
            "$DIR"/wheels/cffi-*.whl "$DIR"/wheels/pycparser-*.whl >>"$work/log" 2>&1 &&
        PYTHONPATH="$work/site:shm" "$PY312" -c \
            "import _build; _build.ffibuilder.compile(tmpdir='$work/build')" >>"$work/log" 2>&1; then
        cp "$work"/build/shm/_native*.so "$DIR/shm/"
        built="built with $("$PY312" -V)"
    else
        echo "the cp$PY_VERSION build failed (see below); copying the checkout's abi3 module"
        tail -5 "$work/log"
    fi
fi
if ! compgen -G "$DIR/shm/_native*.so" >/dev/null; then
    if ! compgen -G "shm/_native*.abi3.so" >/dev/null; then
        echo "no shm/_native.abi3.so to copy: build it first (pip install -e .)" >&2
        exit 1
    fi
    cp shm/_native*.abi3.so "$DIR/shm/"
fi
{
    echo "prepared $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)"
    echo "shm module: $(basename "$DIR"/shm/_native*.so), $built"
    (cd "$DIR/wheels" && ls -1 ./*.whl)
} >"$DIR/PLAN"
cat "$DIR/PLAN"
check
du -sh "$DIR" | awk '{print "size: " $1 " (the working tree that travels may be 64 MiB in all)"}'
carry_line
