"""The shape walk: every tensor one forward pass makes, in order, with its symbolic shape, read off the forward trace
(memory.trace) that the activation formula is summed from: one source for both."""

from __future__ import annotations

from typing import Any

import sympy as sp

from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.memory.activations import checked_trace
from symparam.memory.trace import Mode, trace
from symparam.model import Model
from symparam.symbols import B, S, evaluate


def report(model: Model, seq: int, batch: int = 1, attention: str = "eager", dtype: str = "bf16", train: bool = False) -> list[dict[str, Any]]:
    """Every operation's output in forward order: module, operation, shape in numbers and in symbols, dtype, the layers
    that repeat it, and with `train` whether autograd keeps it (its storage) for backward in a training forward (for a
    family whose activations are checked against autograd)."""
    for option, value in (("--seq", seq), ("--batch", batch)):
        if type(value) is not int or value < 1:
            raise SymparamError(f"{option}: expected a positive integer, got {value!r}")
    model.needs_active("the shape walk of the routed tokens")
    t = (checked_trace if train else trace)(model, Mode(act=dtype, attention=attention), {B: batch, S: seq})
    values = {**as_subs(model.values or {}), B: sp.Integer(batch), S: sp.Integer(seq)}

    def number(x: sp.Expr) -> int:
        return evaluate(x, values, f"{model.name}: {x}")

    kept = {s.ident for s, _ in t.saved}
    out = []
    for op in t.ops:
        for v in op.outputs:
            if any(v is i for i in op.inputs):  # a cast or view that returned its input: no new tensor
                continue
            layers = op_layers(op, t)
            if layers is not None and number(layers) == 0:
                continue
            out.append({"name": op.module, "op": op.name, "shape": [number(x) for x in v.shape], "symbolic": [str(x) for x in v.shape],
                        "dtype": v.dtype, "layers": None if layers is None else number(layers), **({"kept": v.storage.ident in kept} if train else {})})
    return out


def op_layers(op: Any, t: Any) -> sp.Expr | None:
    """The layers an operation runs in, where it runs in the decoder stack; None for once per pass."""
    return op.copies if any(op.module == call.path or op.module.startswith(call.path + ".") for call in t.layers) else None


def text(steps: list[dict[str, Any]]) -> str:
    """One line per tensor: module, operation, shape in numbers and in symbols, dtype, layers; with --train, what
    autograd keeps for backward is marked."""
    rows = [(s["name"] or "(causal LM)", s["op"], f"[{', '.join(f'{x:,}' for x in s['shape'])}]", f"[{', '.join(s['symbolic'])}]", s["dtype"],
             "" if s["layers"] is None else f"x{s['layers']}", "kept" if s.get("kept") else "") for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r[:6], widths)).rstrip() + (f"  {r[6]}" if r[6] else "") for r in rows)


__all__ = ["report", "text"]
