"""Every file a user names, read or written in one place: inputs only if regular and at most a stated size (JSON and
TOML read from them bounded too); outputs atomically (a temporary file beside the target, renamed over it) or through a
FIFO or character device; a failure is one line naming the path."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from symparam.errors import SymparamError

MAX_NESTING = 64  # levels of lists and tables in a config or recipe: real ones have fewer than 8
SHOWN = 400  # characters of a path or value an error shows in full (a path can be 4,096 long)

KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}
REASONS = {  # errno -> the words an error uses (strerror's, lower-cased, where these are not clearer)
    errno.ENOENT: "no such file", errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.ELOOP: "too many levels of symbolic links (a loop?)", errno.ENAMETOOLONG: "file name too long",
    errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device", errno.EISDIR: "a directory", errno.ENXIO: "a FIFO with no reader",
}


def shown(path: str | Path) -> str:
    """A path as an error names it: on one line (control characters escaped), a very long one shortened."""
    text = str(path)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= SHOWN else f"{text[:SHOWN // 2]}...{text[-SHOWN // 2:]} ({len(str(path)):,} characters)"


def reason(e: OSError) -> str:
    """An OSError in a few words."""
    return REASONS.get(e.errno, (e.strerror or e.__class__.__name__).lower())


def kind(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


# --- inputs ----------------------------------------------------------------------------------------------------


def status(path: str | Path) -> os.stat_result:
    """os.stat(path) through symlinks; a missing, looping or unreachable path is a one-line error."""
    try:
        return os.stat(path)
    except OSError as e:
        raise SymparamError(f"{shown(path)}: {reason(e)}") from None
    except ValueError:  # a NUL byte in the name
        raise SymparamError(f"{shown(path)}: not a file name (it holds a NUL byte)") from None


def existing(path: str | Path) -> os.stat_result | None:
    """os.stat(path) through symlinks, None if nothing is there; a name too long, a loop or a file in the way is a
    one-line error (pathlib's exists() raises some of these and hides others)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return status(path)  # the same error, in words


@contextmanager
def opened(path: str | Path) -> Iterator[tuple[BinaryIO, int]]:
    """A regular file open for reading, and its size. A FIFO, a device, a directory, a missing or unreadable path is a
    one-line error; the file is opened without blocking (a FIFO with no writer would wait forever) and checked first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise SymparamError(f"{shown(path)}: {reason(e)}") from None
    except ValueError:  # a NUL byte in the name
        raise SymparamError(f"{shown(path)}: not a file name (it holds a NUL byte)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise SymparamError(f"{shown(path)}: {kind(info.st_mode)}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            yield f, info.st_size
        except OSError as e:
            raise SymparamError(f"{shown(path)}: cannot read ({reason(e)})") from None


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """A regular file's bytes, refused beyond `limit` bytes (before a byte is read where its size says so)."""
    with opened(path) as (f, size):
        data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise SymparamError(f"{shown(path)}: larger than {limit:,} bytes, too large for a {what}")
    return data


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    """A regular file's UTF-8 text (a BOM is dropped: editors write one), at most `limit` bytes."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SymparamError(f"{shown(path)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start:,}); a {what} is UTF-8") from None


def nesting(value: Any, where: str, limit: int = MAX_NESTING) -> Any:
    """`value` (parsed JSON or TOML) if its lists and tables nest at most `limit` deep, else a one-line error; counted
    without recursion, so that nothing downstream recurses deeper than this."""
    level = [(value, 1)]
    while level:
        item, depth = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    raise SymparamError(f"{where}: nested more than {limit} levels deep")
                level.append((child, depth + 1))
    return value


class _LongNumber(Exception):
    """A JSON integer with more digits than Python reads (sys.get_int_max_str_digits())."""


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > sys.get_int_max_str_digits() > 0:
        raise _LongNumber(len(text.lstrip("-")))
    return int(text)


def loads(text: str | bytes, where: str) -> Any:
    """JSON text as data, as Python's json (and so transformers) reads it: NaN and Infinity are floats (Nemotron-H's
    time_step_limit holds Infinity; a size that is one is refused where it is read), an integer of more digits than
    Python reads and too-deep nesting are refused, a duplicate key is warned of (the last wins)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                print(f"{where}: warning: key {key!r} appears more than once; the last value wins, as in transformers", file=sys.stderr)
            out[key] = value
        return out

    try:
        return nesting(json.loads(text, object_pairs_hook=pairs, parse_int=_integer), where)
    except json.JSONDecodeError as e:
        raise SymparamError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise SymparamError(f"{where}: not valid JSON (not UTF-8 text)") from None
    except _LongNumber as e:
        raise SymparamError(f"{where}: a number of {e.args[0]:,} digits, more than Python reads ({sys.get_int_max_str_digits():,}); no size is that large") from None
    except RecursionError:
        raise SymparamError(f"{where}: JSON nested too deeply to be a config") from None


# --- outputs ---------------------------------------------------------------------------------------------------


def new_file_mode() -> int:
    """0o666 less the process umask: what open(path, "w") gives a new file (0o644 under the usual umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def destination(path: Path) -> tuple[Path, os.stat_result | None, bool]:
    """Where writing `path` lands, as open(path, "w") would write it: (the file, its status if it exists, whether to write
    through it). A regular file, or a symlink to one, is replaced where it really is (the link stays); a FIFO or a
    character device (/dev/null, /dev/stdout) is written through, never renamed over; anything else is refused."""
    try:
        info = os.stat(path)  # through symlinks
    except FileNotFoundError:
        real = Path(os.path.realpath(path))  # a new file, or what a dangling symlink names
        if not real.parent.is_dir():
            raise SymparamError(f"{shown(path)}: no such directory {shown(real.parent)}") from None
        return real, None, False
    except (OSError, ValueError):
        info = status(path)  # the same error, in words
    if stat.S_ISREG(info.st_mode):
        return Path(os.path.realpath(path)), info, False
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode):
        return path, info, True
    raise SymparamError(f"{shown(path)}: {kind(info.st_mode)}; give the path of a file to write")


def write_through(path: Path, data: bytes) -> None:
    """`data` written into an existing FIFO or character device, without blocking on a FIFO nobody reads."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "wb") as f:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):  # it changed since destination() looked
            raise SymparamError(f"{shown(path)}: {kind(mode)}, changed while symparam wrote it")
        os.set_blocking(fd, True)
        f.write(data)


@contextmanager
def replacing(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends; on any error `path` is untouched and nothing is left.
    A regular file keeps its mode (and owner, where allowed); a new one gets what a plain open() would give."""
    path = Path(path)
    target, info, through = destination(path)
    try:
        if through:  # nothing reaches the FIFO or device unless the whole output was made
            buffer = io.BytesIO()
            yield buffer
            write_through(path, buffer.getvalue())
            return
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:64]}.", suffix=".tmp")  # short: a long name stays valid
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
            os.chmod(tmp, info.st_mode & 0o777 if info else new_file_mode())  # mkstemp makes it 0600
            if info is not None and (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.chown(tmp, info.st_uid, info.st_gid)
                except PermissionError:
                    pass  # as open() on a file of another owner would leave it: the writer's
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise SymparamError(f"{shown(path)}: cannot write ({reason(e)})") from None


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write text (UTF-8, newlines as given) or bytes to `path` atomically (or through a FIFO or device)."""
    with replacing(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def directory(path: str | Path) -> Path:
    """A directory to write into, made (with its parents) if missing; a file in the way is a one-line error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SymparamError(f"{shown(path)}: not a directory") from None
    except OSError as e:
        raise SymparamError(f"{shown(path)}: cannot make this directory ({reason(e)})") from None
    return path


__all__ = ["MAX_NESTING", "status", "existing", "opened", "read_bytes", "read_text", "nesting", "loads", "new_file_mode", "replacing", "write_atomic", "directory", "shown"]
