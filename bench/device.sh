#!/usr/bin/env bash
# One command for a lent GPU (issue 27, item 6): parity on CUDA in fp32 / bf16 / fp16, the
# benchmarks in fp32 and bf16 with a PASS/MISS goal table, results in bench/results/.
#
#   bash bench/device.sh                  # on the GPU machine: cuda, GPT-2-small shape, < 8 min
#   bash bench/device.sh --device cpu     # here and in CI: the 2-layer toy shapes, ~30 s
#   bash bench/device.sh --parts forward,cache --dtypes bf16    # any bench/device.py flag
#
# What it sets up (see bench/README.md, "On a GPU"):
#   python   $PYTHON if set, else the clone's .venv, else python3 (on the device machine the
#            image's python3 has torch, transformers, einops, jaxtyping, safetensors, tokenizers:
#            every core need of interp_gpt but plotly, which only the figures import);
#            interp_gpt itself is imported from this tree (PYTHONPATH), nothing is installed;
#   wheels   if .whl/ holds wheels (transformer-lens 3.9, sae-lens and what they need, carried with
#            the run tool's `carry: [".whl"]`), they are installed offline into a temporary folder
#            first; without them the transformer-lens and sae-lens comparisons print N/A and why;
#   time     DEVICE_BUDGET seconds (default 400) for bench/device.py, which stops starting parts
#            past it and still writes its results; each part and dtype also has --part-timeout
#            (150 s); `timeout` kills the whole run at DEVICE_BUDGET + 30 s if it hangs anyway; with the
#            60 s of tests and the wheels' install the whole stays under 8 minutes;
#   tests    on cuda, first the tests that only run with a GPU (tests/test_tl_surface2.py -k cuda)
#            with pytest (DEVICE_PYTEST=0 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

device=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --device) device="${args[$((i + 1))]:-}" ;;
        --device=*) device="${args[$i]#--device=}" ;;
    esac
done

if [[ -n "${PYTHON:-}" ]]; then
    py=$PYTHON
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    py=$ROOT/.venv/bin/python
else
    py=python3
fi

site=""
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    site=$(mktemp -d /tmp/interp-gpt-site.XXXXXX)
    echo "installing $(ls "$ROOT"/.whl/*.whl | wc -l) carried wheels into $site (offline)"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$ROOT"/.whl/*.whl
fi
export PYTHONPATH="$ROOT${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
[[ -z "$device" ]] && device=$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
if [[ "$device" == cpu ]]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # the shared 2-core machine: one thread, steady ratios
fi
budget=${DEVICE_BUDGET:-400}
echo "bench/device.sh: python $py, device $device, budget $budget s"

if [[ "$device" == cuda* && "${DEVICE_PYTEST:-1}" == 1 ]]; then
    echo "== pytest on $device: the CUDA-only tests =="
    timeout 60 "$py" -m pytest -q -p no:cacheprovider tests/test_tl_surface2.py -k cuda \
        || echo "pytest on $device: FAILED or timed out (exit $?); the benchmarks run on"
fi

start=$SECONDS
rc=0
timeout $((budget + 30)) "$py" bench/device.py --budget "$budget" "$@" || rc=$?
echo "bench/device.sh: exit $rc after $((SECONDS - start)) s"
[[ -n "$site" ]] && rm -rf "$site"
exit $rc
