#!/usr/bin/env bash
# The GPU evidence on a two-H200 host, in three device calls of at most 10 minutes each.
# GPU 0 carries the 1B pair (build, sweeps); GPU 1 the work that runs beside it (the demo
# drafters of lab/drafters_gpu.sh, cold checks, the second bench). Run from the
# repository root after MLX is installed (lab/devwheels3.sh: three transfers);
# weights stay in $WORK, results go to $OUT/<stage>.tgz.
#   bash lab/h200x2.sh a   # GPU0: build the 1B pair (detached: it outlives the call)
#                                  # GPU1: train the demo DFlash/MTP/model drafters
#   bash lab/h200x2.sh b   # GPU0: sweeps of both 1B targets, soak
#                                  # GPU1: cold check, the new DFlash drafter's H200 sweeps
# As run on 2026-11-29 the drafters' stages hit their limits (250 s, 130 s) before writing the
# DFlash/MTP weights; they were then trained alone with WINDOWS=8192 DFLASH_S=100 MTP_S=60.
#   bash lab/h200x2.sh c   # both: bench against stock mlx-lm at the sweeps' best widths
# Timing runs on one GPU share the host with the other GPU's job; every comparison that
# decides anything is made inside one process, arms interleaved (docs/method.md).
set -uo pipefail
stage=${1:?stage: a | b | c}
WORK=${WORK:-/root/bw}
OUT=${OUT:?OUT must be set}
R=$OUT/$stage
mkdir -p "$R" "$WORK"
export PYTHONUNBUFFERED=1
BW="python3 -m blockwidth"
P=$WORK/gpupair
t0=$(date +%s)
log() { echo "[$(date +%T)] $*" | tee -a "$R/stage.log"; }
wait_build() {  # until the detached build has finished, or $1 seconds since the stage began
    while [ ! -f "$WORK/build.rc" ] && [ $(( $(date +%s) - t0 )) -lt "$1" ]; do sleep 5; done
    [ -f "$WORK/build.rc" ] && log "build rc $(cat "$WORK/build.rc")" || log "build still running"
    cp "$WORK/build.log" "$R/build_gpu.log" 2>/dev/null
    cp "$P/build.json" "$P/prompts.json" "$R/" 2>/dev/null
    return 0
}
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # best_width
case $stage in
a)
    rm -f "$WORK/build.rc"
    log "build (GPU0, detached)"
    CUDA_VISIBLE_DEVICES=0 setsid nohup bash -c "python3 -m lab.build_gpu --out $P \
        --target-seconds ${TARGET_S:-150} --gen-seconds ${GEN_S:-40} --drafter-seconds ${PAIR_DRAFTER_S:-90} \
        > $WORK/build.log 2>&1; echo \$? > $WORK/build.rc" > /dev/null 2>&1 &
    log "demo drafters (GPU1)"
    export CUDA_VISIBLE_DEVICES=1
    OUT=$R timeout "${DRAFTERS_T:-250}" bash lab/drafters_gpu.sh hidden > "$R/hidden.out" 2>&1
    OUT=$R timeout "${DRAFTER_T:-130}" bash lab/drafters_gpu.sh drafter > "$R/drafter.out" 2>&1
    # the new DFlash drafter waits in $WORK for stage b's H200 sweeps
    rm -rf "$WORK/dflash" && cp -r "$R/drafters/dflash" "$WORK/dflash" 2>/dev/null
    unset CUDA_VISIBLE_DEVICES
    wait_build "${BUILD_WAIT:-530}" ;;
b)
    wait_build 420
    (
        export CUDA_VISIBLE_DEVICES=1
        log "coldcheck auto (GPU1)"
        timeout 170 python3 -m lab.coldcheck --target "$P/target-bf16" --draft "$P/drafter" \
            --widths "${WIDTHS:-4,8}" --prompt-file "$P/prompts.json" --prompt-index 1 --max-tokens 128 \
            --verify-attention auto --fresh-runs 3 --out "$R/coldcheck-auto.json" > /dev/null 2> "$R/coldcheck-auto.err"
        d=$WORK/dflash
        [ -f "$d/config.json" ] || d=engine/demo/pair/dflash
        for t in bf16 4bit; do
            log "dflash sweep $t with $d (GPU1)"
            timeout 80 $BW sweep --target engine/demo/pair/target-$t --draft "$d" \
                --widths 2,3,4,5,6,7,8,10,12,14,16 -n 3 --max-tokens 128 --record-dir "$R/dflash-records" \
                > "$R/sweep-dflash-$t.txt" 2>&1
        done
    ) &
    export CUDA_VISIBLE_DEVICES=0
    for t in bf16 4bit; do
        log "sweep $t (GPU0)"
        timeout 170 $BW sweep --target "$P/target-$t" --draft "$P/drafter" --widths 2,3,4,5,6,7,8,12,16 \
            -n "${N:-5}" --max-tokens "${TOKENS:-256}" --prompt-file "$P/prompt.txt" \
            --record-dir "$R/records-$t" > "$R/sweep-$t.txt" 2>&1
        best_width "$R/records-$t" > "$WORK/best-$t" 2>> "$R/stage.log"
        log "best $t: $(cat "$WORK/best-$t")"
    done
    log "soak auto (GPU0)"
    timeout 60 python3 -m lab.soak --target "$P/target-bf16" --draft "$P/drafter" \
        --rounds 2000 --width 4 --verify-attention auto --json 2>&1 | tail -3 > "$R/soak-auto.json"
    wait ;;
c)
    i=0
    for t in bf16 4bit; do
        w=$(cat "$WORK/best-$t" 2>/dev/null || echo 4)
        ws=$(printf '%s\n' 4 "$w" | sort -nu | paste -sd,)
        log "bench $t widths $ws (GPU$i)"
        CUDA_VISIBLE_DEVICES=$i timeout 280 python3 -m lab.bench --target "$P/target-$t" --draft "$P/drafter" \
            --prompts-file "$P/prompts.json" --fresh --n 4 --tokens 128 --widths "$ws" \
            --json-out "$R/bench-$t.json" > "$R/bench-$t.txt" 2>&1 &
        i=$((i + 1))
    done
    wait ;;
esac
log "done in $(( $(date +%s) - t0 ))s"
tar czf "$OUT/$stage.tgz" -C "$OUT" "$stage" && rm -rf "$R"
