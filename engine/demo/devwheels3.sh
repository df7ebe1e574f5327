#!/usr/bin/env bash
# Re-split the MLX CUDA wheels of ../shared/device/mlx-cuda-wheels.sh (.devwheels/a, .devwheels/b)
# into three transfers, .devwheels/p1..p3 (~30 MB each): with the demo pair and the committed
# evidence the working tree is ~23 MB, and one device call carries at most 64 MiB, so the
# two 45 MB halves no longer fit. On the GPU host, three calls right after each other:
#   1. carry .devwheels/p1:  mkdir -p /root/dw && cp .devwheels/p1/mlxpart.0 /root/dw/
#   2. carry .devwheels/p2:  cp .devwheels/p2/mlxpart.1 /root/dw/
#   3. carry .devwheels/p3:  bash .devwheels/p3/install.sh && export PYTHONPATH=/tmp/site:$PWD && ...
set -euo pipefail
cd "$(git rev-parse --show-toplevel)/.devwheels"
name=$(cat b/NAME)
tmp=$(mktemp -d)
cat a/part.aa b/part.ab > "$tmp/$name"
mkdir -p p1 p2 p3
split -b 30000000 -d -a 1 "$tmp/$name" "$tmp/mlxpart."
mv "$tmp/mlxpart.0" p1/ && mv "$tmp/mlxpart.1" p2/ && mv "$tmp/mlxpart.2" p3/
cp b/NAME b/*.whl p3/
cat > p3/install.sh <<'INNER'
#!/usr/bin/env bash
set -euo pipefail
name=$(cat .devwheels/p3/NAME)
cat /root/dw/mlxpart.0 /root/dw/mlxpart.1 .devwheels/p3/mlxpart.2 > "/tmp/$name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "/tmp/$name" $(ls .devwheels/p3/*.whl)
PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info().get("device_name"))'
INNER
chmod +x p3/install.sh
rm -rf "$tmp"
du -sh p1 p2 p3
