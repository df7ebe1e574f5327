#!/usr/bin/env bash
# The GPU evidence on one H200 as one detached pipeline that outlives the device calls.
# Run from the repository root after MLX is installed (lab/devwheels3.sh: three transfers).
#   bash lab/h200pipe.sh start    # with PROBE_LOOP=1 first probe MLX's CUDA graph settings and
#                                         # engine.linear's projections on the decode loop
#                                         # (lab/probe_loop.py, ~3 min; three runs picked stock),
#                                         # pick; then start the pipeline below detached
#   bash lab/h200pipe.sh wait S   # wait up to S seconds for the pipeline; copy what it has
#                                         # written so far to $OUT/results.tgz (call again and again)
# The pipeline (GPU 0): build the pair (build_gpu.py --shape $SHAPE: 5b, or the FALLBACK shape's
# pair when that build leaves no target: 3.5b after 5b, 1b after 3.5b; FALLBACK=none for none), the bf16 sweeps of its model drafter (widths 2-8, 12, 16): first
# with the engine's ``rows`` verify attention when probe_rows passed its parity cases (ROWS_PROBE=1,
# the default: on GPU 1 while GPU 0 builds, or here before the sweeps on one GPU), then with
# $VA; the rest takes the attention of the better of the two: the bench against stock mlx-lm
# (BENCH_TARGETS, bf16), bf16 sweeps at widths 4-8 named in GEMVV_ORDER (default none from
# the ninth run on: 2026-11-30e's gemvv sweep ran 0.88x of classic; 2026-11-30d ran
# "stock1 gemvv gemvv2 stock2"), the 4-bit sweep, the fresh-process cold check at the best bf16
# arm, and a sweep of prompt SAVE_PROMPT (6; none: skip) that --saves its winner in a profile,
# which --check --measure then re-measures. start runs a sampler beside it, which the
# pipeline's end stops: the GPUs' clocks (nvidia-smi, every CLOCK_MS) and, each second, the
# CPUs' MHz and /proc/stat's cpu line (stolen ticks).
# With GPUS=2 (nvidia-h200-x2) the side chain runs on GPU 1 beside the build:
# SIDE=from (the default) another drafter recipe (BUILD_B) for GPU 0's target, distilled as soon
# as that target is written (build_gpu --target-from, the same budgets); SIDE=build (2026-11-30d)
# a whole second build with it; either way the sweeps take whichever pair's drafter keeps more
# drafted tokens on its worse target. SIDE=dflash trains a DFlash drafter for GPU 0's target
# there instead (build_drafters --pair, DFLASH_PAIR_S seconds), swept after the model drafter's bf16
# sweeps. SIDE=demo (2026-11-30c) trains the demo DFlash drafter
# (continuing the committed one) and the demo model drafter there instead. MTP1B=1 trains an MTP
# head on the target and sweeps it (2026-11-30b's was no better); without it the sweeps wait for
# the side chain, to time on a quiet host. PIN_SWEEP=1 adds a sweep pinned to four CPU cores
# (2026-11-30d: pinning did not narrow the spread).
# Weights stay in $WORK; every step's output goes to $WORK/results.
set -uo pipefail
verb=${1:?verb: start | wait | pipeline}
WORK=${WORK:-/root/bw}
R=$WORK/results
P=$WORK/gpupair
mkdir -p "$R"
export PYTHONUNBUFFERED=1
BW="python3 -m blockwidth"
log() { echo "[$(date +%T)] $*" | tee -a "$R/pipeline.log"; }
. "$(dirname "${BASH_SOURCE[0]}")/gpu_lib.sh"  # best_width, best_arm, wait_for(_any), better_build
PB=$WORK/gpupair-b
BUILD_B_DEFAULT="--drafter-labels all --drafter-soft 0.5"
# The pair's shape (build_gpu --shape): 5b since 2026-11-30f (3.5b from 2026-11-30e). The 1B's step
# was launch-bound and moved with the host's state by up to 1.6x between runs, more than any width
# gained; the 3.5B's decode kept the GPU busy about half the time (the host's work per operation
# bound it); on random weights a 5B verify of 2-8 rows cost 1.6-1.8x a pipelined step against
# the 3.5B's 2.2-3.7x (evidence/h200-2026-11-30f/probes).
SHAPE=${SHAPE:-5b}
case $SHAPE in 5b) fb=3.5b ;; 3.5b) fb=1b ;; *) fb=none ;; esac
FALLBACK=${FALLBACK:-$fb}
build() {  # $1: out dir, then build_gpu's recipe flags; the budgets are the same for both builds
    # 2026-11-30b: 60 s of generation at 512 rows gave 2.2M tokens, which a 100 s drafter read
    # ten times over; wider batches cost a GPU little more per step. The 3.5B trains ~3x slower
    # a token: its budgets keep the build under 10 minutes.
    local out=$1 shape=${BUILD_SHAPE:-$SHAPE} ts=180 gs=70 ds=150
    shift
    [ "$shape" = 1b ] && { ts=150; gs=90; ds=200; }
    # 2026-11-30f's trial: the 5b took ~60 s from start to its first step (490 ms a step) and
    # longer than the 3.5b to write its two targets; less generation and drafting keep it near 10 min
    [ "$shape" = 5b ] && { ts=170; gs=60; ds=120; }
    python3 -m lab.build_gpu --out "$out" --shape "$shape" --target-seconds "${TARGET_S:-$ts}" \
        --gen-seconds "${GEN_S:-$gs}" --gen-batch "${GEN_BATCH:-2048}" \
        --drafter-seconds "${PAIR_DRAFTER_S:-$ds}" "$@"
}
sampler() {  # the GPUs' clocks, power and utilisation every CLOCK_MS (nvidia-smi), and the host's
             # CPU clock range every second, while the pipeline runs: whether a run's speed
             # followed a clock shows against the records' run times
    local fields=index,timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu
    if command -v nvidia-smi > /dev/null; then
        # one query (without -l, nvidia-smi queries once): does this driver know the field?
        # Not "-c 1": -c is --compute-mode, a device setting, not a count
        nvidia-smi --query-gpu="$fields,clocks_event_reasons.active" --format=csv,noheader \
            > /dev/null 2>&1 && fields=$fields,clocks_event_reasons.active
        echo "$fields" > "$R/gpu_clocks.csv"
        nvidia-smi --query-gpu="$fields" --format=csv,noheader -lms "${CLOCK_MS:-200}" >> "$R/gpu_clocks.csv" 2>&1 &
    fi
    # 2026-11-30e: the VM reported 2100 MHz on every CPU throughout; /proc/stat's first line adds
    # the host's stolen ticks (its 9th field), which a hypervisor's other guests would raise
    while :; do
        echo "$(date +%s.%N) $(awk '/^cpu MHz/ {print $4}' /proc/cpuinfo | sort -n | sed -n '1p;$p' | paste -sd' ') | $(head -1 /proc/stat)"
        sleep 1
    done >> "$R/cpu_mhz.log" 2>/dev/null
}
stop_sampler() {  # the sampler start recorded, and only it: sampler.pid outlives a run on a
                  # reused host, and by the next run its number can be another process group's
    local pid args
    pid=$(cat "$WORK/sampler.pid" 2>/dev/null) || return 0
    rm -f "$WORK/sampler.pid"
    args=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)
    case $args in *"h200pipe.sh sampler"*) kill -- -"$pid" 2>/dev/null ;; esac
    return 0
}
bench() {  # $1: target variant, $2: the best width of its sweep (4 when none)
    local ws
    ws=$(printf '%s\n' 4 "${2:-4}" | sort -nu | paste -sd,)
    log "bench $1 widths $ws (model drafter: stock mlx-lm runs no MTP head)"
    timeout "${BENCH_TIMEOUT:-260}" python3 -m lab.bench --target "$P/target-$1" --draft "$P/drafter" \
        --prompts-file "$P/prompts.json" --fresh --n 4 --tokens 128 --widths "$ws" --verify-linear "$VL" \
        --verify-attention "$VA" --json-out "$R/bench-$1.json" > "$R/bench-$1.txt" 2>&1
    log "bench $1 rc $?"
}
rows_probe() {  # lab/probe_rows.py: the rows kernel's parity cases and its verify times
               # against plain and vector on a random model of BUILD_SHAPE (else $SHAPE); rows.ok
               # when every case passed
    local shape=${BUILD_SHAPE:-$SHAPE}
    log "probe_rows (parity of the rows attention kernel, verify ms by attention; $shape)"
    timeout "${ROWS_TIMEOUT:-240}" python3 -m lab.probe_rows --shape "$shape" \
        --out "$R/probe_rows.json" > "$R/probe_rows.txt" 2>&1
    local rc=$?
    log "probe_rows rc $rc"
    [ $rc = 0 ] && touch "$WORK/rows.ok"
    touch "$WORK/rows.done"
}
pair_drafter() {  # $1: kind (build_drafters --only), $2: name, $3: time limit, then kind-specific
                  # flags: a drafter of that kind for the pair's bf16 target on its own greedy
                  # text, with its acceptance (128 tokens); the weights stay on the host in
                  # $WORK/<name>, the log and the acceptance come back in the results
    local kind=$1 name=$2 limit=$3
    shift 3
    timeout "$limit" python3 -m lab.build_drafters --pair "$P" --out "$R/$name" --only "$kind" \
        --targets bf16 --gen-batch 2048 --val 128 --batch 32 --accept-tokens 128 "$@" \
        > "$R/build-$name.log" 2>&1
    local rc=$?
    rm -rf "${WORK:?}/$name"
    [ -d "$R/$name/$kind" ] && mv "$R/$name/$kind" "$WORK/$name"
    return $rc
}
dflash_pair() {  # a DFlash drafter for the pair's target (one draft forward a round, where a model
                 # drafter runs one a token: on this host every forward's host work counts); its
                 # acceptance on the demo prompts (build A writes the held-out prompts.json only at
                 # its end, and build_drafters reads it first)
    log "side: DFlash drafter for the target on GPU 1"
    pair_drafter dflash dflashpair "${DFLASH_PAIR_TIMEOUT:-420}" --windows "${DFLASH_WINDOWS:-8192}" \
        --seconds dflash="${DFLASH_PAIR_S:-200}" --dflash-lr "${DFLASH_PAIR_LR:-3e-4}"
    log "side: dflash rc $?"
}
mtp1b() {  # an MTP head for the pair's target (named for the 1B, where it was first tried), started
           # from its last layer; acceptance at width 4 on the pair's held-out prompts
    log "MTP head for the target"
    pair_drafter mtp mtp1b 330 --windows "${MTP_WINDOWS:-8192}" --mtp-init last \
        --seconds mtp="${MTP1B_S:-150}" --prompts-file "$P/prompts.json"
    log "mtp1b rc $?"
    touch "$WORK/mtp1b.done"
}
case $verb in
start)
    rm -f "$WORK/pick.env" "$WORK/pipeline.done" "$WORK/side.done" "$WORK/build.rc" "$WORK/mtp1b.done" \
        "$WORK/build.shape" "$WORK/rows.ok" "$WORK/rows.done"
    # side.out says a side chain runs (the pipeline and wait wait for its side.done): only this run's
    rm -f "$R/side.out"
    rm -rf "$P" "$PB"  # SIDE=from waits for this run's target, not a reused host's last one
    rm -rf "$WORK/mtp1b" "$WORK/dflashpair"  # an earlier run's drafters on a reused host are not this run's
    stop_sampler  # an earlier run's, still sampling on a reused host
    rm -f "$R/gpu_clocks.csv" "$R/cpu_mhz.log"
    setsid nohup bash "$0" sampler > /dev/null 2>&1 < /dev/null &
    echo $! > "$WORK/sampler.pid"
    if [ "${GPUS:-1}" = 2 ]; then
        CUDA_VISIBLE_DEVICES=1 setsid nohup bash "$0" side > "$R/side.out" 2>&1 < /dev/null &
        log "side chain started on GPU 1"
    fi
    export CUDA_VISIBLE_DEVICES=0
    if [ "${PROBE_LOOP:-0}" = 1 ]; then
        log "probe_loop (stock, gather, gemv, each with vector attention too, on a random 1B bf16 pair)"
        # a failed probe must leave MLX's defaults, not an earlier run's pick
        timeout 240 python3 -m lab.probe_loop --out "$R/probe_loop.json" --pick "$WORK/pick.env" \
            --settings "${SETTINGS:-default}" --variants "${VARIANTS:-stock,gather,gv,gemv,gemvv}" \
            > "$R/probe_loop.txt" 2>&1
        log "picked: $(cat "$WORK/pick.env" 2>/dev/null)"
    fi
    setsid nohup bash "$0" pipeline > "$R/pipeline.out" 2>&1 < /dev/null &
    log "pipeline started" ;;
sampler) sampler ;;
side)  # GPU 1 (CUDA_VISIBLE_DEVICES set by start)
    # the rows kernel's probe first: ~2 minutes, done long before GPU 0's target is written
    [ "${ROWS_PROBE:-1}" = 1 ] && rows_probe
    case ${SIDE:-from} in
    dflash)  # instead of build B: a DFlash drafter for GPU 0's target, once it is written
        if wait_for_any "${TARGET_WAIT:-900}" "$P/target-4bit/config.json" "$WORK/build.rc" \
                && [ -f "$P/target-4bit/config.json" ]; then
            # build A writes its targets before its drafter; build_drafters reads the target only
            dflash_pair
        else
            log "side: no target from GPU 0 (build rc $(cat "$WORK/build.rc" 2>/dev/null || echo none yet)); no DFlash drafter"
        fi ;;
    build|from)
        mkdir -p "$R/b"
        from=()
        if [ "${SIDE:-from}" = from ]; then
            from=(--target-from "$P")
            # GPU 0's target, or its build's end (build.rc) without one: a build A that failed
            # before writing its target must not hold GPU 1, and the sweeps waiting on side.done,
            # for the whole TARGET_WAIT (build B would only refuse the missing target)
            wait_for_any "${TARGET_WAIT:-900}" "$P/target-4bit/config.json" "$WORK/build.rc"
        fi
        if [ ${#from[@]} -gt 0 ] && [ ! -f "$P/target-4bit/config.json" ]; then
            log "side: no target from GPU 0 (build rc $(cat "$WORK/build.rc" 2>/dev/null || echo none yet)); no build B"
        else
            # --target-from: the shape of the build that wrote the target (the 1B fallback's
            # would refuse a 3.5b drafter); SIDE=build: a second build of $SHAPE
            bshape=$SHAPE
            [ ${#from[@]} -gt 0 ] && bshape=$(cat "$WORK/build.shape" 2>/dev/null || echo "$SHAPE")
            log "side: build B (--shape $bshape ${from[*]} ${BUILD_B-$BUILD_B_DEFAULT}) on GPU 1"
            # shellcheck disable=SC2086
            BUILD_SHAPE=$bshape build "$PB" "${from[@]}" ${BUILD_B-$BUILD_B_DEFAULT} > "$R/b/build_gpu.log" 2>&1
            log "side: build B rc $?"
            cp "$PB/build.json" "$R/b/" 2>/dev/null
        fi ;;
    esac
    if [ "${SIDE:-from}" = demo ] && [ "${PROBE_OVERLAP:-0}" = 1 ]; then
        log "side: probe_overlap (host and GPU work of a forward, 1-8 rows, bf16 and 4-bit)"
        for q in "" --quant; do timeout 120 python3 -m lab.probe_overlap --json $q; done \
            > "$R/probe_overlap.jsonl" 2> "$R/probe_overlap.err"
    fi
    # the two demo drafters at once (each keeps a GPU busy a fraction of the time), so that GPU 1
    # is done, and the host quiet, before GPU 0's sweeps start
    if [ "${SIDE:-from}" = demo ]; then
        log "side: demo DFlash drafter (continuing the committed one) and demo model drafter (GPU 1)"
        OUT=$R/demo HIDDEN_KINDS=dflash DFLASH_S=${DFLASH_S:-360} WINDOWS=${WINDOWS:-32768} \
            DFLASH_INIT=${DFLASH_INIT-engine/demo/pair/dflash} DFLASH_LR=${DFLASH_LR:-5e-4} \
            timeout 600 bash lab/drafters_gpu.sh hidden > "$R/side-dflash.out" 2>&1 &
        p1=$!
        OUT=$R/demo DRAFTER_S=${DRAFTER_S:-300} DRAFTER_WINDOWS=${DRAFTER_WINDOWS:-65536} \
            SHARE4=${SHARE4:-0.67} timeout 600 bash lab/drafters_gpu.sh drafter \
            > "$R/side-drafter.out" 2>&1 &
        p2=$!
        wait $p1; log "side: dflash rc $?"
        wait $p2; log "side: drafter rc $?"
    fi
    if [ "${MTP1B:-0}" = 1 ]; then
        # the build takes ~9 minutes; a pipeline that died before it must not hold GPU 1
        if wait_for "$WORK/build.rc" "${BUILD_WAIT:-1200}"; then
            mtp1b
        else
            log "side: no build after ${BUILD_WAIT:-1200} s; no MTP head"
        fi
    fi
    touch "$WORK/side.done" ;;
pipeline)
    # shellcheck disable=SC1091
    [ -f "$WORK/pick.env" ] && . "$WORK/pick.env"
    VL=${BW_VERIFY_LINEAR:-auto}  # engine.linear: gather when the probe measured it faster
    VA=${BW_VERIFY_ATTENTION:-auto}  # vector when gather + vector beat gather alone
    log "build (env: $(env | grep ^MLX_ | paste -sd' '); verify linear $VL, attention $VA)"
    echo "$SHAPE" > "$WORK/build.shape"  # GPU 1's --target-from build B takes the target's shape
    # shellcheck disable=SC2086
    build "$P" ${BUILD_A:-} > "$R/build_gpu.log" 2>&1
    rc=$?
    log "build rc $rc"
    if [ ! -f "$P/target-4bit/config.json" ] && [ "$FALLBACK" != none ] && [ "$FALLBACK" != "$SHAPE" ]; then
        # a first build of a new shape that left no target: a known shape's evidence instead of none
        log "build ($SHAPE) left no target: building the $FALLBACK pair instead"
        echo "$FALLBACK" > "$WORK/build.shape"
        # shellcheck disable=SC2086
        BUILD_SHAPE=$FALLBACK build "$P" ${BUILD_A:-} > "$R/build_gpu-$FALLBACK.log" 2>&1
        rc=$?
        log "build $FALLBACK rc $rc"
    fi
    # the build's end, the fallback's included: GPU 1 waits on it (SIDE=from: for a target;
    # MTP1B: to train on this pair), so not while the fallback is still writing $P
    echo $rc > "$WORK/build.rc"
    cp "$P/build.json" "$P/prompts.json" "$R/" 2>/dev/null
    if [ -f "$R/side.out" ] && [ "${SIDE:-from}" != demo ]; then
        wait_for "$WORK/side.done" "${SIDE_WAIT:-900}" || log "build B not done after ${SIDE_WAIT:-900} s"
        read -r pick why <<< "$(better_build "$P" "$PB" || echo A "no comparison")"
        log "pair for the sweeps: $pick ($why)"
        echo "$pick $why" > "$R/pair.txt"
        [ "$pick" = B ] && P=$PB
    fi
    sweep1() {  # $1: label, $2: target variant, $3: drafter dir, $4: widths, $5: seconds,
                # $6 / $7: verify linear / attention; PIN: a command to run it under (taskset)
        log "sweep $1 $2${PIN:+ ($PIN)}"
        # shellcheck disable=SC2086
        timeout "${SWEEP_TIMEOUT:-280}" ${PIN:-} $BW sweep --target "$P/target-$2" --draft "$3" --widths "$4" \
            -n 5 --sequential --max-reps 10 --max-seconds "$5" --max-tokens 256 \
            --prompt-file "$P/prompt.txt" --verify-linear "$6" --verify-attention "$7" \
            --record-dir "$R/records-$1-$2" > "$R/sweep-$1-$2.txt" 2>&1
        log "sweep $1 $2 rc $?; best $(best_arm "$R/records-$1-$2" 2>> "$R/pipeline.log")"
    }
    sweeps() {  # $1: label, $2: drafter dir, $3: widths
        for t in bf16 4bit; do sweep1 "$1" "$t" "$2" "$3" "${SWEEP_S:-110}" "$VL" "$VA"; done
    }
    if [ -f "$R/side.out" ] && [ "${MTP1B:-0}" != 1 ] && [ "${SIDE:-from}" = demo ]; then
        # timings on a host whose other GPU trains share its CPU (each step's graph is built there):
        # 2026-11-30b's classic ranged 228-367 tok/s beside the side chain; sweep on a quiet host
        wait_for "$WORK/side.done" "${SIDE_WAIT:-600}" && said=done || said="still running"
        log "side chain $said before the sweeps"
    fi
    if [ "${ROWS_PROBE:-1}" = 1 ]; then  # GPU 1's probe, or this one's on one GPU
        if [ -f "$R/side.out" ]; then
            wait_for "$WORK/rows.done" "${ROWS_WAIT:-300}" || log "probe_rows not done on GPU 1"
        else
            # after the build: the shape it built (the FALLBACK's when the first left no
            # target), so that the verify times are those of the pair the sweeps run on
            BUILD_SHAPE=$(cat "$WORK/build.shape" 2>/dev/null || echo "$SHAPE") rows_probe
        fi
    fi
    # the bf16 target first (the one a width should win on), its bench, the routed sweeps, then
    # 4-bit: what matters most comes back first if the device budget ends the run
    [ -f "$WORK/rows.ok" ] && sweep1 rows bf16 "$P/drafter" 2,3,4,5,6,7,8,12,16 "${SWEEP_S:-110}" "$VL" rows
    sweep1 model bf16 "$P/drafter" 2,3,4,5,6,7,8,12,16 "${SWEEP_S:-110}" "$VL" "$VA"
    # SIDE=dflash's drafter (this run's only: start removes an earlier one), with $VA as the plain one
    [ -f "$WORK/dflashpair/config.json" ] && \
        sweep1 dflash bf16 "$WORK/dflashpair" 2,3,4,6,8,12,16 "${SWEEP_S:-110}" "$VL" "$VA"
    # the rest runs with the attention of the sweep whose best width did better over its classic
    read -r d _ _ <<< "$(best_arm "$R"/records-{rows,model}-bf16 2>> "$R/pipeline.log")"
    VA0=$VA
    [ "$d" = "$R/records-rows-bf16" ] && VA=rows
    log "verify attention from here: $VA"
    for t in ${BENCH_TARGETS:-bf16}; do
        label=model
        [ "$VA" = rows ] && [ -d "$R/records-rows-$t" ] && label=rows
        read -r _ w _ <<< "$(best_arm "$R/records-$label-$t" 2>/dev/null)"
        bench "$t" "$w"
    done
    # bf16 sweeps at widths 4-8 for the same time, named by routing: stock*, or gemvv* (the engine's
    # 2..8-row kernel for 16-bit projections with vector attention). 2026-11-30d ran
    # "stock1 gemvv gemvv2 stock2" so that a routing's effect on classic showed apart from drift.
    for s in ${GEMVV_ORDER-}; do
        case $s in
        gemvv*) sweep1 "$s" bf16 "$P/drafter" 4,5,6,7,8 "${SWEEP_S2:-90}" gemv vector ;;
        *) sweep1 "$s" bf16 "$P/drafter" 4,5,6,7,8 "${SWEEP_S2:-90}" "$VL" "$VA" ;;
        esac
    done
    sweep1 model 4bit "$P/drafter" 2,3,4,5,6,7,8,12,16 "${SWEEP_S:-110}" "$VL" "$VA"
    if [ "${PIN_SWEEP:-0}" = 1 ] && command -v taskset > /dev/null; then
        PIN="taskset -c 4-7" sweep1 pinned bf16 "$P/drafter" 4,6,8 "${SWEEP_S2:-90}" "$VL" "$VA"
    fi
    if [ "${MTP1B:-0}" = 1 ] && [ "${GPUS:-1}" = 2 ]; then
        wait_for "$WORK/mtp1b.done" "${MTP1B_WAIT:-300}"
    elif [ "${MTP1B:-0}" = 1 ]; then
        mtp1b
    fi
    # only this run's head: mtp1b.done is removed by start, and a head still training on GPU 1
    # after the wait is neither swept nor moved under the sweep's feet
    if [ -f "$WORK/mtp1b.done" ] && [ -f "$WORK/mtp1b/config.json" ]; then
        sweeps mtp "$WORK/mtp1b" 2,3,4,5,6,8
    else
        log "no MTP head from this run: no mtp sweep"
    fi
    read -r d w ratio <<< "$(best_arm "$R"/records-{rows,model,mtp,dflash}-bf16 2>> "$R/pipeline.log")"
    case $d in *records-mtp-*) draft=$WORK/mtp1b ;; *records-dflash-*) draft=$WORK/dflashpair ;;
        *) draft=$P/drafter ;; esac
    case $d in *records-rows-*) VA=rows ;; *records-model-* | *records-dflash-*) VA=$VA0 ;; esac  # that sweep's
    w=${w:-4}
    log "coldcheck bf16 width $w with $draft, $VA attention (sweep median $ratio x classic)"
    timeout 300 python3 -m lab.coldcheck --target "$P/target-bf16" --draft "$draft" --widths "$w" \
        --prompt-file "$P/prompts.json" --prompt-index 1 --max-tokens 128 --verify-linear "$VL" \
        --verify-attention "$VA" --fresh-runs 3 --out "$R/coldcheck.json" > "$R/coldcheck.txt" 2>&1
    log "coldcheck rc $?"
    # what an operator does with a win: sweep a second prompt and --save its winner in a profile,
    # then keep that profile true with --check --measure on the same host (2026-11-30g ran this
    # by hand: width 8 saved on prompt 6, 8 pass). SAVE_PROMPT: an index into prompts.json,
    # "none" to skip; with $VA, the rest's attention
    if [ "${SAVE_PROMPT:-6}" != none ]; then
        python3 -c "import sys; from engine.demo.prompts import read_prompts
print(read_prompts(sys.argv[1])[int(sys.argv[2])], end='')" \
            "$P/prompts.json" "${SAVE_PROMPT:-6}" > "$R/prompt-save.txt" 2>> "$R/pipeline.log"
        log "sweep save bf16 prompt ${SAVE_PROMPT:-6}, --save to gpu-profile.toml"
        timeout "${SWEEP_TIMEOUT:-280}" $BW sweep --target "$P/target-bf16" --draft "$P/drafter" \
            --widths 4,8,12,16 -n 5 --sequential --max-reps 8 --max-seconds "${SWEEP_S2:-90}" \
            --max-tokens 256 --prompt-file "$R/prompt-save.txt" --verify-linear "$VL" \
            --verify-attention "$VA" --record-dir "$R/records-save-bf16" --save \
            --profile "$R/gpu-profile.toml" > "$R/sweep-save-bf16.txt" 2>&1
        log "sweep save bf16 rc $?"
        if [ -f "$R/gpu-profile.toml" ]; then
            timeout 240 $BW --target "$P/target-bf16" --draft "$P/drafter" --profile "$R/gpu-profile.toml" \
                --check --measure --verify-attention "$VA" -n 3 --json > "$R/check.json" 2> "$R/check.err"
            log "check --measure rc $?"
        else
            log "no profile saved: no check"
        fi
    fi
    stop_sampler
    log "pipeline done"
    touch "$WORK/pipeline.done" ;;
wait)
    OUT=${OUT:?OUT must be set}
    t0=$(date +%s)
    # a side chain was started (side.out exists) whatever GPUS this call was given: wait for it too
    done_() { [ -f "$WORK/pipeline.done" ] && { [ ! -f "$R/side.out" ] || [ -f "$WORK/side.done" ]; }; }
    # a copy every minute: a call cut short by the device budget still brings back the latest one
    while ! done_ && [ $(( $(date +%s) - t0 )) -lt "${2:-500}" ]; do
        sleep 5
        [ $(( ($(date +%s) - t0) % 60 )) -lt 5 ] && tar czf "$OUT/results.tgz.part" -C "$WORK" results \
            && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
    done
    tail -8 "$R/pipeline.log"
    tar czf "$OUT/results.tgz.part" -C "$WORK" results && mv "$OUT/results.tgz.part" "$OUT/results.tgz" ;;
esac
