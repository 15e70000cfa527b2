#!/usr/bin/env bash
# G2P by ensemble distillation, one command: three teachers, new words they pronounce, one student that learns from
# them (docs/recipes.md measures each part; the student is one model of the main job's size).
#   1. three teachers, the main job's recipe with batches of 1,500, 3,000 and 6,000 tokens (TEACHER_BUDGET each,
#      default 10m; TEACHER_TOKENS="1500 3000 6000" names the batch sizes, one teacher each): OUTPUT/teacher-1500,
#      -3000, -6000;
#      TEACHER_CONFIG (e.g. encoder_layers=6,decoder_layers=2) changes the three teachers' model
#      (scripts/train.py --config_overrides);
#      with WIDE_TEACHER_BUDGET set (e.g. 1h), one more teacher of another kind, 192 wide (FFN 768) with dropout 0.1,
#      trained that long: OUTPUT/teacher-wide;
#      TEACHER_JOBS=2 trains them two at a time, one queue each with half the cores (a small model makes more
#      updates per core on one thread than on two), the longest budgets first, each to the queue with the least;
#   2. WORDS (default 80000) new words one edit from a training word, pronounced by the teachers together
#      (vaswani-pseudo-label): OUTPUT/train_plus.tsv, the shipped training file followed by them;
#   3. the student (STUDENT_BUDGET, default 23m): the main job's recipe on that file, its loss a fifth the labels'
#      and four fifths the teachers' distribution at each target position (vaswani-train --teachers
#      --distill_alpha 0.8): OUTPUT/student.
# The defaults fill about an hour with start-ups and evaluations.
#   bash scripts/distill_job.sh outputs/g2p-distill
#   TEACHER_BUDGET=15m WIDE_TEACHER_BUDGET=1h WORDS=100000 STUDENT_BUDGET=30m bash scripts/distill_job.sh \
#       outputs/g2p-distill-2h30    # the 2.5-hour recipe of docs/recipes.md, about 2 h 20 min
# Arguments after OUTPUT go to the student's scripts/train.py. Rerunning after an interruption keeps the finished
# parts and resumes the one that was running.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a sizes <<< "${TEACHER_TOKENS:-1500 3000 6000}"
for tokens in "${sizes[@]}"; do
    [[ $tokens =~ ^[1-9][0-9]*$ ]] || { echo "distill_job: TEACHER_TOKENS must be batch sizes in tokens, e.g." \
        "TEACHER_TOKENS=\"1500 3000 6000\"; got '${TEACHER_TOKENS}'" >&2; exit 2; }
done
(( ${#sizes[@]} )) || { echo "distill_job: TEACHER_TOKENS names no batch size" >&2; exit 2; }
[[ $(printf '%s\n' "${sizes[@]}" | sort -u | wc -l) == "${#sizes[@]}" ]] || {
    echo "distill_job: TEACHER_TOKENS names a batch size twice ('${TEACHER_TOKENS}'): one teacher each" >&2; exit 2; }
n='[0-9]+(\.[0-9]+)?'
duration="^(${n}h)?(${n}m)?(${n}s)?\$|^$n\$"
for name in TEACHER_BUDGET WIDE_TEACHER_BUDGET STUDENT_BUDGET; do  # a bad budget stops here, not after the teachers
    value=${!name:-} && v=${value,,} && v=${v// /}
    [[ -z $v || ( $v =~ $duration && $v =~ [1-9] ) ]] || {
        echo "distill_job: $name must be a time like 10m, 1h or 1h30m; got '$value'" >&2; exit 2; }
done
setting='[A-Za-z_][A-Za-z0-9_]*=[^ ,=]+'
[[ -z ${TEACHER_CONFIG:-} || $TEACHER_CONFIG =~ ^$setting(,$setting)*$ ]] || {
    echo "distill_job: TEACHER_CONFIG must be config settings for --config_overrides, e.g." \
        "TEACHER_CONFIG=encoder_layers=6,decoder_layers=2; got '$TEACHER_CONFIG'" >&2; exit 2; }
jobs=${TEACHER_JOBS:-1}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "distill_job: TEACHER_JOBS must be how many teachers train at once, e.g." \
    "TEACHER_JOBS=2; got '$jobs'" >&2; exit 2; }
seconds() {  # seconds BUDGET: the whole seconds in a budget that passed the check above
    local v=${1,,} && v=${v// /}
    [[ $v =~ ^$n$ ]] && v=${v}s  # a bare number is seconds
    [[ $v =~ $duration ]]
    awk -v h="${BASH_REMATCH[1]%h}" -v m="${BASH_REMATCH[3]%m}" -v s="${BASH_REMATCH[5]%s}" \
        'BEGIN { printf "%d\n", h * 3600 + m * 60 + s }'
}
bash scripts/setup_env.sh
out=${1:?usage: bash scripts/distill_job.sh OUTPUT [student arguments]}
shift
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}

train() {  # train OUTPUT_DIR ARGS...: a run of scripts/train.py, resumed if it has checkpoints, skipped if finished
    local dir=$1
    shift
    if [[ -f $dir/metrics.json ]]; then echo "distill_job: $dir has finished"; return; fi
    local resume=()
    if compgen -G "$dir/checkpoints/checkpoint-*" > /dev/null; then resume=(--resume); fi
    .venv/bin/python scripts/train.py --task g2p --output_dir "$dir" "${resume[@]}" "$@"
}

teachers=() budgets=() extras=()  # each teacher's folder, budget and arguments of its own, in the order given
for tokens in "${sizes[@]}"; do
    teachers+=("$out/teacher-$tokens") budgets+=("${TEACHER_BUDGET:-10m}")
    extras+=("--max_tokens $tokens${TEACHER_CONFIG:+ --config_overrides $TEACHER_CONFIG}")
done
if [[ -n ${WIDE_TEACHER_BUDGET:-} ]]; then
    teachers+=("$out/teacher-wide") budgets+=("$WIDE_TEACHER_BUDGET")
    extras+=("--config_overrides d_model=192,encoder_ffn_dim=768,decoder_ffn_dim=768,dropout=0.1")
fi
teacher() {  # teacher I: the I-th teacher's training
    local -a extra
    read -r -a extra <<< "${extras[$1]}"
    train "${teachers[$1]}" --time_budget "${budgets[$1]}" --num_beams 1 --no_progress_bar "${extra[@]}"
}
if (( jobs == 1 )); then
    for i in "${!teachers[@]}"; do teacher "$i"; done
else  # JOBS queues side by side, each on its share of the cores (`nproc`: OMP_NUM_THREADS if set); the longest
    # budgets first, each to the lightest queue
    (( jobs <= ${#teachers[@]} )) || jobs=${#teachers[@]}
    threads=$(( $(nproc) / jobs )) && (( threads >= 1 )) || threads=1
    queues=() loads=()
    for ((q = 0; q < jobs; q++)); do queues+=("") loads+=(0); done
    while read -r secs i; do
        lightest=0
        for ((q = 1; q < jobs; q++)); do (( loads[q] < loads[lightest] )) && lightest=$q; done
        queues[lightest]+=" $i" && (( loads[lightest] += secs ))
    done < <(for i in "${!teachers[@]}"; do echo "$(seconds "${budgets[$i]}") $i"; done | sort -s -k1,1nr)
    pids=()
    for ((q = 0; q < jobs; q++)); do
        (
            export OMP_NUM_THREADS=$threads PYTHONUNBUFFERED=1
            for i in ${queues[q]}; do teacher "$i" 2>&1 | sed -u "s|^|${teachers[$i]##*/}: |"; done
        ) &
        pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=$?; done
    (( failed == 0 )) || { echo "distill_job: a teacher failed (exit $failed), see its lines above; rerunning" \
        "the command keeps the finished teachers and resumes the others" >&2; exit "$failed"; }
fi
if [[ ! -f $out/train_plus.tsv ]]; then
    .venv/bin/python scripts/pseudo_label.py --words "${WORDS:-80000}" --output "$out/train_plus.tsv" \
        --teachers "${teachers[@]}"
fi
train "$out/student" --time_budget "${STUDENT_BUDGET:-23m}" --train_file "$out/train_plus.tsv" \
    --tokenizer "${teachers[0]}" --teachers "${teachers[@]}" --distill_alpha 0.8 "$@"
