#!/usr/bin/env bash
# The overhead benchmark on a CUDA device: same harness, same ratios (benchmarks/overhead.py
# --device cuda), for a lent GPU machine that has python3 with a CUDA torch but cannot
# download anything.
#
# 1. Here (with the package index), once:   benchmarks/gpu.sh prepare
#    downloads the wheels the GPU image lacks into benchmarks/.whl (ours) and
#    benchmarks/.whl-ref (Cockpit 1.0.2 and setuptools<81); both folders are git-ignored.
# 2. There:                                  bash benchmarks/gpu.sh [overhead.py options]
#    with the device tool: carry ["benchmarks/.whl", "benchmarks/.whl-ref"], timeout ~590 s.
#    Results go to $OUT (if set) or benchmarks/results, as overhead_cuda.{json,md}.
#
# Defaults keep the run inside one 10-minute command: presets only, mlp and cnn, every
# step and every 16th step, plus Cockpit 1.0.2 when its wheels are there. Pass options to
# change that, e.g. `bash benchmarks/gpu.sh --configs presets,quantities --problems cnn`.
# Environment: PYTHON (default python3), GPU_BENCH_MINUTES (default 8: no new
# configuration starts after that, so results are written before the command's limit);
# for trying the script without a GPU: GPU_BENCH_DEVICE=cpu, GPU_BENCH_WHL(_REF) (wheel
# folders), GPU_BENCH_PY_VERSION (Python version of the wheels `prepare` downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHL="${GPU_BENCH_WHL:-benchmarks/.whl}"
WHL_REF="${GPU_BENCH_WHL_REF:-benchmarks/.whl-ref}"
DEVICE="${GPU_BENCH_DEVICE:-cuda}"  # cpu only to try this script without a GPU
PY_VERSION="${GPU_BENCH_PY_VERSION:-3.12}"  # Python of the GPU image

if [[ "${1:-}" == "prepare" ]]; then
    # Versions as in the project's environment; the image has Python 3.12.
    dl=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION"
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64)
    "${dl[@]}" -d "$WHL" backpack-for-pytorch==1.7.1 unfoldNd==0.2.3 pydantic==2.14.4 \
        pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 json-tricks==3.17.3
    "${dl[@]}" -d "$WHL_REF" cockpit-for-pytorch==1.0.2 setuptools==80.10.2
    ls -l "$WHL" "$WHL_REF"
    exit 0
fi

if [[ "$DEVICE" == cuda ]]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "gpu.sh: torch of $PY sees no CUDA device" >&2
        exit 2
    }
fi
SITE=/tmp/cockpit-bench-site
mkdir -p "$SITE"
if ! "$PY" -c "import backpack, pydantic, pluggy, json_tricks, yaml, scipy, matplotlib" 2>/dev/null; then
    if ! compgen -G "$WHL/*.whl" >/dev/null; then
        echo "gpu.sh: packages are missing and $WHL holds no wheels: run 'benchmarks/gpu.sh prepare' where pip can download, and carry $WHL" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHL"/*.whl
fi
# cockpit_core and every plugin, installed (not editable) so that entry points are found.
projects=(.)
for d in plugins/cockpit-*/; do
    [[ -f "$d/pyproject.toml" ]] && projects+=("$d")
done
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" "${projects[@]}"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

ref_args=()
if compgen -G "$WHL_REF/*.whl" >/dev/null; then
    REF_SITE=/tmp/cockpit-ref-site
    mkdir -p "$REF_SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$REF_SITE" "$WHL_REF"/*.whl
    # A python for the reference: its own site first (Cockpit 1.0.2, setuptools<81), then
    # the shared site (BackPACK, json-tricks; the project's packages there go unused).
    cat >/tmp/cockpit-ref-python <<EOF
#!/usr/bin/env bash
PYTHONPATH="$REF_SITE:$SITE" exec "$(command -v "$PY")" "\$@"
EOF
    chmod +x /tmp/cockpit-ref-python
    ref_args=(--reference-python /tmp/cockpit-ref-python)
fi

out_dir="${OUT:-benchmarks/results}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
PYTHONUNBUFFERED=1 "$PY" benchmarks/overhead.py --device "$DEVICE" --problems mlp,cnn --configs presets \
    --output-dir "$out_dir" --name "overhead_$DEVICE" --max-minutes "${GPU_BENCH_MINUTES:-8}" \
    --steps mlp=100,cnn=30 --plain-steps mlp=200,cnn=60 --periods mlp=4,cnn=3 \
    --reference-steps mlp=30,cnn=10 --reference-periods mlp=2,cnn=2 \
    "${ref_args[@]}" "$@"
