#!/usr/bin/env bash
# The long-input task: paragraph-level G2P (lines of 32-128 CMUdict words), warm-started from a word-level G2P model
# (the main job's outputs/g2p) and trained in three stages of growing line length, each starting from the last:
# lines of 2-8 words (STAGE1, default 5m), 8-32 words (STAGE2, 5m), then 32-128 words (STAGE3, 50m): an hour in all.
# What makes it learn and read any length (docs/long_inputs.md):
# - word-aligned positions (--word_positions): each token at 64 x its word's index + its offset in the word;
# - word indices modulo 64 words (word_position_period), each line at a random phase in training
#   (word_position_shift=63), so that a line of any length has the positions of the training lines;
# - cross-attention within a window of words (cross_attention_words=1): a target word reads its own source word and
#   the words beside it, so that it cannot lose its place.
# The task's recipe (vaswani.training.recipes) trains each stage: Muon at 4e-3, decaying linearly to zero in the stage.
#   bash scripts/paragraph_job.sh outputs/g2p outputs/paragraph-local \
#       encoder_attention_pattern=local,decoder_attention_pattern=local,attention_window=64
#   bash scripts/paragraph_job.sh outputs/g2p outputs/paragraph-full ""
# The third argument: config overrides (the attention pattern); arguments after it go to every stage's
# scripts/train.py. The model is in OUTPUT/words-32-128; each stage's folder is a model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
init=$1
out=$2
overrides=max_position_embeddings=2048,cross_attention_words=1,word_position_period=64,word_position_shift=63${3:+,$3}
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
