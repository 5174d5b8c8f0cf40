"""The context a pass runs in: S tokens, B sequences, and what each module keeps per token (cache) or per sequence (state).

Memory (the KV cache and fixed states) and FLOPs (the attention term) both read it; it sits below both."""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from symparam.components import walk
from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.files import shown
from symparam.symbols import MAX_VALUE, B, S, W


@dataclass(frozen=True)
class Holder:
    """A module that keeps something between tokens: its name, copies over the model, and one of its facts."""

    path: str  # "model.layers.self_attn"
    label: str  # "attention"
    copies: sp.Expr  # layers (times experts) that have it: N, N - N_linear, ...
    fact: dict[str, object]  # the block's cache / state / attend table, formulas as expressions

    @property
    def windowed(self) -> sp.Expr:
        """Copies that keep only the last W tokens (sliding-window layers)."""
        return sp.sympify(self.fact.get("windowed", 0)) if "windowed" in self.fact else sp.Integer(0)

    def positions(self) -> sp.Expr:
        """Positions these copies keep (or attend to) summed over them: S in full layers, at most W in sliding ones."""
        window = sp.sympify(self.fact.get("window", W))
        return (self.copies - self.windowed) * S + self.windowed * sp.Min(S, window) if self.windowed != 0 else self.copies * S


def holders(model: Model, name: str) -> list[Holder]:
    """Every module with a `name` fact (cache, state, attend), attend taking its module's cache window."""
    found = []
    for node, copies, _, path in walk(model.tree):
        fact = node.fact(name)
        if fact is not None:
            cache = node.fact("cache") or {}
            found.append(Holder(path, node.label, copies, {**{k: cache[k] for k in ("windowed", "window") if k in cache}, **fact}))
    return found


def slides(model: Model) -> bool:
    """Whether some layers of this model keep only a window."""
    return any(h.windowed != 0 for h in holders(model, "cache"))


def substitution(model: Model, seq: int | None, batch: int = 1) -> dict[sp.Symbol, sp.Integer]:
    """Every value of the model plus S (default: its maximum context), B, and the window where layers slide."""
    values = model.values or {}
    if seq is None:
        if "P" not in values:
            raise SymparamError("--seq: give the number of tokens (the config has no max_position_embeddings)")
        seq = values["P"]
    for option, given in (("--seq", seq), ("--batch", batch)):
        if type(given) is not int or not 1 <= given <= MAX_VALUE:
            raise SymparamError(f"{option}: expected a positive integer of at most {MAX_VALUE:,}, got {shown(repr(given))}")
    subs = {**model.substitution(), **as_subs(values), S: sp.Integer(seq), B: sp.Integer(batch)}
    for h in holders(model, "cache"):
        missing = [str(x) for x in sp.sympify(h.fact.get("window", W)).free_symbols if str(x) not in values] if h.windowed != 0 else []
        if missing:
            raise SymparamError(f"{' or '.join(model.recipe.config_keys(missing[0])) or missing[0]}: missing (the window some layers attend within)")
    return subs


__all__ = ["Holder", "holders", "slides", "substitution"]
