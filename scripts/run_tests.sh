#!/usr/bin/env bash
# The test suite, offline and single-threaded (tiny models run many times faster on one thread).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q "$@"
