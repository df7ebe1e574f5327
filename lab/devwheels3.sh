#!/usr/bin/env bash
# Re-split the MLX CUDA wheels of ../shared/device/mlx-cuda-wheels.sh (.devwheels/a, .devwheels/b)
# into PARTS transfers (default 4, at most 10), .devwheels/p1..pN: one device call carries at most
# 64 MiB, working tree included, and with the committed evidence the tree is ~40 MB (2026-11-30,
# seven builds), so the earlier three 30 MB parts no longer fit; it refuses a PARTS whose largest
# transfer, tree included, would not fit. On the GPU host, N calls right after each other:
#   1..N-1. carry .devwheels/pK:  mkdir -p /root/dw && cp .devwheels/pK/mlxpart.* /root/dw/
#   N.      carry .devwheels/pN:  bash .devwheels/pN/install.sh && export PYTHONPATH=/tmp/site:$PWD && ...
# install.sh joins exactly this split's N parts (/root/dw may hold a longer earlier split's).
set -euo pipefail
parts=${PARTS:-4}
case $parts in
[1-9] | 10) ;;
*) echo "PARTS $parts: a whole number from 1 to 10" >&2; exit 2 ;;
esac
top=$(git rev-parse --show-toplevel)
cd "$top/.devwheels"
name=$(cat b/NAME)
# ../shared's wheel set predates the profile's move to tomlkit (comment-keeping round-trip TOML):
# without it `sweep --save` and `--check` fail on the GPU host (2026-11-30g). One download, kept
# in .devwheels/extra, so later splits need no network
if ! ls extra/tomlkit-*.whl > /dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d extra "tomlkit>=0.12" \
        || { echo "tomlkit: no wheel in .devwheels/extra and pip could not download one" >&2; exit 2; }
fi
tmp=$(mktemp -d)
cat a/part.aa b/part.ab > "$tmp/$name"
size=$(( ($(stat -c %s "$tmp/$name") + parts - 1) / parts ))
# what a device call carries besides a part: the tracked and untracked, not ignored, files
tree=$(git -C "$top" ls-files -z -co --exclude-standard | (cd "$top" && xargs -0 -r stat -c %s -- 2>/dev/null || true) \
    | awk '{s += $1} END {print s + 0}')
extra=$(cat b/NAME b/*.whl extra/tomlkit-*.whl | wc -c)
if [ $(( tree + size + extra )) -gt $(( 64 * 1024 * 1024 )) ]; then
    echo "PARTS $parts: the tree ($tree bytes) and a $size-byte part with the wheels come to more than 64 MiB; split in more parts" >&2
    rm -rf "$tmp"
    exit 2
fi
split -b "$size" -d -a 1 "$tmp/$name" "$tmp/mlxpart."
rm -rf p[0-9]*
for k in $(seq 1 "$parts"); do mkdir -p "p$k" && mv "$tmp/mlxpart.$((k - 1))" "p$k/"; done
last=p$parts
cp b/NAME b/*.whl extra/tomlkit-*.whl "$last/"
names=$(seq -f '"$dw/mlxpart.%g"' 0 $((parts - 1)) | paste -sd' ')
cat > "$last/install.sh" <<INNER
#!/usr/bin/env bash
set -euo pipefail
dw=\${DW:-/root/dw} out=\${WHEEL_DIR:-/tmp}
mkdir -p "\$dw"
cp .devwheels/$last/mlxpart.* "\$dw/"
name=\$(cat .devwheels/$last/NAME)
cat $names > "\$out/\$name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \\
    "\$out/\$name" \$(ls .devwheels/$last/*.whl)
PYTHONPATH=/tmp/site python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info().get("device_name"))'
INNER
chmod +x "$last/install.sh"
rm -rf "$tmp"
du -sh p[0-9]*
