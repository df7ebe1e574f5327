# Shell helpers shared by the GPU evidence scripts (h200x2.sh, h200pipe.sh, h200round.sh,
# qmv_sweeps.sh); sourced, not run.

wait_for() {  # until file $1 exists or $2 seconds have passed; succeeds when the file is there
    local t0
    t0=$(date +%s)
    while [ ! -f "$1" ] && [ $(( $(date +%s) - t0 )) -lt "$2" ]; do sleep 5; done
    [ -f "$1" ]
}

wait_for_any() {  # $1 seconds, then files: until one of them exists or the time is up; succeeds
                  # when one is there
    local t0 s=$1 f
    shift
    t0=$(date +%s)
    while [ $(( $(date +%s) - t0 )) -lt "$s" ]; do
        for f in "$@"; do [ -f "$f" ] && return 0; done
        sleep 5
    done
    for f in "$@"; do [ -f "$f" ] && return 0; done
    return 1
}

best_width() {  # the width with the highest median decode tok/s in the newest sweep record of $1
               # (within one record the highest median is the highest ratio over classic's)
    local _d w _r
    read -r _d w _r <<< "$(best_arm "$1")"
    [ -n "$w" ] && echo "$w"
}

best_arm() {  # "<record dir> <width> <median over classic's median>" of the best width in the newest
              # record of each directory given (the highest ratio wins); nothing when none has a record
    python3 - "$@" <<'PY'
import json, pathlib, sys
best = None
for d in sys.argv[1:]:
    recs = sorted(pathlib.Path(d).glob("*.json"))
    if not recs:
        continue
    try:
        arms = json.loads(recs[-1].read_text())["arms"]
        classic = next(a for a in arms if not a.get("width"))["decode_tok_s"][1]
    except (ValueError, KeyError, IndexError, StopIteration, TypeError) as e:
        print(f"best_arm: {recs[-1]}: no classic median ({e!r}); skipped", file=sys.stderr)
        continue
    # an arm that ran no round has no figures ("not measured"): it cannot be the best, and it
    # must not stop the other arms and directories from being compared
    for a in arms:
        if a.get("width") and a.get("decode_tok_s") and (
                best is None or a["decode_tok_s"][1] / classic > best[2]):
            best = (d, a["width"], a["decode_tok_s"][1] / classic)
if best:
    print(best[0], best[1], round(best[2], 3))
PY
}

better_build() {  # "A|B why": the pair whose drafter keeps more drafted tokens on its worse target
                  # (build.json's acceptance at width 4 on the held-out prompts); A when B has none
    python3 - "$1/build.json" "$2/build.json" <<'PY'
import json, sys
def worse(path):
    try:
        acc = json.load(open(path))["acceptance_held_out_width4"]
        return min(acc[t]["pooled"] for t in ("bf16", "4bit"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
a, b = worse(sys.argv[1]), worse(sys.argv[2])
pick = "B" if b is not None and (a is None or b > a) else "A"
print(pick, f"worse-target acceptance A {a} B {b}")
PY
}

pack_results() {  # $1 results folder, $2 tarball name in $OUT, $3 what to call it, $4 log file, $5
                  # log lines: the folder as it is now into $OUT, then whether the run is done
    tar -czf "$OUT/$2" -C "$(dirname "$1")" "$(basename "$1")"
    if [ -f "$1/done" ]; then echo "$3: done"; else echo "$3: running"; fi
    tail -"$5" "$4" 2>/dev/null
}
