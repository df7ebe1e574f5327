#!/usr/bin/env bash
# A GPU-scale target sharded over two GPUs with NCCL (docs/distributed.md), beside the same target on one
# GPU, in stages that each fit one device call of 10 minutes on nvidia-h200-x2. Run from the
# repository root after MLX (CUDA) is installed as for lab/h200.sh; weights stay in $WORK,
# results go to $OUT/<stage>/ (records, printouts, a profile and its check).
#   bash lab/sharded_gpu.sh build    # the 1B pair on GPU 0 (lab/build_gpu.py), ~7 min
#   bash lab/sharded_gpu.sh sweeps   # one GPU, then 2 GPUs tensor-sharded over NCCL: same widths,
#                                    # prompt and tokens; the group's width saved, check run (~6 min)
#   bash lab/sharded_gpu.sh curves   # cost curves: 1 GPU, tensor, pipeline (qwen2 form), with the
#                                    # communication apart; the drafter on rank 0 (~6 min)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0: KINDS.md); every rank inherits it.
# On a CPU (lab/tests): P=<pair dir> BACKEND=ring ONE= WIDTHS=2 N=1 TOKENS=8 bash lab/sharded_gpu.sh sweeps
# (and ROWS=1,2 CONTEXT=16 REPEATS=1 for curves: the stage's shape, not its measurement)
set -uo pipefail
stage=${1:?stage: build | sweeps | curves}
WORK=${WORK:-/root/bw}
OUT=${OUT:?OUT must be set}
R=$OUT/$stage
mkdir -p "$R" "$WORK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BW="${PYTHON:-python3} -m blockwidth"
P=${P:-$WORK/gpupair}
BACKEND=${BACKEND:-nccl}
ONE=${ONE-CUDA_VISIBLE_DEVICES=0}  # how a single-device run is pinned (empty on a CPU)
W=${WIDTHS:-2,3,4,5,6,8}
N=${N:-5}
T=${TOKENS:-128}
G="--distributed tensor --ranks 2 --group-backend $BACKEND --group-timeout ${GROUP_T:-250}"
PROMPT=()
[ -f "$P/prompt.txt" ] && PROMPT=(--prompt-file "$P/prompt.txt")
log() { echo "[$(date +%T)] $*" | tee -a "$R/stage.log"; }
one() { if [ -n "$ONE" ]; then env "$ONE" "$@"; else "$@"; fi; }
case $stage in
build)
    CUDA_VISIBLE_DEVICES=0 ${PYTHON:-python3} -m lab.build_gpu --out "$P" --shape "${SHAPE:-1b}" \
        --target-seconds "${TARGET_S:-180}" --drafter-seconds "${DRAFTER_S:-70}" 2>&1 | tee "$R/build_gpu.log"
    cp "$P/build.json" "$P/prompts.json" "$R/" 2>/dev/null ;;
sweeps)
    log "sweep, one GPU"
    one timeout "${SWEEP_T:-240}" $BW sweep --target "$P/target-bf16" --draft "$P/drafter" --widths "$W" \
        -n "$N" --max-tokens "$T" "${PROMPT[@]}" --record-dir "$R/one" 2>&1 | tee "$R/sweep-one.txt"
    log "sweep, 2 GPUs tensor-sharded over $BACKEND"
    timeout "${SWEEP_T:-240}" $BW sweep --target "$P/target-bf16" --draft "$P/drafter" --widths "$W" \
        -n "$N" --max-tokens "$T" "${PROMPT[@]}" --record-dir "$R/tensor" $G \
        --save --profile "$R/profile.toml" 2>&1 | tee "$R/sweep-tensor.txt"
    log "check, one GPU: the group's entry is skipped"
    one timeout 60 $BW --check --profile "$R/profile.toml" --target "$P/target-bf16" --draft "$P/drafter" \
        > "$R/check-one.txt" 2>&1
    echo "rc $?" >> "$R/check-one.txt" ;;
curves)
    Q=$WORK/target-qwen2
    [ -f "$Q/config.json" ] || ${PYTHON:-python3} -m tests.qwen2_form "$P/target-bf16" "$Q" > /dev/null
    rows=${ROWS:-1,2,3,4,5,6,8,12,16}
    ctx=${CONTEXT:-512}
    reps=${REPEATS:-5}
    log "costcurve, one GPU"
    one timeout 120 $BW costcurve --target "$P/target-bf16" --rows "$rows" --context "$ctx" --repeats "$reps" \
        --json > "$R/costcurve-one.json" 2> "$R/costcurve-one.err"
    for s in tensor pipeline; do
        t=$P/target-bf16
        [ $s = pipeline ] && t=$Q
        log "costcurve, 2 GPUs $s"
        timeout 150 $BW costcurve --target "$t" --rows "$rows" --context "$ctx" --repeats "$reps" \
            --distributed $s --ranks 2 --group-backend "$BACKEND" --group-timeout 140 --json \
            > "$R/costcurve-$s.json" 2> "$R/costcurve-$s.err"
    done
    log "sweep, 2 GPUs tensor-sharded, the drafter on rank 0"
    timeout "${SWEEP_T:-200}" $BW sweep --target "$P/target-bf16" --draft "$P/drafter" --widths "$W" \
        -n "$N" --max-tokens "$T" "${PROMPT[@]}" --record-dir "$R/tensor-rank0" $G --drafter-on rank0 \
        2>&1 | tee "$R/sweep-tensor-rank0.txt" ;;
*)
    echo "stage $stage: build | sweeps | curves" >&2
    exit 2 ;;
esac
log "done"
