"""config.json (or a preset, or --set values) -> validated flags and exact integer symbol values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import sympy as sp

from symparam.components import Term
from symparam.errors import SymparamError
from symparam.recipes import REGISTRY, Recipe, truthy
from symparam.symbols import BY_NAME, SYMBOLS, parse

# Symbols that may be zero; every other dimension must be a positive integer.
MAY_BE_ZERO = {"N_dense", "n_s", "N_swa"}


@dataclass(frozen=True)
class Resolved:
    """A config read against a recipe: its switches, and an exact integer for each symbol it sets."""

    recipe: Recipe
    flags: dict[str, bool]  # "section.option" -> on/off, e.g. "lm_head.tied"
    values: dict[str, int]  # symbol name -> value, e.g. "d" -> 4096
    name: str  # preset name or file path, for titles


def presets() -> dict[str, Any]:
    """Preset name -> the packaged config.json file."""
    files = resources.files("symparam").joinpath("presets")
    return {p.name.removesuffix(".json"): p for p in sorted(files.iterdir(), key=lambda p: p.name) if p.name.endswith(".json")}


def read_preset(name: str) -> dict[str, Any]:
    table = presets()
    if name not in table:
        raise SymparamError(f"model: unknown preset {name!r}; known: {', '.join(table)}")
    return json.loads(table[name].read_text(encoding="utf-8"))


def read_config(path: str | Path) -> dict[str, Any]:
    """A config.json file as a dict; a missing, unreadable or malformed file is a one-line error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SymparamError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SymparamError(f"{path}: cannot read ({e.__class__.__name__})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise SymparamError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return data


def _reject_constant(name: str) -> None:
    raise SymparamError(f"config: {name} is not a number")


def resolve(raw: Any, recipe: Recipe | None = None, overrides: Mapping[str, int] | None = None, name: str = "") -> Resolved:
    """Flags and exact symbol values for `raw` (a config dict), read against its family's recipe."""
    if not isinstance(raw, dict):
        raise SymparamError(f"config: expected a JSON object, got {type(raw).__name__}")
    if recipe is None:
        recipe = REGISTRY.for_model_type(raw.get("model_type"))
    elif "model_type" in raw and raw["model_type"] not in recipe.model_types:
        raise SymparamError(f"model_type: {raw['model_type']!r} is not a {recipe.family} config (that recipe reads {', '.join(recipe.model_types)})")
    config = {**recipe.defaults, **raw}
    flags = {flag: truthy(config.get(key), key, recipe.defaults.get(key)) for flag, key in recipe.flag_keys().items()}
    tree = recipe.build(flags)
    needed = {str(s) for s in tree.expr.free_symbols | tree.active.free_symbols}
    if recipe.options["attention"]["kind"] == "mha":
        needed |= {"h", "h_d"}  # d x d attention: transformers still splits d into h heads of h_d
    values = _values(config, needed, dict(overrides or {}), recipe)
    _consistency(values, needed | set(overrides or {}))
    _whole_shapes(tree, values, as_subs(values))
    return Resolved(recipe, flags, values, name or str(raw.get("_name_or_path", recipe.family)))


def _values(config: dict[str, Any], needed: set[str], overrides: dict[str, int], recipe: Recipe) -> dict[str, int]:
    values: dict[str, int] = {}
    for symbol, value in overrides.items():
        values[symbol] = _check(symbol, f"--set {symbol}", value)
    for symbol in BY_NAME:
        if symbol in values:
            continue
        key = next((k for k in recipe.config_keys(symbol) if config.get(k) is not None), None)
        if key is not None:
            values[symbol] = _check(symbol, key, config[key])
    if "moe" in recipe.options and "N_dense" not in values:
        values["N_dense"] = _dense_layers(recipe.options["moe"]["layers"], config, values)
    if "N" in values and "N_swa" not in values:
        values["N_swa"] = _sliding_layers(recipe.options.get("cache", {}), config, values)
    for symbol in sorted(needed):
        if symbol not in values:
            values[symbol] = _fallback(symbol, values, recipe)
    return values


def _check(symbol: str, field: str, value: Any, meaning: str = "") -> int:
    low = 0 if symbol in MAY_BE_ZERO else 1
    if type(value) is not int or value < low:
        kind = "a non-negative" if low == 0 else "a positive"
        raise SymparamError(f"{field}: expected {kind} integer ({meaning or BY_NAME[symbol].meaning}), got {value!r}")
    return value


def _fallback(symbol: str, values: dict[str, int], recipe: Recipe) -> int:
    sym, keys = BY_NAME[symbol], recipe.config_keys(symbol)
    if sym.fallback is None:
        where = " or ".join(keys) if keys else symbol
        raise SymparamError(f"{where}: missing ({sym.meaning}); set it in the config or with --set {symbol}=...")
    formula = parse(sym.fallback)
    inputs = {str(s) for s in formula.free_symbols}
    for dep in sorted(inputs - set(values)):
        values[dep] = _fallback(dep, values, recipe)
    result = formula.subs({SYMBOLS[s]: values[s] for s in inputs})
    if not result.is_Integer:
        parts = ", ".join(f"{s}={values[s]}" for s in sorted(inputs))
        raise SymparamError(f"{' or '.join(keys)}: not set, and its default {sym.fallback} is not a whole number for {parts}")
    return int(result)


def _dense_layers(layout: str, config: dict[str, Any], values: dict[str, int]) -> int:
    """How many layers keep a dense FFN, by the family's layout rule."""
    layers = values.get("N")
    if layers is None:
        return 0
    if layout == "first_k_dense":
        return min(_check("N_dense", "first_k_dense_replace", config.get("first_k_dense_replace", 0)), layers)
    if layout == "sparse_step":
        step = _check("N", "decoder_sparse_step", config.get("decoder_sparse_step", 1), "every how many layers one is MoE")
        only = config.get("mlp_only_layers") or []  # null means none, as Qwen3MoeConfig reads it
        if not isinstance(only, list) or not all(type(i) is int for i in only):
            raise SymparamError(f"mlp_only_layers: expected a list of layer indices, got {only!r}")
        return sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)
    return 0


def _sliding_layers(rule: dict[str, Any], config: dict[str, Any], values: dict[str, int]) -> int:
    """How many layers attend within a sliding window: config.json's layer_types, else the recipe's rule."""
    kind, switch = rule.get("sliding", "none"), rule.get("window", True)
    on = truthy(config.get(switch), switch) if isinstance(switch, str) else switch
    if kind == "none" or not on or "W" not in values:
        return 0
    types = config.get("layer_types")
    if kind != "all" and isinstance(types, list):
        return min(sum(1 for t in types if t == "sliding_attention"), values["N"])
    first = {"all": 0, "alternate": 0, "above_max_window_layers": config.get("max_window_layers", 0)}[kind]
    step = 2 if kind == "alternate" else 1
    if type(first) is not int or first < 0:
        raise SymparamError(f"max_window_layers: expected a non-negative integer, got {first!r}")
    return len(range(first, values["N"], step))


def _consistency(values: dict[str, int], used: set[str]) -> None:
    """Relations between the values the model uses that transformers needs (some of which it does not check itself)."""
    if {"h", "h_kv"} <= used and values["h"] % values["h_kv"]:
        raise SymparamError(f"num_key_value_heads: {values['h_kv']} does not divide num_attention_heads {values['h']}")
    if {"n", "k"} <= used and values["k"] > values["n"]:
        raise SymparamError(f"num_experts_per_tok: {values['k']} is more than the {values['n']} experts")
    if {"N", "N_dense"} <= used and values["N_dense"] > values["N"]:
        raise SymparamError(f"N_dense: {values['N_dense']} dense layers is more than the {values['N']} layers")


def _whole_shapes(term: Term, values: dict[str, int], subs: dict[sp.Symbol, sp.Integer], path: str = "") -> None:
    """Every tensor dimension must be a whole number at these values (d*h_kv/h with h not dividing d is not)."""
    path = f"{path}.{term.key}" if path else term.key
    for dim in term.shape:
        size = dim.xreplace(subs)
        if not size.is_Integer:
            used = ", ".join(f"{s}={values[str(s)]}" for s in sorted(dim.free_symbols, key=str))
            raise SymparamError(f"{path}: its size {dim} is {size} at {used}, not a whole number")
    for child in term.children:
        _whole_shapes(child, values, subs, path)


def as_subs(values: Mapping[str, int]) -> dict[sp.Symbol, sp.Integer]:
    """Symbol values keyed by the SymPy symbols, ready for `.subs`."""
    return {SYMBOLS[name]: sp.Integer(v) for name, v in values.items()}
