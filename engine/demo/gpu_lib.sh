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
