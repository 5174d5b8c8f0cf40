"""Safetensors files as data: dtype names and widths, a file's header (local or read by the Hub reader), indexes, shards."""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from symparam.errors import SymparamError
from symparam.files import existing, loads, opened, read_bytes, shown, status

# Bytes per stored element, by the dtype name a safetensors header spells.
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
# config.json (torch_dtype) and --dtype names of those dtypes.
DTYPE_NAMES = {
    "float32": "F32", "fp32": "F32", "float16": "F16", "fp16": "F16", "bfloat16": "BF16", "bf16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "fp8": "F8_E4M3", "int8": "I8", "float64": "F64",
}

# The most header bytes read from one safetensors file (local or remote), the limit the safetensors library itself sets:
# a length past it is refused before anything is allocated or fetched.
MAX_HEADER = 100_000_000
MAX_INDEX = 100_000_000  # the largest safetensors index read, local or remote


@dataclass(frozen=True)
class Tensor:
    """One tensor of a checkpoint, from its header."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def bytes(self) -> int | None:
        """Bytes of its data, or None for a dtype this table does not know."""
        width = DTYPE_BYTES.get(self.dtype)
        return None if width is None else width * self.elements


def header_length(head: bytes, where: str, size: int | None) -> int:
    """The header length a safetensors file's first 8 bytes state (little-endian), checked against the cap and the file size."""
    if len(head) < 8:
        raise SymparamError(f"{where}: not a safetensors file (shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_HEADER:
        raise SymparamError(f"{where}: not a safetensors file (its header claims {length:,} bytes; symparam reads at most {MAX_HEADER:,})")
    if size is not None and length > size - 8:
        raise SymparamError(f"{where}: truncated safetensors header (it claims {length:,} bytes, the file holds {size - 8:,} after the length)")
    return length


def parse_header(data: bytes, where: str) -> dict[str, Any]:
    """The JSON object of a safetensors header."""
    header = loads(data, f"{where}: safetensors header")
    if not isinstance(header, dict):
        raise SymparamError(f"{where}: not a safetensors file (header is not a JSON object)")
    return header


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file: 8-byte little-endian length, then that many bytes of JSON."""
    with opened(path) as (f, size):
        length = header_length(f.read(8), shown(path), size)
        return parse_header(f.read(length), shown(path))


def header_tensors(header: dict[str, Any], where: str) -> list[Tensor]:
    """Every tensor a safetensors header lists, with dtype and shape."""
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape) or not isinstance(info.get("dtype"), str):
            raise SymparamError(f"{where}: tensor {name!r} has no valid dtype and shape in the header")
        out.append(Tensor(name, info["dtype"], tuple(shape)))
    return out


def tensors(path: Path) -> list[Tensor]:
    """Every tensor a .safetensors file stores, with dtype and shape."""
    return header_tensors(read_header(path), str(path))


def parse_index(data: bytes | str, where: str) -> dict[str, Any]:
    """A model.safetensors.index.json's text as data: its metadata and weight_map."""
    index = loads(data, where)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise SymparamError(f"{where}: not a safetensors index (no weight_map)")
    return index


def read_index(path: Path) -> dict[str, Any]:
    """A model.safetensors.index.json file: its metadata and weight_map."""
    return parse_index(read_bytes(path, MAX_INDEX, "safetensors index"), shown(path))


def locate(path: str | Path) -> tuple[list[Path], Path | None]:
    """(shard files to read, the index file if any) for a file, a directory of shards, or an index.json."""
    path = Path(path)
    if stat.S_ISDIR(status(path).st_mode):
        shards = sorted(path.glob("*.safetensors"))
        index = next(iter(sorted(path.glob("*.safetensors.index.json"))), None)
        if not shards and index is None:
            raise SymparamError(f"{shown(path)}: no .safetensors files or index in this directory")
        return shards, index
    if path.name.endswith(".index.json"):
        files = sorted({str(v) for v in read_index(path)["weight_map"].values()})
        shards = [path.parent / f for f in files]
        return (shards if all(existing(s) for s in shards) else []), path
    if path.suffix == ".safetensors":
        return [path], None
    raise SymparamError(f"{shown(path)}: expected a .safetensors file, a directory of shards or a model.safetensors.index.json")


__all__ = ["DTYPE_BYTES", "DTYPE_NAMES", "MAX_HEADER", "MAX_INDEX", "Tensor", "header_length", "parse_header", "read_header", "header_tensors",
           "tensors", "parse_index", "read_index", "locate"]
