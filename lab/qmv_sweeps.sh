#!/usr/bin/env bash
# The qmv kernel's answer on the GPU-scale pair (docs/qmv.md, "The product's answer"): the
# 5B pair's 4-bit target swept at widths 2-8 with the verify's projections on the qmv kernel and on
# stock, prompt 0 and prompt 6, so that policy/table.py's cuda 9.0 4-bit row can be re-derived
# from the records (lab/tests/test_table_rows.py). One H200, from the repository root, after MLX is
# installed (lab/devwheels3.sh). Detached, since a device call lasts 10 minutes at most:
#   setsid nohup bash lab/qmv_sweeps.sh run > /root/bw/qmv_sweeps.out 2>&1 < /dev/null &
#   bash lab/qmv_sweeps.sh pack          # $OUT/qmv-sweeps.tgz: what $R holds so far (call again)
# run, in order (~20 minutes on a fresh host; ~10 with the pair still in $P):
# 1. the 5B pair (2026-11-30g's recipe with pair B's drafter flags, the pair its 4-bit row was
#    measured on), unless $P/target-4bit exists (~10 minutes);
# 2. the 4-bit target's verify cost by rows 1-16, stock then qmv (engine.costcurve): the 5B
#    shape's answer to the 1.3x line, and the first use of stock's JIT-compiled qmm kernels
#    (~1-2 minutes on a fresh host) paid before any sweep;
# 3. per prompt (0, then 6: the bf16 row's harder prompt), the qmv sweep at widths 2-8 and 12,
#    16 (rows 9+ stay stock: the current row's widths, in the same session) and the stock sweep
#    at widths 2-8 (the control), each sweep as 2026-11-30g's (n 5, sequential, 10 reps or 110 s,
#    256 tokens, rows attention): ~100 s each.
# The call strategy is said (BLOCKWIDTH_QMV_CALL=compile, the default), so every record's
# linear summary and this log agree on what was measured.
set -uo pipefail
verb=${1:?verb: run | pack}
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # pack_results
W=${WORK:-/root/bw}
P=${PAIR:-$W/gpupair}
R=${RESULTS:-$W/qmv-results}
export PYTHONUNBUFFERED=1 BLOCKWIDTH_QMV_CALL=${BLOCKWIDTH_QMV_CALL:-compile}
BW="python3 -m blockwidth"
SWEEP=(-n 5 --sequential --max-reps 10 --max-seconds "${SWEEP_S:-110}" --max-tokens 256 --verify-attention rows)
mkdir -p "$R"
log() { echo "[$(date +%T)] $*" | tee -a "$R/qmv_sweeps.log"; }
case $verb in
run)
    log "qmv sweeps: pair $P, results $R, BLOCKWIDTH_QMV_CALL=$BLOCKWIDTH_QMV_CALL"
    if [ ! -f "$P/target-4bit/config.json" ]; then
        log "build the 5b pair"
        python3 -m lab.build_gpu --out "$P" --shape 5b --target-seconds 170 --gen-seconds 60 --gen-batch 2048 \
            --drafter-seconds 120 --drafter-labels all --drafter-soft 0.5 > "$R/build.txt" 2>&1
        log "build rc $?"
    fi
    if [ ! -f "$P/target-4bit/config.json" ]; then
        log "no 4-bit target in $P: nothing to sweep"
        exit 1
    fi
    cp "$P"/build.json "$P"/prompts.json "$R"/ 2>/dev/null
    python3 -c "import sys; from engine.demo.prompts import read_prompts
print(read_prompts(sys.argv[1])[6], end='')" "$P/prompts.json" > "$R/prompt6.txt" 2>> "$R/qmv_sweeps.log"
    for vl in stock qmv; do
        timeout 300 $BW costcurve --target "$P/target-4bit" --rows 1-16 --verify-linear "$vl" --json \
            > "$R/costcurve-4bit-$vl.json" 2> "$R/costcurve-4bit-$vl.err"
        log "costcurve 4bit $vl rc $?"
    done
    for p in 0 6; do
        f=$P/prompt.txt
        [ "$p" = 6 ] && f=$R/prompt6.txt
        timeout 280 $BW sweep --target "$P/target-4bit" --draft "$P/drafter" --widths 2,3,4,5,6,7,8,12,16 \
            "${SWEEP[@]}" --prompt-file "$f" --verify-linear qmv \
            --record-dir "$R/records-qmv-4bit-p$p" > "$R/sweep-qmv-4bit-p$p.txt" 2>&1
        log "sweep qmv 4bit prompt $p rc $?"
        timeout 280 $BW sweep --target "$P/target-4bit" --draft "$P/drafter" --widths 2,3,4,5,6,7,8 \
            "${SWEEP[@]}" --prompt-file "$f" --verify-linear stock \
            --record-dir "$R/records-stock-4bit-p$p" > "$R/sweep-stock-4bit-p$p.txt" 2>&1
        log "sweep stock 4bit prompt $p rc $?"
    done
    log "qmv sweeps done"
    touch "$R/done" ;;
pack)
    OUT=${OUT:?OUT must be set}
    pack_results "$R" qmv-sweeps.tgz "qmv sweeps" "$R/qmv_sweeps.log" 3 ;;
*)
    echo "qmv_sweeps.sh: unknown verb $verb (run | pack)" >&2
    exit 2 ;;
esac
