"""What a checkpoint folder holds, read without loading it: safetensors headers,
parameter count, and a content fingerprint. No MLX import."""

from __future__ import annotations

import hashlib
import math
import os
import struct
from pathlib import Path
from typing import Any

from blockwidth.policy.errors import BlockwidthError

_SAMPLE = 1 << 16


class CheckpointError(BlockwidthError):
    """A weights file that is missing or unreadable; the message names the file."""


# Bytes per element of the safetensors dtypes; a header naming another is corrupt.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
                "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                "I64": 8, "U64": 8, "F64": 8, "C64": 8}
MAX_HEADER_BYTES = 100_000_000


def weight_files(path: Path) -> list[Path]:
    """The folder's ``*.safetensors``; one that is not a regular file is an error, not skipped."""
    files = sorted(Path(path).glob("*.safetensors"))
    for f in files:
        if not f.is_file():
            kind = "a directory" if f.is_dir() else "not a regular file"
            raise CheckpointError(f"{f}: is {kind}, not a safetensors file")
    return files


def _tensor_problem(name: str, meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return f"tensor {name!r} is not described by an object"
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        return f"tensor {name!r} has shape {str(shape)[:40]}, not a list of sizes"
    if meta.get("dtype") not in _DTYPE_BYTES:
        return f"tensor {name!r} has dtype {str(meta.get('dtype'))[:20]!r}, not a safetensors dtype"
    off = meta.get("data_offsets")
    if (not isinstance(off, list) or len(off) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in off)
            or off[0] > off[1]):
        return f"tensor {name!r} has data_offsets {str(off)[:40]}, not [begin, end]"
    # What MLX's loader refuses, so is refused here: a shape whose bytes are not its data's
    # (a header claiming a 10^12-element tensor in 16 bytes counted 1.1 trillion parameters).
    want = math.prod(shape) * _DTYPE_BYTES[meta["dtype"]]
    if want != off[1] - off[0]:
        return (f"tensor {name!r} of shape {str(shape)[:40]} and dtype {meta['dtype']} needs "
                f"{int(want) if want == int(want) else want} bytes, its data_offsets give {off[1] - off[0]}")
    return None


def read_header(file: Path) -> dict[str, Any]:
    """The safetensors header, checked: every tensor has a shape of sizes, a known dtype and
    offsets inside the file (a truncated file is an error, not a smaller model)."""
    from blockwidth.policy import files as _files

    try:
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            raw = fh.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{file}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise CheckpointError(f"{file}: not a safetensors file (header length {n}, "
                                      f"file {size} bytes)")
            body = fh.read(n)
    except OSError as e:
        raise CheckpointError(f"{file}: cannot be read ({e.strerror})") from None
    try:
        header = _files.loads_json(body, file)
    except _files.FileProblem as e:
        raise CheckpointError(f"corrupt safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: corrupt safetensors header")
    end = 0
    meta_block = header.get("__metadata__")
    if isinstance(meta_block, dict) and not all(isinstance(v, str) for v in meta_block.values()):
        raise CheckpointError(f"{file}: corrupt safetensors header: __metadata__ values must be strings")
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(name, meta)
        if problem:
            raise CheckpointError(f"{file}: corrupt safetensors header: {problem}")
        end = max(end, meta["data_offsets"][1])
    if 8 + n + end > size:
        raise CheckpointError(f"{file}: truncated: the header describes {8 + n + end} bytes, "
                              f"the file has {size}")
    return header


def module_bits(config: dict) -> dict[str, int]:
    """Per-module bits an MLX ``quantization`` block overrides (mlx-lm's class_predicate reads
    the same keys): a GGUF's Q8_0 embedding beside Q4_1 layers is ``model.embed_tokens``: 8."""
    out: dict[str, int] = {}
    for holder in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        q = holder.get("quantization") if isinstance(holder, dict) else None
        if isinstance(q, dict):
            for name, v in q.items():
                if isinstance(v, dict) and isinstance(v.get("bits"), int) and not isinstance(v.get("bits"), bool):
                    out[name] = v["bits"]
    return out


def parameter_count(path: Path, bits: int | None = None, per_module: dict[str, int] | None = None) -> int | None:
    """Parameters in the folder's safetensors, unpacking MLX-quantized weights (``per_module``:
    bits of the modules that differ from ``bits``, module_bits)."""
    files = weight_files(path)
    if not files:
        return None
    per_module = per_module or {}
    total = 0
    for f in files:
        header = read_header(f)
        names = set(header)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name.endswith(".scales") or name.endswith(".biases"):
                continue
            n = math.prod(meta["shape"])
            base = name[: -len(".weight")] if name.endswith(".weight") else None
            b = per_module.get(base, bits) if base else bits
            if base and f"{base}.scales" in names and meta.get("dtype") == "U32" and b:
                n = n * 32 // b
            total += n
    return total


_FLOAT_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def tensor_dtypes(path: Path) -> dict[str, str | None]:
    """What the tensors are, not what config.json says: ``weights``, the dtype holding most
    elements of the unquantized floating tensors, and ``scales``, the quantized weights' scales
    dtype (None when nothing is quantized). On MLX's CPU the scales' dtype alone moves a 4-bit
    matmul's cost 8-60x (issue 34), and a converted checkpoint's config may not say it."""
    weights: dict[str, int] = {}
    scales: dict[str, int] = {}
    for f in weight_files(path):
        for name, meta in read_header(f).items():
            if name == "__metadata__" or meta.get("dtype") not in _FLOAT_NAMES:
                continue
            into = scales if name.endswith(".scales") else None if name.endswith(".biases") else weights
            if into is not None:
                dt = _FLOAT_NAMES[meta["dtype"]]
                into[dt] = into.get(dt, 0) + math.prod(meta["shape"])
    top = lambda d: max(d, key=d.get) if d else None  # noqa: E731
    return {"weights": top(weights), "scales": top(scales)}


def fingerprint(path: Path) -> str:
    """A content fingerprint: config.json and, per weights file, size and sampled bytes."""
    path = Path(path)
    h = hashlib.sha256()
    cfg = path / "config.json"
    if cfg.is_file():
        from blockwidth.policy import files as _files

        try:
            h.update(_files.read_bytes(cfg, _files.MAX_JSON_BYTES))
        except _files.FileProblem as e:
            raise CheckpointError(str(e)) from None
    try:
        for f in weight_files(path):
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            with open(f, "rb") as fh:
                for off in (0, max(size // 2 - _SAMPLE // 2, 0), max(size - _SAMPLE, 0)):
                    fh.seek(off)
                    h.update(fh.read(_SAMPLE))
    except OSError as e:
        raise CheckpointError(f"{e.filename or path}: cannot be read ({e.strerror})") from None
    return h.hexdigest()[:16]


def pair_key(target_fp: str, drafter_fp: str | None) -> str:
    """The key a pair-specific profile entry matches: both fingerprints (``lookup`` for no drafter)."""
    return f"{target_fp}+{drafter_fp or 'lookup'}"


def pair_id(target: Path, drafter: Path | None) -> str:
    return pair_key(fingerprint(target), fingerprint(drafter) if drafter else None)
