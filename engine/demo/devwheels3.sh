#!/usr/bin/env bash
# Re-split the MLX CUDA wheels of ../shared/device/mlx-cuda-wheels.sh (.devwheels/a, .devwheels/b)
# into PARTS transfers (default 4), .devwheels/p1..pN: one device call carries at most 64 MiB,
# working tree included, and with the committed evidence the tree is ~37 MB (2026-11-30), so
# the earlier three 30 MB parts no longer fit. On the GPU host, N calls right after each other:
#   1..N-1. carry .devwheels/pK:  mkdir -p /root/dw && cp .devwheels/pK/mlxpart.* /root/dw/
#   N.      carry .devwheels/pN:  bash .devwheels/pN/install.sh && export PYTHONPATH=/tmp/site:$PWD && ...
set -euo pipefail
parts=${PARTS:-4}
cd "$(git rev-parse --show-toplevel)/.devwheels"
name=$(cat b/NAME)
tmp=$(mktemp -d)
cat a/part.aa b/part.ab > "$tmp/$name"
size=$(( ($(stat -c %s "$tmp/$name") + parts - 1) / parts ))
split -b "$size" -d -a 1 "$tmp/$name" "$tmp/mlxpart."
rm -rf p[0-9]*
for k in $(seq 1 "$parts"); do mkdir -p "p$k" && mv "$tmp/mlxpart.$((k - 1))" "p$k/"; done
last=p$parts
cp b/NAME b/*.whl "$last/"
cat > "$last/install.sh" <<INNER
#!/usr/bin/env bash
set -euo pipefail
cp .devwheels/$last/mlxpart.* /root/dw/
name=\$(cat .devwheels/$last/NAME)
cat \$(ls /root/dw/mlxpart.* | sort -t. -k2 -n) > "/tmp/\$name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \\
    "/tmp/\$name" \$(ls .devwheels/$last/*.whl)
PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info().get("device_name"))'
INNER
chmod +x "$last/install.sh"
rm -rf "$tmp"
du -sh p[0-9]*
