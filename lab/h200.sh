#!/usr/bin/env bash
# The GPU evidence behind docs/gpu-builds.md's H200 figures, in stages that each fit one device call
# (10 minutes). Run from the repository root on the GPU host after MLX is installed
# (shared/device/README.md, or lab/devwheels3.sh when the tree is too large for two
# transfers); weights stay in $WORK, results go to $OUT/<stage>.tgz.
#   bash lab/h200.sh build      # the 1B pair (lab/build_gpu.py), ~7 min
#   bash lab/h200.sh sweeps     # sweeps on both targets, soaks, 8B cost curves
#   bash lab/h200.sh cold       # fresh-process cold checks, bench against mlx-lm
set -uo pipefail
stage=${1:?stage: build | sweeps | cold}
WORK=${WORK:-/root/bw}
OUT=${OUT:?OUT must be set}
R=$OUT/$stage
mkdir -p "$R" "$WORK"
export PYTHONUNBUFFERED=1
BW="python3 -m blockwidth"
P=$WORK/gpupair
log() { echo "[$(date +%T)] $*" | tee -a "$R/stage.log"; }
case $stage in
build)
    python3 -m lab.build_gpu --out "$P" --shape "${SHAPE:-1b}" --target-seconds "${TARGET_S:-180}" \
        --drafter-seconds "${DRAFTER_S:-70}" 2>&1 | tee "$R/build_gpu.log"
    cp "$P/build.json" "$P/prompts.json" "$R/" ;;
sweeps)
    for t in bf16 4bit; do
        log "sweep $t"
        timeout 200 $BW sweep --target "$P/target-$t" --draft "$P/drafter" --widths 2,3,4,5,6,7,8,12,16 \
            -n "${N:-5}" --max-tokens "${TOKENS:-256}" --prompt-file "$P/prompt.txt" --record-dir "$R/records" \
            2>&1 | tee "$R/sweep-$t.txt"
    done
    for a in auto fused; do
        log "soak $a"
        timeout 100 python3 -m lab.soak --target "$P/target-bf16" --draft "$P/drafter" \
            --rounds 2000 --width 4 --verify-attention $a --json 2>&1 | tail -3 | tee "$R/soak-$a.json"
    done
    log "synthetic 8b"
    python3 -m lab.synthetic --shape "${SYNTH:-8b}" --quant affine-4 --out "$WORK/fake8b" > /dev/null
    for a in plain bucketed fused; do
        log "costcurve 8b $a"
        timeout 120 $BW costcurve --target "$WORK/fake8b" --rows 1,2,4,8,16 --context 1000 --repeats 5 \
            --verify-attention $a --json > "$R/costcurve-8b-$a.json" 2> "$R/costcurve-8b-$a.err"
    done ;;
cold)
    for a in auto fused; do
        log "coldcheck $a"
        timeout 200 python3 -m lab.coldcheck --target "$P/target-bf16" --draft "$P/drafter" \
            --widths "${WIDTHS:-4,8}" --prompt-file "$P/prompts.json" --prompt-index 1 --max-tokens 128 \
            --verify-attention $a --fresh-runs "${FRESH:-1}" --out "$R/coldcheck-$a.json" > /dev/null 2> "$R/coldcheck-$a.err"
    done
    for t in bf16 4bit; do
        log "bench $t"
        timeout 150 python3 -m lab.bench --target "$P/target-$t" --draft "$P/drafter" \
            --prompts-file "$P/prompts.json" --fresh --n 4 --tokens 128 --widths "${WIDTHS:-4,8}" \
            --json-out "$R/bench-$t.json" 2>&1 | tee "$R/bench-$t.txt"
    done ;;
esac
log "done"
tar czf "$OUT/$stage.tgz" -C "$OUT" "$stage" && rm -rf "$R"
