#!/usr/bin/env bash
# The long-input task: paragraph-level G2P (lines of 32-128 CMUdict words), warm-started from a word-level G2P model
# (the main job's outputs/g2p) and trained in three stages of growing line length, each starting from the last:
# lines of 2-8 words (STAGE1, default 5m), 8-32 words (STAGE2, 5m), then 32-128 words (STAGE3, 50m): an hour in all.
# Every stage places tokens at word-aligned positions (--word_positions), without which the models do not learn the
# task in an hour; from the word model straight to 32-128-word lines, the loss stalls where a model ignores the
# source, and short lines first teach it to move along the source (docs/long_inputs.md).
#   bash scripts/paragraph_job.sh outputs/g2p outputs/paragraph-local \
#       encoder_attention_pattern=local,decoder_attention_pattern=local,attention_window=64 --eval_every 250
#   bash scripts/paragraph_job.sh outputs/g2p outputs/paragraph-full "" --eval_every 250
# The third argument: config overrides (the attention pattern); arguments after it go to every stage's
# scripts/train.py. The model is in OUTPUT/words-32-128; each stage's folder is a model too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
init=$1
out=$2
overrides=max_position_embeddings=2048${3:+,$3}
shift $(( $# < 3 ? $# : 3 ))
stages=("2 8 ${STAGE1:-5m} 20000" "8 32 ${STAGE2:-5m} 20000" "32 128 ${STAGE3:-50m} 2500")
for stage in "${stages[@]}"; do
    read -r low high budget lines <<< "$stage"
    HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1} \
        .venv/bin/python scripts/train.py --task g2p-paragraph --init_from "$init" --paragraph_words "$low" "$high" \
        --paragraph_lines "$lines" 50 --time_budget "$budget" --output_dir "$out/words-$low-$high" \
        --config_overrides "$overrides" --word_positions "$@"
    init="$out/words-$low-$high"
done
