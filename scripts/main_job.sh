#!/usr/bin/env bash
# The main job: set up the environment (once), train the default grapheme-to-phoneme model on CMUdict within a
# bounded time, print dev WER/PER and the pronunciations of words that are not in the training data.
#   bash scripts/main_job.sh                 # 15 minutes, output in outputs/g2p
#   TIME_BUDGET=1h OUTPUT_DIR=outputs/g2p-1h bash scripts/main_job.sh
# Extra arguments go to scripts/train.py (e.g. --num_beams 4). Rerunning after an interruption resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
OUTPUT_DIR=${OUTPUT_DIR:-outputs/g2p}
RESUME=()
if compgen -G "$OUTPUT_DIR/checkpoints/checkpoint-*" > /dev/null; then RESUME=(--resume); fi
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1} \
    .venv/bin/python scripts/train.py --time_budget "${TIME_BUDGET:-15m}" --output_dir "$OUTPUT_DIR" "${RESUME[@]}" "$@"
