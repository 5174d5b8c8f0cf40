"""Architecture recipes: TOML data (symbols, switches, blocks of tensors, layer rules) composed into term trees.

A recipe starts from the built-in library `_library.toml` (transformers' Llama layout), or from the recipe it
`extends`, and merges its own tables over it: `[blocks.X]` entry by entry (an entry set to false removes it),
`[symbols]`, `[switches]`, `[defaults]` and the rest key by key. LANGUAGE.md beside this file is the reference.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import sympy as sp

from symparam import components as c
from symparam.errors import SymparamError
from symparam.files import MAX_NESTING, nesting, read_text, shown
from symparam.rules import Rule, compile_rule, message_fields
from symparam.symbols import TABLE, SymbolDef, define, make, parse

LIBRARY = "_library.toml"
MAX_RECIPE = 2**20  # bytes of a recipe file read at most (the largest built-in one is 17 kB)
MAX_TERMS = 10_000  # modules and tensors a recipe's tree may expand to (the largest built-in one has 134)
MAX_BLOCK_DEPTH = 32  # blocks inside blocks (the deepest built-in recipe nests 8)
ROOT = "causal_lm"  # the block a model is built from
TOP_LEVEL = {"family", "title", "model_types", "architectures", "summary", "extends", "defaults", "symbols",
             "switches", "blocks", "lists", "checks", "names", "zh", "checkpoint", "functions", "tp_plan"}
OWN = ("family", "title", "model_types", "architectures", "summary", "checkpoint", "tp_plan")  # never inherited through `extends`
ENTRY_FIELDS = {"block", "shape", "times", "active", "when", "component", "label", "note", "key", "count", "tied",
                "buffer", "frozen", "lookup", "layers", "matmul", "dtype", "module"}
BLOCK_META = {"args", "component", "label", "note", "cache", "state", "attend", "rows", "module", "forward", "kernel",
              "no_checkpointing", "first_layer", "frozen"}
MODULE_KINDS = ("linear", "conv1d", "experts", "head", "embedding", "router", "kept")  # kept: a module the modeling keeps unquantized  # `module = ...` of a block: what quantization formats read
FACTS = {  # per-module facts memory and FLOPs read: formulas, and words
    "cache": ({"per_token", "windowed", "window"}, {"what"}),  # values one token leaves per copy; `windowed` of them keep only `window`
    "state": ({"size"}, {"what"}),  # values per sequence per copy, whatever the context (linear attention, SSM)
    "attend": ({"qk", "v", "heads"}, set()),  # widths a query scores against and sums per attended position; query heads
}
SYMBOL_FIELDS = {"latex", "meaning", "keys", "default", "layers", "zero", "zh", "each", "over", "routing", "sum"}
NAME_TABLES = ("rename", "not_parameters")  # [names]: how checkpoints name tensors, regex -> replacement (verify.py)


@dataclass(frozen=True)
class Entry:
    """One line of a block: a tensor (shape) or a sub-block, with its switch, copies and words."""

    key: str  # module or tensor name as transformers has it
    block: str | None
    shape: tuple[str, ...]
    args: dict[str, Any]  # the sub-block's arguments given here
    when: Rule | None
    times: str | None
    active: str | None
    count: str | None  # a layer variant: the layer-count symbol of the layers that have it
    component: str | None
    label: str | None
    note: str
    tied: Rule | None
    buffer: bool
    lookup: bool
    matmul: bool  # a 2-D tensor that multiplies activations (FLOPs); false for a bias or gate shaped as a matrix
    layers: bool  # the decoder-layer stack: entries inside may be variants chosen per layer
    frozen: bool = False  # a parameter with requires_grad=False: counted, never trained
    dtype: str | None = None  # the dtype it is stored in whatever the model's (transformers' _keep_in_fp32_modules_strict): "F32"
    module: str | None = None  # a sub-block's module kind where it differs from its block's ("kept": _keep_in_fp32_modules)


@dataclass(frozen=True)
class Block:
    """A module: its arguments with defaults, its words and facts, and its entries in module order."""

    name: str
    args: dict[str, Any]  # name -> default: a formula (str or int), or a condition (true, false, a switch rule)
    flags: frozenset[str]  # the arguments that are conditions
    meta: dict[str, Any]  # component, label, note, cache, state, attend
    entries: tuple[tuple[str, Entry | tuple[Entry, ...]], ...]  # key -> entry, or the variants of one slot


@dataclass(frozen=True)
class Recipe:
    """One architecture family: its vocabulary, switches, blocks and the library defaults its configs omit."""

    family: str  # canonical name, e.g. "qwen3_moe"
    title: str  # human name, e.g. "Qwen3-MoE"
    model_types: tuple[str, ...]  # config.json model_type values it reads
    summary: str  # one line on what sets the family apart
    symbols: dict[str, SymbolDef]  # every symbol it may use, with this family's keys, defaults and layer rules
    switches: dict[str, Rule]  # name -> rule over the config
    blocks: dict[str, Block]
    defaults: dict[str, Any] = field(default_factory=dict)  # config key -> transformers' default
    architectures: tuple[str, ...] = ()  # class names read as this family when the model_type is unknown
    lists: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-layer config lists: length formula, values
    checks: dict[str, str] = field(default_factory=dict)  # rule over symbol values -> message when it fails
    names: dict[str, dict[str, str]] = field(default_factory=dict)  # [names.rename] / [names.not_parameters]
    zh: dict[str, str] = field(default_factory=dict)  # English words of this recipe -> Chinese
    functions: dict[str, str] = field(default_factory=dict)  # [functions]: name -> a program its blocks' forwards call
    source: str = ""  # where the recipe was read from
    checkpoint: dict[str, dict[str, str]] = field(default_factory=dict)  # [checkpoint]: what published checkpoints store beyond the model
    tp_plan: dict[str, str] = field(default_factory=dict)  # [tp_plan]: module or parameter pattern -> transformers' tensor-parallel style

    def config_keys(self, symbol: str) -> tuple[str, ...]:
        """The config keys a symbol is read from in this family."""
        return self.symbols[symbol].keys

    @cached_property
    def per_layer_symbols(self) -> dict[str, Rule]:
        """Symbols read layer by layer (`each`), with their rules over layer index i."""
        return {name: compile_rule(s.each, f"{self.source}: [symbols] {name}.each") for name, s in self.symbols.items() if s.each is not None}

    @cached_property
    def layer_symbols(self) -> dict[str, Rule]:
        """Layer-count symbols and their rules over layer index i (N_dense, N_swa, N_linear, ...)."""
        return {name: compile_rule(s.layers, f"{self.source}: [symbols] {name}.layers") for name, s in self.symbols.items() if s.layers is not None}

    def switch_values(self, config: Mapping[str, Any]) -> dict[str, bool]:
        """Every switch read against a config (defaults filled in); a null where the library has a bool is an error."""
        from symparam.rules import lookup_in

        read = lookup_in(config)
        out = {}
        for name, rule in self.switches.items():
            key = rule.text
            if key in config or key in self.defaults:
                out[name] = truthy(read(key), key, self.defaults.get(key))
            else:
                out[name] = bool(rule(read))
        return out

    def default_switches(self) -> dict[str, bool]:
        """Switches as the library defaults set them."""
        return self.switch_values(self.defaults)

    def variant_slots(self) -> list[tuple[str, ...]]:
        """The count symbols of each slot's conditional variants: one layer may be in at most one per slot."""
        return [tuple(v.count for v in entry if v.count) for block in self.blocks.values() for _, entry in block.entries if isinstance(entry, tuple)]

    def build(self, switches: Mapping[str, bool] | None = None, absent: frozenset[str] = frozenset()) -> c.Term:
        """The model tree with every switch set (library defaults where `switches` is silent); layer variants whose
        count is in `absent` (0 for a config) are left out, so the layers that remain group as they really are."""
        return _Builder(self, {**self.default_switches(), **(switches or {})}, absent).block(ROOT, "", {}, {})

    def build_extras(self, switches: Mapping[str, bool] | None = None) -> list[tuple[str, str, c.Term]]:
        """What the published checkpoints store beyond the model transformers builds ([checkpoint]): (where in the
        checkpoint, what it is, its tree with `times` copies), e.g. DeepSeek-V3's multi-token-prediction layer."""
        builder = _Builder(self, {**self.default_switches(), **(switches or {})})
        out = []
        for spec in self.checkpoint.values():
            term = builder.block(spec["block"], spec.get("key", ""), {}, {})
            out.append((spec.get("path", ""), spec["what"], replace(term, times=parse(spec.get("times", 1), known=make))))
        return out


def truthy(value: Any, key: str, default: Any = None) -> bool:
    """A config value that switches a part on or off: a bool (where the default is one), else also null or a size."""
    import json

    if isinstance(default, bool) and not isinstance(value, bool):
        raise SymparamError(f"{key}: expected true or false, got {shown(json.dumps(value))}")
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value >= 0:
        return value > 0
    raise SymparamError(f"{key}: expected true, false, null or a non-negative integer, got {value!r}")


class _Builder:
    """Instantiates blocks into Terms for one set of switches."""

    def __init__(self, recipe: Recipe, switches: Mapping[str, bool], absent: frozenset[str] = frozenset()):
        self.recipe = recipe
        self.switches = switches
        self.absent = absent

    def on(self, rule: Rule | None, env: Mapping[str, Any]) -> bool:
        if rule is None:
            return True
        return bool(rule(lambda name: env[name] if name in env else self.switches[name]))

    def formula(self, text: Any, env: Mapping[str, Any]) -> sp.Expr:
        return parse(text, {k: v for k, v in env.items() if isinstance(v, sp.Expr)}, make)

    def bind(self, block: Block, entry: Entry, env: Mapping[str, Any]) -> dict[str, Any]:
        """The sub-block's argument values: given in the entry (in the caller's terms) or its defaults (in its own)."""
        bound: dict[str, Any] = {}
        for name, default in block.args.items():
            given = entry.args.get(name)
            if name in block.flags:
                value = default if given is None else given
                bound[name] = value if isinstance(value, bool) else self.on(compile_rule(value, name), env if given is not None else {})
            else:
                bound[name] = self.formula(default, bound) if given is None else self.formula(given, env)
        return bound

    def words(self, text: str | None, env: Mapping[str, Any]) -> str:
        return string.Template(text or "").safe_substitute({k: v for k, v in env.items() if isinstance(v, str)})

    def block(self, name: str, key: str, env: Mapping[str, Any], words: Mapping[str, Any], hoist: list | None = None,
              count: sp.Expr | None = None, path: str = "") -> c.Term:
        """One block instance; inside the layer stack, variant slots go to `hoist` as [count, path in the layer, term]."""
        block = self.recipe.blocks[name]
        env = {**env, **{k: v for k, v in words.items() if isinstance(v, str)}}
        children = []
        for entry_key, spec in block.entries:
            if isinstance(spec, tuple):
                if hoist is None:
                    raise SymparamError(f"{self.recipe.source}: [blocks.{name}] {entry_key}: variants are only allowed inside the layer stack")
                self.variants(spec, env, hoist, count, path, f"{path}.{entry_key}" if path else entry_key)
                continue
            term = self.entry(spec, env, hoist, count, path)
            if term is not None:
                children.append(term)
        meta = block.meta
        code = c.Code(meta["forward"], f"{self.recipe.source}: [blocks.{name}] forward", _bound(env), entries=_keys(block),
                      kernel=self.words(meta.get("kernel"), env), no_checkpointing=self.words(meta.get("no_checkpointing"), env),
                      first_layer=self.words(meta.get("first_layer"), env)) if "forward" in meta else None
        facts = tuple((fact, tuple((k, self.formula(v, env) if k in FACTS[fact][0] else self.words(v, env)) for k, v in sorted(meta[fact].items())))
                      for fact in FACTS if fact in meta)
        term = c.Term(key=key, label=self.words(words.get("label") or meta.get("label") or name, env),
                      note=self.words(words.get("note") or meta.get("note", ""), env),
                      children=tuple(children), component=words.get("component") or meta.get("component"), facts=facts,
                      rows=self.formula(meta["rows"], env) if "rows" in meta else None, module=meta.get("module"), code=code)
        return c.frozen(term) if meta.get("frozen") else term  # a module transformers builds with requires_grad False

    def entry(self, e: Entry, env: Mapping[str, Any], hoist: list | None, count: sp.Expr | None, path: str) -> c.Term | None:
        """A tensor or a sub-block instance, or None where its switch is off."""
        if not self.on(e.when, env):
            return None
        if e.shape:
            return c.Term(key=e.key, label=self.words(e.label or e.key, env), note=self.words(e.note, env),
                          shape=tuple(self.formula(s, env) for s in e.shape), component=e.component,
                          tied=self.on(e.tied, env) if e.tied else False, buffer=e.buffer, frozen=e.frozen, lookup=e.lookup, matmul=e.matmul,
                          dtype=e.dtype)
        block = self.recipe.blocks[e.block]
        args = self.bind(block, e, env)
        words = {"label": e.label and self.words(e.label, env), "note": e.note and self.words(e.note, env), "component": e.component}  # $note of this level, then passed down
        if e.layers:
            return self.stack(e, args, words)
        term = self.block(e.block, e.key, args, words, hoist, count, f"{path}.{e.key}" if path else e.key)
        times = self.formula(e.times, env) if e.times else c.ONE
        return replace(term, times=times, active_times=self.formula(e.active, env) if e.active else times, module=e.module or term.module)

    def variants(self, spec: tuple[Entry, ...], env: Mapping[str, Any], hoist: list, count: sp.Expr, path: str, slot: str) -> None:
        """A slot whose module differs by layer: each conditional variant counts its layers; the last may take the rest.
        Hoisted as [layers, path in the layer, term, slot path]."""
        rest = count
        for v in spec:
            if v.count in self.absent:
                continue
            n = make(v.count) if v.count else rest
            rest = rest - n
            at = len(hoist)
            term = self.entry(v, env, hoist, n, path)
            if term is not None:
                hoist.insert(at, [n, f"{path}.{v.key}" if path else v.key, term, slot])

    def stack(self, e: Entry, args: Mapping[str, Any], words: Mapping[str, Any]) -> c.Term:
        """The decoder layers: the layer block's parts grouped by how many layers have them (N, N_dense, N - N_dense, ...)."""
        layers = self.formula(e.times or "N", {})
        hoist: list = []
        layer = self.block(e.block, "", args, words, hoist, layers)
        groups: dict[sp.Expr, list[c.Term]] = {}
        slots: dict[str, list[tuple[sp.Expr, str]]] = {}
        for n, key, term, slot in [(layers, t.key, t, None) for t in layer.children] + hoist:
            groups.setdefault(n, []).append(replace(term, key=key))
            if slot is not None:
                slots.setdefault(slot, []).append((n, key))
        code = layer.code and replace(layer.code, slots=tuple((k, tuple(v)) for k, v in slots.items()), stack=True, layers=layers)
        one = len(groups) == 1  # a single kind is the stack itself; several sit in it unnamed (model.layers.<module>)
        kinds = [c.group(e.key if one else "", layer.label if n == layers else _layers_label(self.recipe, n, terms), terms, times=n, component=layer.component)
                 for n, terms in groups.items()]
        return replace(kinds[0], code=code) if one else c.group(e.key, layer.label, kinds, code=code)


def _keys(block: Block) -> tuple[str, ...]:
    """The module and tensor names a block declares, as transformers names them (every variant's too)."""
    return tuple(e.key for _, spec in block.entries for e in (spec if isinstance(spec, tuple) else (spec,)))


def _bound(env: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A block's arguments as its forward program reads them: sizes (formulas) and conditions (true/false)."""
    return tuple(sorted((k, v) for k, v in env.items() if isinstance(v, (sp.Expr, bool))))


def _layers_label(recipe: Recipe, count: sp.Expr, terms: list[c.Term]) -> str:
    """A layer group's name: its count symbol's meaning, else what its modules are."""
    if isinstance(count, sp.Symbol) and str(count) in recipe.symbols:
        return recipe.symbols[str(count)].meaning
    return "layers with " + ", ".join(t.label for t in terms)


# ---------------------------------------------------------------- parsing and validation


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged onto `base`: tables key by key, [blocks.X] entry by entry (false removes), lists replaced."""
    out = dict(base)
    for key, value in over.items():
        if key == "blocks" and isinstance(value, dict):
            blocks = dict(base.get("blocks", {}))
            for name, table in value.items():
                if isinstance(table, dict) and isinstance(blocks.get(name), dict):
                    merged = {**blocks[name], **table}
                    blocks[name] = {k: v for k, v in merged.items() if v is not False or k in BLOCK_META}
                else:
                    blocks[name] = table
            out["blocks"] = blocks
        elif key == "symbols" and isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = {**base[key], **{n: {**base[key].get(n, {}), **s} if isinstance(s, dict) else s for n, s in value.items()}}
        elif isinstance(value, dict) and isinstance(base.get(key), dict) and key != "names":
            out[key] = {**base[key], **value}
        elif key == "names" and isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = {t: {**base[key].get(t, {}), **(value.get(t) or {})} for t in set(base[key]) | set(value)}
        else:
            out[key] = value
    return out


def _table(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise SymparamError(f"{source}: [{key}] must be a table")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SymparamError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _symbols(data: dict[str, Any], source: str) -> dict[str, SymbolDef]:
    """The global vocabulary with this recipe's additions and overrides (keys, default, layer rule)."""
    table = {s.name: s for s in TABLE}
    for name, spec in _table(data, "symbols", source).items():
        where = f"{source}: [symbols] {name}"
        if not isinstance(spec, dict):
            raise SymparamError(f"{where}: expected a table such as {{ latex = ..., meaning = ..., keys = [...] }}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or name == "i":
            raise SymparamError(f"{where}: not a valid symbol name")
        for unknown in set(spec) - SYMBOL_FIELDS:
            raise SymparamError(f"{where}: unknown field {unknown!r}; known: {', '.join(sorted(SYMBOL_FIELDS))}")
        base = table.get(name)
        if base is None and not {"latex", "meaning"} <= set(spec):
            raise SymparamError(f"{where}: a new symbol needs latex and meaning")
        default = spec.get("default", base.fallback if base else None)
        if default is not None and type(default) is not int and not isinstance(default, str):
            raise SymparamError(f"{where}: default must be an integer or a formula, got {default!r}")
        layers = spec.get("layers", base.layers if base else None)
        if layers is not None:
            compile_rule(layers, f"{where}.layers")
        each = spec.get("each", base.each if base else None)
        if each is not None:
            compile_rule(each, f"{where}.each")
        routing = spec.get("routing", base.routing if base else None)
        if routing is not None:
            compile_rule(routing, f"{where}.routing")
        summed = spec.get("sum", base.summed if base else False)
        if type(summed) is not bool or (summed and each is None):
            raise SymparamError(f"{where}.sum: true or false, and true only with a rule `each` to sum over the layers")
        table[name] = SymbolDef(
            name=name,
            latex=str(spec.get("latex", base.latex if base else name)),
            meaning=str(spec.get("meaning", base.meaning if base else "")),
            keys=_strings(spec["keys"], f"{where}.keys") if "keys" in spec else (base.keys if base else ()),
            fallback=None if default is None else str(default),
            layers=None if layers is None else str(layers),
            zero=bool(spec.get("zero", base.zero if base else layers is not None)),
            zh=str(spec.get("zh", base.zh if base else "")),
            each=None if each is None else str(each),
            over=spec.get("over", base.over if base else None),
            routing=None if routing is None else str(routing),
            summed=summed,
        )
    for s in table.values():
        if s.over is not None and (s.over not in table or table[s.over].layers is None):
            raise SymparamError(f"{source}: [symbols] {s.name}.over: {s.over!r} is not a layer-count symbol")
        define(SymbolDef(s.name, s.latex, s.meaning, zero=s.zero))
    _no_cycles(table, source)
    return table


def _no_cycles(table: dict[str, SymbolDef], source: str) -> None:
    """Symbol defaults must not depend on themselves (d_a = d_b, d_b = d_a)."""
    deps = {}
    for name, s in table.items():
        try:
            deps[name] = {str(x) for x in parse(s.fallback, known=make).free_symbols} if s.fallback else set()
        except SymparamError as e:
            raise SymparamError(f"{source}: [symbols] {name}.default: {e}") from None
        for dep in deps[name] - set(table):
            raise SymparamError(f"{source}: [symbols] {name}.default: unknown symbol {dep!r}")
    state: dict[str, int] = {}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join(trail[trail.index(name):] + (name,))
            raise SymparamError(f"{source}: [symbols] defaults form a cycle: {cycle}")
        state[name] = 1
        for dep in sorted(deps[name]):
            visit(dep, trail + (name,))
        state[name] = 2

    for name in table:
        visit(name, ())


def _entry(key: str, spec: Any, where: str) -> Entry:
    if not isinstance(spec, dict):
        raise SymparamError(f"{where}: expected a table with shape = [...] or block = \"...\", got {spec!r}")
    if ("shape" in spec) == ("block" in spec):
        raise SymparamError(f"{where}: give exactly one of shape (a tensor) and block (a module)")
    if "shape" in spec:
        shape = spec["shape"]
        if not isinstance(shape, list) or not shape or not all(isinstance(s, (str, int)) and type(s) is not bool for s in shape):
            raise SymparamError(f"{where}: shape must be a non-empty list of formulas, got {shape!r}")
        unknown = set(spec) - ENTRY_FIELDS
        if unknown:
            raise SymparamError(f"{where}: unknown field {sorted(unknown)[0]!r} for a tensor")
    for name in ("times", "active"):
        if name in spec and not isinstance(spec[name], (str, int)):
            raise SymparamError(f"{where}: {name} must be a formula, got {spec[name]!r}")
    for name in ("buffer", "frozen", "lookup", "layers", "matmul"):
        if name in spec and not isinstance(spec[name], bool):
            raise SymparamError(f"{where}: {name} must be true or false")
    return Entry(
        key=str(spec.get("key", key)),
        block=spec.get("block"),
        shape=tuple(str(s) for s in spec.get("shape", ())),
        args={k: v for k, v in spec.items() if k not in ENTRY_FIELDS},
        when=compile_rule(spec["when"], f"{where}.when") if "when" in spec else None,
        times=None if "times" not in spec else str(spec["times"]),
        active=None if "active" not in spec else str(spec["active"]),
        count=spec.get("count"),
        component=spec.get("component"),
        label=spec.get("label"),
        note=str(spec.get("note", "")),
        tied=compile_rule(spec["tied"], f"{where}.tied") if "tied" in spec else None,
        buffer=bool(spec.get("buffer", False)),
        lookup=bool(spec.get("lookup", False)),
        matmul=bool(spec.get("matmul", True)),
        layers=bool(spec.get("layers", False)),
        frozen=bool(spec.get("frozen", False)),
        dtype=None if "dtype" not in spec else _dtype(spec["dtype"], where),
        module=_module(spec.get("module"), where),
    )


def _module(value: Any, where: str) -> str | None:
    if value is not None and value not in MODULE_KINDS:
        raise SymparamError(f"{where}: module {value!r} is not a module kind; known: {', '.join(MODULE_KINDS)}")
    return value


def _dtype(value: Any, where: str) -> str:
    from symparam.safetensors import DTYPE_BYTES

    if value not in DTYPE_BYTES:
        raise SymparamError(f"{where}: dtype {value!r} is not a safetensors dtype; known: {', '.join(DTYPE_BYTES)}")
    return value


def _block(name: str, table: Any, source: str, switches: set[str]) -> Block:
    where = f"{source}: [blocks.{name}]"
    if not isinstance(table, dict):
        raise SymparamError(f"{where}: must be a table")
    args = table.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(v, (str, int, bool)) for v in args.values()):
        raise SymparamError(f"{where} args: expected name = default (a formula or true/false)")
    meta = {k: v for k, v in table.items() if k in BLOCK_META and k != "args"}
    for fact in set(meta) & set(FACTS):
        formulas, texts = FACTS[fact]
        if not isinstance(meta[fact], dict) or set(meta[fact]) - formulas - texts:
            raise SymparamError(f"{where} {fact}: expected a table of {', '.join(sorted(formulas | texts))}")
    if meta.get("module", MODULE_KINDS[0]) not in MODULE_KINDS:
        raise SymparamError(f"{where} module: unknown kind {meta['module']!r}; known: {', '.join(MODULE_KINDS)}")
    entries = []
    for key, spec in table.items():
        if key in BLOCK_META:
            continue
        if isinstance(spec, list):
            variants = tuple(_entry(key, v, f"{where} {key}[{i}]") for i, v in enumerate(spec))
            for i, v in enumerate(variants[:-1]):
                if v.count is None:
                    raise SymparamError(f"{where} {key}[{i}]: every variant but the last needs count = \"<layer-count symbol>\"")
            entries.append((key, variants))
        else:
            entries.append((key, _entry(key, spec, f"{where} {key}")))
    flags = frozenset(k for k, v in args.items() if isinstance(v, bool) or (isinstance(v, str) and _reads_only(v, switches)))
    return Block(name, dict(args), flags, meta, tuple(entries))


def _reads_only(text: str, switches: set[str]) -> bool:
    """Whether an argument's default is a condition: a rule that reads only switches ("mlp_bias", "not q_lora")."""
    try:
        return set(compile_rule(text, "argument").reads) <= switches
    except SymparamError:  # "d_ff/3" is no rule: a formula
        return False


def _validate(recipe: Recipe) -> None:
    """Every name a recipe uses resolves: blocks, arguments, symbols, switches, count symbols; no block includes itself."""
    src = recipe.source
    symbols = set(recipe.symbols)
    clash = symbols & set(recipe.switches)
    if clash:
        raise SymparamError(f"{src}: {sorted(clash)[0]!r} is both a symbol and a switch")

    def known(where: str, names: set[str]):
        def check(name: str) -> sp.Expr:
            if name not in names:
                raise SymparamError(f"{where}: unknown symbol {name!r}")
            return make(name)
        return check

    def formulas(where: str, texts, block: Block) -> None:
        sizes = set(block.args) - block.flags
        for text in texts:
            try:
                parse(text, {k: make(k) for k in sizes}, known(where, symbols | sizes))
            except SymparamError as e:
                raise SymparamError(f"{where}: {e}") from None

    def conditions(where: str, rule: Rule | None, block: Block) -> None:
        flags = set(recipe.switches) | block.flags
        for name in rule.reads if rule else ():
            if name not in flags:
                raise SymparamError(f"{where}: {name!r} is not a switch; known: {', '.join(sorted(flags))}")

    for block in recipe.blocks.values():
        where = f"{src}: [blocks.{block.name}]"
        formulas(f"{where} args", [v for k, v in block.args.items() if k not in block.flags], block)
        for fact in set(block.meta) & set(FACTS):
            formulas(f"{where} {fact}", [v for k, v in block.meta[fact].items() if k in FACTS[fact][0]], block)
        for key, spec in block.entries:
            for e in spec if isinstance(spec, tuple) else (spec,):
                at = f"{where} {key}"
                conditions(f"{at}.when", e.when, block)
                conditions(f"{at}.tied", e.tied, block)
                formulas(f"{at}.shape", e.shape, block)
                formulas(f"{at}.times", [x for x in (e.times, e.active) if x], block)
                if e.count is not None and (e.count not in recipe.symbols or recipe.symbols[e.count].layers is None):
                    raise SymparamError(f"{at}: count {e.count!r} is not a layer-count symbol (a [symbols] entry with layers = \"<rule>\")")
                if e.block is None:
                    continue
                if e.block not in recipe.blocks:
                    raise SymparamError(f"{at}: unknown block {e.block!r}; known: {', '.join(sorted(recipe.blocks))}")
                sub = recipe.blocks[e.block]
                for arg, value in e.args.items():
                    if arg not in sub.args:
                        raise SymparamError(f"{at}: block {e.block!r} has no argument {arg!r}; it takes {', '.join(sub.args) or 'none'}")
                    if arg in sub.flags:
                        conditions(f"{at}.{arg}", compile_rule(value, f"{at}.{arg}") if not isinstance(value, bool) else None, block)
                    else:
                        formulas(f"{at}.{arg}", [value], block)
    if ROOT not in recipe.blocks:
        raise SymparamError(f"{src}: no [blocks.{ROOT}]")
    for name, spec in recipe.checkpoint.items():
        if spec["block"] not in recipe.blocks:
            raise SymparamError(f"{src}: [checkpoint] {name}: unknown block {spec['block']!r}")
        try:
            parse(spec.get("times", "1"), known=known(f"{src}: [checkpoint] {name}.times", symbols))
        except SymparamError as e:
            raise SymparamError(f"{src}: [checkpoint] {name}.times: {e}") from None
    _acyclic(recipe)


def _acyclic(recipe: Recipe) -> None:
    """No block includes itself, and the tree the root expands to stays small: at most MAX_BLOCK_DEPTH blocks deep and
    MAX_TERMS modules and tensors (a block used twice counts twice), counted once per block, before anything is built."""
    terms: dict[str, int] = {}

    def uses(block: Block) -> list[str | None]:
        return [e.block for _, spec in block.entries for e in (spec if isinstance(spec, tuple) else (spec,))]

    def visit(name: str, trail: tuple[str, ...]) -> int:
        if name in trail:
            raise SymparamError(f"{recipe.source}: block {name!r} includes itself: {' -> '.join(trail + (name,))}")
        if len(trail) >= MAX_BLOCK_DEPTH:
            raise SymparamError(f"{recipe.source}: blocks nested more than {MAX_BLOCK_DEPTH} deep: {' -> '.join(trail[:3])} -> ... -> {name}")
        if name not in terms:
            total = 1
            for sub in uses(recipe.blocks[name]):
                total += visit(sub, trail + (name,)) if sub else 1
                if total > MAX_TERMS:
                    raise SymparamError(f"{recipe.source}: [blocks.{name}] expands to more than {MAX_TERMS:,} modules and tensors")
            terms[name] = total
        return terms[name]

    visit(ROOT, ())


def parse_recipe(data: dict[str, Any], source: str, base: dict[str, Any] | None = None) -> Recipe:
    """A validated Recipe from a parsed TOML table merged over `base` (the library, or what it extends)."""
    unknown = set(data) - TOP_LEVEL
    if unknown:
        raise SymparamError(f"{source}: unknown section {sorted(unknown)[0]!r}; known: {', '.join(sorted(TOP_LEVEL))}")
    for required in ("family", "model_types"):
        if required not in data:
            raise SymparamError(f"{source}: missing {required!r}")
    full = merge(base if base is not None else library(), data)
    switches = {}
    for name, value in _table(full, "switches", source).items():
        if not isinstance(value, (bool, str)):
            raise SymparamError(f"{source}: [switches] {name}: expected true, false, a config key or a rule, got {value!r}")
        switches[name] = compile_rule(value, f"{source}: [switches] {name}")
    blocks = {name: _block(name, table, source, set(switches)) for name, table in _table(full, "blocks", source).items()}
    symbols = _symbols(full, source)
    recipe = Recipe(
        family=str(full["family"]),
        title=str(full.get("title", full["family"])),
        model_types=_strings(full["model_types"], f"{source}: model_types"),
        summary=str(full.get("summary", "")),
        symbols=symbols,
        switches=switches,
        blocks=blocks,
        defaults=dict(_table(full, "defaults", source)),
        architectures=_strings(full.get("architectures", []), f"{source}: architectures"),
        lists=_lists(full, source),
        checks=_checks(full, source, set(symbols)),
        names=_names(source, full.get("names", {})),
        zh={str(k): str(v) for k, v in _table(full, "zh", source).items()},
        functions=_functions(full, source),
        source=source,
        checkpoint=_checkpoint(full, source),
        tp_plan=_tp_plan(full, source),
    )
    _validate(recipe)
    return recipe


def _checks(data: dict[str, Any], source: str, symbols: set[str]) -> dict[str, str]:
    """[checks]: rule -> the message shown when it fails, whose only fields are {symbol}s."""
    out = {}
    for rule, message in _table(data, "checks", source).items():
        where = f"{source}: [checks] {rule!r}"
        if message is False:  # false removes an inherited check
            continue
        if not isinstance(message, str):
            raise SymparamError(f"{where}: expected a message, got {message!r}")
        for name in message_fields(message, where):
            if name not in symbols:
                raise SymparamError(f"{where}: the message's field {{{name}}} is not a symbol")
        out[str(rule)] = message
    return out


def _functions(data: dict[str, Any], source: str) -> dict[str, str]:
    """[functions]: programs the blocks' forwards call by name (rotate_half, repeat_kv, an attention kernel's wrapper)."""
    table = _table(data, "functions", source)
    for name, text in table.items():
        if not isinstance(text, str):
            raise SymparamError(f"{source}: [functions] {name}: expected a program (def {name}(...): ...)")
    return dict(table)
def _tp_plan(data: dict[str, Any], source: str) -> dict[str, str]:
    """[tp_plan]: the model's tensor-parallel plan as transformers ships it (module or parameter name, layer indices as
    `*` -> style); memory/sharding.py reads it."""
    table = _table(data, "tp_plan", source)
    for key, style in table.items():
        if not isinstance(style, str):
            raise SymparamError(f"{source}: [tp_plan] {key}: expected a style name such as \"colwise\", got {style!r}")
    return dict(table)


def _checkpoint(data: dict[str, Any], source: str) -> dict[str, dict[str, str]]:
    """[checkpoint]: name -> { block, times (copies), path (where the checkpoint keeps it), what (words) }."""
    out = {}
    for name, spec in _table(data, "checkpoint", source).items():
        if not isinstance(spec, dict) or set(spec) - {"block", "times", "path", "what", "key"} or not isinstance(spec.get("block"), str) or not isinstance(spec.get("what"), str):
            raise SymparamError(f"{source}: [checkpoint] {name}: expected {{ block = \"...\", times = \"...\", path = \"model.layers\", what = \"...\" }}")
        out[name] = {k: str(v) for k, v in spec.items()}
    return out


def _lists(data: dict[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """[lists]: per-layer config lists (layer_types, ...): their length formula, the values they may hold, and the legacy
    names of kinds that transformers reads as others (remap_legacy_layer_types: "mamba" is "linear_attention")."""
    out = {}
    for key, spec in _table(data, "lists", source).items():
        where = f"{source}: [lists] {key}"
        if not isinstance(spec, dict) or set(spec) - {"length", "values", "aliases", "sets"}:
            raise SymparamError(f"{where}: expected {{ length = \"N\", values = [...], aliases = {{ old = \"new\" }}, sets = true }}")
        aliases = spec.get("aliases", {})
        if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()) or "." in key and aliases:
            raise SymparamError(f"{where}: aliases must be a table of kind names (old = \"new\") of a top-level key")
        length = str(spec.get("length", "N"))
        if not isinstance(spec.get("sets", False), bool) or spec.get("sets") and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", length):
            raise SymparamError(f"{where}: sets = true needs a length that is one symbol (length = \"N\")")
        out[key] = {"length": length, "values": list(spec["values"]) if "values" in spec else None, "aliases": dict(aliases),
                    "sets": bool(spec.get("sets", False))}
    return out


def _names(source: str, names: Any) -> dict[str, dict[str, str]]:
    """[names] tables of regex -> text; every regex must compile."""
    if not isinstance(names, dict) or set(names) - set(NAME_TABLES):
        raise SymparamError(f"{source}: [names] must hold only the tables {', '.join(NAME_TABLES)}")
    for table, rules in names.items():
        if not isinstance(rules, dict) or not all(isinstance(v, str) for v in rules.values()):
            raise SymparamError(f"{source}: [names.{table}] must map regexes to strings")
        for pattern in rules:
            try:
                re.compile(pattern)
            except re.error as e:
                raise SymparamError(f"{source}: [names.{table}] {pattern!r} is not a regex ({e})") from None
    return {table: dict(names.get(table, {})) for table in NAME_TABLES}


def read_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return nesting(tomllib.loads(text), source)
    except tomllib.TOMLDecodeError as e:
        raise SymparamError(f"{source}: not valid TOML ({e})") from None
    except RecursionError:
        raise SymparamError(f"{source}: nested more than {MAX_NESTING} levels deep") from None
    except ValueError as e:  # an integer of more digits than Python reads
        raise SymparamError(f"{source}: not valid TOML ({str(e).split(':')[0]})") from None


def library() -> dict[str, Any]:
    """The built-in blocks, switches and symbols every recipe starts from."""
    return read_toml(resources.files(__package__).joinpath(LIBRARY).read_text(encoding="utf-8"), f"recipes/{LIBRARY}")


def load_recipe(path: str | Path) -> Recipe:
    """A recipe from a TOML file a user wrote (it may extend a built-in family)."""
    data = read_toml(read_text(path, MAX_RECIPE, "recipe"), shown(path))
    return parse_recipe(data, shown(path), REGISTRY.base_of(data, shown(path)))


class Registry:
    """Recipes by family, model_type and class name; a name defined twice is an error. Only each file's header (its
    top-level keys) is read up front; a recipe is parsed when first used, so more recipes cost the cold CLI little."""

    def __init__(self, files: dict[str, str], known: dict[str, list] | None = None) -> None:
        self._files = files  # family file name -> TOML text
        known = known or {}  # file -> [sha1 of its text, its header]: headers read before (HEADERS), skipped if unchanged
        self._full: dict[str, dict[str, Any]] = {}
        self._parsed: dict[str, Recipe] = {}
        self.headers: dict[str, dict[str, Any]] = {}  # file -> family, title, summary, model_types, architectures
        self.by_family: dict[str, str] = {}
        self.by_type: dict[str, str] = {}
        self.by_class: dict[str, str] = {}
        for file, text in files.items():
            digest = fingerprint(text)
            data = self.headers[file] = known[file][1] if known.get(file, [None])[0] == digest else read_toml(header(text), file)
            family = data.get("family")
            if not isinstance(family, str):
                raise SymparamError(f"{file}: missing 'family'")
            tables = ((self.by_family, [family]), (self.by_type, data.get("model_types", [])),
                      (self.by_class, data.get("architectures", [])))
            for table, names in tables:
                for name in names:
                    if name in table:
                        raise SymparamError(f"{file}: {name!r} is already defined by {table[name]}")
                    table[name] = file

    def families(self) -> list[dict[str, Any]]:
        """Every family's header (family, title, model_types, summary, ...), in family order, without parsing recipes."""
        return [{"title": h["family"], "model_types": [], "summary": "", **h} for h in self.headers.values()]

    def _raw(self, file: str) -> dict[str, Any]:
        if file not in self._full:
            self._full[file] = read_toml(self._files[file], file)
        return self._full[file]

    def base_of(self, data: dict[str, Any], source: str) -> dict[str, Any]:
        """What a recipe merges over: the library, or the merged recipe it extends (own names dropped)."""
        parent = data.get("extends")
        if parent is None:
            return library()
        if not isinstance(parent, str) or parent.replace("-", "_") not in self.by_family:
            raise SymparamError(f"{source}: extends unknown family {parent!r}")
        file = self.by_family[parent.replace("-", "_")]
        raw = self._raw(file)
        merged = merge(self.base_of(raw, file), raw)
        return {k: v for k, v in merged.items() if k not in OWN and k != "extends"}

    def _recipe(self, file: str) -> Recipe:
        if file not in self._parsed:
            raw = self._raw(file)
            self._parsed[file] = parse_recipe(raw, f"recipes/{file}", self.base_of(raw, file))
        return self._parsed[file]

    def family(self, name: str) -> Recipe:
        """The recipe for an arch name; `qwen3-moe` and `qwen3_moe` are the same name."""
        key = name.replace("-", "_")
        if key not in self.by_family:
            raise SymparamError(f"arch: unknown {name!r}; known: {', '.join(self.by_family)}")
        return self._recipe(self.by_family[key])

    def for_model_type(self, model_type: Any) -> Recipe:
        if not isinstance(model_type, str) or model_type not in self.by_type:
            raise SymparamError(f"model_type: unsupported {model_type!r}; `symparam list` shows the {len(self.by_type)} supported model types")
        return self._recipe(self.by_type[model_type])

    def for_class(self, classes: Any) -> Recipe | None:
        """The recipe of the first class in config.json's `architectures` that a recipe names, if any."""
        names = classes if isinstance(classes, list) else []
        return next((self._recipe(self.by_class[n]) for n in names if isinstance(n, str) and n in self.by_class), None)

    def __iter__(self):
        return (self._recipe(file) for file in self.by_family.values())


HEADER_END = re.compile(r"^\[", re.M)  # the first table: top-level keys come before it


def header(text: str) -> str:
    """A recipe's top-level keys: all the registry needs to index it."""
    end = HEADER_END.search(text)
    return text if end is None else text[:end.start()]


HEADERS = "_headers.json"  # every recipe's header with the fingerprint of its text, written by `symparam docs`


def fingerprint(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def header_index(registry: Registry) -> str:
    """HEADERS as JSON text: what the registry read, so the next cold start need not parse any TOML (a recipe edited
    since is read anew: the file only saves time)."""
    return json.dumps({file: [fingerprint(text), registry.headers[file]] for file, text in registry._files.items()}, indent=0, sort_keys=True) + "\n"


def builtin() -> Registry:
    """The registry of the recipes shipped in this package."""
    root = resources.files(__package__)
    files = sorted(root.iterdir(), key=lambda p: p.name)
    texts = {p.name: p.read_text(encoding="utf-8") for p in files if p.name.endswith(".toml") and not p.name.startswith("_")}
    try:
        known = json.loads(root.joinpath(HEADERS).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        known = {}
    return Registry(texts, known)


REGISTRY = builtin()


# ---------------------------------------------------------------- multimodal wrappers (_wrappers.toml)

WRAPPERS = "_wrappers.toml"
WRAPPER_FIELDS = {"text", "defaults", "tie", "head", "head_keys", "keys", "text_defaults", "flat", "rename", "reason"}
GENERAL_TIE = "tie_word_embeddings"  # a wrapper's own flag ties its own head; with no flag of its own, no tie


@dataclass(frozen=True)
class Wrapper:
    """How a multimodal config type keeps and reads its language model: what its config.json cannot say for itself."""

    model_type: str
    keys: tuple[str, ...]  # where it keeps the language model's config, first found wins
    tie: Rule  # over the wrapper's keys (text_config.<key>: the language model's config): whether its own head is tied
    text: str | None = None  # the language model's model_type where the sub-config names none
    defaults: dict[str, Any] = field(default_factory=dict)  # the wrapper class's defaults for the keys `tie` reads
    head: str = "wrapper"  # "wrapper": the head is the wrapper's own; "language model": the language model's, tied by it
    head_keys: tuple[str, ...] = ()  # the wrapper's own keys that size its head (Ovis2's vocab_size and hidden_size)
    text_defaults: dict[str, Any] = field(default_factory=dict)  # merged under the config's sub-config, as transformers does
    flat: bool | tuple[str, ...] = False  # no sub-config: the language model's keys at the top level (all, or these)
    rename: dict[str, str] = field(default_factory=dict)  # the sub-config's model_type read as another
    reason: str | None = None  # not counted, and why
    known: bool = False  # a wrapper type of transformers 5.23 listed in _wrappers.toml


@cache
def wrapper_table() -> tuple[tuple[str, ...], dict[str, Wrapper]]:
    """The keys where wrappers keep their language model, and the wrapper types of transformers 5.23 (_wrappers.toml)."""
    source = f"recipes/{WRAPPERS}"
    data = read_toml(resources.files(__package__).joinpath(WRAPPERS).read_text(encoding="utf-8"), source)
    keys = _strings(data.get("keys"), f"{source}: keys")
    types = {}
    for name, spec in _table(data, "types", source).items():
        where = f"{source}: [types] {name}"
        if not isinstance(spec, dict) or set(spec) - WRAPPER_FIELDS:
            raise SymparamError(f"{where}: expected a table of {', '.join(sorted(WRAPPER_FIELDS))}")
        flat = spec.get("flat", False)
        types[name] = Wrapper(name, _strings(spec["keys"], f"{where}.keys") if "keys" in spec else ("text_config",),
                              compile_rule(spec.get("tie", GENERAL_TIE), f"{where}.tie"), spec.get("text"), dict(spec.get("defaults", {})),
                              spec.get("head", "wrapper"), _strings(spec.get("head_keys", []), f"{where}.head_keys"), dict(spec.get("text_defaults", {})),
                              flat if isinstance(flat, bool) else _strings(flat, f"{where}.flat"), dict(spec.get("rename", {})),
                              spec.get("reason"), True)
    return keys, types


@cache
def scope() -> dict[str, dict[str, str]]:
    """The causal-LM model types of transformers that are out of scope, with the reason for each (_scope.toml)."""
    return read_toml(resources.files(__package__).joinpath("_scope.toml").read_text(encoding="utf-8"), "recipes/_scope.toml")


def wrapper(model_type: Any) -> Wrapper:
    """How a config of this model_type keeps its language model: its _wrappers.toml line, else the general rule."""
    keys, types = wrapper_table()
    known = types.get(model_type) if isinstance(model_type, str) else None
    return known or Wrapper(str(model_type), keys, compile_rule(GENERAL_TIE, "wrapper tie"))


__all__ = ["Recipe", "Registry", "REGISTRY", "Wrapper", "load_recipe", "parse_recipe", "truthy", "merge", "library", "scope", "wrapper", "wrapper_table"]
