#!/usr/bin/env bash
# Creates .venv (once) with the CPU build of torch and vaswani installed in editable mode (with its console
# scripts, .venv/bin/vaswani-*).
# torch is pinned here, not in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# (Re)installs when the package, its console scripts or a dev tool are missing, e.g. a .venv from before
# vaswani.data or pytest-xdist.
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/vaswani-train ] \
        || [ ! -x .venv/bin/vaswani-pseudo-label ] \
        || ! .venv/bin/python -c "import vaswani.data, torch, transformers, xdist" 2>/dev/null; then
    "$PY" -m venv .venv
    .venv/bin/pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import vaswani, torch, transformers; print('environment ready: torch', torch.__version__, 'transformers', transformers.__version__)"
fi
