#!/usr/bin/env bash
# The test suite, offline and single-threaded (tiny models run many times faster on one thread).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One worker process per core, at most 4 (pytest-xdist, each worker on one thread); an idle worker takes tests queued
# on a busy one (`worksteal`: a few test files hold most of the suite's time). Arguments come after these: `-n 0`
# runs every test in this process, as a debugger wants.
workers=$(nproc 2>/dev/null || echo 1)
[ "$workers" -gt 4 ] && workers=4
exec .venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
