"""What a checkpoint folder holds, read without loading it: safetensors headers,
parameter count, and a content fingerprint; and ``Checkpoint``, one folder read once (its config,
quantization, weights' headers, tokenizer files and fingerprint), which a pair load builds per
folder and passes down. No MLX import."""

from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockwidth.policy.errors import BlockwidthError

if TYPE_CHECKING:
    from blockwidth.engine.shapes import Weights
    from blockwidth.policy.quantization import Quantization

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
    matmul's cost 8-60x, and a converted checkpoint's config may not say it."""
    from blockwidth.engine.shapes import read_weights

    return tensor_dtypes_of(read_weights(path))


def tensor_dtypes_of(weights: "Weights") -> dict[str, str | None]:
    """tensor_dtypes from headers already read (a Checkpoint's), so a pair load reads none again."""
    counts: dict[str, dict[str, int]] = {"weights": {}, "scales": {}}
    for name, dtype in weights.dtypes.items():
        if dtype not in _FLOAT_NAMES or name.endswith(".biases"):
            continue
        into = counts["scales" if name.endswith(".scales") else "weights"]
        dt = _FLOAT_NAMES[dtype]
        into[dt] = into.get(dt, 0) + math.prod(weights.shapes[name])
    return {k: (max(v, key=v.get) if v else None) for k, v in counts.items()}


def fingerprint(path: Path, config_bytes: bytes | None = None) -> str:
    """A content fingerprint: config.json and, per weights file, size and sampled bytes.
    ``config_bytes``: config.json as already read (Checkpoint), so it is not read again."""
    path = Path(path)
    h = hashlib.sha256()
    cfg = path / "config.json"
    if config_bytes is not None:
        h.update(config_bytes)
    elif cfg.is_file():
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


def pair_id(target: "Path | Checkpoint", drafter: "Path | Checkpoint | None") -> str:
    """The pair's key; a Checkpoint's fingerprint is the one it already computed."""
    def fp(c: "Path | Checkpoint") -> str:
        return c.fingerprint if isinstance(c, Checkpoint) else fingerprint(c)

    return pair_key(fp(target), fp(drafter) if drafter else None)


def _file_digest(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:  # in blocks: a tokenizer file can be large
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One checkpoint folder, read once. ``read`` reads config.json (the one read of it: its
    bytes feed the fingerprint); the quantization sidecar, the weights' headers, the fingerprint
    and the tokenizer files' digests are read on first use and kept, so a folder that only
    resolves (a hub checkpoint fetched without weights) reads no weights. A pair load builds one
    per folder and passes it down (engine.pair); ``resolve`` builds one per resolution."""

    path: Path
    config: dict[str, Any]
    config_bytes: bytes = field(repr=False)

    @classmethod
    def read(cls, path: Path | str) -> "Checkpoint":
        """The folder's config.json, read and checked (policy.config.ConfigError as it says)."""
        from blockwidth.policy.config import read_config_bytes

        config, raw = read_config_bytes(Path(path))
        return cls(Path(path), config, raw)

    @cached_property
    def sidecar(self) -> dict[str, Any] | None:
        """ModelOpt's hf_quant_config.json, or None (policy.config.ConfigError when broken)."""
        from blockwidth.policy.config import read_sidecar

        return read_sidecar(self.path)

    @cached_property
    def quantization(self) -> "Quantization":
        from blockwidth.policy.quantization import classify

        return classify(self.config, self.sidecar)

    @cached_property
    def weights(self) -> "Weights":
        """Every safetensors header, checked (CheckpointError)."""
        from blockwidth.engine.shapes import read_weights

        return read_weights(self.path)

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.path, self.config_bytes)

    @cached_property
    def tokenizer_digests(self) -> dict[str, str]:
        """sha256 of each tokenizer* file (OSError as open raises it)."""
        return {f.name: _file_digest(f) for f in sorted(self.path.iterdir())
                if f.name.startswith("tokenizer") and f.is_file()}

    @property
    def context_length(self) -> int | None:
        from blockwidth.policy.config import context_length

        return context_length(self.config)


def read_checkpoint(path: "Path | str | Checkpoint", what: str) -> Checkpoint:
    """The folder read once (a Checkpoint is returned as it is); a ConfigError about the input
    ``what`` (``target``, ``draft``) when its config.json cannot be read or asks to run code."""
    if isinstance(path, Checkpoint):
        return path
    from blockwidth.policy.config import ConfigError

    try:
        return Checkpoint.read(path)
    except ConfigError as e:
        raise e.about(what) from None
