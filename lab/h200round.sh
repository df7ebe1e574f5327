#!/usr/bin/env bash
# The tenth round's GPU evidence on one H200, in one lease of about 15 minutes (the session's device
# budget after the first lease's probes): a 5B pair built on short budgets, then, most needed first,
#   1. the served path: stock mlx_lm.server, without cuDNN attention, and with the dispatcher,
#      beside the engine path (docs/served.md; lab/served_gpu.py; the 2026-12-02 lease's 40 s steps
#      were too short for a 5B server's start, so the step limit is a setting, SERVED_STEP),
#   2. the 4-bit target at widths 2, 4, 8 on stock projections (the kernel's control), then
#   3. the same target at widths 2-8 with the verify's projections on the qmv kernel (docs/qmv.md),
#      side by side in one lease,
#   4. with time left, the qmv sweep on the pair's last held-out prompt,
#   5. a workload session of the bf16 target over the built-in mixed workload, with the auto arm
#      (docs/auto.md: per-request best widths, intervals, auto against the oracle).
# Every step has its own time limit, so a slow step costs itself and not the ones after it.
# Detached, since a device call lasts 10 minutes at most; from the repository root, after MLX is
# installed (lab/devwheels3.sh):
#   setsid nohup bash lab/h200round.sh run > /root/bw/round.out 2>&1 < /dev/null &
#   bash lab/h200round.sh wait S      # up to S seconds for the run to finish; then $OUT/round.tgz
#                                     # holds what $R has so far (call again and again)
# SHAPE, TS/GS/DS (the build's target, generation and drafter seconds), STEPS (default all:
# build,served,stock,qmv,qmv6,workload) and DEADLINE (seconds from the start after which no step
# starts, default 840) are settings; on this CPU the lab test runs it with SHAPE=tiny.
set -uo pipefail
verb=${1:?verb: run | wait}
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # pack_results
W=${WORK:-/root/bw}
P=${PAIR:-$W/gpupair}
R=${RESULTS:-$W/round}
SHAPE=${SHAPE:-5b}
STEPS=${STEPS:-build,served,stock,qmv,qmv6,workload}
export PYTHONUNBUFFERED=1 BLOCKWIDTH_QMV_CALL=${BLOCKWIDTH_QMV_CALL:-compile}
BW="python3 -m blockwidth"
TOKENS=${TOKENS:-128}
VA=${VA:-rows}
mkdir -p "$R"
# to round.log and stderr, never stdout: a step's stdout is its JSON (the 2026-12-02 lease's two
# JSON files began and ended with a log line)
log() { echo "[$(date +%T)] $*" | tee -a "$R/round.log" >&2; }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }
t0=$(date +%s)
left() { echo $(( ${DEADLINE:-840} - ($(date +%s) - t0) )); }
# a step runs only when its limit fits before the deadline: $1 name, $2 seconds, then the command
step() {
    local name=$1 limit=$2
    shift 2
    if [ "$(left)" -lt "$limit" ]; then
        log "$name: skipped, $(left) s left before the deadline and the step may take $limit"
        return 1
    fi
    log "$name: start (limit $limit s)"
    timeout -s INT -k 15 "$limit" "$@"
    local rc=$?
    log "$name: rc $rc"
    return $rc
}
sweep4() {  # $1 name, $2 widths, $3 verify-linear, $4 prompt file, $5 limit
    step "$1" "$5" $BW sweep --target "$P/target-4bit" --draft "$P/drafter" --widths "$2" -n 3 \
        --max-tokens "$TOKENS" --verify-attention "$VA" --verify-linear "$3" --prompt-file "$4" \
        --record-dir "$R/records-$1" --json > "$R/$1.json" 2> "$R/$1.err"
}
case $verb in
run)
    log "round: shape $SHAPE, pair $P, results $R, steps $STEPS, BLOCKWIDTH_QMV_CALL=$BLOCKWIDTH_QMV_CALL"
    python3 -c 'import mlx.core as mx, json; print(json.dumps(mx.device_info()))' > "$R/device.json" 2>&1
    if want build && [ ! -f "$P/target-4bit/config.json" ]; then
        step build "${BUILD_LIMIT:-480}" python3 -m lab.build_gpu --out "$P" --shape "$SHAPE" \
            --target-seconds "${TS:-90}" --gen-seconds "${GS:-35}" --gen-batch "${GEN_BATCH:-2048}" \
            --drafter-seconds "${DS:-75}" --drafter-labels all --drafter-soft 0.5 > "$R/build.txt" 2>&1
        mkdir -p "$R/build"
        cp "$P"/build.json "$P"/prompts.json "$P"/*.log "$R/build/" 2>/dev/null
    fi
    if [ ! -f "$P/target-4bit/config.json" ]; then
        log "no pair in $P: nothing to sweep"
        touch "$R/done"
        exit 1
    fi
    python3 -c "import sys; from engine.demo.prompts import read_prompts
print(read_prompts(sys.argv[1])[-1], end='')" "$P/prompts.json" > "$R/prompt-last.txt" 2>> "$R/round.log"
    # most needed first: the served path, then the stock/qmv pair of sweeps
    want served && step served "${SERVED_LIMIT:-230}" python3 -m lab.served_gpu --pair "$P" \
        --out "$R/served" --widths 4,8 -n 3 --tokens 64 --step-timeout "${SERVED_STEP:-45}" \
        > "$R/served.txt" 2>&1
    want stock && sweep4 stock-4bit-p0 2,4,8 stock "$P/prompt.txt" "${STOCK_LIMIT:-100}"
    want qmv && sweep4 qmv-4bit-p0 2,3,4,5,6,7,8 qmv "$P/prompt.txt" "${QMV_LIMIT:-150}"
    want qmv6 && sweep4 qmv-4bit-plast 2,3,4,6,8 qmv "$R/prompt-last.txt" "${QMV6_LIMIT:-120}"
    want workload && step workload-bf16 "${WORKLOAD_LIMIT:-210}" $BW sweep --target "$P/target-bf16" \
        --draft "$P/drafter" --workload mixed --widths auto,4,8,12 -n 2 --max-tokens "$TOKENS" \
        --verify-attention "$VA" --seed 23 --record-dir "$R/records-workload-bf16" --json \
        > "$R/workload-bf16.json" 2> "$R/workload-bf16.err"
    log "round done"
    touch "$R/done" ;;
wait)
    OUT=${OUT:?OUT must be set}
    s=${2:-500}
    t=$(date +%s)
    while [ ! -f "$R/done" ] && [ $(( $(date +%s) - t )) -lt "$s" ]; do sleep 5; done
    pack_results "$R" round.tgz round "$R/round.log" 12 ;;
*)
    echo "h200round.sh: unknown verb $verb (run | wait)" >&2
    exit 2 ;;
esac
