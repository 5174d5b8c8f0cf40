"""Exactness, 0 parameters off, per tensor: presets, library-default configs and random small configs against the oracle."""

from __future__ import annotations

import functools
import json
import tomllib
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import symparam
from symparam.components import leaves
from symparam.config import presets, read_preset
from symparam.errors import SymparamError
from symparam.recipes import REGISTRY, wrapper_table
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
WRAPPER_HINTS = tomllib.loads((Path(__file__).parent / "wrappers.toml").read_text(encoding="utf-8"))
WRAPPERS = sorted(t for t, w in wrapper_table()[1].items() if not w.reason)  # every counted wrapper type of transformers 5.23


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


def wrapper_family(wrapper: str) -> str:
    """The family of a wrapper's language model, by the text model_type _wrappers.toml gives it."""
    return REGISTRY.headers[REGISTRY.by_type[wrapper_table()[1][wrapper].text]]["family"]


def wrapper_config(wrapper: str) -> dict[str, Any]:
    """A wrapper's library-default config as config.json holds it, with its tests/wrappers.toml [default] hints."""
    from transformers import AutoConfig

    return set_keys(AutoConfig.for_model(wrapper).to_dict(), WRAPPER_HINTS.get("default", {}).get(wrapper, {}))


def wrapper_oracle(config: dict[str, Any], wrapper: str) -> Oracle:
    """The whole multimodal model transformers builds from `config`, its language model and LM head per tensor."""
    return oracle(config, **hints(wrapper_family(wrapper)).get("oracle", {}), towers=WRAPPER_HINTS.get("towers", {}).get(wrapper), whole=True)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_multimodal_wrapper_counts_its_language_model_per_tensor(wrapper):
    """The wrapper's library-default config: symparam counts its language model and LM head, exactly what the whole model
    transformers builds holds outside its other towers, and says so."""
    config = wrapper_config(wrapper)
    assert_same(config, wrapper_oracle(config, wrapper))
    model = symparam.load(config)
    assert model.recipe.family == wrapper_family(wrapper)
    assert model.scope == {"scope": "language model", "wrapper": wrapper}
    assert any(key == "note_wrapper" and fields["wrapper"] == wrapper for key, fields in model.notes)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_ties_its_head_as_transformers_does(wrapper):
    """Every combination of the wrapper's own tie flag (absent: its class's default) and its text config's: the head
    is tied, or not, as in the whole model transformers builds."""
    base = wrapper_config(wrapper)
    for own in (None, True, False):
        for text in (True, False):
            config = {k: v for k, v in base.items() if k != "tie_word_embeddings"} | ({} if own is None else {"tie_word_embeddings": own})
            config["text_config"] = {**base["text_config"], "tie_word_embeddings": text}
            reference = wrapper_oracle(config, wrapper)
            head = reference.tensors.get("lm_head.weight")
            if wrapper_table()[1][wrapper].head_keys and head is not None and head != reference.tensors["model.embed_tokens.weight"]:
                with pytest.raises(SymparamError, match="sizes its untied LM head by its own"):  # Ovis2: a head sized by its own keys
                    symparam.load(config)
                continue
            assert_same(config, reference)
            assert symparam.load(config).flags["tied"] == (head is None), (own, text)


@pytest.mark.parametrize("wrapper", sorted(t for t in WRAPPERS if wrapper_table()[1][t].flat))
def test_a_wrapper_with_its_language_model_at_the_top_level_counts_it(wrapper):
    """Published dots3_note and Fuyu configs keep the language model's keys at the top level, with no text_config:
    transformers builds the text config from them (Fuyu only from the keys its class names)."""
    config = wrapper_config(wrapper)
    text, flat = config.pop("text_config"), wrapper_table()[1][wrapper].flat
    config |= {k: v for k, v in text.items() if k != "model_type" and (flat is True or k in flat)}
    assert_same(config, wrapper_oracle(config, wrapper))
    assert symparam.load(config).scope == {"scope": "language model", "wrapper": wrapper}


@pytest.mark.parametrize("wrapper", WRAPPERS)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_a_random_language_model_in_its_wrapper_equals_oracle(wrapper, data):
    """A random small text config of the wrapper's language family inside the wrapper's default config."""
    family = wrapper_family(wrapper)
    drawn = data.draw(random_config(family), label="config")
    config = drawn if drawn["model_type"] == wrapper else wrapper_config(wrapper) | {"text_config": drawn}  # Emu3's tests draw the wrapper
    config = set_keys(config, WRAPPER_HINTS.get("default", {}).get(wrapper, {}))
    follow = WRAPPER_HINTS.get("follow", {}).get(wrapper, {})  # tower sizes the wrapper checks against its language model
    config = set_keys(config, {key: eval(rule, {}, dict(config["text_config"])) for key, rule in follow.items()})  # noqa: S307 (our own test data)
    try:
        reference = wrapper_oracle(config, wrapper)
    except Exception:  # transformers refuses this combination: nothing to compare against
        assume(False)
    assert_same(config, reference)


SAVED_WRAPPERS = sorted((Path(__file__).parent / "wrappers").glob("*.json"))  # named ORG--NAME after the checkpoint each class's docstring cites
LEGACY_FORMS = {  # what published configs of these types hold instead, as the configuration classes' own BC code reads them
    "kimi_k25": lambda c: c | {"text_config": c["text_config"] | {"model_type": "kimi_k2"}},  # remote-code text type
    "exaone4_5": lambda c: c | {"text_config": c["text_config"] | {"model_type": "exaone4_5_text"}},  # the first release's text type
    "lfm2_vl": lambda c: {k: v for k, v in c.items() if k != "tie_word_embeddings"} | {"tie_embedding": False},  # LFM2's name for the flag
    "nemotron_h_omni": lambda c: {("llm_config" if k == "text_config" else k): v for k, v in c.items()},  # released checkpoints' key
}


@pytest.mark.parametrize("path", SAVED_WRAPPERS, ids=lambda p: p.stem.replace("--", "/"))
def test_a_saved_wrapper_config_counts_exactly(path):
    """No network here: each file is the config.json transformers 5.23 saves (save_pretrained, use_diff) for its
    configuration class's defaults, which the class's docstring attributes to the checkpoint the file is named after
    (EXAONE 4.5, Kimi, LFM2-VL, MiniCPM-V 4.6, Nemotron 3 Nano Omni); not the Hub's files. Read from disk, as saved and in
    the legacy form published configs of the type hold, each against the whole model transformers builds from it."""
    from transformers import AutoConfig, PreTrainedConfig

    text = path.read_text(encoding="utf-8")
    wrapper = json.loads(text)["model_type"]
    assert text == AutoConfig.for_model(wrapper).to_json_string(use_diff=True), "the file is not what transformers saves"
    config = PreTrainedConfig._decode_special_floats(json.loads(text))  # as from_pretrained reads it ({"__float__": "Infinity"})
    assert symparam.load(str(path)).count().total == wrapper_oracle(config, wrapper).total
    for form in (config, *((LEGACY_FORMS[wrapper](config),) if wrapper in LEGACY_FORMS else ())):
        assert_same(form, wrapper_oracle(form, wrapper))
        assert symparam.load(form).scope == {"scope": "language model", "wrapper": wrapper}


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
