"""What fits on a GPU: the longest context or largest batch a layout can serve or train, or the fewest GPUs that hold
it; each answer is the inequality it solved (the most-loaded rank plus a labelled reserve <= the GPU's memory), with
the exact figures on both sides. GPUs and the reserve's terms are data (conventions/gpus.toml)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import sympy as sp

from symparam.errors import SymparamError
from symparam.memory import sharding
from symparam.model import Model
from symparam.symbols import B, S

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
LIMIT = 2**40  # no context or batch beyond this is searched (a trillion tokens)
WIDEST = 8  # tensor parallelism stays within one node of 8 GPUs when searching for the fewest GPUs


@cache
def table() -> dict[str, Any]:
    text = resources.files("symparam.memory").joinpath("conventions", "gpus.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@dataclass(frozen=True)
class GPU:
    name: str
    bytes: int
    what: str


def gpu(name: str | None, memory: str | None) -> GPU:
    """A GPU of the table, or one of the memory given (--gpu-memory), which also overrides a named GPU's."""
    known = table()["gpus"]
    if memory is not None:
        size = parse_size(memory, None, "--gpu-memory")
        return GPU(name or "GPU", size, f"{known[name]['what']} with {memory}" if name in known else f"a GPU of {memory}")
    if name is None:
        raise SymparamError("--gpu: name a GPU (" + ", ".join(known) + ") or give --gpu-memory SIZE")
    if name not in known:
        raise SymparamError(f"--gpu: unknown {name!r}; known: {', '.join(known)} (or give --gpu-memory SIZE)")
    return GPU(name, known[name]["mib"] * 2**20, known[name]["what"])


def parse_size(text: str, whole: int | None, option: str) -> int:
    """Bytes from "96GiB", "500MB", "1234" or, of a GPU's memory, "5%"."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%|[KMGT]i?B|B)?\s*", str(text), re.IGNORECASE)
    if m is None:
        raise SymparamError(f"{option}: expected a size such as 96GiB, 500MB or 5%, got {text!r}")
    number, unit = m.group(1), (m.group(2) or "").upper()
    if unit == "%":
        if whole is None:
            raise SymparamError(f"{option}: a share needs a GPU's memory; give a size such as 96GiB")
        return int(sp.Rational(number) * whole / 100)
    value = sp.Rational(number) * UNITS[unit]
    if not value.is_Integer:
        raise SymparamError(f"{option}: {text!r} is not a whole number of bytes")
    return int(value)


def reserve(device: GPU, settings: list[str]) -> list[tuple[str, int, str]]:
    """The labelled reserve: each term of gpus.toml at its default or as --reserve NAME=SIZE sets it."""
    terms = table()["reserve"]
    given: dict[str, str] = {}
    for item in settings:
        name, sep, size = item.partition("=")
        if not sep or name not in terms:
            raise SymparamError(f"--reserve {item}: expected NAME=SIZE with NAME one of {', '.join(terms)}")
        given[name] = size
    return [(name, parse_size(given.get(name, spec["default"]), device.bytes, f"--reserve {name}"), spec["what"]) for name, spec in terms.items()]


@dataclass(frozen=True)
class Check:
    """One side of the inequality at one point: the most-loaded rank and its figure, formula and terms."""

    layout: sharding.Layout
    batch: int
    seq: int
    rank: str
    bytes: int
    formula: str
    parts: dict[str, int]
    fits: bool


class Fitter:
    """Evaluates a model's most-loaded rank under layouts at (B, S) against a GPU less its reserve."""

    def __init__(self, model: Model, device: GPU, reserved: list[tuple[str, int, str]], dtype: str, train: Any, quant: str | None):
        self.model, self.device, self.reserved = model, device, reserved
        self.dtype, self.train, self.quant = dtype, train, quant
        self.room = device.bytes - sum(n for _, n, _ in reserved)
        if self.room <= 0:
            raise SymparamError(f"--reserve: the reserve ({sum(n for _, n, _ in reserved):,} bytes) leaves nothing of the GPU's {device.bytes:,}")
        self.traces: dict[tuple[int, int], sharding.Traced] = {}

    def result(self, layout: sharding.Layout, batch: int, seq: int) -> sharding.PerRank:
        found = None
        if self.train is not None:
            key = (batch, seq)
            if key not in self.traces:
                self.traces[key] = sharding.traced(self.model, self.dtype, self.train, {B: batch, S: seq})
            found = self.traces[key]
        return sharding.per_rank(self.model, layout, self.dtype, {B: batch, S: seq}, self.train, self.quant, found=found)

    def check(self, layout: sharding.Layout, batch: int, seq: int) -> Check:
        result = self.result(layout, batch, seq)
        held = result.most_loaded
        figure = result.bytes(held)
        peak = max(held.moments, key=lambda m: result.exact(held, m[1]))[1] if held.moments else held.total
        return Check(layout, batch, seq, held.label, figure, str(peak), {name: result.exact(held, e) for name, e, _ in held.parts}, figure <= self.room)

    def formula(self, layout: sharding.Layout, batch: int, seq: int) -> Callable[[int, int], int]:
        """The most-loaded rank's bytes as a function of (B, S), from the formulas traced at (batch, seq)."""
        result = self.result(layout, batch, seq)
        exprs = [(h, [e for _, e, _ in h.moments] or [h.total]) for h in result.ranks]

        def value(b: int, s: int) -> int:
            at = {**result.values, B: sp.Integer(b), S: sp.Integer(s)}
            return max(int(sp.sympify(e).xreplace({**at, **h.rank.stage.values})) for h, es in exprs for e in es)

        return value

    def largest(self, layout: sharding.Layout, batch: int | None, seq: int | None) -> tuple[int, Check, Check | None]:
        """The largest B (at seq) or S (at batch) whose most-loaded rank fits: searched on the formulas, then checked
        at the answer and one past it, traced anew there (a branch of the forward may change with S or B)."""
        vary_batch = batch is None
        start = (1, seq) if vary_batch else (batch, 1)
        point = start
        for _ in range(6):
            f = self.formula(layout, *point)
            at = (lambda x: f(x, seq)) if vary_batch else (lambda x: f(batch, x))
            x = search(lambda x: at(x) <= self.room)
            if x == 0:
                return 0, self.check(layout, *start), None
            here = self.check(layout, *((x, seq) if vary_batch else (batch, x)))
            past = self.check(layout, *((x + 1, seq) if vary_batch else (batch, x + 1))) if x < LIMIT else None
            if here.fits and (past is None or not past.fits):
                return x, here, past
            point = (here.batch, here.seq)
        raise SymparamError("fit: the search did not settle (the forward's branches change with the size); give --seq and --batch")


def search(ok: Callable[[int], bool]) -> int:
    """The largest x >= 1 with ok(x) (ok decreasing), 0 if none, by doubling then bisection."""
    if not ok(1):
        return 0
    low, high = 1, 2
    while high <= LIMIT and ok(high):
        low, high = high, high * 2
    if high > LIMIT:
        return LIMIT
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def layouts(model: Model, base: sharding.Layout, training: bool) -> Iterator[sharding.Layout]:
    """Layouts in order of GPUs: tensor parallelism within a node (where the model has a plan), then pipeline stages;
    for training, data parallelism under the given sharding convention as well."""
    widths = [t for t in (8, 4, 2, 1) if t == 1 or model.recipe.tp_plan]
    layers = int(model.values["N"])
    seen = set()
    for gpus in (2**i for i in range(0, 14)):
        for tp in widths:
            for pp in range(1, layers + 1):
                dp = gpus // (tp * pp)
                if tp * pp * dp != gpus or (dp > 1 and not training) or (tp, pp, dp) in seen:
                    continue
                seen.add((tp, pp, dp))
                yield replace(base, tp=tp, pp=pp, dp=dp)


def fit(model: Model, device: GPU, reserved: list[tuple[str, int, str]], layout: sharding.Layout | None, dtype: str,
        seq: int | None, batch: int | None, train: Any = None, quant: str | None = None) -> dict[str, Any]:
    """The answer to what fits, with the inequality it solved and every term of both sides."""
    fitter = Fitter(model, device, reserved, dtype, train, quant)
    given = layout or sharding.Layout(sharding="fsdp2" if train is not None else "ddp")
    if seq is not None and batch is not None:
        if layout is not None:
            here = fitter.check(layout, batch, seq)
            return answer(model, fitter, "fits" if here.fits else "does not fit", None, here, None, f"B = {batch}, S = {seq:,} on this layout")
        previous = None
        for candidate in layouts(model, given, train is not None):
            try:
                here = fitter.check(candidate, batch, seq)
            except SymparamError:
                continue  # a layout the model cannot take (heads that do not split, more stages than layers)
            if here.fits:
                return answer(model, fitter, "fewest GPUs", candidate.gpus, here, previous, f"B = {batch}, S = {seq:,}")
            previous = here
        raise SymparamError(f"fit: no layout of up to {2**13:,} GPUs holds B = {batch}, S = {seq:,} on {device.name}")
    if seq is None and batch is None:
        batch = 1
    value, here, past = fitter.largest(given, batch, seq)
    question = "largest batch" if batch is None else "longest context"
    return answer(model, fitter, question, value, here, past, f"S = {seq:,}" if batch is None else f"B = {batch}")


def answer(model: Model, fitter: Fitter, question: str, value: int | None, here: Check, other: Check | None, at: str) -> dict[str, Any]:
    def side(c: Check) -> dict[str, Any]:
        return {"layout": c.layout.named(fitter.train is not None), "gpus": c.layout.gpus, "batch": c.batch, "seq": c.seq, "rank": c.rank,
                "bytes": c.bytes, "formula": c.formula, "parts": c.parts,
                "left": c.bytes + sum(n for _, n, _ in fitter.reserved), "right": fitter.device.bytes, "fits": c.fits}

    limit = model.values.get("P")
    return {
        "name": model.name,
        "question": question,
        "at": at,
        "training": fitter.train is not None,
        "answer": value if value is not None else here.fits,
        "context_limit": limit,
        "gpu": {"name": fitter.device.name, "bytes": fitter.device.bytes, "what": fitter.device.what},
        "inequality": "most-loaded rank + reserve <= GPU memory",
        "holds": side(here),
        "fails": side(other) if other is not None else None,
        "reserve": [{"name": name, "bytes": n, "what": what} for name, n, what in fitter.reserved],
        "leaves_out": "what the reserve's labelled terms do not hold" + ("" if fitter.train is not None else
                      "; the forward's own transient tensors (one layer's intermediates, the logits of the tokens it returns)"),
    }


def text(r: dict[str, Any]) -> str:
    """The answer, the inequality with exact figures at the answer (and where it fails), and the reserve."""
    def line(side: dict[str, Any]) -> str:
        reserve = sum(t["bytes"] for t in r["reserve"])
        sign = "<=" if side["fits"] else ">"
        return (f"  {side['bytes']:,} + {reserve:,} = {side['left']:,} {sign} {side['right']:,}   "
                f"(B = {side['batch']}, S = {side['seq']:,}; {side['gpus']} GPU(s), the most loaded: {side['rank']})")

    what = "training" if r["training"] else "serving"
    gpu = r["gpu"]
    unit = "sequence" if r["question"] == "largest batch" else "token"
    if r["question"] in ("fits", "does not fit"):
        head = f"{r['at']}: {r['question']}"
    elif r["answer"] == 0:
        head = (f"nothing fits at {r['at']}, not even 1 {unit}: give both --seq and --batch for the fewest GPUs that hold it, "
                "or set a layout (--tp, --pp, --dp with --sharding)")
    else:
        head = {"longest context": f"longest context at {r['at']}: S = {r['answer']:,} tokens",
                "largest batch": f"largest batch at {r['at']}: B = {r['answer']:,}",
                "fewest GPUs": f"fewest GPUs for {r['at']}: {r['answer']:,} ({r['holds']['layout']})"}[r["question"]]
    lines = [f"{r['name']}, {what} on {gpu['name']} ({gpu['what']}: {gpu['bytes']:,} bytes)", head]
    if r["question"] == "longest context" and r["context_limit"] and r["answer"] > r["context_limit"]:
        lines.append(f"  (the model's own limit is max_position_embeddings = {r['context_limit']:,} tokens)")
    lines.append(f"{r['inequality']}:")
    lines.append(line(r["holds"]))
    if r["fails"] is not None:
        lines.append(line(r["fails"]))
    lines.append(f"  layout: {r['holds']['layout']}")
    lines.append(f"  most-loaded rank = {r['holds']['formula']}")
    lines += [f"    {name}: {n:,}" for name, n in r["holds"]["parts"].items() if n]
    lines.append("reserve (--reserve NAME=SIZE sets each):")
    lines += [f"  {t['name']}: {t['bytes']:,} bytes ({t['what']})" for t in r["reserve"]]
    lines.append(f"leaves out {r['leaves_out']}")
    return "\n".join(lines)


__all__ = ["GPU", "gpu", "parse_size", "reserve", "fit", "text"]
