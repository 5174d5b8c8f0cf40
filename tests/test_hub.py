"""Hub ids for real: a loopback server shaped like the Hub (resolve URLs, ETag, X-Repo-Commit, LFS redirects, Range,
X-Error-Code), the real huggingface_hub client pointed at it by HF_ENDPOINT, the CLI run as a user runs it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pty
import re
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from symparam import hub
from symparam.config import MAX_CONFIG
from symparam.errors import SymparamError

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

TOKEN = "hf_test_token_with_access"
MAIN, V1 = "1" * 40, "2" * 40  # commits: every repo's main, and tiny/llama's branch v1

# Tiny random models; embeddings of 2048 x 64 floats make the tensor data of each file far larger than its header.
DIMS = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, pad_token_id=0)
DRIP = 1.0  # seconds between the bytes of a file that drips: each read is quick, the whole transfer never ends
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
GPT2 = dict(vocab_size=2048, n_embd=64, n_layer=2, n_head=4, n_positions=32)


def save_tiny(family: str, path: Path, dims: dict, **save) -> int:
    """A tiny random model of `family` saved by transformers' save_pretrained; returns its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **dims))
    model.save_pretrained(path, **save)
    return sum(p.numel() for p in model.parameters())


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def length_prefixed(length: int, body: bytes) -> bytes:
    return length.to_bytes(8, "little") + body


# --- the Hub-shaped server -------------------------------------------------------------------------------------


@dataclass
class Repo:
    trees: dict[str, dict[str, bytes]]  # commit -> file name -> bytes
    refs: dict[str, str] = field(default_factory=lambda: {"main": MAIN})
    gated: bool = False
    drop: set[str] = field(default_factory=set)  # files whose download is cut off after 20 bytes
    drip: set[str] = field(default_factory=set)  # files sent a byte every DRIP seconds, headers first
    loop: bool = False  # every file redirects to itself


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int = 0
    sent: int = 0  # body bytes written


class Hub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, tuple[bytes, bool]] = {}  # sha256 -> (bytes, cut off)
        self.log: list[Request] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.counts: dict[str, int] = {}  # family -> parameters of its tiny model
        self.root = Path()  # where the tiny models were saved


class Handler(BaseHTTPRequestHandler):
    """Answers as huggingface.co does: /ORG/NAME/resolve/REV/FILE gives small files with ETag (git sha1) and X-Repo-Commit,
    redirects LFS files (.safetensors) with X-Linked-Etag and X-Linked-Size to a CDN path that honours Range; errors carry
    X-Error-Code (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound)."""

    protocol_version = "HTTP/1.1"
    server: Hub

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(body=False)

    def do_GET(self):
        self.answer(body=True)

    def answer(self, body: bool) -> None:
        path = urlsplit(self.path).path
        self.request_log = Request(self.command, path, self.headers.get("Range"), self.headers.get("Authorization"))
        self.server.log.append(self.request_log)
        if path.startswith("/cdn/") and path[5:] in self.server.blobs:
            data, cut = self.server.blobs[path[5:]]
            return self.send(data, body, {}, cut)
        if path.startswith("/loop/"):  # a URL that redirects to itself
            return self.status(302, {"Location": path, "Content-Length": "0"})
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m is None:
            return self.error(404, None, "Not found")
        repo_id, revision, name = m.group(1), unquote(m.group(2)), unquote(m.group(3))
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return self.error(404, "RepoNotFound", "Repository not found")
        auth = self.headers.get("Authorization")
        if repo.gated and auth != f"Bearer {TOKEN}":
            return self.error(403 if auth else 401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it.")
        if repo.loop:
            return self.status(302, {"Location": path, "Content-Length": "0"})
        commit = repo.refs.get(revision, revision if revision in repo.trees else None)
        if commit is None:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        data = repo.trees[commit].get(name)
        if data is None:
            return self.error(404, "EntryNotFound", f"{name} does not exist on {revision!r}", commit)
        if name in repo.drip:
            return self.drip(data, body, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
        if not name.endswith(".safetensors"):
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            return self.send(data, body, {"ETag": f'"{blob}"', "X-Repo-Commit": commit}, name in repo.drop)
        sha = hashlib.sha256(data).hexdigest()
        self.server.blobs[sha] = (data, name in repo.drop)
        self.status(302, {"Location": f"{self.server.url}/cdn/{sha}", "X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"',
                          "X-Linked-Size": str(len(data)), "ETag": f'"{sha}"', "Content-Length": "0"})

    def status(self, code: int, headers: dict[str, str]) -> None:
        self.request_log.status = code
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()

    def error(self, code: int, error_code: str | None, message: str, commit: str | None = None) -> None:
        text = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(text)), "X-Error-Message": message}
        headers |= {"X-Error-Code": error_code} if error_code else {}
        headers |= {"X-Repo-Commit": commit} if commit else {}
        self.status(code, headers)
        if self.command == "GET":
            self.wfile.write(text)

    def drip(self, data: bytes, body: bool, headers: dict[str, str]) -> None:
        """The whole file, honestly labelled, one byte every DRIP seconds (a Range is ignored: 200 with everything)."""
        self.status(200, {**headers, "Content-Length": str(len(data))})
        if not body:
            return
        try:
            for byte in data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                self.request_log.sent += 1
                time.sleep(DRIP)
        except OSError:  # the client gave up
            self.close_connection = True

    def send(self, data: bytes, body: bool, headers: dict[str, str], cut: bool = False) -> None:
        start, stop, code = 0, len(data), 200
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if asked:
            start, code = int(asked.group(1)), 206
            stop = min(int(asked.group(2)) + 1, len(data)) if asked.group(2) else len(data)
            if start >= len(data):
                return self.status(416, {"Content-Range": f"bytes */{len(data)}", "Content-Length": "0"})
            headers = {**headers, "Content-Range": f"bytes {start}-{stop - 1}/{len(data)}"}
        chunk = data[start:stop]
        self.status(code, {**headers, "Accept-Ranges": "bytes", "Content-Length": str(len(chunk))})
        if body:
            sent = chunk[:20] if cut else chunk
            self.wfile.write(sent)
            self.request_log.sent = len(sent)
            self.close_connection = cut


def start(root: Path) -> Hub:
    """The Hub-shaped server, serving: tiny models of three families saved under `root` (one sharded), a config that
    disagrees with its weights, a gated copy, and broken checkpoints."""
    counts = {}
    counts["llama"] = save_tiny("llama", root / "llama", DIMS)
    counts["gpt2"] = save_tiny("gpt2", root / "gpt2", GPT2)
    counts["qwen3_moe"] = save_tiny("qwen3_moe", root / "qwen3_moe", {**DIMS, **MOE}, max_shard_size="200KB")
    save_tiny("llama", root / "mha", {**DIMS, "num_key_value_heads": 4})
    mismatch = files(root / "mha")
    mismatch["config.json"] = json.dumps({**json.loads(mismatch["config.json"]), "num_key_value_heads": 2}).encode()
    llama, sharded = files(root / "llama"), files(root / "qwen3_moe")
    assert sum(n.endswith(".safetensors") for n in sharded) > 2
    v1 = {"config.json": json.dumps({**json.loads(llama["config.json"]), "num_hidden_layers": 1}).encode()}
    broken = {"config.json": llama["config.json"]}
    last_shard = max(n for n in sharded if n.endswith(".safetensors"))
    server = Hub()
    server.repos = {
        "tiny/llama": Repo({MAIN: llama, V1: v1}, refs={"main": MAIN, "v1": V1}),
        "tiny/gpt2": Repo({MAIN: files(root / "gpt2")}),
        "tiny/qwen3-moe": Repo({MAIN: sharded}),
        "tiny/llama-mismatch": Repo({MAIN: mismatch}),
        "gated/llama": Repo({MAIN: llama}, gated=True),
        "broken/drop": Repo({MAIN: {**broken, "model.safetensors": llama["model.safetensors"]}}, drop={"model.safetensors"}),
        "broken/truncated": Repo({MAIN: {**broken, "model.safetensors": length_prefixed(5000, b'{"a": ' + b" " * 94)}}),
        "broken/huge": Repo({MAIN: {**broken, "model.safetensors": length_prefixed(10**12, b"{" + b" " * 200_000)}}),
        "broken/missing-shard": Repo({MAIN: {k: v for k, v in sharded.items() if k != last_shard}}),
        "broken/no-weights": Repo({MAIN: broken}),
        "broken/no-config": Repo({MAIN: {"model.safetensors": llama["model.safetensors"]}}),
        "broken/config-drop": Repo({MAIN: llama}, drop={"config.json"}),
        "slow/config": Repo({MAIN: llama}, drip={"config.json"}),
        "slow/weights": Repo({MAIN: llama}, drip={"model.safetensors"}),
        "loop/redirect": Repo({MAIN: llama}, loop=True),
        "bad/not-json": Repo({MAIN: {"config.json": b"{not json"}}),
        "bad/digits": Repo({MAIN: {"config.json": b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}"}}),
        "bad/array": Repo({MAIN: {"config.json": b"[1, 2, 3]"}}),
        "bad/huge": Repo({MAIN: {"config.json": b"{" + b" " * MAX_CONFIG + b"}"}}),
    }
    server.counts, server.root = counts, root
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start(tmp_path_factory.mktemp("models"))
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def hf(server, tmp_path):
    """A clean Hugging Face home and cache for one test, the server's log emptied."""
    server.log.clear()
    return Env(server, tmp_path / "hf-home", tmp_path / "hf-cache")


@dataclass
class Env:
    server: Hub
    home: Path
    cache: Path

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_")) and "proxy" not in k.lower()}
        return {**base, "HF_HOME": str(self.home), "HF_HUB_CACHE": str(self.cache), "HF_ENDPOINT": self.server.url,
                "NO_PROXY": "127.0.0.1,localhost", **extra}

    def run(self, *argv: str, tty: bool = False, **extra: str) -> tuple[int, str, str]:
        """The CLI in a fresh process as a user runs it: (exit code, stdout, stderr); stderr a terminal if `tty`."""
        command = [sys.executable, "-m", "symparam.cli", *argv]
        if not tty:
            proc = subprocess.run(command, capture_output=True, text=True, env=self.env(**extra), timeout=120)
            return proc.returncode, proc.stdout, proc.stderr
        master, slave = pty.openpty()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, env=self.env(**extra), timeout=120)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
        os.close(master)
        return proc.returncode, proc.stdout.decode(), err.decode()

    def paths(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.server.log]

    def written(self) -> list[str]:
        """Every file under the Hugging Face home and cache."""
        return sorted(str(p) for d in (self.home, self.cache) if d.exists() for p in d.rglob("*") if not p.is_dir())


def one_error(code: int, out: str, err: str) -> str:
    """The bad-input contract: exit 2, nothing on stdout, one line on stderr."""
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("symparam: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write_cache(cache: Path, repo: str, config: bytes, commit: str = MAIN, ref: str = "main") -> Path:
    """A cache entry laid out as huggingface_hub writes it: blobs/SHA1, snapshots/COMMIT/config.json -> the blob, refs/REF."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(config)
    link = folder / "snapshots" / commit / "config.json"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    ref_file = folder / "refs" / ref
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    ref_file.write_text(commit)
    return link


# --- the local cache: offline, no request ----------------------------------------------------------------------


def test_cache_hit_reads_no_network_and_loads_no_huggingface_hub(hf):
    config = (hf.server.root / "llama" / "config.json").read_bytes()
    path = write_cache(hf.cache, "cached/llama", config)
    code, out, _ = hf.run("count", "--model", "cached/llama", "--json")
    data = json.loads(out)
    assert code == 0 and data["name"] == "cached/llama" and data["total"] == hf.server.counts["llama"]
    assert data["source"] == {"kind": "cache", "hub": "cached/llama", "revision": "main", "commit": MAIN, "path": str(path)}
    assert "read from the local Hugging Face cache" in data["notes"][0]
    code, out, _ = hf.run("count", "--model", "cached/llama", HF_HUB_OFFLINE="1")
    assert code == 0 and out.splitlines()[1] == f"Config: cached/llama at revision main (commit {MAIN}), read from the local Hugging Face cache: {path}."
    assert hf.paths() == []  # no request reached the server
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "symparam.cli", "count", "--model", "cached/llama"],
                          capture_output=True, text=True, env=hf.env(), timeout=int(os.environ.get("HUBTRY_TIMEOUT", "120")))
    assert proc.returncode == 0 and "huggingface_hub" not in proc.stderr and "sympy" in proc.stderr  # the cold path stays offline


def test_cache_revision_and_derivation_say_where_the_config_came_from(hf):
    config = json.loads((hf.server.root / "llama" / "config.json").read_bytes())
    write_cache(hf.cache, "cached/llama", json.dumps(config).encode())
    path = write_cache(hf.cache, "cached/llama", json.dumps({**config, "num_hidden_layers": 1}).encode(), commit=V1, ref="v1")
    code, out, _ = hf.run("count", "--model", "cached/llama", "--revision", "v1", "--json", HF_HUB_OFFLINE="1")
    data = json.loads(out)
    assert code == 0 and data["source"]["commit"] == V1 and data["source"]["path"] == str(path) and data["total"] < hf.server.counts["llama"]
    code, out, _ = hf.run("count", "--model", "cached/llama", "--revision", V1, "--json", HF_HUB_OFFLINE="1")  # a commit, no ref needed
    assert code == 0 and json.loads(out)["source"]["commit"] == V1
    code, out, _ = hf.run("derive", "--model", "cached/llama", "--markdown", HF_HUB_OFFLINE="1")
    assert code == 0 and f"(commit {MAIN}), read from the local Hugging Face cache" in out.split("\n\n")[1]
    code, out, _ = hf.run("derive", "--model", "cached/llama", "--latex", "--lang", "zh", HF_HUB_OFFLINE="1")
    assert code == 0 and f"（提交 {MAIN}），读自本地 Hugging Face 缓存" in out
    assert hf.paths() == []


@pytest.mark.parametrize(("env", "where"), [
    ({"HF_HUB_CACHE": "/x/cache", "HF_HOME": "/y"}, "/x/cache"),
    ({"HF_HOME": "/y"}, "/y/hub"),
    ({"XDG_CACHE_HOME": "/z"}, "/z/huggingface/hub"),
    ({}, "~/.cache/huggingface/hub"),
])
def test_cache_dir_is_where_huggingface_hub_keeps_it(monkeypatch, env, where):
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert hub.cache_dir() == Path(os.path.expanduser(where))


# --- downloading config.json -----------------------------------------------------------------------------------


def test_download_fetches_only_config_json_then_reads_the_cache(hf):
    code, out, err = hf.run("count", "--model", "tiny/llama", "--json")
    data = json.loads(out)
    assert code == 0 and err == "" and data["total"] == hf.server.counts["llama"]
    path = hf.cache / "models--tiny--llama" / "snapshots" / MAIN / "config.json"
    assert data["source"] == {"kind": "download", "hub": "tiny/llama", "revision": "main", "commit": MAIN, "path": str(path), "endpoint": hf.server.url}
    head, get = "HEAD /tiny/llama/resolve/main/config.json", "GET /tiny/llama/resolve/main/config.json"
    assert hf.paths() == [head, head, get]  # its size first (too large is refused unread), then the file; no telemetry, no other file
    assert (hf.cache / "models--tiny--llama" / "refs" / "main").read_text() == MAIN
    code, out, _ = hf.run("count", "--model", "tiny/llama", HF_HUB_OFFLINE="1")
    assert code == 0 and "read from the local Hugging Face cache" in out and len(hf.server.log) == 3  # the second run is offline


def test_download_of_a_revision_and_its_note(hf):
    code, out, _ = hf.run("count", "--model", "tiny/llama", "--revision", "v1")
    host = hf.server.url.removeprefix("http://")
    assert code == 0 and f"Config: tiny/llama at revision v1 (commit {V1}), downloaded from {host} into the Hugging Face cache" in out
    assert hf.paths()[0] == "HEAD /tiny/llama/resolve/v1/config.json"


def test_hf_token_opens_a_gated_model_and_goes_to_the_hub_only(hf):
    code, out, _ = hf.run("count", "--model", "gated/llama", "--json", HF_TOKEN=TOKEN)
    assert code == 0 and json.loads(out)["total"] == hf.server.counts["llama"]
    code, out, _ = hf.run("verify", "--model", "gated/llama", "--remote", HF_TOKEN=TOKEN)
    assert code == 0 and out.splitlines()[-1] == "match"
    assert {r.authorization for r in hf.server.log} == {f"Bearer {TOKEN}"}
    hf.server.log.clear()
    elsewhere = hf.server.url.replace("127.0.0.1", "localhost") + "/tiny/llama/resolve/main/model.safetensors"  # another host name
    code, out, _ = hf.run("verify", "--model", "gated/llama", "--remote", elsewhere, HF_TOKEN=TOKEN)
    assert code == 0 and len(hf.server.log) == 4 and all(r.authorization is None for r in hf.server.log)  # config cached; 2 x (302, CDN)


# --- verify --remote -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("repo", "family"), [("tiny/llama", "llama"), ("tiny/gpt2", "gpt2"), ("tiny/qwen3-moe", "qwen3_moe")])
def test_remote_verify_matches_reading_headers_only(hf, repo, family):
    code, out, err = hf.run("verify", "--model", repo, "--remote", "--json")
    report = json.loads(out)
    assert code == 0 and report["match"] and report["found"] == report["expected"] == hf.server.counts[family], report
    assert err == ""  # not a terminal: no progress line
    lengths = [int.from_bytes(p.read_bytes()[:8], "little") for p in (hf.server.root / family).iterdir() if p.name.endswith(".safetensors")]
    cdn = [r for r in hf.server.log if r.path.startswith("/cdn/")]
    assert sorted(r.range for r in cdn) == sorted(["bytes=0-7"] * len(lengths) + [f"bytes=8-{7 + n}" for n in lengths])
    assert sum(r.sent for r in cdn) == sum(8 + n for n in lengths)  # the headers, not a byte of tensor data
    assert report["source"] == f"{hf.server.url}/{repo} (commit {MAIN})"  # the commit the config came from
    assert any(n.startswith("read over HTTP") for n in report["notes"]) and any(n.startswith("Config:") for n in report["notes"])


def test_remote_verify_of_a_sharded_checkpoint_reads_the_index_then_each_shard_at_its_commit(hf):
    code, out, _ = hf.run("verify", "--model", "tiny/qwen3-moe", "--remote")
    assert code == 0 and out.splitlines()[-1] == "match"
    resolved = [p for p in hf.paths() if "/resolve/" in p and "config.json" not in p]
    assert resolved[:2] == [f"GET /tiny/qwen3-moe/resolve/{MAIN}/model.safetensors", f"GET /tiny/qwen3-moe/resolve/{MAIN}/model.safetensors.index.json"]
    assert len(resolved) > 4 and all(f"GET /tiny/qwen3-moe/resolve/{MAIN}/model-" in p for p in resolved[2:])  # at the config's commit


def test_remote_verify_names_the_mismatch(hf):
    code, out, _ = hf.run("verify", "--model", "tiny/llama-mismatch", "--remote")
    assert code == 1 and out.splitlines()[-1] == "MISMATCH (2)"
    k_line = next(line for line in out.splitlines() if "k_proj" in line)
    assert "fits h_kv = 4" in k_line and "full multi-head attention, the config says grouped-query" in k_line


def test_remote_url_of_an_index_or_a_file(hf):
    config = hf.server.root / "qwen3_moe" / "config.json"
    base = f"{hf.server.url}/tiny/qwen3-moe/resolve/main"
    code, out, _ = hf.run("verify", "--config", str(config), "--remote", f"{base}/model.safetensors.index.json", "--json")
    assert code == 0 and json.loads(out)["match"] and json.loads(out)["source"] == f"{base}/model.safetensors.index.json"
    code, out, _ = hf.run("verify", "--config", str(hf.server.root / "llama" / "config.json"), "--remote", f"{hf.server.url}/tiny/llama/resolve/main/model.safetensors")
    assert code == 0 and out.splitlines()[-1] == "match"
    assert all(r.authorization is None for r in hf.server.log)  # no token was set, none sent


def test_progress_on_a_terminal_for_many_shards(hf):
    shards = sum(n.endswith(".safetensors") for n in files(hf.server.root / "qwen3_moe"))
    code, out, err = hf.run("verify", "--model", "tiny/qwen3-moe", "--remote", tty=True)
    assert code == 0 and out.splitlines()[-1] == "match"
    assert f"\rsymparam: read {shards}/{shards} safetensors headers (" in err and err.endswith("\r\x1b[K")


# --- bad input: one line, exit 2, nothing written ----------------------------------------------------------------


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["count", "--model", "nobody/nothing"], {"HF_HUB_OFFLINE": "1"}, "nobody/nothing: not in the Hugging Face cache"),
    (["count", "--model", "nobody/nothing"], {}, "no such model, or a private one (set HF_TOKEN to a token with access) (HTTP 404)"),
    (["count", "--model", "gated/llama"], {}, "a gated model; accept its conditions on its Hub page, then set HF_TOKEN"),
    (["count", "--model", "gated/llama"], {"HF_TOKEN": "hf_wrong"}, "a gated model; accept its conditions on its Hub page, then set HF_TOKEN to a token with access (HTTP 403)"),
    (["count", "--model", "tiny/llama", "--revision", "nope"], {}, "no branch, tag or commit nope"),
    (["count", "--model", "a/b/c"], {}, "'a/b/c' is not a Hub id"),
    (["count", "--model", "Qwen/Qwen3 8B"], {}, "'Qwen/Qwen3 8B' is not a Hub id"),
    (["count", "--model", "tiny/llama", "--revision", "../x"], {}, "--revision: '../x' is not a branch, tag or commit"),
    (["verify", "--model", "broken/drop", "--remote"], {}, "broken/drop/model.safetensors: the connection failed after 20 bytes"),
    (["verify", "--model", "broken/truncated", "--remote"], {}, "truncated safetensors header (it claims 5,000 bytes, the file holds 100 after the length)"),
    (["verify", "--model", "broken/huge", "--remote"], {}, "its header claims 1,000,000,000,000 bytes; symparam reads at most 100,000,000"),
    (["verify", "--model", "broken/missing-shard", "--remote"], {}, "(named in model.safetensors.index.json): not found (HTTP 404)"),
    (["verify", "--model", "broken/no-weights", "--remote"], {}, "neither model.safetensors nor model.safetensors.index.json"),
    (["verify", "--model", "tiny/llama", "--remote", "http://127.0.0.1:1/model.safetensors"], {}, "cannot reach 127.0.0.1:1"),
    (["verify", "--model", "classic-512", "--remote"], {}, "--remote: this model has no Hub id"),
    (["verify", "--model", "qwen3-8b", "--remote"], {"HF_HUB_OFFLINE": "1"}, "verify --remote: HF_HUB_OFFLINE is set"),
    (["verify", "--model", "tiny/llama", "--remote", "ftp://x/y.json"], {}, "--remote: 'ftp://x/y.json' is not an http(s) URL"),
    (["verify", "--model", "tiny/llama", "--remote", "https://x/org/name"], {}, "not an http(s) URL of a .safetensors file or a safetensors index"),
])
def test_bad_input_is_one_line_and_leaves_nothing(hf, argv, env, says):
    before = hf.written()
    err = one_error(*hf.run(*argv, **env))
    assert says in err
    if argv[0] == "count":
        assert hf.written() == before  # nothing downloaded or cached half-way
    if "OFFLINE" in str(env) or "Hub id" in says or "URL" in says:
        assert hf.paths() == []


def test_a_repo_without_config_json_leaves_only_huggingface_hubs_record_of_that(hf):
    err = one_error(*hf.run("count", "--model", "broken/no-config"))
    assert f"broken/no-config config.json (revision main, {hf.server.url.removeprefix('http://')}): not found (HTTP 404)" in err
    folder = hf.cache / "models--broken--no-config"
    assert hf.written() == sorted([str(folder / ".no_exist" / MAIN / "config.json"), str(folder / "refs" / "main")])
    assert (folder / ".no_exist" / MAIN / "config.json").stat().st_size == 0 and not (folder / "blobs").exists()


def test_a_config_cut_off_mid_download_is_not_cached(hf):
    err = one_error(*hf.run("count", "--model", "broken/config-drop"))
    assert "config.json (revision main" in err and "the connection failed (peer closed connection" in err
    folder = hf.cache / "models--broken--config-drop"
    assert [p for p in hf.written() if "/blobs/" in p or "/snapshots/" in p or "incomplete" in p] == []  # no blob, no part of one
    assert (folder / "refs" / "main").read_text() == MAIN  # huggingface_hub's note of what main is, from the answer to HEAD
    assert "broken/config-drop: not in the Hugging Face cache" in one_error(*hf.run("count", "--model", "broken/config-drop", HF_HUB_OFFLINE="1"))


def cached_files(hf: Env) -> list[str]:
    """What the cache holds beyond huggingface_hub's records (refs, .no_exist): blobs, parts of them, snapshots."""
    return [p for p in hf.written() if "/blobs/" in p or "/snapshots/" in p or "incomplete" in p]


SLOW = {"SYMPARAM_TRANSFER_TIMEOUT": "2"}  # the server drips a byte a second (DRIP): each read is quick, no transfer ends


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["count", "--model", "bad/not-json"], {}, "config.json: not valid JSON (Expecting property name"),
    (["count", "--model", "bad/digits"], {}, "config.json: a number of 5,000 digits, more than Python reads"),
    (["count", "--model", "bad/array"], {}, "config.json: expected a JSON object, got list"),
    (["count", "--model", "bad/huge"], {}, f"bad/huge config.json (revision main, 127.0.0.1"),
    (["count", "--model", "slow/config"], SLOW, "slow/config config.json (revision main, 127.0.0.1"),
    (["count", "--model", "loop/redirect"], {}, "the server redirects in a loop"),
    (["verify", "--model", "slow/weights", "--remote"], SLOW, "slow/weights: the safetensors headers: no complete answer within 2 s (SYMPARAM_TRANSFER_TIMEOUT)"),
    (["verify", "--model", "tiny/llama", "--remote", "{url}/loop/model.safetensors"], {}, "/loop/model.safetensors: the server redirects in a loop"),
    (["count", "--model", "-org/name"], {}, "model: '-org/name' is not a Hub id"),
    (["count", "--model", "slow/config"], {"SYMPARAM_TRANSFER_TIMEOUT": "soon"}, "SYMPARAM_TRANSFER_TIMEOUT: expected a positive number of seconds, got 'soon'"),
])
def test_a_refused_slow_or_looping_download_is_one_line_and_caches_nothing(hf, argv, env, says):
    err = one_error(*hf.run(*[a.format(url=hf.server.url) for a in argv], **env))
    assert says in err
    assert [p for p in cached_files(hf) if "tiny--llama" not in p and "slow--weights" not in p] == []  # nothing of the refused file
    if argv[-1] in ("bad/not-json", "slow/config"):  # nothing in the cache for the next run to read
        assert "not in the Hugging Face cache" in one_error(*hf.run(*argv, HF_HUB_OFFLINE="1"))


def test_a_config_too_large_is_refused_before_it_is_fetched(hf):
    err = one_error(*hf.run("count", "--model", "bad/huge"))
    assert f"{MAX_CONFIG + 2:,} bytes, too large for a config.json (at most {MAX_CONFIG:,})" in err
    assert hf.paths() == ["HEAD /bad/huge/resolve/main/config.json"]  # its size, then nothing


def test_unknown_id_offline_says_how_to_get_it(hf):
    err = one_error(*hf.run("count", "--model", "nobody/nothing", HF_HUB_OFFLINE="1"))
    assert str(hf.cache) in err and "hf download nobody/nothing config.json" in err and "unset it" in err


def test_a_huge_header_is_refused_before_it_is_fetched(hf):
    one_error(*hf.run("verify", "--model", "broken/huge", "--remote"))
    cdn = [r for r in hf.server.log if r.path.startswith("/cdn/")]
    assert len(cdn) == 1 and cdn[0].sent == 8  # the length only: no request for the claimed terabyte


def test_without_huggingface_hub_it_says_how_to_install(hf):
    script = "import sys; sys.modules['huggingface_hub'] = None; from symparam.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv, says in [(["count", "--model", "tiny/llama"], "to download its config.json, install huggingface_hub: pip install 'symparam[hub]'"),
                       (["verify", "--model", "qwen3-8b", "--remote"], "verify --remote: to read safetensors headers over HTTP, install huggingface_hub")]:
        proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=hf.env(), timeout=int(os.environ.get("HUBTRY_TIMEOUT", "120")))
        assert says in one_error(proc.returncode, proc.stdout, proc.stderr)
    assert hf.paths() == []


def test_check_id():
    assert hub.check_id("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    for bad in ["a/b/c", "Qwen/Qwen3 8B", "a--b/c", "a/b..c", "-a/b", "a/b-", "/b", "a/", "a/" + "x" * 97]:
        with pytest.raises(SymparamError):
            hub.check_id(bad)


@pytest.mark.parametrize("weight_map", [{}, {"w": "../x.safetensors"}, {"w": "http://elsewhere/x.safetensors"}, {"w": "/x.safetensors"}, {"w": "x.bin"}])
def test_an_index_names_only_files_beside_it(weight_map):
    with pytest.raises(SymparamError, match="weight_map names"):
        hub.shard_names({"weight_map": weight_map}, "index.json")
    assert hub.shard_names({"weight_map": {"a": "s-2.safetensors", "b": "s-1.safetensors", "c": "s-1.safetensors"}}, "i") == ["s-1.safetensors", "s-2.safetensors"]
