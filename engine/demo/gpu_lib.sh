# Shell helpers shared by the GPU evidence scripts (h200x2.sh, h200pipe.sh); sourced, not run.

best_width() {  # the width with the highest median decode tok/s in the newest sweep record of $1
    python3 - "$1" <<'PY'
import json, pathlib, sys
recs = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
r = json.loads(recs[-1].read_text())
arms = [a for a in r["arms"] if a.get("width")]
print(max(arms, key=lambda a: a["decode_tok_s"][1])["width"])
PY
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
    r = json.loads(recs[-1].read_text())
    classic = next(a for a in r["arms"] if not a.get("width"))["decode_tok_s"][1]
    for a in r["arms"]:
        if a.get("width") and (best is None or a["decode_tok_s"][1] / classic > best[2]):
            best = (d, a["width"], a["decode_tok_s"][1] / classic)
if best:
    print(best[0], best[1], round(best[2], 3))
PY
}
