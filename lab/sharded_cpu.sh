#!/usr/bin/env bash
# CPU evidence for docs/distributed.md: the demo pair alone against its target sharded over two
# ranks (ring, 127.0.0.1), the drafter replicated against on rank 0, and the cost curves of one
# device, a tensor-sharded and a pipeline-split target (the qwen2 form, tests/qwen2_form.py) with
# the communication apart. Run from the repository root:  OUT=dir bash lab/sharded_cpu.sh
# Every command is bounded (timeout, --group-timeout); ~15 minutes on a 2-core host.
set -uo pipefail
OUT=${OUT:?OUT must be set}
mkdir -p "$OUT/records"
BW="${PYTHON:-.venv/bin/python} -m blockwidth"
W=${WIDTHS:-2,3,4}
N=${N:-3}
T=${TOKENS:-48}
log() { echo "[$(date +%T)] $* (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/run.log"; }
sweep() {  # name, extra args...
    local name=$1; shift
    log "sweep $name"
    timeout 900 $BW sweep --widths "$W" -n "$N" --max-tokens "$T" --record-dir "$OUT/records" "$@" \
        > "$OUT/sweep-$name.txt" 2> "$OUT/sweep-$name.err"
    echo "rc $?" >> "$OUT/sweep-$name.txt"
}
curve() {
    local name=$1; shift
    log "costcurve $name"
    timeout 600 $BW costcurve --rows 1,2,3,4,8 --repeats 5 --context 64 "$@" > "$OUT/costcurve-$name.txt" 2>&1
    echo "rc $?" >> "$OUT/costcurve-$name.txt"
}
Q=$(mktemp -d)/target-qwen2
${PYTHON:-.venv/bin/python} -m tests.qwen2_form engine/demo/pair/target-bf16 "$Q" > /dev/null
G="--ranks 2 --group-backend ring --group-timeout 880"
sweep alone
sweep tensor-replicated --distributed tensor $G --drafter-on replicated
sweep tensor-rank0 --distributed tensor $G --drafter-on rank0
sweep pipeline-replicated --distributed pipeline $G --target "$Q" --draft engine/demo/pair/drafter
curve alone
curve tensor --distributed tensor $G
curve pipeline --distributed pipeline $G --target "$Q"
rm -rf "$(dirname "$Q")"
log done
