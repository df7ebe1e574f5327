#!/usr/bin/env bash
# The real pairs on this CPU (the real models' evidence): SmolLM2-135M-Instruct (bf16 target; lookup, and
# its own 4-bit as a draft model) over the built-in chat and mixed workloads, and Gemma 3 270M
# with lookup on a prompt past its 512-token sliding window. Token counts are modest on purpose:
# one row of the 135M model costs 0.2-0.5 s on this busy 2-core CPU, and a verify of w rows
# costs about w rows. The models are the tests' cache (tests/real.py), built first if missing.
#   bash lab/real_cpu.sh OUT_DIR [STEP...]     steps: chat-lookup chat-model mixed-lookup gemma-window
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: lab/real_cpu.sh OUT_DIR [STEP...]}; shift
steps=${*:-chat-lookup chat-model mixed-lookup gemma-window}
py=.venv/bin/python
models=$($py -c 'from tests import real; print(real.build())')  # (python -m tests.real lists the folders)
smol=$models/smollm2; gemma=$models/gemma3/bf16
mkdir -p "$out/records"
sweep() {  # name, sweep args...
  local name=$1; shift
  echo "== $name: blockwidth sweep $*" | tee "$out/$name.txt"
  $py -m blockwidth sweep "$@" --record-dir "$out/records" >> "$out/$name.txt" 2>&1
  echo "exit $?" >> "$out/$name.txt"
}
for step in $steps; do
  case $step in
    chat-lookup) sweep chat-lookup --target "$smol/bf16" --kind lookup --workload lab/evidence/real-cpu-2026-12-04/chat-classes.jsonl --widths 2,4 -n 2 --max-tokens 24 --seed 1 ;;
    chat-model) sweep chat-model --target "$smol/bf16" --draft "$smol/native" --kind model --workload lab/evidence/real-cpu-2026-12-04/chat-classes.jsonl --widths 2 -n 1 --max-tokens 16 --seed 1 ;;
    mixed-lookup) sweep mixed-lookup --target "$smol/bf16" --kind lookup --workload mixed --widths 2 -n 1 --max-tokens 12 --seed 1 ;;
    gemma-window) sweep gemma-window --target "$gemma" --kind lookup --prompt-file lab/evidence/real-cpu-2026-12-04/gemma-window-prompt.txt --widths 3 -n 1 --max-tokens 24 --seed 1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
