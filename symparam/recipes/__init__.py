"""Architecture recipes: TOML files that compose the components, and the registry that refuses duplicates."""

from __future__ import annotations

import re
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import sympy as sp

from symparam import components as c
from symparam.errors import SymparamError
from symparam.symbols import BY_NAME, N, N_dense, parse

FLAG = "flag"  # an option that is true, false, or the name of a config key that says which
FORMULA = "formula"  # an option that is a formula over symbols, such as "n_s*d_moe"

# Every section a recipe may have, its options, their kinds or allowed values, and their defaults.
SCHEMA: dict[str, dict[str, tuple[Any, Any]]] = {
    "embedding": {"positions": (FLAG, False)},
    "attention": {
        "kind": (("gqa", "mha", "mla"), "gqa"),
        "qkv_bias": (FLAG, False),
        "o_bias": (FLAG, False),
        "qk_norm": (("none", "head", "full"), "none"),
        "sinks": (FLAG, False),
        "fused": (FLAG, False),
        "q_lora": (FLAG, False),
    },
    "ffn": {"kind": (("gated", "plain"), "gated"), "size": (FORMULA, "d_ff"), "bias": (FLAG, False), "fused": (FLAG, False)},
    "moe": {
        "layers": (("all", "first_k_dense", "sparse_step"), "all"),
        "kind": (("gated", "plain"), "gated"),
        "size": (FORMULA, "d_moe"),
        "bias": (FLAG, False),
        "router_bias": (FLAG, False),
        "shared": (FORMULA, None),
        "shared_bias": (FLAG, False),  # shared experts are dense MLPs: DeepSeek-V2 gives them mlp_bias, routed experts none
    },
    "norm": {"kind": (("rms", "layer"), "rms"), "per_layer": (int, 2), "final": (FLAG, True)},
    "lm_head": {"tied": (FLAG, False)},
    # Which layers attend within a sliding window W (KV cache and FLOPs), when config.json has no layer_types:
    # none; all (every layer, once sliding_window is set); alternate (layers 0, 2, 4, ...);
    # above_max_window_layers (layers i >= max_window_layers). `window` says whether the window is on at all.
    "cache": {"sliding": (("none", "all", "alternate", "above_max_window_layers"), "none"), "window": (FLAG, True)},
}
TOP_LEVEL = {"family", "title", "model_types", "summary", "defaults", "keys", "names"}
# [names] tables: how checkpoints name this family's tensors, as regex -> replacement (verify.py reads them).
NAME_TABLES = ("rename", "not_parameters")


@dataclass(frozen=True)
class Recipe:
    """One architecture family: its options per section and the library defaults its configs omit."""

    family: str  # canonical name, e.g. "qwen3_moe"
    title: str  # human name, e.g. "Qwen3-MoE"
    model_types: tuple[str, ...]  # config.json model_type values it reads
    summary: str  # one line on what sets the family apart
    options: dict[str, dict[str, Any]]  # section -> option -> value (literal, config key, or formula)
    defaults: dict[str, Any] = field(default_factory=dict)  # config key -> transformers' default
    source: str = ""  # where the recipe was read from
    names: dict[str, dict[str, str]] = field(default_factory=dict)  # [names.rename] / [names.not_parameters]: regex -> text
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # symbol -> the config keys this family reads it from

    def config_keys(self, symbol: str) -> tuple[str, ...]:
        """The config keys a symbol is read from: the family's own list, else the symbol table's."""
        return self.keys.get(symbol, BY_NAME[symbol].keys)

    def flag_keys(self) -> dict[str, str]:
        """Config keys the recipe's flags read, as "section.option" -> key."""
        return {
            f"{sec}.{opt}": val
            for sec, opts in self.options.items()
            for opt, val in opts.items()
            if SCHEMA[sec][opt][0] == FLAG and isinstance(val, str)
        }

    def default_flags(self) -> dict[str, bool]:
        """Flags as the library defaults set them."""
        return {name: truthy(self.defaults.get(key), key, self.defaults.get(key)) for name, key in self.flag_keys().items()}

    @property
    def has_moe(self) -> bool:
        return "moe" in self.options

    @property
    def has_dense(self) -> bool:
        return not self.has_moe or self.options["moe"]["layers"] != "all"

    def resolved(self, flags: dict[str, bool] | None = None) -> dict[str, dict[str, Any]]:
        """Every option with its flag resolved (defaults where `flags` is silent) and formulas parsed."""
        flags = {**self.default_flags(), **(flags or {})}

        def opt(section: str, name: str, value: Any) -> Any:
            kind = SCHEMA[section][name][0]
            if kind == FLAG and isinstance(value, str):
                return flags[f"{section}.{name}"]
            if kind == FORMULA and value is not None:
                return parse(value)
            return value

        return {sec: {name: opt(sec, name, value) for name, value in opts.items()} for sec, opts in self.options.items()}

    def layer_groups(self) -> list[tuple[str, sp.Expr]]:
        """The decoder layer kinds, ("dense", count) and/or ("moe", count), in order: dense layers come first."""
        if self.has_dense and self.has_moe:
            return [("dense", N_dense), ("moe", N - N_dense)]
        return [("moe" if self.has_moe else "dense", N)]

    def build(self, flags: dict[str, bool] | None = None) -> c.Term:
        """The model tree with every flag resolved (defaults where `flags` is silent)."""
        opts = self.resolved(flags)
        norms = opts["norm"]
        attention = c.attention(**opts["attention"])
        layers = []
        for kind, count in self.layer_groups():
            if kind == "dense":
                layers.append(c.decoder_layers("layers", "dense decoder layer", count, norms["kind"], norms["per_layer"], attention, c.ffn(**opts["ffn"])))
            else:
                experts = {name: value for name, value in opts["moe"].items() if name != "layers"}
                layers.append(c.decoder_layers("layers", "MoE decoder layer", count, norms["kind"], norms["per_layer"], attention, c.moe(**experts)))
        final = norms["kind"] if norms["final"] else None
        return c.group("model", self.title, [*c.embedding(opts["embedding"]["positions"]), *layers, *c.head(opts["lm_head"]["tied"], final)])


def truthy(value: Any, key: str, default: Any = None) -> bool:
    """A config value that switches a part on or off: a bool (where the default is one), else also null or a size."""
    if isinstance(default, bool) and not isinstance(value, bool):
        raise SymparamError(f"{key}: expected true or false, got {json.dumps(value)}")
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value > 0:
        return True
    raise SymparamError(f"{key}: expected true, false, null or a positive integer, got {value!r}")


def parse_recipe(data: dict[str, Any], source: str) -> Recipe:
    """A validated Recipe from a parsed TOML table; every unknown name is an error naming it."""
    unknown = set(data) - TOP_LEVEL - set(SCHEMA)
    if unknown:
        raise SymparamError(f"{source}: unknown section {sorted(unknown)[0]!r}; known: {', '.join(sorted(TOP_LEVEL | set(SCHEMA)))}")
    for required in ("family", "model_types"):
        if required not in data:
            raise SymparamError(f"{source}: missing {required!r}")
    options = {}
    for sec, schema in SCHEMA.items():
        if sec == "moe" and sec not in data:
            continue
        given = data.get(sec, {})
        if not isinstance(given, dict):
            raise SymparamError(f"{source}: [{sec}] must be a table")
        for name in set(given) - set(schema):
            raise SymparamError(f"{source}: [{sec}] unknown option {name!r}; known: {', '.join(schema)}")
        options[sec] = {name: _check_option(source, sec, name, given.get(name, default), kind) for name, (kind, default) in schema.items()}
    types = data["model_types"]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise SymparamError(f"{source}: model_types must be a list of strings")
    return Recipe(
        family=str(data["family"]),
        title=str(data.get("title", data["family"])),
        model_types=tuple(types),
        summary=str(data.get("summary", "")),
        options=options,
        defaults=dict(data.get("defaults", {})),
        source=source,
        names=_check_names(source, data.get("names", {})),
        keys=_check_keys(source, data.get("keys", {})),
    )


def _check_keys(source: str, keys: Any) -> dict[str, tuple[str, ...]]:
    """[keys]: symbol -> list of config keys, for a family that reads a symbol from other keys than usual."""
    if not isinstance(keys, dict):
        raise SymparamError(f"{source}: [keys] must be a table")
    for name, given in keys.items():
        if name not in BY_NAME:
            raise SymparamError(f"{source}: [keys] unknown symbol {name!r}")
        if not isinstance(given, list) or not all(isinstance(k, str) for k in given):
            raise SymparamError(f"{source}: [keys] {name} must be a list of config keys")
    return {name: tuple(given) for name, given in keys.items()}


def _check_names(source: str, names: Any) -> dict[str, dict[str, str]]:
    """[names]: tables of regex -> text; every regex must compile."""
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


def _check_option(source: str, section: str, name: str, value: Any, kind: Any) -> Any:
    where = f"{source}: [{section}] {name}"
    if kind == FLAG and not isinstance(value, (bool, str)):
        raise SymparamError(f"{where}: expected true, false or a config key, got {value!r}")
    if kind == FORMULA and value is not None:
        if not isinstance(value, str):
            raise SymparamError(f"{where}: expected a formula such as \"d_ff\", got {value!r}")
        try:
            parse(value)
        except SymparamError as e:
            raise SymparamError(f"{where}: {e}") from None
    if kind is int and (type(value) is not int or value < 0):
        raise SymparamError(f"{where}: expected a non-negative integer, got {value!r}")
    if isinstance(kind, tuple) and value not in kind:
        raise SymparamError(f"{where}: expected one of {', '.join(kind)}, got {value!r}")
    return value


def load_recipe(path: str | Path) -> Recipe:
    """A recipe from a TOML file a user wrote."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SymparamError(f"{path}: no such recipe file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SymparamError(f"{path}: not valid TOML ({e})") from None
    return parse_recipe(data, str(path))


class Registry:
    """Recipes by family name and by model_type; registering a name twice is an error."""

    def __init__(self) -> None:
        self._by_family: dict[str, Recipe] = {}
        self._by_type: dict[str, Recipe] = {}

    def add(self, recipe: Recipe) -> None:
        for table, names in ((self._by_family, [recipe.family]), (self._by_type, recipe.model_types)):
            for name in names:
                if name in table:
                    raise SymparamError(f"{recipe.source}: {name!r} is already defined by {table[name].source}")
                table[name] = recipe

    def family(self, name: str) -> Recipe:
        """The recipe for an arch name; `qwen3-moe` and `qwen3_moe` are the same name."""
        key = name.replace("-", "_")
        if key not in self._by_family:
            raise SymparamError(f"arch: unknown {name!r}; known: {', '.join(self._by_family)}")
        return self._by_family[key]

    def for_model_type(self, model_type: Any) -> Recipe:
        if not isinstance(model_type, str) or model_type not in self._by_type:
            raise SymparamError(f"model_type: unsupported {model_type!r}; supported: {', '.join(self._by_type)}")
        return self._by_type[model_type]

    def __iter__(self):
        return iter(self._by_family.values())


def builtin() -> Registry:
    """The registry of the recipes shipped in this package."""
    registry = Registry()
    for item in sorted(resources.files(__package__).iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            registry.add(parse_recipe(tomllib.loads(item.read_text(encoding="utf-8")), f"recipes/{item.name}"))
    return registry


REGISTRY = builtin()

__all__ = ["Recipe", "Registry", "REGISTRY", "load_recipe", "parse_recipe", "truthy", "SCHEMA"]
