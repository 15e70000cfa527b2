#!/usr/bin/env bash
# The one command for a lent GPU machine (the `device` tool): gpu_check.py (flash-attention-2 and SDPA against
# eager in bf16, padded), gpu_benchmark.py (base and big sizes) and gpu_patterns.py (the long-input attention
# patterns on flash and flex attention: agreement with eager, training-step time against source length), logs and
# JSON into $OUT. GPU_RUN_PARTS picks some of them (default "check benchmark patterns"; e.g. GPU_RUN_PARTS=patterns
# for a short call).
#
# That machine has CUDA PyTorch but transformers 5.17 and no network, so carry transformers as wheels. transformers
# 5.25 needs huggingface_hub >= 2.4 (with httpx2, httpcore2, truststore, click >= 8.4.2) and kernels (with tomlkit),
# none of which that machine had on 4 Dec 2026; the versions of this venv:
#   here, once:  echo /.whl/ >> .git/info/exclude
#                for p in transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 tokenizers==0.23.3 \
#                    httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 click==8.5.1 tomlkit==0.15.3; do
#                  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#                    -d .whl "$p"; done
#   device:      run(command="bash scripts/gpu_run.sh", carry=[".whl"], timeout_s=600)
# This package is not built there: its three folders are copied into a `vaswani` package under $SITE (the layout
# pyproject's package-dir gives), so no build backend is needed.
#
# GPU_RUN_SMOKE=1 runs both scripts on the CPU at the tiny size (the suite's test of this file); PYTHON picks the
# interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
site=${SITE:-/tmp/site}
python=${PYTHON:-python3}
mkdir -p "$out" "$site/vaswani"

if [ -z "${GPU_RUN_SMOKE:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then  # wheels for that machine's Python
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "gpu_run: installing the carried wheels failed" >&2; exit 1; }
fi
cp modeling/*.py "$site/vaswani/" && cp -r tokenizer training "$site/vaswani/" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

if [ -n "${GPU_RUN_SMOKE:-}" ]; then
    check_args=(--device cpu --preset tiny --vocab_size 100 --batch 4 --src_len 9 --tgt_len 7)
    bench_args=(--device cpu --dtype float32 --sizes tiny --vocab_size 100 --batch 4 --length 8 --rounds 1
                --new_tokens 4 --peak_n 256)
    pattern_args=(--device cpu --preset tiny --vocab_size 100 --window 3 --block 4 --batch 2 --src_len 20
                  --tgt_len 6 --lengths 32 64)
else
    check_args=()
    bench_args=()
    pattern_args=()
    nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt"
fi

"$python" - <<'EOF' 2>&1 | tee "$out/versions.txt" || exit 1
import torch, transformers, vaswani
device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, vaswani from {vaswani.__file__}, {device}")
EOF
status=0
parts=" ${GPU_RUN_PARTS:-check benchmark patterns} "
if [[ $parts == *" check "* ]]; then
    timeout 150 "$python" scripts/gpu_check.py "${check_args[@]}" 2>&1 | tee "$out/gpu_check.log" || status=1
fi
if [[ $parts == *" benchmark "* ]]; then
    timeout 270 "$python" scripts/gpu_benchmark.py "${bench_args[@]}" --output "$out/gpu_benchmark.json" 2>&1 \
        | tee "$out/gpu_benchmark.log" || status=1
fi
if [[ $parts == *" patterns "* ]]; then
    timeout "${GPU_PATTERNS_LIMIT:-300}" "$python" scripts/gpu_patterns.py "${pattern_args[@]}" \
        --output "$out/gpu_patterns.json" 2>&1 \
        | tee "$out/gpu_patterns.log" || status=1
fi
exit $status
