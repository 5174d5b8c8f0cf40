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
from symparam.files import loads, read_text, shown
from symparam.recipes import REGISTRY, Recipe, Wrapper, scope, wrapper
from symparam.rules import Uniform, compile_rule, lookup_in, message_text
from symparam.symbols import MAX_VALUE, make, parse

MAX_CONFIG = 16 * 2**20  # bytes of a config.json read at most (published ones are under 100 kB)

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
    unknown: dict[str, str] = field(default_factory=dict)  # symbols only `active` needs that the config does not set -> their keys


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
    """A config.json file as a dict; a missing, unreadable, oversized or malformed file is a one-line error."""
    raw = loads(read_text(path, MAX_CONFIG, "config.json"), shown(path))  # a BOM is dropped: transformers reads one too
    if not isinstance(raw, dict):
        raise SymparamError(f"{shown(path)}: expected a JSON object, got {type(raw).__name__}")
    return raw


Note = tuple[str, dict[str, str]]  # a phrase of templates/<lang>.toml and its fields: how a config was read


def unwrap(raw: dict[str, Any], recipe: Recipe | None) -> tuple[dict[str, Any], Recipe, tuple[Note, ...], dict[str, Any], bool | None]:
    """The language-model config and its recipe, how it was read, its scope, and whether a wrapper ties its head (None:
    the language model's own flag decides): a config of a family's own type; a multimodal wrapper, read by structure (its
    language model under text_config or a legacy key, recipes/_wrappers.toml); a family found by class name."""
    if not isinstance(raw, dict):
        raise SymparamError(f"config: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in (recipe.model_types if recipe is not None else REGISTRY.by_type):
        return raw, recipe or REGISTRY.for_model_type(model_type), (), {}, None
    spec = wrapper(model_type)
    key = next((k for k in spec.keys if k in raw), None)
    if isinstance(model_type, str) and (spec.known or key is not None):
        return _language_model(raw, spec, key, recipe)
    if recipe is not None:
        if "model_type" in raw:
            raise SymparamError(f"model_type: {model_type!r} is not a {recipe.family} config (that recipe reads {', '.join(recipe.model_types)}); --as {recipe.family} reads it as one")
        return raw, recipe, (), {}, None
    by_class = REGISTRY.for_class(raw.get("architectures"))
    if by_class is not None:
        return raw, by_class, (_by_class(by_class, raw),), {}, None
    raise unsupported(model_type, raw, "model_type")


def _by_class(recipe: Recipe, config: dict[str, Any]) -> Note:
    """The note for a config read as a family because its architectures names that family's class."""
    cls = next(a for a in config["architectures"] if a in recipe.architectures)
    fields = {"family": recipe.family, "cls": cls, "model_type": str(config.get("model_type"))}
    return ("note_unknown_type" if config.get("model_type") is not None else "note_no_type", fields)


def _language_model(raw: dict[str, Any], spec: Wrapper, key: str | None, recipe: Recipe | None) -> tuple[dict[str, Any], Recipe, tuple[Note, ...], dict[str, Any], bool | None]:
    """A multimodal wrapper's language model, with the wrapper's keys applied as transformers applies them."""
    model_type = raw["model_type"]
    if spec.reason:
        raise SymparamError(f"model_type: a {model_type} config is not counted: {spec.reason}")
    text = raw.get(key) if key else None
    where = key or spec.keys[0]
    if text is None and spec.flat:  # published configs that keep the language model's keys at the top level
        text = {k: v for k, v in raw.items() if k != "model_type" and not k.endswith("_config") and (spec.flat is True or k in spec.flat)}
        where = "its top-level keys"
    of = f" ({spec.text})" if spec.text else ""
    if text is None:
        raise SymparamError(f"{where}: missing; a {model_type} config keeps its language model{of} there")
    if not isinstance(text, dict):
        raise SymparamError(f"{where}: expected an object, the config of a {model_type} config's language model{of}; got {_shown(text)}")
    if not text:
        raise SymparamError(f"{where}: empty; a {model_type} config keeps the config of its language model{of} there")
    text = {**spec.text_defaults, **text}
    text_type = text.get("model_type", spec.text)
    text_type = spec.rename.get(text_type, text_type) if isinstance(text_type, str) else text_type
    notes: tuple[Note, ...] = (("note_wrapper", {"wrapper": model_type, "key": where}),)
    if recipe is None and isinstance(text_type, str) and text_type in REGISTRY.by_type:
        recipe = REGISTRY.for_model_type(text_type)
    elif recipe is None:
        recipe = REGISTRY.for_class(text.get("architectures"))
        if recipe is None:
            raise unsupported(text_type, text, f"{where}.model_type")
        notes += (_by_class(recipe, text),)
    elif text_type is not None and text_type not in recipe.model_types:
        raise SymparamError(f"{where}.model_type: {text_type!r} is not a {recipe.family} config (that recipe reads {', '.join(recipe.model_types)}); --as {recipe.family} reads it as one")
    inner = {**text, "model_type": text_type if isinstance(text_type, str) else recipe.model_types[0]}
    return inner, recipe, notes, {"scope": "language model", "wrapper": model_type}, _wrapper_tie(raw, spec, key, {**recipe.defaults, **inner})


def _wrapper_tie(raw: dict[str, Any], spec: Wrapper, key: str | None, text: dict[str, Any]) -> bool | None:
    """Whether the wrapper ties its own LM head, by its rule over its own keys (text_config.<key> reads the language
    model's config); None where the head is the language model's own (Blip-2's OPTForCausalLM ties it by its config)."""
    if spec.head == "language model":
        return None
    for name in spec.tie.reads:
        if name != "text_config" and raw.get(name) is not None and not isinstance(raw[name], bool):
            raise SymparamError(f"{name}: expected true or false, got {_shown(raw[name])}")
    own = {**spec.defaults, **{k: v for k, v in raw.items() if k != key and v is not None}}
    tied = bool(spec.tie(lookup_in({**own, "text_config": text})))
    for name in spec.head_keys if not tied else ():  # a head of its own size: transformers sizes it by the wrapper's keys
        if own.get(name) != text.get(name):
            raise SymparamError(f"{name}: this {raw['model_type']} config sizes its untied LM head by its own {name} ({_shown(own.get(name))}) and its "
                                f"language model by text_config's ({_shown(text.get(name))}); symparam counts a head the size of the embedding")
    return tied


def _shown(value: Any) -> str:
    """A config value as JSON, cut short for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_as(raw: Any, recipe: Recipe) -> tuple[Any, Note]:
    """`--as FAMILY`: the config with its language model's model_type (a wrapper's text_config's, else its own) set to
    the family's, and the note that says so."""
    if not isinstance(raw, dict):
        return raw, ("note_read_as", {"family": recipe.family, "model_type": "None"})  # resolve refuses it
    model_type = raw.get("model_type")
    spec = wrapper(model_type)
    key = next((k for k in spec.keys if k in raw), None) if isinstance(model_type, str) and model_type not in REGISTRY.by_type else None
    if (key is not None or spec.known) and not isinstance(raw.get(key or ""), dict):  # a wrapper without its language model
        return raw, ("note_read_as", {"family": recipe.family, "model_type": str(model_type)})  # (flat, or resolve says what is missing)
    inner = raw[key] if key else raw
    note = ("note_read_as", {"family": recipe.family, "model_type": str(inner.get("model_type"))})
    given = {**inner, "model_type": recipe.model_types[0]}
    return ({**raw, key: given} if key else given), note


def unsupported(model_type: Any, config: dict[str, Any], where: str) -> SymparamError:
    """The error for a model_type no recipe reads: its reason where it is out of scope, else the nearest families (by
    architectures and config keys) and how to count it anyway."""
    reason = scope()["types"].get(model_type) if isinstance(model_type, str) else None
    if reason is not None:
        return SymparamError(f"{where}: {model_type!r} is out of scope: {scope()['reasons'][reason]}")
    nearest = ", ".join(nearest_families(config))
    return SymparamError(f"{where}: unsupported {model_type!r}; nearest families by architectures and keys: {nearest}; to count it anyway, "
                         f"read it as one of them with --as FAMILY, or describe it in a recipe of your own with --recipe FILE")


def nearest_families(config: dict[str, Any], count: int = 3) -> list[str]:
    """The families closest to a config: the similarity of its architectures and model_type to theirs, plus the share
    of config keys the family reads that the config sets (keys no family reads do not count)."""
    import difflib

    def stem(name: Any) -> str:
        text = str(name).lower()
        for suffix in ("forcausallm", "forconditionalgeneration", "lmheadmodel", "model"):
            text = text.removesuffix(suffix)
        return "".join(ch for ch in text if ch.isalnum())

    recipes = list(REGISTRY)
    reads = {r.family: _keys_read(r) for r in recipes}
    known = set().union(*reads.values())
    given = {k for k in config if k in known}
    mine = [stem(a) for a in config.get("architectures") or [] if isinstance(a, str)] + [stem(config.get("model_type"))]

    def alike(a: str, b: str) -> float:  # a family's name inside the config's (MyLlama holds llama) counts as the same
        return 1.0 if a and b and (a in b or b in a) else difflib.SequenceMatcher(None, a, b).ratio()

    def score(r: Recipe) -> float:
        names = [stem(a) for a in r.architectures] + [stem(t) for t in r.model_types]
        similar = max(alike(a, b) for a in mine for b in names if a) if any(mine) else 0.0
        union = given | reads[r.family]
        return similar + (len(given & reads[r.family]) / len(union) if union else 0.0)

    return [r.family for r in sorted(recipes, key=lambda r: (-score(r), r.family))[:count]]


def _keys_read(recipe: Recipe) -> set[str]:
    """The top-level config keys a family reads: its symbols' keys, defaults, switches, per-layer rules and lists."""
    found = set(recipe.defaults) | set(recipe.lists) | {k for s in recipe.symbols.values() for k in s.keys}
    for rule in (*recipe.switches.values(), *recipe.layer_symbols.values(), *recipe.per_layer_symbols.values()):
        found |= set(rule.reads) - {"i"}
    return {k.split(".")[0] for k in found}


def resolve(raw: Any, recipe: Recipe | None = None, overrides: Mapping[str, int] | None = None, name: str = "", source: Source | None = None) -> Resolved:
    """Switches and exact symbol values for `raw` (a config dict), read against its family's recipe; `source` says where it came from."""
    outer = raw
    raw, recipe, notes, scope, tied = unwrap(raw, recipe)
    notes = ((source.note,) if source is not None and source.note else ()) + notes
    config = legacy_kinds(recipe, {**recipe.defaults, **raw})
    flags = recipe.switch_values(config)
    if tied is not None:  # a wrapper's own head, tied by the wrapper's rule whatever the language model's flag says
        flags["tied"] = tied
    tree = recipe.build(flags)
    needed = {str(s) for s in tree_symbols(tree, active=False)}
    for_active = {str(s) for s in tree_symbols(tree)} - needed  # k: what one token visits, not what the model holds
    overrides = dict(overrides or {})
    for symbol in overrides:
        if symbol not in recipe.symbols:
            raise SymparamError(f"--set {symbol}: unknown symbol for {recipe.family}; known: {', '.join(recipe.symbols)}")
    values = Values(recipe, config, overrides)
    _check_lists(recipe, config, values, set(raw))  # before any layer rule indexes them
    for symbol in sorted(needed):
        values.get(symbol)
    unknown = {symbol: " or ".join(recipe.symbols[symbol].keys) or symbol for symbol in sorted(for_active) if values.get(symbol, required=False) is None}
    if unknown:
        notes += (("note_active_unknown", {"keys": ", ".join(unknown.values()), "symbols": ", ".join(unknown)}),)
    for symbol in _optional(recipe, tree):
        values.maybe(symbol)
    _layer_counts(recipe, values, overrides)
    _one_variant_per_layer(recipe, values)
    _checks(recipe, values.known)
    _whole_shapes(tree, values.known, as_subs(values.known))
    return Resolved(recipe, flags, values.known, name or str(raw.get("_name_or_path", recipe.family)), notes, scope, source,
                    quantization(outer, raw), stored_dtype(outer, raw), config, unknown)


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


def tree_symbols(tree: Term, active: bool = True) -> set[sp.Symbol]:
    """Every symbol a tree's shapes and copies use, tied tensors and buffers included (Zamba's reuse count is only in
    tied copies; a layer count whose kinds cancel in the total still sizes its tensors); with `active` false, only
    those the model's tensors need, not the copies one token visits (k)."""
    from symparam.components import walk

    found: set[sp.Symbol] = set()
    for node, *_ in walk(tree):
        for e in (*node.shape, node.times, *((node.active_times,) if active else ())):
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
        elif s.routing is not None:  # a routing statistic: the value its rule gives over the other symbols
            rule = compile_rule(s.routing, f"{self.recipe.source}: [symbols] {symbol}.routing")
            value = _check(self.recipe, symbol, f"{symbol} ({s.routing})", rule(lambda name: self.get(name) if name in self.recipe.symbols else self.read(name)))
        else:
            key = next((k for k in s.keys if self.read(k) is not None), None)
            listed = self.listed_length(symbol)
            if key is not None:
                value = _check(self.recipe, symbol, key, self.read(key))
            elif listed is not None:
                value = listed
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

    def listed_length(self, symbol: str) -> int | None:
        """The length of the first per-layer list the config gives whose length sets `symbol` ([lists] sets = true:
        Nemotron-H's layers_block_type, as transformers derives num_hidden_layers from it); None if it gives none."""
        given = (self.read(key) for key, spec in self.recipe.lists.items() if spec["sets"] and spec["length"] == symbol)
        return next((len(v) for v in given if isinstance(v, (list, str)) and v), None)

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
        model has no such layer. Values that differ within those layers are an error: exact or nothing. A summed one
        (`sum = true`) is the sum of its values over those layers, which may differ (a size that grows layer by layer)."""
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
        if s.summed:
            return _check(self.recipe, symbol, key, found[0] * mask.count(True) if isinstance(values, Uniform) else sum(found.values()))
        for i, v in found.items():
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
    """A value for `symbol`: an integer from its least (0 or 1) to MAX_VALUE (PyTorch's int64 sizes)."""
    s = recipe.symbols[symbol]
    low = 0 if s.zero else 1
    if type(value) is not int or not low <= value <= MAX_VALUE:
        kind = "a non-negative" if low == 0 else "a positive"
        limit = f" of at most {MAX_VALUE:,}" if type(value) is int and value > MAX_VALUE else ""
        raise SymparamError(f"{field}: expected {kind} integer{limit} ({s.meaning}), got {shown(repr(value))}")
    return value


def _layer_counts(recipe: Recipe, values: Values, overrides: Mapping[str, int]) -> None:
    """A layer-count symbol set with --set counts at most the N layers it divides (a rule never counts more)."""
    for name in sorted(set(overrides) & set(recipe.layer_symbols)):
        layers = values.get("N")
        if overrides[name] > layers:
            raise SymparamError(f"--set {name}={overrides[name]}: more than the N = {layers} layers ({recipe.symbols[name].meaning} are some of them)")


def legacy_kinds(recipe: Recipe, config: dict[str, Any]) -> dict[str, Any]:
    """The config with the legacy kind names of its per-layer lists read as transformers reads them ([lists] aliases:
    Nemotron-H's "mamba" is "linear_attention")."""
    out = dict(config)
    for key, spec in recipe.lists.items():
        if spec["aliases"] and isinstance(out.get(key), list):
            out[key] = [spec["aliases"].get(kind, kind) if isinstance(kind, str) else kind for kind in out[key]]
    return out


def _check_lists(recipe: Recipe, config: dict[str, Any], values: Values, given: set[str]) -> None:
    """Per-layer lists (layer_types, ...): one entry per layer, each a kind the family knows; a list of one-character
    kinds may be a string (Nemotron-H's hybrid_override_pattern "M-M*"). Of the lists that set one symbol, transformers
    reads the first the config gives and ignores the rest (layers_block_type before hybrid_override_pattern)."""
    read = lookup_in(config)
    chosen: set[str] = set()
    for key, spec in recipe.lists.items():
        entries = read(key)
        if entries is None or spec["sets"] and spec["length"] in chosen:
            continue
        if spec["sets"]:
            chosen.add(spec["length"])
        letters = spec["values"] is not None and all(len(v) == 1 for v in spec["values"])
        if not isinstance(entries, list) and not (letters and isinstance(entries, str)):
            raise SymparamError(f"{key}: expected a list{' or a string' if letters else ''}, got {shown(json.dumps(entries))}")
        formula = parse(spec["length"], known=make)
        length = formula.xreplace(as_subs({str(x): values.get(str(x)) for x in formula.free_symbols}))
        if length.is_Integer and len(entries) != int(length):
            symbol = recipe.symbols.get(spec["length"])
            said = next((k for k in symbol.keys if read(k) is not None), None) if symbol else None
            where = f" ({said} = {length})" if said else f" = {length}"
            default = "" if key.split(".")[0] in given else " (transformers' default, the config gives none)"
            raise SymparamError(f"{key}: has {len(entries)} entries{default}, expected {spec['length']}{where}")
        for i, kind in enumerate(entries):
            if spec["values"] is not None and kind not in spec["values"]:
                legacy = f" (and the legacy {', '.join(spec['aliases'])})" if spec["aliases"] else ""
                raise SymparamError(f"{key}: unknown kind {kind!r} at layer {i}; known: {', '.join(spec['values'])}{legacy}")


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
            raise SymparamError(message_text(message, values))


def _whole_shapes(term: Term, values: dict[str, int], subs: dict[sp.Symbol, sp.Integer], path: str = "") -> None:
    """Every tensor dimension must be a whole number at these values (d*h_kv/h with h not dividing d is not), and every
    count of copies (N - N_dense layers, k of n experts) one that is not negative."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    copies = [times for times in {term.times, term.active_times} if times.free_symbols and {str(x) for x in times.free_symbols} <= set(values)]  # k may be unset
    sizes = [(dim, "its size") for dim in term.shape] + [(times, "its copies") for times in copies]
    for dim, what in sizes:
        size = dim.xreplace(subs)
        if not size.is_Integer or size < 0:
            used = ", ".join(f"{s}={values[str(s)]}" for s in sorted(dim.free_symbols, key=str))
            raise SymparamError(f"{path or 'model'}: {what} {dim} is {shown(str(size))} at {used}, not a whole number")
    for child in term.children:
        _whole_shapes(child, values, subs, path)


def as_subs(values: Mapping[str, int]) -> dict[sp.Symbol, sp.Integer]:
    """Symbol values keyed by the SymPy symbols, ready for `.subs`."""
    return {make(name): sp.Integer(v) for name, v in values.items()}


__all__ = ["Resolved", "Source", "Values", "presets", "read_preset", "read_config", "loads", "resolve", "as_subs"]
