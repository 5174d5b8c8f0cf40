"""Tensor shapes through one forward pass of S tokens, read from the model's tree: symbolic, numbers by substitution."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy as sp

from symparam.components import ONE, Term
from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.symbols import S, V, evaluate


@dataclass(frozen=True)
class Step:
    """One tensor of the forward pass (batch of one, so no batch axis)."""

    name: str  # the module that makes it, as transformers names it ("model.layers.self_attn.q_proj"), or a stage
    shape: tuple[sp.Expr, ...]  # in the vocabulary's symbols
    note: str  # what it is
    layers: sp.Expr | None = None  # how many layers repeat it; None for once per pass


def _visit(term: Term, path: str, layers: sp.Expr, tokens: sp.Expr, in_stack: bool, bucket: str | None = None) -> Iterator[tuple[Term, str, sp.Expr, sp.Expr, bool, str | None]]:
    """Nodes with their module path, the layers repeating them, the rows they see (S, or S*k token-expert pairs), their bucket."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    bucket = term.component or bucket
    routed = term.active_times != term.times
    if term.rows is not None:  # a module that runs on other positions than its parent (BLT's patches, CPM-Ant's prompt)
        tokens = term.rows.xreplace({S: tokens})
    if routed:
        tokens = tokens * term.active_times
    elif term.times != ONE:
        layers, in_stack = layers * term.times, True
    yield term, path, layers, tokens, in_stack, bucket
    for child in term.children:
        yield from _visit(child, path, layers, tokens, in_stack, bucket)


def trace(model: Model) -> list[Step]:
    """Every activation of one forward pass, symbolic: each matrix's output, embeddings, attention scores, logits."""
    steps = [Step("token ids", (S,), "one integer per token")]
    for node, path, layers, tokens, in_stack, bucket in _visit(model.tree, "", ONE, S, False):
        repeat = layers if in_stack else None
        attend = node.fact("attend")
        if attend is not None and "heads" in attend:
            steps.append(Step(f"{path} scores", (sp.sympify(attend["heads"]), S, S), "softmax(q k^T / sqrt(head dim)) per query head, causal mask", repeat))
        if not node.is_leaf or node.buffer or not node.matmul or len(node.shape) != 2:
            continue
        module = path.rsplit(".", 1)[0] if node.key == "weight" else path
        if node.lookup:
            steps.append(Step(module, (tokens, node.shape[1]), f"rows of the [{node.shape[0]}, {node.shape[1]}] table", repeat))
        elif bucket == "LM head":
            steps.append(Step(module, (S, node.shape[0]), "logits: one score per vocabulary entry per position", repeat))
        else:
            rows = "token-expert pairs, each expert seeing its share" if tokens != S else node.note or node.label
            steps.append(Step(module, (tokens, node.shape[0]), rows, repeat))
    return steps + [Step("next-token logits", (V,), "the last position's row")]


def report(model: Model, seq: int) -> list[dict[str, Any]]:
    """The trace with numbers: each step's name, shape, symbolic shape, layer count and note."""
    if type(seq) is not int or seq < 1:
        raise SymparamError(f"--seq: expected a positive integer, got {seq!r}")
    model.needs_active("the shapes of the tokens each expert receives")
    values = {**model.substitution(), **as_subs(model.values or {}), S: sp.Integer(seq)}

    def number(x: sp.Expr) -> int:
        return evaluate(x, values, f"{model.name}: {x}")

    return [
        {"name": s.name, "shape": [number(x) for x in s.shape], "symbolic": [str(x) for x in s.shape], "layers": None if s.layers is None else number(s.layers), "note": s.note}
        for s in trace(model)
        if s.layers is None or number(s.layers) > 0
    ]


def text(steps: list[dict[str, Any]]) -> str:
    """One line per tensor: name, shape in numbers, shape in symbols, how many layers repeat it."""
    rows = [(s["name"], f"[{', '.join(f'{x:,}' for x in s['shape'])}]", f"[{', '.join(s['symbolic'])}]", "" if s["layers"] is None else f"x{s['layers']} layers") for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {e}".rstrip() for a, b, c, e in rows)


__all__ = ["Step", "trace", "report", "text"]
