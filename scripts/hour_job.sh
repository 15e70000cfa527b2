#!/usr/bin/env bash
# The best G2P model this host can train in about an hour, one command. Distillation (scripts/distill_job.sh: three
# 10-minute teachers, new words, a student) beats one model trained for the hour only where a 10-minute teacher makes
# enough updates; on a slower host the single model wins (docs/recipes.md measures both on two kinds of host). So:
#   1. a probe: the main job's recipe for PROBE_STEPS updates (default 300) on all cores, timed from its 100th
#      (OUTPUT/probe); its updates a second decide the plan (vaswani.training.recipes.hour_plan), written to
#      OUTPUT/hour_plan.txt so that a rerun keeps it; HOUR_PLAN=distill or HOUR_PLAN=single skips the probe;
#   2. distill: `bash scripts/distill_job.sh OUTPUT` (its variables apply), the model in OUTPUT/student;
#      single: `scripts/train.py --recipe g2p-1h --time_budget SINGLE_BUDGET` (default 58m, the probe's minute
#      and the evaluations within the hour), the model in OUTPUT/single;
#   3. OUTPUT/model links to the model.
#   bash scripts/hour_job.sh outputs/g2p-hour
# Arguments after OUTPUT go to the model's scripts/train.py (the student's or the single model's). Rerunning after an
# interruption keeps the plan and the finished parts and resumes the one that was running.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/hour_job.sh OUTPUT [training arguments]}
shift
plan=${HOUR_PLAN:-}
[[ -z $plan || $plan == distill || $plan == single ]] || {
    echo "hour_job: HOUR_PLAN must be distill or single (or unset: a probe decides); got '$plan'" >&2; exit 2; }
steps=${PROBE_STEPS:-300}
[[ $steps =~ ^[1-9][0-9]*$ ]] && (( steps >= 200 )) || {
    echo "hour_job: PROBE_STEPS must be at least 200 updates (timed from the 100th); got '$steps'" >&2; exit 2; }
budget=${SINGLE_BUDGET:-58m}
[[ ${budget,,} =~ ^([0-9]+h)?([0-9]+m)?([0-9]+s)?$ && ${budget,,} =~ [1-9] ]] || {
    echo "hour_job: SINGLE_BUDGET must be a time like 58m or 1h; got '$budget'" >&2; exit 2; }
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
mkdir -p "$out"

if [[ -z $plan && -f $out/hour_plan.txt ]]; then
    read -r plan rate < "$out/hour_plan.txt"
    echo "hour_job: the plan recorded in $out/hour_plan.txt: $plan ($rate updates a second)"
elif [[ -z $plan ]]; then
    rm -rf "$out/probe"
    .venv/bin/python scripts/train.py --task g2p --max_steps "$steps" --eval_every 0 --save_every 0 --num_beams 1 \
        --log_every 20 --no_progress_bar --no_tensorboard --output_dir "$out/probe" > "$out/probe.log" 2>&1 || {
        echo "hour_job: the probe failed, its output is in $out/probe.log" >&2; exit 1; }
    read -r plan rate < <(.venv/bin/python -m vaswani.training.recipes hour-plan "$out/probe/train_log.jsonl")
    [[ $plan == distill || $plan == single ]] || { echo "hour_job: no plan from the probe" >&2; exit 1; }
    echo "$plan $rate" > "$out/hour_plan.txt.tmp" && mv "$out/hour_plan.txt.tmp" "$out/hour_plan.txt"
    echo "hour_job: the main job's recipe makes $rate updates a second here: the plan is $plan"
fi

if [[ $plan == distill ]]; then
    bash scripts/distill_job.sh "$out" "$@"
    model=student
else
    dir=$out/single
    if [[ -f $dir/metrics.json ]]; then
        echo "hour_job: $dir has finished"
    else
        resume=()
        if compgen -G "$dir/checkpoints/checkpoint-*" > /dev/null; then resume=(--resume); fi
        .venv/bin/python scripts/train.py --recipe g2p-1h --time_budget "$budget" --output_dir "$dir" \
            "${resume[@]}" "$@"
    fi
    model=single
fi
ln -sfn "$model" "$out/model"
echo "hour_job: the hour's model is $out/model ($out/$model)"
