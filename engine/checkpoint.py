"""What a checkpoint folder holds, read without loading it: safetensors headers,
parameter count, and a content fingerprint. No MLX import."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

_SAMPLE = 1 << 16


class CheckpointError(Exception):
    """A weights file that is missing or unreadable; the message names the file."""


def weight_files(path: Path) -> list[Path]:
    return sorted(Path(path).glob("*.safetensors"))


def read_header(file: Path) -> dict[str, Any]:
    try:
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{file}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000:
                raise CheckpointError(f"{file}: not a safetensors file (header length {n})")
            body = fh.read(n)
        header = json.loads(body)
    except OSError as e:
        raise CheckpointError(f"{file}: cannot be read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{file}: corrupt safetensors header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: corrupt safetensors header")
    return header


def parameter_count(path: Path, bits: int | None = None) -> int | None:
    """Parameters in the folder's safetensors, unpacking MLX-quantized weights."""
    files = weight_files(path)
    if not files:
        return None
    total = 0
    for f in files:
        header = read_header(f)
        names = set(header)
        for name, meta in header.items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            if name.endswith(".scales") or name.endswith(".biases"):
                continue
            n = math.prod(meta.get("shape", []))
            base = name[: -len(".weight")] if name.endswith(".weight") else None
            if base and f"{base}.scales" in names and meta.get("dtype") == "U32" and bits:
                n = n * 32 // bits
            total += n
    return total


def fingerprint(path: Path) -> str:
    """A content fingerprint: config.json and, per weights file, size and sampled bytes."""
    path = Path(path)
    h = hashlib.sha256()
    cfg = path / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for f in weight_files(path):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            for off in (0, max(size // 2 - _SAMPLE // 2, 0), max(size - _SAMPLE, 0)):
                fh.seek(off)
                h.update(fh.read(_SAMPLE))
    return h.hexdigest()[:16]


def pair_key(target_fp: str, drafter_fp: str | None) -> str:
    """The key a pair-specific profile entry matches: both fingerprints (``lookup`` for no drafter)."""
    return f"{target_fp}+{drafter_fp or 'lookup'}"


def pair_id(target: Path, drafter: Path | None) -> str:
    return pair_key(fingerprint(target), fingerprint(drafter) if drafter else None)
