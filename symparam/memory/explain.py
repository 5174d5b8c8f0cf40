"""The training step as a derivation shows it: activations per module in symbols, by layer kind, then summed, then
the numbers; the step's terms and its peak; and the 2022 GPT-3 activation formula set beside the model's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy as sp

from symparam.components import walk
from symparam.config import as_subs
from symparam.memory.activations import CHECKPOINTING, routed
from symparam.memory.trace import Mode
from symparam.memory.training import optimizer, training
from symparam.symbols import B, S, evaluate, make

# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 4.1), bytes per
# layer with 16-bit activations and 1-byte dropout masks, in its symbols s (sequence), b (batch), h (hidden), a (heads):
# attention 11sbh + 5as^2b, MLP 19sbh, two layer norms 4sbh; written here in the model's S, B, d and h.
GPT3_BLOCKS = (("attention", "11*S*B*d + 5*h*S**2*B"), ("dense FFN", "19*S*B*d"), ("norms", "4*S*B*d"))


@dataclass(frozen=True)
class Row:
    """One module's activation bytes: per layer (or once), the layers, their total."""

    module: str
    component: str
    layers: sp.Expr
    per_layer: sp.Expr
    value: int


@dataclass(frozen=True)
class Block:
    """One block of a layer as the GPT-3 formula splits it, beside this model's own bytes per layer for it."""

    component: str
    gpt3: sp.Expr
    model: sp.Expr


@dataclass(frozen=True)
class Term:
    """A term of the training step: its formula and value."""

    key: str
    formula: sp.Expr
    value: int


@dataclass(frozen=True)
class MemoryDerivation:
    """Everything a derivation's memory section lays out."""

    seq: int
    batch: int
    dtype: str
    attention: str
    checkpointing: str
    optimizer: str
    assumed: tuple[sp.Basic, ...]
    rows: tuple[Row, ...]
    by_layers: tuple[tuple[sp.Expr, sp.Expr], ...]  # (layers, bytes per layer of that kind): A = sum of their products
    activations: sp.Expr
    activations_value: int
    terms: tuple[Term, ...]  # weights, gradients, optimizer states, loss peak
    peak_at: str
    peak: sp.Expr
    peak_value: int
    gpt3: tuple[Block, ...]
    gpt3_layer: sp.Expr  # the paper's bytes per layer in this model's symbols
    gpt3_value: int
    layer_value: int  # this model's bytes in its most common layer, at the values
    kernels: tuple[tuple[str, str], ...]
    routing: tuple[tuple[sp.Symbol, int, str], ...] = ()  # routing statistics the formula reads: (symbol, value taken, its rule)
    rank: Any = None  # RankDerivation: the most loaded GPU under a parallel layout, where one is given


@dataclass(frozen=True)
class RankDerivation:
    """The most loaded GPU of a parallel layout: its terms as formulas in the layout's degrees, and its peak."""

    layout: str  # "64 GPUs = dp 4 x tp 4 x pp 4 x cp 1; data: zero1; ..."
    conventions: tuple[str, ...]  # each convention's kind, name and title
    rank: str
    layers: tuple[tuple[sp.Symbol, int], ...]  # the stage's decoder layers by kind: (symbol, value)
    terms: tuple[Term, ...]
    at: str  # the moment of its peak (training), or "" (serving: everything at once)
    total: sp.Expr
    value: int


def rank_derivation(model: Any, layout: Any, dtype: str, context: dict, train: Any) -> RankDerivation:
    """The most loaded GPU under a layout (memory/sharding.py), as the derivation lays it out."""
    from symparam.memory import sharding

    result = sharding.per_rank(model, layout, dtype, context, train)
    held = result.most_loaded
    peak = max(held.moments, key=lambda m: result.exact(held, m[1])) if held.moments else None
    terms = tuple(Term(name, e, result.exact(held, e)) for name, e, _ in held.parts if result.exact(held, e))
    return RankDerivation(layout.named(result.training), tuple(f"{c['kind']} ({c['name']}): {c['title']}" for c in sharding.conventions(layout, result.training)),
                          held.label, tuple((sym, int(n)) for _, sym, n in held.rank.stage.counts), terms, peak[0] if peak else "",
                          peak[1] if peak else sp.expand(held.total), result.bytes(held))


def memory_derivation(model: Any, seq: int, batch: int, dtype: str = "bf16", attention: str = "sdpa",
                      checkpointing: str = "none", optimizer_name: str = "adamw", layout: Any = None) -> MemoryDerivation:
    """The memory section of a model's derivation at S = seq, B = batch; with a parallel layout, its most loaded GPU."""
    from symparam.memory import Train

    opt = optimizer(optimizer_name)
    step = training(model, opt, Mode(act=dtype, attention=attention), checkpointing, {B: batch, S: seq})
    values = {**as_subs(model.values), B: sp.Integer(batch), S: sp.Integer(seq)}

    def at(expr: sp.Expr) -> int:
        return evaluate(expr, values, f"{model.name}: {expr}")

    buckets = {path: bucket or "other" for _, _, bucket, path in walk(model.tree)}
    a = step.activations
    rows = tuple(Row(p.module, buckets.get(p.module, "inputs" if p.module == "(inputs)" else "loss"), p.layers, p.bytes, at(p.total))
                 for p in a.parts if at(p.total))
    kinds: dict[sp.Expr, sp.Expr] = {}
    for r in rows:
        kinds[r.layers] = kinds.get(r.layers, sp.Integer(0)) + r.per_layer
    by_layers = tuple((n, sp.expand(e)) for n, e in kinds.items())
    summed = {name for name, s in model.recipe.symbols.items() if s.summed}  # sums over the layers, not a layer kind's count
    layered = [n for n in kinds if n != 1 and not {str(x) for x in n.free_symbols} & summed]
    layers = max(layered, key=lambda n: at(n), default=sp.Integer(1))
    per_layer = {c: sum((r.per_layer for r in rows if r.layers == layers and r.component == c), sp.Integer(0)) for c, _ in GPT3_BLOCKS}
    gpt3 = tuple(Block(c, sp.sympify(f, locals={"S": S, "B": B, "d": make("d"), "h": make("h")}), sp.expand(per_layer[c])) for c, f in GPT3_BLOCKS)
    gpt3_layer = sp.Add(*(b.gpt3 for b in gpt3))
    peak_at, peak_value, peak = step.peak(values)
    terms = tuple(Term(k, e, at(e)) for k, e in (("weights", step.weights), ("gradients", step.gradients), ("optimizer_states", step.states), ("loss_peak", step.loss_peak)))
    rank = None if layout is None else rank_derivation(model, layout, dtype, {B: batch, S: seq}, Train(optimizer_name, attention, checkpointing))
    return MemoryDerivation(seq, batch, step.act, attention, checkpointing, opt.title, step.assumed, rows, by_layers, a.formula, at(a.formula),
                            terms, peak_at, peak, peak_value, gpt3, gpt3_layer, at(gpt3_layer), at(kinds.get(layers, sp.Integer(0))), a.kernels,
                            tuple((make(s.name), at(make(s.name)), s.routing) for s in routed(model, a.formula)), rank)


__all__ = ["MemoryDerivation", "RankDerivation", "memory_derivation", "rank_derivation", "GPT3_BLOCKS", "CHECKPOINTING"]
