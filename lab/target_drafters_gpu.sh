#!/usr/bin/env bash
# Drafters for a real target (docs/target-drafters.md): a DFlash drafter, an MTP head and a model drafter
# for the mlx-lm target folder $TARGET (e.g. SmolLM2-135M-Instruct in bfloat16), trained on the
# GPU host in one detached run of about 5.5 minutes on one H200. lab/target_drafters.py does the
# work; every step is its own process under its own time limit, so a failed step costs only
# itself (a drafter's measurement needs only its own weights). From the repository root, after
# MLX is installed (lab/devwheels3.sh):
#
#   export PYTHONPATH=/tmp/site:$PWD TARGET=/root/bw/smollm/target-bf16 RESULTS=/root/bw/drafters
#   setsid nohup bash lab/target_drafters_gpu.sh run > /root/bw/drafters.out 2>&1 < /dev/null &
#   bash lab/target_drafters_gpu.sh wait 500   # up to 500 s for the run; then $OUT/drafters.tgz
#                                              # holds the logs, build-*.json, acceptance-*.json and
#                                              # the drafters' configs so far (call again and again)
#   bash lab/target_drafters_gpu.sh weights 1  # the weights, tarred and cut in 15 MiB parts, four
#                                              # a call into $OUT (weights 2: the next four);
#                                              # here: cat drafters-weights.tgz.* | tar -xz
#
# Steps, in order, with the time each is expected to take on one H200 (estimated from the demo
# and 1B drafter builds' logs, lab/evidence/h200-2026-11-30b; not yet run on this target) and its
# limit: text ~45 s (limit 100), dflash ~60 s (110), measure-dflash ~35 s (90), mtp ~45 s (90),
# measure-mtp ~35 s (90), drafter ~60 s (110), measure-drafter ~40 s (90). Each drafter is
# measured right after it is trained, so a run cut short keeps whole drafters with their figures.
# A step starts with what is left before DEADLINE (seconds from the start, default 480) as its
# limit when that is less than its own, and is skipped when under 30 s are left.
# Settings: GEN_S, DFLASH_S, MTP_S, DRAFTER_S (generation and training budgets in seconds; 25,
# 45, 30, 45), ROWS (greedy continuations at most, 16384), NEW (greedy tokens a row, 160),
# GEN_BATCH (2048), BATCH (rows a training step, 32), TOKENS (new tokens a measured request, 64),
# STEPS (default text,dflash,mtp,drafter; a drafter's step includes its measurement),
# EXTRA (more lab.target_drafters options for every step; on this CPU the lab test passes tiny
# sizes there), PART (the weights' part size, 15M: a device call brings back 8 files of 16 MiB,
# 64 MiB in all; SmolLM2's three drafters, about 110 MB, take two calls).
set -uo pipefail
verb=${1:?verb: run | wait | weights}
R=${RESULTS:-/root/bw/drafters}
STEPS=${STEPS:-text,dflash,mtp,drafter}
export PYTHONUNBUFFERED=1
mkdir -p "$R"
log() { echo "[$(date +%T)] $*" | tee -a "$R/run.log" >&2; }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }
t0=$(date +%s)
left() { echo $(( ${DEADLINE:-480} - ($(date +%s) - t0) )); }
# $1 name, $2 limit in seconds, then the command; its output goes to $R/$1.log
step() {
    local name=$1 limit=$2 rest
    shift 2
    rest=$(left)
    if [ "$rest" -lt 30 ]; then
        log "$name: skipped, $rest s left before the deadline"
        return 1
    fi
    [ "$rest" -lt "$limit" ] && limit=$rest
    log "$name: start (limit $limit s)"
    timeout -s INT -k 15 "$limit" "$@" > "$R/$name.log" 2>&1
    local rc=$?
    log "$name: rc $rc"
    return $rc
}
case $verb in
run)
    rm -f "$R/done"
    TARGET=${TARGET:?TARGET must name the target folder (mlx-lm, bfloat16)}
    log "drafters: target $TARGET, results $R, steps $STEPS, deadline ${DEADLINE:-480} s"
    python3 -c 'import mlx.core as mx, json; print(json.dumps(mx.device_info()))' > "$R/device.json" 2>&1
    # EXTRA: more options for every step, split at spaces (no value with a space in it)
    # shellcheck disable=SC2206
    extra=(${EXTRA:-})
    td=(python3 -m lab.target_drafters)
    common=(--target "$TARGET" --out "$R")
    if want text; then
        step text "${TEXT_LIMIT:-100}" "${td[@]}" text "${common[@]}" --seconds "${GEN_S:-25}" \
            --rows "${ROWS:-16384}" --new "${NEW:-160}" --gen-batch "${GEN_BATCH:-2048}" "${extra[@]}"
    fi
    if [ ! -f "$R/text.npz" ]; then
        log "no greedy text in $R: nothing to train on"
        touch "$R/done"
        exit 1
    fi
    for kind in dflash mtp drafter; do
        want "$kind" || continue
        case $kind in
        dflash) s=${DFLASH_S:-45} limit=${DFLASH_LIMIT:-110} ;;
        mtp) s=${MTP_S:-30} limit=${MTP_LIMIT:-90} ;;
        drafter) s=${DRAFTER_S:-45} limit=${DRAFTER_LIMIT:-110} ;;
        esac
        step "$kind" "$limit" "${td[@]}" "$kind" "${common[@]}" --seconds "$s" \
            --batch "${BATCH:-32}" "${extra[@]}" \
            && step "measure-$kind" "${MEASURE_LIMIT:-90}" "${td[@]}" measure "${common[@]}" \
                --kinds "$kind" --tokens "${TOKENS:-64}" "${extra[@]}"
    done
    log "drafters: done in $(( $(date +%s) - t0 )) s"
    touch "$R/done" ;;
wait)
    OUT=${OUT:?OUT must be set}
    s=${2:-500}
    t=$(date +%s)
    while [ ! -f "$R/done" ] && [ $(( $(date +%s) - t )) -lt "$s" ]; do sleep 5; done
    # the small files only: the weights come back with `weights`; the greedy text and the model
    # drafter's copy of the target's tokenizer (3.5 MB for SmolLM2) stay
    tar -czf "$OUT/drafters.tgz" -C "$(dirname "$R")" --exclude='*.safetensors' --exclude=text.npz \
        --exclude=tokenizer.json --exclude='weights.tgz.*' "$(basename "$R")"
    if [ -f "$R/done" ]; then echo "drafters: done"; else echo "drafters: running"; fi
    tail -12 "$R/run.log" 2>/dev/null ;;
weights)
    OUT=${OUT:?OUT must be set}
    k=${2:-1}
    [ -f "$R/done" ] || { echo "the run in $R is not done: wait first" >&2; exit 1; }
    if [ ! -f "$R/weights.tgz.00" ]; then
        names=$(cd "$R" && ls -d dflash mtp drafter 2>/dev/null)
        [ -n "$names" ] || { echo "no drafter folders in $R" >&2; exit 1; }
        # shellcheck disable=SC2086  # the folder names are words
        tar -czf - -C "$R" $names | split -b "${PART:-15M}" -d -a 2 - "$R/weights.tgz."
    fi
    parts=("$R"/weights.tgz.*)
    n=${#parts[@]}
    for ((i = 4 * (k - 1); i < 4 * k && i < n; i++)); do
        cp "${parts[$i]}" "$OUT/drafters-weights.tgz.$(printf %02d "$i")"
    done
    echo "weights: parts $(( 4 * (k - 1) + 1 ))..$(( 4 * k < n ? 4 * k : n )) of $n in \$OUT" ;;
*)
    echo "target_drafters_gpu.sh: unknown verb $verb (run | wait | weights)" >&2
    exit 2 ;;
esac
