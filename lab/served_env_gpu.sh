#!/usr/bin/env bash
# The served path's environment end to end on the GPU host (docs/served.md, after 2026-12-02b): the demo
# pair through mlx_lm.server with MLX_CUDA_USE_CUDNN_SDPA=0, saved to a profile; resolve's answer
# for serving (its command must set the variable); blockwidth serve from that profile answering one
# /v1/completions request (its launch line must set it too). Writes into OUT (or $1):
# sweep.txt/.err, p.toml, rec/, resolve.txt, serve.out/.err, completion.json. About 2 minutes.
#   bash lab/served_env_gpu.sh [OUT]
set -uo pipefail
R=${1:-${OUT:?OUT or a folder}}
mkdir -p "$R"
BW="python3 -m blockwidth"
export PYTHONUNBUFFERED=1
# no prompt cache: mlx-lm 0.32.2's cached repeat can differ from classic (docs/served.md), which
# would leave nothing saveable; SKIP_SWEEP=1 uses a p.toml already in the folder
if [ -z "${SKIP_SWEEP:-}" ]; then
    MLX_CUDA_USE_CUDNN_SDPA=0 timeout -s INT -k 15 150 $BW sweep --path mlx-lm-server --widths 2,4 -n 3 \
        --max-tokens 64 --sequential --max-reps 8 --max-seconds 60 --server-args="--prompt-cache-size 0" \
        --save --profile "$R/p.toml" --record-dir "$R/rec" > "$R/sweep.txt" 2> "$R/sweep.err"
    echo "sweep rc $?"
fi
$BW resolve --path mlx-lm-server --profile "$R/p.toml" > "$R/resolve.txt" 2>&1
echo "resolve rc $?"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$BW serve --profile "$R/p.toml" --port "$port" --max-tokens 32 > "$R/serve.out" 2> "$R/serve.err" &
pid=$!
for _ in $(seq 1 60); do grep -q "ready at" "$R/serve.err" 2>/dev/null && break; sleep 1; done
python3 - "$port" > "$R/completion.json" 2>&1 <<'PY'
import json, sys, urllib.request
body = json.dumps({"prompt": "def main(", "max_tokens": 16, "temperature": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
print(json.dumps(json.loads(urllib.request.urlopen(req, timeout=60).read()), indent=1))
PY
echo "completion rc $?"
kill -TERM "$pid"; wait "$pid"; echo "serve rc $?"  # TERM: a background job ignores SIGINT
cat "$R/resolve.txt"; grep "blockwidth serve" "$R/serve.out" "$R/serve.err"
