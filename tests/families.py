r"""Every family under test: its oracle configs (library default, or a fixed config where the default does not build)
and a random small config generator driven by the recipe's own data (symbols, switches, layer rules, lists).

A family may add hints in tests/families/<family>.toml, each optional:
    model_type = "qwen3_5_text"      # the type to test (default: the recipe's first model_type)
    [default]   key = value          # merged over the library default config (what transformers needs to build it)
    [fixed]     key = value          # set in every random config
    [choices]   key = [a, b, ...]    # random configs draw this key from the list
    [ranges]    key = [low, high]    # random configs draw this integer key from the range
    [tiny]      key = value          # merged over the tiny config test_features runs for real (see tiny_config)
    [features]  cache = "why"        # test_features: symparam's cache differs from transformers' by definition
                matmul = "why"       # ... and its matmul weights per token (a weight applied once per head, ...)
                shapes = "why"       # ... and the activation sizes it traces (a module run c times traced as one tensor)
    [assume]    "rule" = "why"       # random configs must satisfy these rules over the config (relations transformers does not check)
    [multiples] hidden_size = 8      # random configs scale these drawn sizes by this (kernels that need aligned rows)
    [follow]    head_dim = "qk_rope_head_dim"  # random configs copy the other key's value (or a rule's over the config:
                                     # "2 * hidden_size") into this one (what the library's config derives and a saved
                                     # config.json carries: DeepSeek's head_dim)
    [symbolic]  idle = "formula"     # parameters no token ever uses (what active leaves out even when k = n)
    [points]    chunks = [[1, 130]]  # test_activations: more (B, S) for the library-default config, past what a fixed
                                     # length makes regimes of (a CPU rule scanning whole chunks of 64 tokens)
    [oracle]    routed = "regex"     # which tensors are routed experts (default \.experts\.); experts / per_token: n and k keys
Multimodal wrappers have their hints in tests/wrappers.toml.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from symparam.recipes import REGISTRY, Recipe
from symparam.rules import compile_rule, lookup_in

HINTS = Path(__file__).parent / "families"
NO_SPECIAL_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # small V: ids out of range
CORE = {"N", "V", "d", "h", "h_kv", "h_d", "n", "k"}  # drawn together, as they constrain each other


@functools.cache
def hints(family: str) -> dict[str, Any]:
    path = HINTS / f"{family}.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def model_type(recipe: Recipe) -> str:
    return hints(recipe.family).get("model_type", recipe.model_types[0])


@functools.cache
def default_config(family: str) -> dict[str, Any]:
    """The library-default config of a family as config.json would hold it, plus its hints' [default]."""
    recipe = REGISTRY.family(family)
    if family == "classic":
        return {"model_type": "classic", "vocab_size": 32000, "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                "learned_positions": False, "final_norm": False, "tie_word_embeddings": False, "max_position_embeddings": 64}
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type(recipe)).to_dict()
    return set_keys(config, hints(family).get("default", {}))


def set_keys(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`config` with dotted keys set ("linear_attn_config.num_heads")."""
    out = dict(config)
    for key, value in values.items():
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node[p] = dict(node.get(p) or {})
            node = node[p]
        node[last] = value
    return out


def first_key(recipe: Recipe, symbol: str, config: dict[str, Any]) -> str | None:
    """The config key a symbol is read from: the first of its keys the default config holds, else its first key."""
    keys = recipe.symbols[symbol].keys
    read = lookup_in(config)
    return next((k for k in keys if read(k) is not None), keys[0] if keys else None)


TINY = {"V": 64, "d": 32, "h": 4, "h_kv": 2, "h_d": 8, "d_ff": 48, "d_moe": 16, "n": 4, "k": 2}  # sizes a CPU runs at once
TINY_LAYERS = 6  # enough for the layouts of real families (five sliding layers then a full one, three dense then MoE)
TINY_WINDOW = 16  # more than the tokens test_features runs, so no layer drops one


@functools.cache
def tiny_config(family: str) -> dict[str, Any]:
    """The library default shrunk to run on CPU at once: core sizes small, at most TINY_LAYERS layers (per-layer lists
    cut to match), windows wider than the test's tokens; then the family's [tiny] hints."""
    recipe = REGISTRY.family(family)
    base = default_config(family)
    read = lookup_in(base)
    values: dict[str, Any] = {}
    for symbol, size in TINY.items():
        key = first_key(recipe, symbol, base)
        if key is not None and type(read(key)) is int:
            values[key] = size
    h, h_kv = (first_key(recipe, s, base) for s in ("h", "h_kv"))
    if h and h_kv and read(h_kv) is not None and read(h_kv) == read(h):
        values[h_kv] = TINY["h"]  # multi-head attention stays multi-head
    n_key = first_key(recipe, "N", base) or "num_hidden_layers"
    layers = read(n_key)
    if type(layers) is int:
        values[n_key] = min(layers, TINY_LAYERS)
        for key, value in base.items():
            if isinstance(value, list) and len(value) == layers:
                values[key] = value[:TINY_LAYERS]
    if type(base.get("sliding_window")) is int:
        values["sliding_window"] = TINY_WINDOW
    special = {} if family == "classic" else NO_SPECIAL_TOKENS
    return set_keys(base, values | special | hints(family).get("tiny", {}))


@st.composite
def random_config(draw, family: str) -> dict[str, Any]:
    """A random small config of a family: core sizes that fit together, then every other value the recipe reads."""
    recipe = REGISTRY.family(family)
    base = default_config(family)
    read = lookup_in(base)
    hint = hints(family)
    values: dict[str, Any] = {}

    def put(symbol: str, value: int) -> None:
        key = first_key(recipe, symbol, base)
        if key is not None:
            values[key] = value

    layers = draw(st.integers(1, 4))
    h_kv, g = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    put("N", layers)
    put("V", draw(st.integers(8, 96)))
    put("h", g * h_kv)
    put("h_kv", h_kv)
    put("d", g * h_kv * 2 * draw(st.integers(1, 6)))  # d/h whole and even: families without head_dim need it, RoPE too
    if draw(st.booleans()):
        put("h_d", 2 * draw(st.integers(1, 6)))  # often != d/h
    experts = draw(st.integers(1, 6))
    put("n", experts)
    put("k", draw(st.integers(1, experts)))
    for name, s in recipe.symbols.items():
        key = first_key(recipe, name, base)
        if name in CORE or s.layers is not None or key is None or key in values or type(read(key)) is not int:
            continue  # a key a core size set keeps its value (GPT-Neo's h and the global h_ssm both read num_heads)
        values[key] = draw(st.integers(0 if s.zero else 1, 3)) * (1 if s.zero else 2)  # small and even (RoPE halves)
    for rule in recipe.switches.values():
        if type(base.get(rule.text)) is bool:
            values[rule.text] = draw(st.booleans())
        elif type(base.get(rule.text)) is int and draw(st.booleans()):
            values[rule.text] = None  # a size that may be unset: q_lora_rank null is a plain q_proj
    for rule in recipe.layer_symbols.values():
        for key in rule.reads:
            current = read(key)
            if key in recipe.lists or key == "i" or key in (first_key(recipe, s, base) for s in CORE):
                continue  # a core size (num_hidden_layers) is drawn above
            if isinstance(current, list) and all(type(x) is int for x in current):
                values[key] = draw(st.lists(st.integers(0, layers - 1), unique=True, max_size=layers))
            elif type(current) is int:
                values[key] = draw(st.integers(0, layers + 1))
            elif type(current) is bool:
                values[key] = draw(st.booleans())
    base_layers = read(first_key(recipe, "N", base) or "num_hidden_layers")
    per_layer = [k for k, v in base.items() if isinstance(v, list) and len(v) == base_layers and k not in values]
    for key in per_layer:  # lists of one entry per layer: drawn anew where the recipe knows their kinds, else left to the library
        spec = recipe.lists.get(key)
        values[key] = draw(st.lists(st.sampled_from(spec["values"]), min_size=layers, max_size=layers)) if spec and spec["values"] and draw(st.booleans()) else None
    values |= {} if family == "classic" else NO_SPECIAL_TOKENS  # small V: no special ids out of range, unless the hints say
    for key, choices in hint.get("choices", {}).items():
        values[key] = draw(st.sampled_from(choices))
    for key, (low, high) in hint.get("ranges", {}).items():
        values[key] = draw(st.integers(low, high))
    for key, factor in hint.get("multiples", {}).items():
        if type(values.get(key)) is int:
            values[key] *= factor
    values |= hint.get("fixed", {})
    for key, source in hint.get("follow", {}).items():  # another key's value, or a rule's over the config drawn so far
        values[key] = compile_rule(source, f"tests/families/{family}.toml [follow]")(lookup_in(set_keys(base, values)))
    config = {k: v for k, v in set_keys(base, values).items() if not (k in per_layer and values[k] is None)}
    for rule in hint.get("assume", {}):
        assume(compile_rule(rule, f"tests/families/{family}.toml [assume]")(lookup_in(config)))
    return config


__all__ = ["default_config", "random_config", "tiny_config", "model_type", "hints", "set_keys"]
