"""Activation memory: the bytes autograd keeps for backward in one training forward, per module and layer kind.

Read off the forward trace (memory.trace): every storage an operation saves, once, parameters excluded, attributed to
the module whose code allocated it. With full activation checkpointing (transformers' `gradient_checkpointing_enable`,
non-reentrant), a decoder layer keeps only its input; what it saves inside is recomputed in backward.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

import sympy as sp

from symparam.errors import SymparamError
from symparam.memory.ops import Storage
from symparam.memory.trace import Mode, Trace, trace

CHECKPOINTING = {
    "none": "no checkpointing: every tensor a backward needs stays from the forward",
    "full": "full activation checkpointing (transformers' gradient_checkpointing_enable, non-reentrant): each decoder "
            "layer keeps its input hidden states; everything it saves inside is recomputed in backward, one layer at a time; "
            "tensors a layer receives as keyword arguments (rotary tables, masks) stay alive through the recompute closures "
            "without autograd saving them",
}


@cache
def checked_families() -> tuple[str, ...]:
    """The families whose activation formula tests hold to autograd (conventions/activations.toml)."""
    text = resources.files("symparam.memory").joinpath("conventions", "activations.toml").read_text(encoding="utf-8")
    return tuple(tomllib.loads(text)["checked"])


def checked_trace(model, mode: Mode, context: Mapping | None = None) -> Trace:
    """The training forward's trace, for a family whose activations are checked against autograd; else a clear error."""
    family = model.recipe.family
    if family not in checked_families():
        raise SymparamError(f"activation memory: {model.recipe.title} ({family}) is not checked against autograd yet, so "
                            f"symparam derives no training figure for it ({len(checked_families())} families are: "
                            "symparam/memory/conventions/activations.toml)")
    return trace(model, mode, context)


@dataclass(frozen=True)
class Part:
    """Bytes one module keeps for backward in each of `layers` copies (the layers of its kind, or 1)."""

    module: str  # dotted path as transformers names it, layer indices left out; "(inputs)" for the batch
    layers: sp.Expr
    bytes: sp.Expr  # per copy
    what: tuple[str, ...]  # the operations that allocated them

    @property
    def total(self) -> sp.Expr:
        return self.layers * self.bytes


@dataclass(frozen=True)
class Activations:
    """What a training forward keeps for backward, as formulas in B, S and the model's symbols."""

    parts: tuple[Part, ...]
    mode: Mode
    checkpointing: str
    assumed: tuple[sp.Basic, ...]  # conditions on sizes the forward's branches took: where the formula holds
    kernels: tuple[tuple[str, str], ...] = ()  # (module, text): CPU reference paths a GPU replaces with a fused kernel

    @property
    def formula(self) -> sp.Expr:
        return sp.expand(sp.Add(*(p.total for p in self.parts)))

    def by_layers(self) -> dict[sp.Expr, sp.Expr]:
        """Bytes in one layer of each kind (the layer count -> its bytes), what runs once under 1."""
        out: dict[sp.Expr, sp.Expr] = {}
        for p in self.parts:
            out[p.layers] = sp.expand(out.get(p.layers, sp.Integer(0)) + p.bytes)
        return out

    @property
    def grouped(self) -> str:
        """The formula written by layer kind, as the derivations write counts: N*(...) + ... + (what runs once)."""
        kinds = sorted(self.by_layers().items(), key=lambda item: item[0] == 1)  # the layers first, what runs once last
        return " + ".join(f"({e})" if n == 1 else f"{n}*({e})" if n.is_Atom or n.is_Mul else f"({n})*({e})" for n, e in kinds)

    def by_module(self) -> dict[str, sp.Expr]:
        """Bytes per module, all its copies."""
        out: dict[str, sp.Expr] = {}
        for p in self.parts:
            out[p.module] = sp.expand(out.get(p.module, sp.Integer(0)) + p.total)
        return out


def kept(t: Trace, checkpointing: str = "none") -> list[Storage]:
    """The storages autograd keeps, each once: all the forward saved (but what a branch it drops saved), or with full
    checkpointing what is saved outside the decoder layers plus each layer's input. A stack's layer-input storage stands
    for the embedding output it covers."""
    if checkpointing not in CHECKPOINTING:
        raise SymparamError(f"--checkpointing: unknown {checkpointing!r}; known: {', '.join(CHECKPOINTING)}")
    saves = [s for i, (s, _) in enumerate(t.saved) if i not in t.dropped]  # a branch the forward drops frees its saves
    if checkpointing == "full":
        inside = {i for call in t.layers for i in call.saves}
        saves = [s for i, (s, _) in enumerate(t.saved) if i not in inside and i not in t.dropped] + [s for call in t.layers for s in call.inputs]
    saves = [k for s in saves for k in s.allocated()]
    unique = once([s for s in saves if not s.param])
    covered = {c.ident for s in unique for c in s.covers}
    return [s for s in unique if s.ident not in covered]


def once(saves: list[Storage]) -> list[Storage]:
    """Each storage once: in all the layers that made it, or, saved only by layer kinds, in the layers of those kinds."""
    found: dict[int, list[Storage]] = {}
    for s in saves:
        found.setdefault(s.ident, []).append(s)
    out = []
    for entries in found.values():
        whole = next((s for s in entries if not s.partial), None)
        kinds = list(dict.fromkeys(s.copies for s in entries))
        parts = {s.copies: s.owners for s in entries}  # a layer input saved by kinds: what each kind's layers stand for
        owners: dict[str, sp.Expr] = {}
        for module, n in (o for group in parts.values() for o in group):
            owners[module] = sp.expand(owners.get(module, sp.Integer(0)) + n)
        out.append(whole or replace(entries[0], copies=sp.Add(*kinds), partial=False, owners=tuple(owners.items())))
    return out


def parts(storages: Iterable[Storage]) -> tuple[Part, ...]:
    """Bytes per (module, layers), in the order modules first keep something."""
    sums: dict[tuple[str, sp.Expr], list] = {}
    for s in storages:
        for module, copies in s.owners or ((s.module, s.copies),):
            entry = sums.setdefault((module, copies), [sp.Integer(0), []])
            entry[0] += s.bytes
            entry[1].append(s.op)
    return tuple(Part(m, n, sp.expand(b), tuple(dict.fromkeys(ops))) for (m, n), (b, ops) in sums.items())


def routed(model, formula: sp.Expr) -> tuple:
    """The routing statistics a formula reads: symbols the router decides, not the config (`routing` in the recipe),
    whose figures take the value their rule gives (the largest) unless --set gives another."""
    free = {str(s) for s in sp.sympify(formula).free_symbols}
    return tuple(s for s in model.recipe.symbols.values() if s.routing and s.name in free)


def activations(model, mode: Mode = Mode(), checkpointing: str = "none", context: dict | None = None) -> Activations:
    """The activation memory of a configured model under a mode; `context` holds S and B where a branch needs them."""
    t = checked_trace(model, replace(mode, checkpointing=checkpointing != "none"), context)
    if checkpointing == "full" and t.uncheckpointed:
        raise SymparamError(f"--checkpointing {checkpointing}: {'; '.join(dict.fromkeys(t.uncheckpointed.values()))}")
    return Activations(parts(kept(t, checkpointing)), mode, checkpointing, tuple(t.assumed), tuple(t.kernels.items()))


__all__ = ["CHECKPOINTING", "checked_families", "checked_trace", "Part", "Activations", "kept", "parts", "routed", "activations"]
