"""Hub ids: config.json from the local Hugging Face cache (offline) or the Hub, and safetensors headers read by Range."""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import SplitResult, quote, urljoin, urlsplit

from symparam.config import MAX_CONFIG, Source, catalog, preset_name, presets, read_config, read_preset
from symparam.errors import SymparamError
from symparam.files import read_text

T = TypeVar("T")
ENDPOINT = "https://huggingface.co"  # the Hub, unless HF_ENDPOINT names another
REVISION = "main"
INSTALL = "pip install 'symparam[hub]'"
TRUE = {"1", "ON", "YES", "TRUE"}  # the values huggingface_hub reads as a true environment variable
PART = re.compile(r"\w(?:[\w.-]*\w)?", re.ASCII)  # an organisation or model name as the Hub allows it
REF = re.compile(r"[\w.-]+(?:/[\w.-]+)*", re.ASCII)  # a branch, tag (refs/pr/1 too) or commit
COMMIT = re.compile(r"[0-9a-f]{40}")
SHARD = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.safetensors", re.ASCII)  # a shard an index may name: a file beside it
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"  # what a repo's checkpoint is called, as transformers saves it
WORKERS = 8  # headers read at once
TIMEOUT = 10.0  # seconds to wait for the server, each read (huggingface_hub's default)
TRANSFER = 60.0  # seconds a whole transfer may take, unless SYMPARAM_TRANSFER_TIMEOUT says otherwise


# --- names and places ------------------------------------------------------------------------------------------


def check_id(name: str) -> str:
    """A Hub id ORG/NAME as the Hub allows it (letters, digits, '-', '_', '.'; no '--' or '..'), else a one-line error."""
    parts = name.split("/")
    if len(parts) != 2 or not all(PART.fullmatch(p) for p in parts) or "--" in name or ".." in name or len(parts[1]) > 96:
        raise SymparamError(f"model: {name!r} is not a Hub id (ORG/NAME of letters, digits, '-', '_' and '.')")
    return name


def check_revision(revision: str) -> str:
    if not REF.fullmatch(revision) or ".." in revision:
        raise SymparamError(f"--revision: {revision!r} is not a branch, tag or commit")
    return revision


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, as huggingface_hub reads it: no network call at all."""
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE


def endpoint() -> str:
    """The Hub to ask: HF_ENDPOINT (a mirror, or a test server), else huggingface.co."""
    url = (os.environ.get("HF_ENDPOINT") or ENDPOINT).rstrip("/")
    if web(url) is None:
        raise SymparamError(f"HF_ENDPOINT: {url!r} is not an http(s) URL")
    return url


def web(url: str) -> SplitResult | None:
    """An http(s) URL with a host, split; None for anything else (a bad port or IPv6 address included)."""
    try:
        parts = urlsplit(url)
        return parts if parts.scheme in ("http", "https") and parts.hostname and parts.port != 0 else None
    except ValueError:
        return None


def host(url: str) -> str:
    return urlsplit(url).netloc


def cache_dir() -> Path:
    """The Hugging Face hub cache where huggingface_hub keeps it: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    where = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(where)))


def cached(repo: str, revision: str) -> tuple[Path, str] | None:
    """(config.json, commit) of `repo` at `revision` in the cache (models--ORG--NAME, refs/REVISION names the commit), or None."""
    folder = cache_dir() / f"models--{repo.replace('/', '--')}"
    commit = revision
    if not COMMIT.fullmatch(revision):
        try:
            commit = read_text(folder / "refs" / revision, 4096, "ref").strip()
        except SymparamError:  # no such ref (or none that is a small text file): not cached
            return None
    path = folder / "snapshots" / commit / "config.json"
    return (path, commit) if COMMIT.fullmatch(commit) and path.is_file() else None


# --- config.json -----------------------------------------------------------------------------------------------


def read_model(name: str, revision: str | None = None) -> tuple[dict[str, Any], str, Source]:
    """The config `--model NAME` names, a title, and its source: the catalog preset (by name or Hub id) unless a revision
    is asked for; else the Hub id's config.json from the local Hugging Face cache, or from the Hub when online."""
    preset = preset_name(name)
    hub = catalog().get(preset, {}).get("hub", "") if preset else ""
    if preset is not None and revision is None:
        return read_preset(preset), preset, Source("catalog", preset=preset, hub=hub)
    if preset is None and "/" not in name:
        raise SymparamError(f"model: unknown preset {name!r}; `symparam list` shows the {len(presets())} presets, and a Hub id is ORG/NAME")
    if preset is not None and not hub:
        raise SymparamError(f"--revision: the preset {preset} is not on the Hub")
    repo, revision = hub or check_id(name), check_revision(revision or REVISION)
    hit = cached(repo, revision)
    if hit is not None:
        path, commit = hit
        return read_config(path), repo, Source("cache", hub=repo, revision=revision, commit=commit, path=str(path))
    if offline():
        raise SymparamError(f"{repo}: not in the Hugging Face cache {cache_dir()} at revision {revision}, and HF_HUB_OFFLINE is set; "
                            f"unset it to download its config.json, or get it where you are online: hf download {repo} config.json")
    raw, path = download(repo, revision)
    return raw, repo, Source("download", hub=repo, revision=revision, commit=path.parent.name, path=str(path), endpoint=endpoint())


def download(repo: str, revision: str) -> tuple[dict[str, Any], Path]:
    """config.json of `repo` at `revision`, and only that file, fetched into the cache by huggingface_hub and read. The
    whole transfer is bounded in time (transfer_limit()) and a file too large for a config.json is refused before it is
    fetched; what a failed or refused download put in the cache is taken out again (huggingface_hub's records of what a
    revision is and of files the repo lacks stay, as it writes them)."""
    what = f"{repo} config.json (revision {revision}, {host(endpoint())})"
    hf = library(f"{repo}: not in the Hugging Face cache {cache_dir()} at revision {revision}; to download its config.json")
    import httpx2  # huggingface_hub's HTTP client

    def fetch() -> Path:
        options = dict(revision=revision, cache_dir=cache_dir(), endpoint=endpoint())
        size = hf.hf_hub_download(repo, "config.json", dry_run=True, **options).file_size  # a HEAD request: nothing is written
        if size is not None and size > MAX_CONFIG:
            raise SymparamError(f"{what}: {size:,} bytes, too large for a config.json (at most {MAX_CONFIG:,})")
        return Path(hf.hf_hub_download(repo, "config.json", **options))

    folder = cache_dir() / f"models--{repo.replace('/', '--')}"
    before = stored(folder)
    try:
        with quiet():
            try:
                path = within(transfer_limit(), what, fetch)
            except (OSError, httpx2.HTTPError) as e:  # huggingface_hub's HTTP and cache errors, and a connection cut mid-file
                response = getattr(e, "response", None)
                if isinstance(e, hf.errors.HfHubHTTPError) and response is not None:
                    raise SymparamError(refusal(response.status_code, response.headers.get("X-Error-Code"), what, revision)) from None
                if isinstance(e, hf.errors.LocalEntryNotFoundError):
                    raise SymparamError(f"{what}: cannot reach {host(endpoint())} ({line(e.__cause__ or e)})") from None
                if isinstance(e, httpx2.TransportError):
                    raise SymparamError(f"{what}: the connection failed ({line(e)})") from None
                if isinstance(e, httpx2.TooManyRedirects):
                    raise SymparamError(f"{what}: the server redirects in a loop ({line(e)})") from None
                raise SymparamError(f"{what}: {e.__class__.__name__}: {line(e)}") from None
        return read_config(path), path
    except BaseException:
        forget(folder, before)
        raise


def stored(folder: Path) -> set[Path]:
    """The files (and links) under a cached repo's blobs/ and snapshots/."""
    return {p for part in ("blobs", "snapshots") if (folder / part).is_dir() for p in (folder / part).rglob("*") if not p.is_dir()}


def forget(folder: Path, before: set[Path]) -> None:
    """Remove what appeared under a cached repo's blobs/ and snapshots/ since `before` (a blob, a part of one, a
    snapshot's link), and the snapshot folders that leaves empty."""
    for path in stored(folder) - before:
        path.unlink(missing_ok=True)
    snapshots = folder / "snapshots"
    for commit in snapshots.iterdir() if snapshots.is_dir() else ():
        if commit.is_dir() and not any(commit.iterdir()):
            commit.rmdir()


def transfer_limit() -> float:
    """Seconds a whole transfer may take (a config.json, or every header of a checkpoint): SYMPARAM_TRANSFER_TIMEOUT,
    else TRANSFER. huggingface_hub's own timeout bounds each read; a server that sends a byte every few seconds passes
    that, and only this ends it."""
    text = os.environ.get("SYMPARAM_TRANSFER_TIMEOUT", "")
    try:
        seconds = float(text) if text else TRANSFER
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < math.inf:
        raise SymparamError(f"SYMPARAM_TRANSFER_TIMEOUT: expected a positive number of seconds, got {text!r}")
    return seconds


def within(seconds: float, what: str, work: Callable[[], T]) -> T:
    """work() in a daemon thread: its result or its exception, or after `seconds` a one-line error (the thread is left
    behind and ends with the process; nothing waits for it)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run, name="symparam-transfer", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise SymparamError(f"{what}: no complete answer within {seconds:g} s (SYMPARAM_TRANSFER_TIMEOUT)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def library(why: str) -> ModuleType:
    """huggingface_hub (the `hub` extra), imported only on the paths that go online."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # no agent-registry request or telemetry: only the files asked for
    try:
        import huggingface_hub.file_download  # its logging is set up on this import, before quiet() holds warnings back
    except ImportError:
        raise SymparamError(f"{why}, install huggingface_hub: {INSTALL}") from None
    return huggingface_hub


@contextmanager
def quiet() -> Iterator[None]:
    """huggingface_hub's retry warnings held back: a failure is one line, said by symparam."""
    import logging  # here, as every online-only import: the cold CLI does not load it

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__


def refusal(status: int, code: str | None, what: str, revision: str) -> str:
    """An HTTP error in words, by the X-Error-Code the Hub sends (GatedRepo, RepoNotFound, ...), else by its status."""
    if code == "GatedRepo":
        return f"{what}: a gated model; accept its conditions on its Hub page, then set HF_TOKEN to a token with access (HTTP {status})"
    if code == "RepoNotFound" or status == 401:
        return f"{what}: no such model, or a private one (set HF_TOKEN to a token with access) (HTTP {status})"
    if code == "RevisionNotFound":
        return f"{what}: no branch, tag or commit {revision} (HTTP {status})"
    if status == 404:
        return f"{what}: not found (HTTP 404)"
    return f"{what}: the server answered HTTP {status}"


# --- safetensors headers over HTTP -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """The safetensors headers of a published checkpoint: where they were read, each file's header, and the bytes read."""

    label: str
    headers: list[tuple[str, dict[str, Any]]]
    read: int


class Reader:
    """Range requests through huggingface_hub's HTTP session (proxies, user agent), the HF token sent to the Hub's host only."""

    def __init__(self, revision: str):
        if offline():
            raise SymparamError("verify --remote: HF_HUB_OFFLINE is set; unset it to read the checkpoint's headers over HTTP, or give --checkpoint PATH")
        self.hf = library("verify --remote: to read safetensors headers over HTTP")
        self.revision = revision
        self.commit = ""  # the commit the Hub resolved the revision to (X-Repo-Commit), once seen

    def get(self, url: str, start: int, stop: int, what: str, missing_ok: bool = False) -> tuple[bytes, int | None] | None:
        """Bytes [start, stop) of `url` (fewer where the file ends) and the file's size if the server says it; None for a
        missing file when `missing_ok`. Of a server that ignores Range, only the bytes up to `stop` are read."""
        import httpx2  # huggingface_hub's HTTP client

        token = None if host(url) == host(endpoint()) else False
        headers = {**self.hf.utils.build_hf_headers(token=token), "Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
        data = bytearray()
        try:
            with self.hf.utils.get_session().stream("GET", url, headers=headers, timeout=TIMEOUT) as r:
                code = r.headers.get("X-Error-Code")
                if r.status_code == 404 and missing_ok and code in (None, "EntryNotFound"):
                    return None
                if r.status_code not in (200, 206):
                    raise SymparamError(refusal(r.status_code, code, what, self.revision))
                skip, size = ranged(r.headers.get("Content-Range"), start, what) if r.status_code == 206 else (start, whole(r.headers.get("Content-Length")))
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) >= skip + stop - start:
                        break
                self.commit = self.commit or next((h.headers["X-Repo-Commit"] for h in [*r.history, r] if "X-Repo-Commit" in h.headers), "")
        except httpx2.ConnectError as e:
            raise SymparamError(f"{what}: cannot reach {host(url)} ({line(e)})") from None
        except httpx2.TransportError as e:
            raise SymparamError(f"{what}: the connection failed after {len(data):,} bytes ({line(e)})") from None
        except httpx2.TooManyRedirects as e:
            raise SymparamError(f"{what}: the server redirects in a loop ({line(e)})") from None
        except httpx2.HTTPError as e:  # an invalid URL or answer
            raise SymparamError(f"{what}: {e.__class__.__name__}: {line(e)}") from None
        return bytes(data[skip:skip + stop - start]), size

    def header(self, url: str, what: str, missing_ok: bool = False) -> tuple[dict[str, Any], int] | None:
        """A safetensors file's header and the bytes read: the 8-byte length, checked, then exactly the header; never a
        byte of tensor data (huggingface_hub asks for 100 kB at once, which holds tensor data after a small header)."""
        from symparam.safetensors import header_length, parse_header

        got = self.get(url, 0, 8, what, missing_ok)
        if got is None:
            return None
        length = header_length(got[0], what, got[1])
        data = self.get(url, 8, 8 + length, what)[0] if length else b""
        if len(data) < length:
            raise SymparamError(f"{what}: truncated safetensors header (it claims {length:,} bytes, the file ends after {len(data):,})")
        return parse_header(data, what), 8 + len(data)

    def index(self, url: str, what: str, missing_ok: bool = False) -> dict[str, Any] | None:
        """A safetensors index (at most MAX_INDEX bytes), or None for a missing file when `missing_ok`."""
        from symparam.safetensors import MAX_INDEX, parse_index

        got = self.get(url, 0, MAX_INDEX + 1, what, missing_ok)
        if got is None:
            return None
        if len(got[0]) > MAX_INDEX:
            raise SymparamError(f"{what}: over {MAX_INDEX:,} bytes, too large for a safetensors index")
        return parse_index(got[0], what)

    def headers(self, files: dict[str, tuple[str, str]]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """Each file's header (name -> (url, words for errors)), read by WORKERS daemon threads at once (nothing waits
        for one that hangs), progress on a terminal; the first failure ends the reading."""
        from queue import Empty, Queue

        todo: Queue = Queue()
        done: Queue = Queue()
        stop = threading.Event()
        for item in files.items():
            todo.put(item)

        def work() -> None:
            while not stop.is_set():
                try:
                    name, (url, what) = todo.get_nowait()
                except Empty:
                    return
                try:
                    done.put((name, self.header(url, what), None))
                except BaseException as e:  # noqa: BLE001 - handed to the reader
                    done.put((name, None, e))

        for _ in range(min(WORKERS, len(files))):
            threading.Thread(target=work, name="symparam-header", daemon=True).start()
        found: dict[str, dict[str, Any]] = {}
        total = 0
        try:
            with progress(len(files)) as tick:
                while len(found) < len(files):
                    name, got, error = done.get()
                    if error is not None:
                        raise error
                    found[name] = got[0]
                    total += got[1]
                    tick(len(found), total)
        finally:
            stop.set()
        return sorted(found.items()), total


def ranged(value: str | None, start: int, what: str) -> tuple[int, int | None]:
    """(bytes to skip, file size or None) from a 206 answer's Content-Range, which must start where asked."""
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", value or "")
    if match is None or int(match.group(1)) != start:
        raise SymparamError(f"{what}: the server answered a Range request with Content-Range {value!r}, not bytes from {start}")
    return 0, None if match.group(3) == "*" else int(match.group(3))


def whole(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@contextmanager
def progress(files: int) -> Iterator[Any]:
    """A tick(done, bytes) that rewrites one stderr line, when stderr is a terminal and there are several files; erased at the end."""
    shown = files > 1 and sys.stderr.isatty()

    def tick(done: int, read: int) -> None:
        if shown:
            sys.stderr.write(f"\rsymparam: read {done}/{files} safetensors headers ({read:,} bytes)")
            sys.stderr.flush()

    try:
        yield tick
    finally:
        if shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def hub_url(repo: str, revision: str, filename: str) -> str:
    """A file's resolve URL, as huggingface_hub's hf_hub_url writes it."""
    return f"{endpoint()}/{repo}/resolve/{quote(revision, safe='')}/{quote(filename)}"


def shard_names(index: dict[str, Any], what: str) -> list[str]:
    """The files an index's weight_map names: relative .safetensors names only (no URL, no '..')."""
    names = sorted({str(v) for v in index["weight_map"].values()})
    if not names:
        raise SymparamError(f"{what}: weight_map names no file")
    for name in names:
        if not SHARD.fullmatch(name) or ".." in name:
            raise SymparamError(f"{what}: weight_map names {name!r}, not a .safetensors file beside the index")
    return names


def check_url(url: str) -> str:
    """The file name of an http(s) URL of a .safetensors file or a safetensors index (.json), else a one-line error."""
    parts = web(url)
    name = parts.path.rsplit("/", 1)[-1] if parts else ""
    if not name.endswith((".safetensors", ".json")):
        raise SymparamError(f"--remote: {url!r} is not an http(s) URL of a .safetensors file or a safetensors index (.json)")
    return name


def remote_checkpoint(target: str, revision: str) -> Checkpoint:
    """The headers of a checkpoint on the Hub (a Hub id: its model.safetensors, else its index and every shard it names)
    or at a URL (a .safetensors file or an index), all within transfer_limit(); tensor data is never fetched."""
    reader = Reader(check_revision(revision))
    return within(transfer_limit(), f"{target}: the safetensors headers", lambda: read_checkpoint(reader, target, revision))


def read_checkpoint(reader: Reader, target: str, revision: str) -> Checkpoint:
    """What remote_checkpoint reads, without its time limit."""
    if target.startswith(("http://", "https://")):
        name = check_url(target)
        if name.endswith(".safetensors"):
            files = {name: (target, target)}
        else:
            names = shard_names(reader.index(target, target), target)
            files = {n: (urljoin(target, n), f"{n} (named in {target})") for n in names}
        headers, read = reader.headers(files)
        return Checkpoint(target, headers, read)
    repo = check_id(target)
    where = f"{repo} (revision {revision}, {host(endpoint())})"
    single = reader.header(hub_url(repo, revision, SINGLE), f"{repo}/{SINGLE}", missing_ok=True)
    if single is not None:
        headers, read = [(SINGLE, single[0])], single[1]
    else:
        index = reader.index(hub_url(repo, revision, INDEX), f"{repo}/{INDEX}", missing_ok=True)
        if index is None:
            raise SymparamError(f"{where}: neither {SINGLE} nor {INDEX}; give --remote URL of the checkpoint")
        names = shard_names(index, f"{repo}/{INDEX}")
        pinned = reader.commit or revision  # every shard from the commit the index came from
        headers, read = reader.headers({n: (hub_url(repo, pinned, n), f"{repo}/{n} (named in {INDEX})") for n in names})
    at = f"commit {revision}" if COMMIT.fullmatch(revision) else f"revision {revision}" + (f", commit {reader.commit}" if reader.commit else "")
    return Checkpoint(f"{endpoint()}/{repo} ({at})", headers, read)


__all__ = ["Checkpoint", "cache_dir", "cached", "check_id", "check_url", "read_model", "remote_checkpoint"]
