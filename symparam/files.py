"""Atomic writes: a temporary file beside the target, renamed over it, with the mode a plain open() would give."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from symparam.errors import SymparamError


def new_file_mode() -> int:
    """0o666 less the process umask: what open(path, "w") gives a new file (0o644 under the usual umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def replacing(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` when the block ends; on any error `path` is untouched and nothing is left."""
    path = Path(path)
    if not path.parent.is_dir():
        raise SymparamError(f"{path}: no such directory {path.parent}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, new_file_mode())  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write text (UTF-8, newlines as given) or bytes to `path` atomically."""
    with replacing(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


__all__ = ["new_file_mode", "replacing", "write_atomic"]
