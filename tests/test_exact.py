"""Exactness, 0 parameters off, per tensor: presets, library-default configs and random small configs against the oracle."""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import symparam
from symparam.components import leaves
from symparam.config import presets, read_preset
from symparam.errors import SymparamError
from symparam.recipes import REGISTRY
from symparam.symbols import evaluate

from families import default_config, hints, random_config, set_keys
from oracle import Oracle, oracle

# Published figures (DESIGN.md and issue 2): name -> (total, active). Independent of this package's code.
PUBLISHED: dict[str, tuple[int, int]] = {
    "gpt2": (124_439_808, 124_439_808),
    "gpt2-medium": (354_823_168, 354_823_168),
    "gpt2-large": (774_030_080, 774_030_080),
    "gpt2-xl": (1_557_611_200, 1_557_611_200),
    "llama-2-7b": (6_738_415_616, 6_738_415_616),
    "mistral-7b": (7_241_732_096, 7_241_732_096),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "qwen2.5-3b": (3_085_938_688, 3_085_938_688),
    "qwen3-8b": (8_190_735_360, 8_190_735_360),
    "qwen3-32b": (32_762_123_264, 32_762_123_264),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
    "deepseek-v3": (671_026_404_352, 37_552_282_624),
    "classic-512": (57_987_072, 57_987_072),
    "classic-512-tied": (41_603_072, 41_603_072),
}
FAMILIES = sorted(recipe.family for recipe in REGISTRY)
WRAPPERS = sorted((wrapper, recipe.family) for recipe in REGISTRY for wrapper in recipe.wrappers)


def per_tensor(config: dict[str, Any]) -> tuple[dict[str, int], dict[str, Fraction]]:
    """symparam's tensors for a config: name -> elements, and name -> what one token uses (zeros left out)."""
    model = symparam.load(config)
    subs = model.substitution()
    total: dict[str, int] = {}
    active: dict[str, Fraction] = {}
    for leaf, copies, _, name in leaves(model.tree):
        if leaf.counted:
            total[name] = total.get(name, 0) + evaluate(copies * leaf.each, subs)
    for leaf, copies, _, name in leaves(model.tree, active=True) if not model.unknown else ():  # no k: no active figures
        if leaf.counted:
            active[name] = active.get(name, Fraction(0)) + evaluate(copies * leaf.each, subs)
    return {k: v for k, v in total.items() if v}, {k: v for k, v in active.items() if v}


def assert_same(config: dict[str, Any], reference: Oracle) -> None:
    """Per tensor, then totals: a miss names the tensor."""
    total, active = per_tensor(config)
    theirs = {k: v for k, v in reference.tensors.items() if v}
    misses = {k: (total.get(k), theirs.get(k)) for k in sorted(set(total) | set(theirs)) if total.get(k) != theirs.get(k)}
    assert not misses, f"tensors (symparam, transformers): {misses}"
    their_active = {k: v for k, v in reference.active_tensors.items() if v}
    misses = {k: (active.get(k), their_active.get(k)) for k in sorted(set(active) | set(their_active)) if active.get(k) != their_active.get(k)}
    assert not misses, f"active per tensor (symparam, transformers): {misses}"
    count = symparam.load(config).count()
    assert (count.total, count.active) == (reference.total, reference.active)


@functools.cache
def default_oracle(family: str) -> Oracle:
    """One meta build per family default, shared by the tests that need it."""
    return oracle(default_config(family), **hints(family).get("oracle", {}))


def test_every_preset_has_a_published_figure():
    assert set(PUBLISHED) <= set(presets())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_equals_published_figure_and_oracle(name):
    config = read_preset(name)
    reference = oracle(config)
    assert (reference.total, reference.active) == PUBLISHED[name], "the oracle disagrees with the published figure"
    assert_same(config, reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_library_default_config_equals_oracle_per_tensor(family):
    assert_same(default_config(family), default_oracle(family))


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_config_equals_oracle_per_tensor(family, data):
    config = data.draw(random_config(family), label="config")
    try:
        reference = oracle(config, **hints(family).get("oracle", {}))
    except Exception:  # transformers refuses this combination: nothing to compare against
        assume(False)
    try:
        assert_same(config, reference)
    except SymparamError as e:
        pytest.fail(f"transformers builds this config but symparam refuses it: {e}")


@pytest.mark.parametrize("wrapper, family", WRAPPERS)
def test_multimodal_wrapper_counts_its_language_model_per_tensor(wrapper, family):
    """The wrapper's library-default config: symparam counts text_config's language model, exactly what the wrapper
    model holds outside its other towers, and says so."""
    from transformers import AutoConfig

    config = set_keys(AutoConfig.for_model(wrapper).to_dict(), hints(family).get("wrappers", {}).get(wrapper, {}))
    reference = config
    if wrapper in hints(family).get("text_oracle", {}):  # documented: the wrapper itself does not build here
        spec = REGISTRY.family(family).wrappers[wrapper]
        reference = {**{k: config[k] for k in spec.get("keep", []) if k in config}, **config[spec.get("config", "text_config")]}
    assert_same(config, oracle(reference, **hints(family).get("oracle", {})))
    spec = REGISTRY.family(family).wrappers[wrapper]
    if spec.get("flat"):  # the same language model with its keys at the top level, as published configs write it
        text = config[spec.get("config", "text_config")]
        flat = {**{k: v for k, v in text.items() if k != "model_type"}, **{k: config[k] for k in spec.get("keep", []) if k in config}, "model_type": wrapper}
        assert_same(flat, oracle(flat, **hints(family).get("oracle", {})))
    model = symparam.load(config)
    text_type = config[REGISTRY.family(family).wrappers[wrapper].get("config", "text_config")].get("model_type")
    assert model.recipe.family == (REGISTRY.for_model_type(text_type).family if text_type in REGISTRY.by_type else family)  # mistral3 wraps "mistral"
    assert model.scope == {"scope": "language model", "wrapper": wrapper}


NEMOTRON_KINDS = ("mamba", "attention", "moe", "mlp", "linear_attention", "full_attention")  # legacy and current names


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(NEMOTRON_KINDS), min_size=1, max_size=7), pattern=st.booleans())
def test_nemotron_layer_list_without_num_hidden_layers_equals_oracle(kinds, pattern):
    """Nemotron 3's form: layers_block_type (legacy kinds "mamba" and "attention" included) or the hybrid_override_pattern
    string, and no num_hidden_layers: transformers builds one layer per entry, and so does symparam."""
    config = {k: v for k, v in default_config("nemotron_h").items() if k not in ("num_hidden_layers", "layers_block_type", "layer_types")}
    letters = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}
    config.update({"hybrid_override_pattern": "".join(letters[k] for k in kinds)} if pattern else {"layers_block_type": kinds})
    assert_same(config, oracle(config))
    assert symparam.load(config).values["N"] == len(kinds)


def test_a_total_never_waits_for_k():
    """DeepSeek-V2 without num_experts_per_tok (transformers' default is null and builds): the total is exact, per tensor,
    and active is unknown, not refused."""
    config = {**default_config("deepseek_v2"), "num_experts_per_tok": None}
    reference = oracle(config)
    model = symparam.load(config)
    total, active = per_tensor(config)
    assert total == {k: v for k, v in reference.tensors.items() if v} and active == {}
    count = model.count()
    assert (count.total, count.active, count.active_without_embedding) == (reference.total, None, None)
    assert count.active_components["routed experts"] is None and count.active_components["attention"] == count.components["attention"]
    assert model.unknown == {"k": "num_experts_per_tok"}


def test_k_may_count_the_zero_experts_a_router_chooses_from():
    """LongCat-Flash's router picks moe_topk of the routed and the zero (identity) experts: 12 of 8 routed + 256 zero is
    a real config (transformers builds it), counted exactly."""
    config = {**default_config("longcat_flash"), "n_routed_experts": 8, "zero_expert_num": 256, "moe_topk": 12}
    assert_same(config, oracle(config, **hints("longcat_flash").get("oracle", {})))
    with pytest.raises(SymparamError, match=r"moe_topk: 265 is more than the 8 routed plus 256 zero experts"):
        symparam.load({**config, "moe_topk": 265})
