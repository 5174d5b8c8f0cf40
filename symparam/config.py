"""config.json (or a preset, or --set values) -> validated switches and exact integer symbol values."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import sympy as sp

from symparam.components import Term
from symparam.errors import SymparamError
from symparam.recipes import REGISTRY, Recipe
from symparam.rules import Uniform, compile_rule, lookup_in
from symparam.symbols import make, parse

_NAME = re.compile(r"[A-Za-z_]\w*")  # a name a forward program may read


@dataclass(frozen=True)
class Resolved:
    """A config read against a recipe: its switches, an exact integer for each symbol it sets, and how it was read."""

    recipe: Recipe
    flags: dict[str, bool]  # switch -> on/off, e.g. "tied"
    values: dict[str, int]  # symbol name -> value, e.g. "d" -> 4096
    name: str  # preset name or file path, for titles
    notes: tuple[tuple[str, dict[str, str]], ...] = ()  # how the config was read: (catalog phrase, its fields), e.g. ("note_wrapper", {...})
    scope: dict[str, Any] = field(default_factory=dict)  # {"scope": "language model", "wrapper": "gemma3"} for wrappers
    source: Source | None = None  # where the config came from
    quantization: dict[str, Any] | None = None  # quantization_config (top level, else the language model's), as written
    dtype: str = "bfloat16"  # torch_dtype (or dtype) the checkpoint's unquantized tensors are stored in
    config: dict[str, Any] = field(default_factory=dict)  # the language model's config.json with the family's defaults


@dataclass(frozen=True)
class Source:
    """Where a config came from: a catalog preset, a file, the local Hugging Face cache, or a download from the Hub."""

    kind: str  # "catalog", "file", "cache" or "download"
    preset: str = ""  # the catalog preset's name
    hub: str = ""  # the Hub id, e.g. Qwen/Qwen3-8B
    revision: str = ""  # the branch, tag or commit asked for
    commit: str = ""  # the commit it resolved to
    path: str = ""  # the config.json read
    endpoint: str = ""  # the Hub it was downloaded from

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}

    @property
    def note(self) -> tuple[str, dict[str, str]] | None:
        """The catalog phrase that says where the config came from (a file needs none: the title is its path)."""
        if self.kind == "catalog":
            return ("note_source_catalog", {"preset": self.preset, "hub": self.hub}) if self.hub else ("note_source_preset", {"preset": self.preset})
        if self.kind == "cache":
            return "note_source_cache", {"hub": self.hub, "revision": self.revision, "commit": self.commit, "path": self.path}
        if self.kind == "download":
            host = self.endpoint.split("://", 1)[-1]
            return "note_source_download", {"hub": self.hub, "revision": self.revision, "commit": self.commit, "path": self.path, "host": host}
        return None


def presets() -> dict[str, Any]:
    """Preset name -> the packaged config.json file."""
    files = resources.files("symparam").joinpath("presets")
    return {p.name.removesuffix(".json"): p for p in sorted(files.iterdir(), key=lambda p: p.name) if p.name.endswith(".json") and not p.name.startswith("_")}


@cache
def catalog() -> dict[str, dict[str, str]]:
    """Preset name -> {"hub": Hugging Face Hub id, "series": name}: the published models (presets/_catalog.toml)."""
    text = resources.files("symparam").joinpath("presets", "_catalog.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["models"]


def preset_name(name: str) -> str | None:
    """The preset a name means: a preset name or its Hub id, in any case; None if no preset is called that."""
    wanted = name.lower()
    return next((p for p in presets() if p.lower() == wanted or catalog().get(p, {}).get("hub", "").lower() == wanted), None)


def read_preset(name: str) -> dict[str, Any]:
    """A preset's config.json by its name or Hub id."""
    found = preset_name(name)
    if found is None:
        raise SymparamError(f"model: unknown preset {name!r}; `symparam list` shows the {len(presets())} presets and their Hub ids")
    return loads(presets()[found].read_text(encoding="utf-8"), found)


def read_config(path: str | Path) -> dict[str, Any]:
    """A config.json file as a dict; a missing, unreadable or malformed file is a one-line error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # editors write a BOM; transformers reads it too
    except FileNotFoundError:
        raise SymparamError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SymparamError(f"{path}: cannot read ({e.__class__.__name__})") from None
    return loads(text, str(path))


def loads(text: str, where: str) -> Any:
    """JSON text as data, as Python's json (and so transformers) reads it: NaN and Infinity are floats (Nemotron-H's
    time_step_limit holds Infinity; a size that is one is refused where it is read), too-deep nesting is refused, a
    duplicate key is warned of (the last wins)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                print(f"{where}: warning: key {key!r} appears more than once; the last value wins, as in transformers", file=sys.stderr)
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise SymparamError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise SymparamError(f"{where}: JSON nested too deeply to be a config") from None


Note = tuple[str, dict[str, str]]  # a phrase of templates/<lang>.toml and its fields: how a config was read


def unwrap(raw: dict[str, Any], recipe: Recipe | None) -> tuple[dict[str, Any], Recipe, tuple[Note, ...], dict[str, Any]]:
    """The language-model config and its recipe: a multimodal wrapper's text_config, or a family found by class name."""
    model_type = raw.get("model_type")
    wrapped = (recipe if isinstance(model_type, str) and model_type in recipe.wrappers else None) if recipe is not None else REGISTRY.wrapper(model_type)
    if wrapped is not None:
        spec = wrapped.wrappers[model_type]
        key = spec.get("config", "text_config")
        text = raw.get(key)
        if text is None and spec.get("flat"):  # the language model's keys at the top level, as transformers reads them then
            text = {k: v for k, v in raw.items() if k != "model_type" and not k.endswith("_config")}
        if not isinstance(text, dict):
            raise SymparamError(f"{key}: missing; a {model_type} config keeps its language model there")
        defaults = spec.get("defaults", {})  # the wrapper config's own defaults for the keys it keeps
        kept = {k: raw.get(k, defaults.get(k)) for k in spec.get("keep", []) if k in raw or k in defaults}
        inner = {**text, **kept}  # a kept key is the wrapper's: transformers ties a wrapper's head by its top-level flag
        inner.setdefault("model_type", wrapped.model_types[0])
        if recipe is None and inner["model_type"] in REGISTRY.by_type:  # Mistral 3 may wrap a plain "mistral" text config
            wrapped = REGISTRY.for_model_type(inner["model_type"])
        note = ("note_wrapper", {"wrapper": model_type, "key": key})
        return inner, wrapped, (note,), {"scope": "language model", "wrapper": model_type}
    if recipe is not None:
        if "model_type" in raw and model_type not in recipe.model_types:
            raise SymparamError(f"model_type: {model_type!r} is not a {recipe.family} config (that recipe reads {', '.join(recipe.model_types)})")
        return raw, recipe, (), {}
    if isinstance(model_type, str) and model_type in REGISTRY.by_type:
        return raw, REGISTRY.for_model_type(model_type), (), {}
    by_class = REGISTRY.for_class(raw.get("architectures"))
    if by_class is not None:
        cls = next(a for a in raw["architectures"] if a in by_class.architectures)
        fields = {"family": by_class.family, "cls": cls, "model_type": str(model_type)}
        return raw, by_class, (("note_unknown_type" if model_type is not None else "note_no_type", fields),), {}
    return raw, REGISTRY.for_model_type(model_type), (), {}


def resolve(raw: Any, recipe: Recipe | None = None, overrides: Mapping[str, int] | None = None, name: str = "", source: Source | None = None) -> Resolved:
    """Switches and exact symbol values for `raw` (a config dict), read against its family's recipe; `source` says where it came from."""
    if not isinstance(raw, dict):
        raise SymparamError(f"config: expected a JSON object, got {type(raw).__name__}")
    outer = raw
    raw, recipe, notes, scope = unwrap(raw, recipe)
    notes = ((source.note,) if source is not None and source.note else ()) + notes
    config = {**recipe.defaults, **raw}
    flags = recipe.switch_values(config)
    tree = recipe.build(flags)
    needed = {str(s) for s in tree_symbols(tree)}
    overrides = dict(overrides or {})
    for symbol in overrides:
        if symbol not in recipe.symbols:
            raise SymparamError(f"--set {symbol}: unknown symbol for {recipe.family}; known: {', '.join(recipe.symbols)}")
    values = Values(recipe, config, overrides)
    for symbol in sorted(needed):
        values.get(symbol)
    for symbol in _optional(recipe, tree):
        values.maybe(symbol)
    _check_lists(recipe, config, values.known)
    _one_variant_per_layer(recipe, values)
    _checks(recipe, values.known)
    _whole_shapes(tree, values.known, as_subs(values.known))
    return Resolved(recipe, flags, values.known, name or str(raw.get("_name_or_path", recipe.family)), notes, scope, source,
                    quantization(outer, raw), stored_dtype(outer, raw), config)


def quantization(outer: dict[str, Any], inner: dict[str, Any]) -> dict[str, Any] | None:
    """quantization_config at the top level, else in the language model's config, as transformers reads it; a value
    that is not a table is a one-line error. What it says is read where a stored layout is asked for (memory/storage.py):
    counting does not depend on it."""
    for where, config in (("quantization_config", outer), ("text_config.quantization_config", inner)):
        value = config.get("quantization_config")
        if value is None:
            continue
        if not isinstance(value, dict):
            raise SymparamError(f"{where}: expected a table, got {json.dumps(value)}")
        return value
    return None


def stored_dtype(outer: dict[str, Any], inner: dict[str, Any]) -> str:
    """The torch dtype name a config says its weights are stored in (torch_dtype, or dtype as transformers 5 writes it), bfloat16 if none."""
    for config in (outer, inner):
        value = config.get("torch_dtype") or config.get("dtype")
        if isinstance(value, str):
            return value.removeprefix("torch.")
    return "bfloat16"


def tree_symbols(tree: Term) -> set[sp.Symbol]:
    """Every symbol a tree's shapes and copies use, tied tensors and buffers included (Zamba's reuse count is only in
    tied copies; a layer count whose kinds cancel in the total still sizes its tensors)."""
    from symparam.components import walk

    found: set[sp.Symbol] = set()
    for node, *_ in walk(tree):
        for e in (*node.shape, node.times, node.active_times):
            found |= sp.sympify(e).free_symbols
    return found


def _optional(recipe: Recipe, tree: Term) -> list[str]:
    """Symbols the model does not need but its facts, checks and estimates read: resolved where the config has them."""
    from symparam.components import walk

    found = {name for name, s in recipe.symbols.items() if s.keys}
    for node, *_ in walk(tree):
        for _, items in node.facts:
            found |= {str(s) for _, v in items if isinstance(v, sp.Expr) for s in v.free_symbols}
        if node.code is not None:  # what the forward programs read (activation memory, the shape walk)
            found |= set(_NAME.findall(node.code.text))
    for text in recipe.functions.values():
        found |= set(_NAME.findall(text))
    for rule in recipe.checks:
        found |= set(compile_rule(rule, "check").reads)
    return sorted(found & set(recipe.symbols))


class Values:
    """Symbol values read from a config on demand: --set, layer rules, config keys, then defaults."""

    def __init__(self, recipe: Recipe, config: dict[str, Any], overrides: dict[str, int]):
        self.recipe = recipe
        self.config = config
        self.read = lookup_in(config)
        self.known: dict[str, int] = {}
        self.masks: dict[str, Sequence[bool]] = {}
        for symbol, value in overrides.items():
            self.known[symbol] = _check(recipe, symbol, f"--set {symbol}", value)

    def get(self, symbol: str, required: bool = True) -> int | None:
        if symbol in self.known:
            return self.known[symbol]
        s = self.recipe.symbols[symbol]
        if s.layers is not None:
            value = self.mask(symbol).count(True)
        elif s.each is not None:
            value = self.per_layer(symbol)
        else:
            key = next((k for k in s.keys if self.read(k) is not None), None)
            if key is not None:
                value = _check(self.recipe, symbol, key, self.read(key))
            elif s.fallback is not None:
                value = self._default(symbol, required)
                if value is None:
                    return None
            elif required:
                where = " or ".join(s.keys) if s.keys else symbol
                raise SymparamError(f"{where}: missing ({s.meaning}); set it in the config or with --set {symbol}=...")
            else:
                return None
        self.known[symbol] = value
        return value

    def maybe(self, symbol: str) -> int | None:
        """A value the model does not need but other figures read (the window, d_ff of an estimate): None if unset or unusable."""
        try:
            return self.get(symbol, required=False)
        except SymparamError:
            return None

    def mask(self, symbol: str) -> Sequence[bool]:
        """Which layers a layer-count symbol selects, by its rule over layer index i."""
        if symbol not in self.masks:
            layers = self.get("N")
            rule = self.recipe.layer_symbols[symbol]
            self.masks[symbol] = rule.layers(self.read, layers)
        return self.masks[symbol]

    def per_layer(self, symbol: str) -> int:
        """A size read layer by layer (`each`): the one value its layers share (those of `over`, else all); 0 where the
        model has no such layer. Values that differ within those layers are an error: exact or nothing."""
        s = self.recipe.symbols[symbol]
        rule = self.recipe.per_layer_symbols[symbol]
        layers = self.get("N")
        mask = self.mask(s.over) if s.over else Uniform(True, layers)
        if not mask.count(True):
            return 0
        values = rule.layers_values(self.read, layers)
        found = {0: values.value} if isinstance(values, Uniform) else {i: v for i, v in enumerate(values) if mask[i]}
        key = next((k for k in rule.reads if k != "i"), symbol)
        first = next(iter(found))
        for i, v in found.items():
            _check(self.recipe, symbol, f"{key} (layer {i})", v)
            if v != found[first]:
                kind = f"the {s.over} layers" if s.over else "the layers"
                raise SymparamError(f"{key}: {symbol} is {found[first]} at layer {first} but {v} at layer {i}, within {kind}; symparam needs one value per layer kind")
        return found[first]

    def _default(self, symbol: str, required: bool) -> int | None:
        s = self.recipe.symbols[symbol]
        formula = parse(s.fallback, known=make)
        inputs = sorted(str(x) for x in formula.free_symbols)
        got = {name: self.get(name, required) for name in inputs}
        if any(v is None for v in got.values()):
            return None
        result = formula.xreplace({make(n): sp.Integer(v) for n, v in got.items()})
        if not result.is_Integer or result < (0 if s.zero else 1):
            parts = ", ".join(f"{n}={v}" for n, v in got.items())
            if not required:
                return None
            raise SymparamError(f"{' or '.join(s.keys) or symbol}: not set, and its default {s.fallback} is {result} for {parts}, not a {'non-negative' if s.zero else 'positive'} whole number")
        return int(result)


def _check(recipe: Recipe, symbol: str, field: str, value: Any) -> int:
    s = recipe.symbols[symbol]
    low = 0 if s.zero else 1
    if type(value) is not int or value < low:
        kind = "a non-negative" if low == 0 else "a positive"
        raise SymparamError(f"{field}: expected {kind} integer ({s.meaning}), got {value!r}")
    return value


def _check_lists(recipe: Recipe, config: dict[str, Any], values: dict[str, int]) -> None:
    """Per-layer lists (layer_types, ...): one entry per layer, each a kind the family knows."""
    read = lookup_in(config)
    for key, spec in recipe.lists.items():
        given = read(key)
        if given is None:
            continue
        if not isinstance(given, list):
            raise SymparamError(f"{key}: expected a list, got {json.dumps(given)}")
        length = parse(spec["length"], known=make).xreplace(as_subs(values))
        if length.is_Integer and len(given) != int(length):
            raise SymparamError(f"{key}: has {len(given)} entries, expected {spec['length']} = {length}")
        for i, kind in enumerate(given):
            if spec["values"] is not None and kind not in spec["values"]:
                raise SymparamError(f"{key}: unknown kind {kind!r} at layer {i}; known: {', '.join(spec['values'])}")


def _one_variant_per_layer(recipe: Recipe, values: Values) -> None:
    """A layer has at most one variant of each slot (a layer both dense and MoE is a rule error)."""
    for slot in recipe.variant_slots():
        masks = {name: values.mask(name) for name in slot if name in values.known}
        if all(isinstance(m, Uniform) for m in masks.values()):  # the same for every layer: look at one
            masks = {name: [m.value] for name, m in masks.items()}
        for i in range(min(len(m) for m in masks.values()) if masks else 0):
            chosen = [name for name, mask in masks.items() if mask[i]]
            if len(chosen) > 1:
                raise SymparamError(f"layer {i}: selected by both {chosen[0]} and {chosen[1]} rules; a layer has one of them")


def _checks(recipe: Recipe, values: dict[str, int]) -> None:
    """The recipe's relations between values ("h % h_kv == 0"), where the config sets every value they read (a size
    read per layer of a kind the config has no layers of is 0 and no value: its checks do not apply)."""
    absent = {name for name, s in recipe.symbols.items() if s.each is not None and values.get(name) == 0}
    for text, message in recipe.checks.items():
        rule = compile_rule(text, f"{recipe.source}: [checks]")
        if set(rule.reads) <= set(values) - absent and not rule(values.get):
            raise SymparamError(message.format(**values))


def _whole_shapes(term: Term, values: dict[str, int], subs: dict[sp.Symbol, sp.Integer], path: str = "") -> None:
    """Every tensor dimension must be a whole number at these values (d*h_kv/h with h not dividing d is not)."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    for dim in term.shape:
        size = dim.xreplace(subs)
        if not size.is_Integer or size < 0:
            used = ", ".join(f"{s}={values[str(s)]}" for s in sorted(dim.free_symbols, key=str))
            raise SymparamError(f"{path}: its size {dim} is {size} at {used}, not a whole number")
    for child in term.children:
        _whole_shapes(child, values, subs, path)


def as_subs(values: Mapping[str, int]) -> dict[sp.Symbol, sp.Integer]:
    """Symbol values keyed by the SymPy symbols, ready for `.subs`."""
    return {make(name): sp.Integer(v) for name, v in values.items()}


__all__ = ["Resolved", "Source", "Values", "presets", "read_preset", "read_config", "loads", "resolve", "as_subs"]
