#!/usr/bin/env bash
# The demo drafters built on the GPU host, in stages that each fit one device call (10 minutes).
# Run from the repository root after MLX is installed (shared/device/README.md); results go
# to $OUT/drafters (the small weights, logs, acceptance) and $OUT/sweeps.
#   bash engine/demo/drafters_gpu.sh hidden    # DFlash drafter + MTP head, ~5 min
#   bash engine/demo/drafters_gpu.sh drafter   # the model drafter, retrained on both targets
#   bash engine/demo/drafters_gpu.sh sweep     # widths 2..16 with the DFlash drafter, both targets
set -uo pipefail
stage=${1:?stage: hidden | drafter | sweep}
OUT=${OUT:?OUT must be set}
D=$OUT/drafters
mkdir -p "$D"
export PYTHONUNBUFFERED=1
case $stage in
hidden)
    # the demo's were built with DFLASH_S=30 MTP_S=20 (the session's device budget)
    python3 -m engine.demo.build_drafters --out "$D" --only dflash --only mtp --windows 1024 \
        --seconds dflash="${DFLASH_S:-150}" --seconds mtp="${MTP_S:-90}" 2>&1 | tee "$D/build-hidden.log" ;;
drafter)
    python3 -m engine.demo.build_drafters --out "$D" --only drafter --windows 1024 \
        --seconds drafter="${DRAFTER_S:-240}" 2>&1 | tee "$D/build-drafter.log" ;;
sweep)
    mkdir -p "$OUT/sweeps"
    for t in bf16 4bit; do
        timeout 250 python3 -m console.cli sweep --demo-target $t --kind dflash \
            --widths 2,3,4,5,6,7,8,10,12,14,16 -n "${N:-3}" --max-tokens "${TOKENS:-128}" \
            --record-dir "$OUT/sweeps" 2>&1 | tee "$OUT/sweeps/sweep-dflash-$t.txt"
    done ;;
esac
