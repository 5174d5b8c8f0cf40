"""Coverage: every causal-LM model type of transformers has a recipe (exact), is a wrapper a recipe reads, or is out of
scope with its reason; every model type a recipe reads counts exactly from its library-default config."""

from __future__ import annotations

import json

import pytest

from symparam.cli import main
from symparam.docs import causal_lm_types, coverage, multimodal_types, wrapper_coverage
from symparam.recipes import REGISTRY, scope, wrapper_table

from families import hints, model_type
from test_exact import assert_same
from families import set_keys
from oracle import oracle

MAPPING, VERSION = causal_lm_types()


def test_every_causal_lm_type_has_a_recipe_or_a_reason():
    missing = sorted(t for t, (status, _, _) in coverage(MAPPING).items() if status == "missing")
    assert missing == [], f"transformers {VERSION}: no recipe and no stated reason for {missing}"


def test_reasons_are_known_and_name_real_types():
    data = scope()
    assert set(data["types"].values()) <= set(data["reasons"])
    assert set(data["types"]) <= set(MAPPING), "a reason for a type transformers does not map"
    assert not set(data["types"]) & set(REGISTRY.by_type), "a type both out of scope and read by a recipe"
    assert not {t for t, w in wrapper_table()[1].items() if not w.reason} & set(data["types"]), "a wrapper both counted and out of scope"


MULTIMODAL = multimodal_types()


def test_every_multimodal_type_holding_a_causal_lm_is_counted_or_has_a_reason():
    """Every config type of transformers that keeps a causal-LM model in a sub-config: its language model is counted
    (each such type is in tests/test_exact.py's WRAPPERS, against the whole model), or it has a stated reason."""
    rows = wrapper_coverage(MULTIMODAL)
    assert [t for t, (status, _, _) in rows.items() if status == "missing"] == []
    counted = {t for t, (status, _, _) in rows.items() if status == "exact"}
    assert counted == {t for t, w in wrapper_table()[1].items() if not w.reason}, "_wrappers.toml lists a type transformers does not have as a wrapper"
    assert set(wrapper_table()[1]) <= set(MULTIMODAL)


def test_what_wrappers_toml_says_is_what_transformers_configuration_classes_say():
    """Where a config.json is silent, the wrapper's configuration class decides: its sub-config's default model_type,
    its own defaults, the defaults it merges under text_config and the keys it reads flat (Fuyu's, from its init_kwargs)."""
    import dataclasses

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for model_type, spec in wrapper_table()[1].items():
        cls = CONFIG_MAPPING[model_type]
        key, inner = MULTIMODAL[model_type]
        assert spec.text == inner, model_type
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert {k: fields.get(k) for k in spec.defaults} == spec.defaults, model_type
        init = cls.sub_configs_defaults[key].init_kwargs
        if spec.text_defaults:
            assert spec.text_defaults == init, model_type
        if isinstance(spec.flat, tuple):
            assert set(spec.flat) == set(init) | {"rope_scaling", "rope_theta"}, model_type


ALIASES = sorted((t, REGISTRY.headers[f]["family"]) for t, f in REGISTRY.by_type.items()
                 if t in MAPPING and t != model_type(REGISTRY.family(REGISTRY.headers[f]["family"])))  # a text type inside a wrapper is tested with it


@pytest.mark.parametrize("model_type_, family", ALIASES)
def test_every_model_type_a_recipe_reads_counts_its_default_exactly(model_type_, family):
    """A recipe's other model types (gpt-sw3 beside gpt2, ...): their own library defaults, per tensor."""
    from transformers import AutoConfig

    config = set_keys(AutoConfig.for_model(model_type_).to_dict(), hints(family).get("default", {}))
    assert_same(config, oracle(config, **hints(family).get("oracle", {})))


def test_list_shows_every_family_with_its_model_types(capsys):
    assert main(["list", "--json"]) == 0
    families = {f["family"]: f["model_types"] for f in json.loads(capsys.readouterr().out)["families"]}
    assert families == {h["family"]: h["model_types"] for h in REGISTRY.families()}
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert all(t in text for types in families.values() for t in types)
