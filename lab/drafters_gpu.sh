#!/usr/bin/env bash
# The demo drafters built on the GPU host, in stages that each fit one device call (10 minutes).
# Run from the repository root after MLX is installed (shared/device/README.md); results go
# to $OUT/drafters (the small weights, logs, acceptance) and $OUT/sweeps.
#   bash lab/drafters_gpu.sh hidden    # DFlash drafter + MTP head, ~3.7 min (h200x2.sh allows 250 s)
#   bash lab/drafters_gpu.sh drafter   # the model drafter, fine-tuned on both targets, ~1.8 min (130 s)
#   bash lab/drafters_gpu.sh sweep     # widths 2..16 with the DFlash drafter, both targets
# HIDDEN_KINDS=dflash trains the DFlash drafter alone; DFLASH_INIT=DIR continues that checkpoint
# (DFLASH_LR: its peak learning rate, default 2e-3).
# SHARE4: the share of the model drafter's rows labelled by the 4-bit target (default 0.5).
# hidden then drafter back to back take about 5.5 minutes on one H200 with the defaults below
# (training budgets DFLASH_S=120 MTP_S=70 DRAFTER_S=75 seconds; greedy continuations of 193
# tokens after 64 of corpus, WINDOWS=32768 for hidden and DRAFTER_WINDOWS=8192 for drafter,
# generated in batches of GEN_BATCH=4096 rows, VAL=256 of them held out to validate draft
# agreement during training; BATCH=64 sequences a step, BLOCKS=16 DFlash blocks per sequence).
# Each stage logs the held-out agreement and keeps the weights that validated best.
# The drafter stage writes $OUT/drafters/drafter only when the fine-tuned drafter beats the
# committed engine/demo/pair/drafter on BOTH targets (the log says ADOPTED or NOT adopted);
# otherwise only drafter-candidate/ is there, and the committed drafter stays.
set -uo pipefail
stage=${1:?stage: hidden | drafter | sweep}
OUT=${OUT:?OUT must be set}
D=$OUT/drafters
mkdir -p "$D"
export PYTHONUNBUFFERED=1
common=(--out "$D" --gen-batch "${GEN_BATCH:-4096}" --val "${VAL:-256}"
        --batch "${BATCH:-64}" --blocks "${BLOCKS:-16}")
case $stage in
hidden)
    python3 -m lab.build_drafters "${common[@]}" --windows "${WINDOWS:-32768}" \
        $(for k in ${HIDDEN_KINDS:-dflash mtp}; do printf -- '--only %s ' "$k"; done) \
        --seconds dflash="${DFLASH_S:-120}" --seconds mtp="${MTP_S:-70}" \
        ${DFLASH_INIT:+--dflash-init "$DFLASH_INIT"} --dflash-lr "${DFLASH_LR:-2e-3}" 2>&1 | tee "$D/build-hidden.log" ;;
drafter)
    python3 -m lab.build_drafters "${common[@]}" --windows "${DRAFTER_WINDOWS:-8192}" \
        --only drafter --drafter-4bit-share "${SHARE4:-0.5}" \
        --seconds drafter="${DRAFTER_S:-75}" 2>&1 | tee "$D/build-drafter.log" ;;
sweep)
    mkdir -p "$OUT/sweeps"
    for t in bf16 4bit; do
        timeout 250 python3 -m blockwidth sweep --demo-target $t --kind dflash \
            --widths 2,3,4,5,6,7,8,10,12,14,16 -n "${N:-3}" --max-tokens "${TOKENS:-128}" \
            --record-dir "$OUT/sweeps" 2>&1 | tee "$OUT/sweeps/sweep-dflash-$t.txt"
    done ;;
esac
