#!/usr/bin/env bash
# The GPU evidence on one H200 as one detached pipeline that outlives the device calls.
# Run from the repository root after MLX is installed (engine/demo/devwheels3.sh: three transfers).
#   bash engine/demo/h200pipe.sh start    # probe MLX's CUDA graph settings and engine.linear's gather
#                                         # projections on the decode loop (engine/demo/probe_loop.py,
#                                         # SETTINGS=default,nographs by default; 2026-11-30 ran all five,
#                                         # ~3 min), pick, then start the pipeline below detached under it
#   bash engine/demo/h200pipe.sh wait S   # wait up to S seconds for the pipeline; copy what it has
#                                         # written so far to $OUT/results.tgz (call again and again)
# The pipeline: build the 1B pair (build_gpu.py), sequential sweeps of both targets, the
# fresh-process cold check and the bench against stock mlx-lm at the best width, a prompt-lookup
# sweep, the MTP head's retraining. Weights stay in $WORK; every step's output goes to $WORK/results.
set -uo pipefail
verb=${1:?verb: start | wait | pipeline}
WORK=${WORK:-/root/bw}
R=$WORK/results
P=$WORK/gpupair
mkdir -p "$R"
export PYTHONUNBUFFERED=1
BW="python3 -m console.cli"
log() { echo "[$(date +%T)] $*" | tee -a "$R/pipeline.log"; }
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # best_width
case $verb in
start)
    log "probe_loop (MLX CUDA graph settings, random 1B bf16)"
    rm -f "$WORK/pick.env"  # a failed probe must leave MLX's defaults, not an earlier run's pick
    timeout 240 python3 -m engine.demo.probe_loop --out "$R/probe_loop.json" --pick "$WORK/pick.env" \
        --settings "${SETTINGS:-default,nographs}" > "$R/probe_loop.txt" 2>&1
    log "picked: $(cat "$WORK/pick.env" 2>/dev/null)"
    rm -f "$WORK/pipeline.done"
    setsid nohup bash "$0" pipeline > "$R/pipeline.out" 2>&1 < /dev/null &
    log "pipeline started" ;;
pipeline)
    # shellcheck disable=SC1091
    [ -f "$WORK/pick.env" ] && . "$WORK/pick.env"
    VL=${BW_VERIFY_LINEAR:-auto}  # engine.linear: gather when the probe measured it faster
    VA=${BW_VERIFY_ATTENTION:-auto}  # vector when gather + vector beat gather alone
    log "build (env: $(env | grep ^MLX_ | paste -sd' '); verify linear $VL, attention $VA)"
    python3 -m engine.demo.build_gpu --out "$P" --target-seconds "${TARGET_S:-150}" \
        --gen-seconds "${GEN_S:-80}" --drafter-seconds "${PAIR_DRAFTER_S:-120}" > "$R/build_gpu.log" 2>&1
    log "build rc $?"
    cp "$P/build.json" "$P/prompts.json" "$R/" 2>/dev/null
    for t in bf16 4bit; do
        log "sweep $t"
        timeout 200 $BW sweep --target "$P/target-$t" --draft "$P/drafter" --widths 2,3,4,5,6,7,8,12,16 \
            -n 5 --sequential --max-reps 10 --max-seconds 150 --max-tokens 256 --prompt-file "$P/prompt.txt" \
            --verify-linear "$VL" --verify-attention "$VA" \
            --record-dir "$R/records-$t" > "$R/sweep-$t.txt" 2>&1
        # No record (the sweep failed): no file, so the steps below fall back to width 4 (an empty
        # file would pass `cat` and hand them an empty width).
        best_width "$R/records-$t" > "$WORK/best-$t" 2>> "$R/pipeline.log" || rm -f "$WORK/best-$t"
        log "sweep $t done; best $(cat "$WORK/best-$t" 2>/dev/null || echo 'none (width 4 below)')"
    done
    w=$(cat "$WORK/best-bf16" 2>/dev/null || echo 4)
    log "coldcheck bf16 width $w"
    timeout 300 python3 -m engine.coldcheck --target "$P/target-bf16" --draft "$P/drafter" --widths "$w" \
        --prompt-file "$P/prompts.json" --prompt-index 1 --max-tokens 128 --verify-linear "$VL" --verify-attention "$VA" --fresh-runs 2 --out "$R/coldcheck-auto.json" > "$R/coldcheck.txt" 2>&1
    log "coldcheck rc $?"
    for t in bf16 4bit; do
        w=$(cat "$WORK/best-$t" 2>/dev/null || echo 4)
        ws=$(printf '%s\n' 4 "$w" | sort -nu | paste -sd,)
        log "bench $t widths $ws"
        timeout 200 python3 -m engine.bench --target "$P/target-$t" --draft "$P/drafter" \
            --prompts-file "$P/prompts.json" --fresh --n 4 --tokens 128 --widths "$ws" --verify-linear "$VL" --verify-attention "$VA" \
            --json-out "$R/bench-$t.json" > "$R/bench-$t.txt" 2>&1
        log "bench $t rc $?"
    done
    log "lookup sweep bf16"
    timeout 150 $BW sweep --target "$P/target-bf16" --kind lookup --widths 2,4,8,12,16 -n 5 --max-tokens 256 \
        --verify-linear "$VL" --verify-attention "$VA" \
        --prompt-file "$P/prompt.txt" --record-dir "$R/records-lookup" > "$R/sweep-lookup-bf16.txt" 2>&1
    log "soak auto"
    timeout 60 python3 -m engine.soak --target "$P/target-bf16" --draft "$P/drafter" \
        --rounds 2000 --width 4 --verify-linear "$VL" --verify-attention "$VA" --json 2> "$R/soak-auto.err" | tail -3 > "$R/soak-auto.json"
    log "MTP head retraining (build_drafters --only mtp)"
    OUT=$R timeout 200 python3 -m engine.demo.build_drafters --out "$R/drafters" --gen-batch 4096 --val 256 \
        --batch 64 --blocks 16 --windows 8192 --only mtp --seconds mtp="${MTP_S:-60}" > "$R/build-mtp.log" 2>&1
    log "mtp rc $?"
    log "pipeline done"
    touch "$WORK/pipeline.done" ;;
wait)
    OUT=${OUT:?OUT must be set}
    t0=$(date +%s)
    while [ ! -f "$WORK/pipeline.done" ] && [ $(( $(date +%s) - t0 )) -lt "${2:-500}" ]; do sleep 5; done
    tail -5 "$R/pipeline.log"
    tar czf "$OUT/results.tgz" -C "$WORK" results ;;
esac
