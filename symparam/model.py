"""Model: a recipe's term tree as SymPy totals, active counts and breakdowns; exact ints by substitution."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import sympy as sp

from dataclasses import replace

from symparam.components import Term, breakdown, leaves, tensors
from symparam.config import Resolved, Source, as_subs, preset_name, read_config, read_preset, resolve, tree_symbols
from symparam.errors import SymparamError
from symparam.files import existing
from symparam.recipes import REGISTRY, Recipe
from symparam.symbols import evaluate, latex, make


@dataclass(frozen=True)
class Count:
    """Exact parameter counts of one configured model."""

    total: int  # every parameter, tied weights once
    active: int | None  # what one token uses: routed experts it does not visit left out; None where the config lacks k
    components: dict[str, int]  # bucket -> total
    active_components: dict[str, int | None]  # bucket -> active (None: it needs what the config does not set)
    lookup: int = 0  # active parameters in lookup tables (token and position embeddings): read by index, not multiplied

    @property
    def active_without_embedding(self) -> int | None:
        """Active parameters less the embedding tables, as vendors often quote."""
        return None if self.active is None else self.active - self.lookup

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "active": self.active,
            "active_without_embedding": self.active_without_embedding,
            "components": self.components,
            "active_components": self.active_components,
        }


def prune(term: Term, zero: Mapping[sp.Symbol, sp.Integer]) -> Term | None:
    """The tree without what a config does not build: layer counts that are 0 set to 0, groups of 0 copies dropped."""
    times = term.times.xreplace(zero)
    if times == 0:
        return None
    children = tuple(t for t in (prune(c, zero) for c in term.children) if t is not None)
    if term.children and not children:
        return None
    facts = tuple((name, tuple((k, v.xreplace(zero) if isinstance(v, sp.Expr) else v) for k, v in items)) for name, items in term.facts)
    return replace(term, times=times, active_times=term.active_times.xreplace(zero), children=children, facts=facts)


class Model:
    """One architecture (a recipe with its switches set) as SymPy expressions, optionally with values."""

    def __init__(self, recipe: Recipe, flags: Mapping[str, bool] | None = None, values: Mapping[str, int] | None = None, name: str = "",
                 notes: tuple = (), scope: Mapping[str, Any] | None = None, source: Source | None = None,
                 quantization: Mapping[str, Any] | None = None, dtype: str = "bfloat16", config: Mapping[str, Any] | None = None,
                 unknown: Mapping[str, str] | None = None):
        self.recipe = recipe
        self.flags = {**recipe.default_switches(), **(flags or {})}
        self.values = dict(values) if values is not None else None
        self.name = name or recipe.title
        self.notes = tuple(notes)  # how the config was read: (catalog phrase, fields), e.g. the language model of a wrapper
        self.scope = dict(scope or {})  # {"scope": "language model", "wrapper": "gemma3"} for a multimodal config
        self.source = source  # where the config came from: a catalog preset, a file, the Hugging Face cache or the Hub
        self.quantization = dict(quantization) if quantization is not None else None  # quantization_config as written (memory/storage.py reads it)
        self.dtype = dtype  # torch dtype name of the checkpoint's unquantized tensors ("bfloat16")
        self.config = dict(config if config is not None else recipe.defaults)  # config.json with the family's defaults: what forwards read
        self.unknown = dict(unknown or {})  # symbols only `active` needs that the config does not set (k) -> their config keys

    @classmethod
    def from_resolved(cls, r: Resolved) -> Model:
        return cls(r.recipe, r.flags, r.values, r.name, r.notes, r.scope, r.source, r.quantization, r.dtype, r.config, r.unknown)

    def with_tree(self, tree: Term) -> Model:
        """The same model (config, values, source) with another tree: peft's adapters added."""
        other = Model(self.recipe, self.flags, self.values, self.name, self.notes, self.scope, self.source, self.quantization,
                      self.dtype, self.config, self.unknown)
        other.__dict__["tree"] = tree  # the cached property, set
        return other

    def needs_active(self, what: str) -> None:
        """Refuse a figure of one token (FLOPs, the routed tokens' shapes) where the config does not set k."""
        for symbol, keys in self.unknown.items():
            raise SymparamError(f"{keys}: missing ({self.recipe.symbols[symbol].meaning}); {what} needs it: set it in the config or with --set {symbol}=...")

    @cached_property
    def tree(self) -> Term:
        """The component tree every figure is computed from: with values, only the parts that config builds."""
        absent = frozenset(str(s) for s in self.zeros)
        return prune(self.recipe.build(self.flags, absent), self.zeros) or self.recipe.build(self.flags, absent)

    @cached_property
    def zeros(self) -> dict[sp.Symbol, sp.Integer]:
        """Layer counts this model has none of: 0 at its values, or a rule that never selects a layer (`False`)."""
        rules = self.recipe.layer_symbols
        return {make(name): sp.Integer(0) for name, rule in rules.items() if rule.text == "False" or (self.values or {}).get(name) == 0}

    @cached_property
    def tensors(self) -> dict[str, sp.Expr]:
        """Parameter elements per tensor name (transformers' names, layer and expert indices left out)."""
        return tensors(self.tree)

    @cached_property
    def total(self) -> sp.Expr:
        """Total parameters as an expression in the canonical symbols."""
        return sp.expand(self.tree.expr)

    @cached_property
    def active(self) -> sp.Expr:
        """Parameters one token uses, as an expression."""
        return sp.expand(self.tree.active)

    @cached_property
    def components(self) -> dict[str, sp.Expr]:
        """Total parameters per component bucket (input embedding, attention, routed experts, ...)."""
        return breakdown(self.tree)

    @cached_property
    def active_components(self) -> dict[str, sp.Expr]:
        return breakdown(self.tree, active=True)

    @property
    def symbols(self) -> list[sp.Symbol]:
        """The symbols the total depends on, in vocabulary order."""
        free = self.total.free_symbols | self.active.free_symbols | tree_symbols(self.tree)
        return [make(name) for name in self.recipe.symbols if make(name) in free]

    def substitution(self, values: Mapping[Any, int] | None = None) -> dict[sp.Symbol, int]:
        """Values for every symbol of the model, from `values` or the model's own config (k may be missing: it sizes nothing)."""
        given = self.values if values is None else {str(key): v for key, v in values.items()}
        if given is None:
            raise SymparamError(f"{self.name}: no values to substitute; pass a mapping such as {{'d': 4096, ...}}")
        held = tree_symbols(self.tree, active=False)  # a symbol only one token's share reads (k) may be missing: active is then None
        missing = [str(s) for s in self.symbols if str(s) not in given and s in held]
        if missing:
            raise SymparamError(f"{self.name}: no value for {', '.join(missing)}")
        return as_subs({str(s): given[str(s)] for s in self.symbols if str(s) in given})

    def count(self, values: Mapping[Any, int] | None = None) -> Count:
        """Exact integer counts: the expressions with the values substituted."""
        subs = self.substitution(values)

        def exact(expr: sp.Expr) -> int:
            return evaluate(expr, subs, f"{self.name}: {expr}")

        def known(expr: sp.Expr) -> int | None:  # a figure of one token: None where it needs k the config does not set
            return None if expr.free_symbols - set(subs) else exact(expr)

        lookups = sum((copies * leaf.each for leaf, copies, _, _ in leaves(self.tree, active=True) if leaf.lookup), sp.Integer(0))
        count = Count(
            total=exact(self.total),
            active=known(self.active),
            components={c: exact(e) for c, e in self.components.items()},
            active_components={c: known(e) for c, e in self.active_components.items()},
            lookup=known(lookups) or 0,
        )
        figures = {"total": count.total, "active": count.active, **count.components, **{f"active {c}": n for c, n in count.active_components.items()}}
        below = next(((label, n) for label, n in figures.items() if n is not None and n < 0), None)
        if below is not None:  # values no config gives (a layer count above N, set directly): no figure is ever negative
            used = ", ".join(f"{s}={v}" for s, v in subs.items())
            raise SymparamError(f"{self.name}: {below[0]} is {below[1]:,} at {used}; the values contradict each other (a layer count above N?)")
        return count

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle \\text{{{self.name}}}: {latex(self.total)}$"

    def __repr__(self) -> str:
        return f"Model({self.name!r}, total={self.total})"


def family(name: str) -> Model:
    """The symbolic model of a family (`qwen3-moe` or `qwen3_moe`) with its library-default switches."""
    return Model(REGISTRY.family(name))


def load(source: str | Path | Mapping[str, Any], overrides: Mapping[str, int] | None = None, recipe: Recipe | None = None) -> Model:
    """A model with values: from a preset (its name or Hub id), a config.json path, a config dict, or a Hub id of no preset
    (ORG/NAME, not a path here: read from the local Hugging Face cache, else the Hub, and its source noted)."""
    origin = None
    if isinstance(source, Mapping):
        raw, name = dict(source), ""
    elif isinstance(source, str) and preset_name(source) is not None:
        raw, name = read_preset(source), preset_name(source)
    elif isinstance(source, str) and not source.endswith(".json") and "/" not in source:
        raw, name = read_preset(source), source
    elif isinstance(source, str) and not source.endswith(".json") and existing(source) is None:
        from symparam.hub import read_model

        raw, name, origin = read_model(source)
    else:
        raw, name = read_config(source), str(source)
    return Model.from_resolved(resolve(raw, recipe, overrides, name, origin))
