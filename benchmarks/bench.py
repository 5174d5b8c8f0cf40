"""Benchmarks: compiled formula vs transformers on the meta device, a 10^6-config sweep, and cold CLI processes."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import sympy as sp

from symparam import load
from symparam.recipes import REGISTRY
from symparam.whatif import compile_count, sweep

PRESET = "qwen3-8b"
ROOT = Path(__file__).resolve().parent.parent
SYMPARAM = [sys.executable, "-m", "symparam.cli", "count", "--model", PRESET]
META_BUILD = """
import json, logging, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
logging.disable(logging.WARNING)
raw = json.load(open(sys.argv[1]))
cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(cfg)
print(sum(p.numel() for p in model.parameters()))
"""


def best_of(fn, repeat: int) -> float:
    """The fastest of `repeat` timings of fn(), in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def meta_total(raw: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    cfg = AutoConfig.for_model(raw["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def in_process(model, raw: dict) -> tuple[float, float, int]:
    """(a) seconds per count: the total lambdified over Python ints, and transformers building on the meta device."""
    syms = [s for s in model.symbols]
    f = sp.lambdify(syms, model.total, "math")
    args = [model.values[str(s)] for s in syms]
    assert f(*args) == meta_total(raw) == model.count().total
    loops = 10_000
    compiled = best_of(lambda: [f(*args) for _ in range(loops)], 5) / loops
    meta = best_of(lambda: meta_total(raw), 3)
    return compiled, meta, f(*args)


def big_sweep(model, rows: int = 10**6) -> tuple[float, float]:
    """(b) seconds for `rows` configs through the compiled int64 path (compile excluded), and compile time."""
    rng = np.random.default_rng(0)
    columns = {"d": rng.integers(8, 128, rows) * 64, "N": rng.integers(1, 96, rows), "h_kv": rng.choice([1, 2, 4, 8], rows), "V": rng.integers(1000, 262_144, rows)}
    start = time.perf_counter()
    compile_count(model.total)
    compile_s = time.perf_counter() - start
    sweep(model, {k: v[:10] for k, v in columns.items()})  # warm up
    seconds = best_of(lambda: sweep(model, columns), 3)
    check = sweep(model, {k: v[:5] for k, v in columns.items()})["total"]
    for i in range(5):
        assert check[i] == model.count({**model.values, **{k: int(v[i]) for k, v in columns.items()}}).total
    return seconds, compile_s


# Child processes run as a user's Python does, writing and reading bytecode caches (this machine sets
# PYTHONDONTWRITEBYTECODE, which would recompile symparam's modules on every start).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cold(cmds: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median wall-clock seconds of `runs` fresh processes of each command, the commands taking turns (so a change in
    the machine's load weighs on all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=ENV)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    model = load(PRESET)
    raw = json.loads((ROOT / "symparam" / "presets" / f"{PRESET}.json").read_text())
    compiled, meta, total = in_process(model, raw)
    print(f"(a) {PRESET} total {total:,}: compiled formula {compiled * 1e6:.2f} us, transformers meta build {meta * 1e3:.0f} ms: "
          f"{meta / compiled:,.0f}x faster (goal >= 1000x)")
    seconds, compile_s = big_sweep(model)
    print(f"(b) sweep over 10^6 configs (exact int64, overflow-guarded): {seconds:.3f} s, plus {compile_s:.3f} s to compile (goal < 1 s)")
    runs = 11
    config = ROOT / "symparam" / "presets" / f"{PRESET}.json"
    m = cold({"sympy": [sys.executable, "-c", "import sympy"], "count": SYMPARAM, "list": [sys.executable, "-m", "symparam.cli", "list"]}, runs)
    other = cold({"meta": [sys.executable, "-c", META_BUILD, str(config)]}, 3)["meta"]
    print(f"(c) cold process, median of {runs}: `symparam count --model {PRESET}` {m['count']:.3f} s; python importing transformers + meta build "
          f"{other:.3f} s (median of 3): {other / m['count']:.1f}x faster (goals >= 5x and <= 0.5 s)")
    print(f"    of which `python -c 'import sympy'` alone takes {m['sympy']:.3f} s; symparam's own share {m['count'] - m['sympy']:.3f} s")
    print(f"(d) with {len(REGISTRY.headers)} recipes installed, against `python -c 'import sympy'`: `count --model {PRESET}` "
          f"{m['count'] / m['sympy']:.2f}x, `list` {m['list']:.3f} s = {m['list'] / m['sympy']:.2f}x (goal <= 1.5x each)")


if __name__ == "__main__":
    main()
