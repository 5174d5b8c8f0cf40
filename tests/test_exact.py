"""Exactness, 0 parameters off: presets, library-default configs and random small configs against the oracle."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symparam
from symparam.config import presets, read_preset
from symparam.recipes import REGISTRY

from oracle import oracle

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # n_shared_experts = 0 builds empty MLPs

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

ISSUE_FAMILIES = {"gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gemma2", "phi3", "olmoe", "gpt_oss", "classic"}
FAMILIES = sorted(recipe.family for recipe in REGISTRY)
HF_MODEL_TYPES = sorted(t for recipe in REGISTRY for t in recipe.model_types if t != "classic")

# DeepSeek-V2's library default leaves num_experts_per_tok unset (active is then undefined); DeepSeek-V2 ships 6.
DEFAULT_GAPS: dict[str, dict[str, Any]] = {"deepseek_v2": {"num_experts_per_tok": 6}}


def ours(config: dict[str, Any]) -> tuple[int, int]:
    """(total, active) from symparam for a config dict."""
    count = symparam.load(config).count()
    return count.total, count.active


def reference(config: dict[str, Any]) -> tuple[int, int]:
    """(total, active) from the oracle for the same dict."""
    o = oracle(config)
    return o.total, o.active


def test_every_preset_has_a_published_figure_and_every_issue_family_a_recipe():
    assert set(presets()) == set(PUBLISHED)
    assert set(FAMILIES) == ISSUE_FAMILIES


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_equals_published_figure_and_oracle(name):
    config = read_preset(name)
    assert reference(config) == PUBLISHED[name], "the oracle disagrees with the published figure"
    assert ours(config) == PUBLISHED[name]
    assert symparam.load(name).count().total == PUBLISHED[name][0]


@pytest.mark.parametrize("model_type", HF_MODEL_TYPES)
def test_library_default_config_equals_oracle(model_type):
    from transformers import AutoConfig

    config = {**AutoConfig.for_model(model_type).to_dict(), **DEFAULT_GAPS.get(model_type, {})}
    assert ours(config) == reference(config)


# ---- hypothesis: random small configs of every family ------------------------------------------------

NO_SPECIAL_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # small V: ids out of range
GPT2_KEYS = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "intermediate_size": "n_inner"}
MLA = {"deepseek_v2", "deepseek_v3"}
EXPERT_KEY = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "qwen3_moe": "num_experts", "olmoe": "num_experts"} | {f: "n_routed_experts" for f in MLA}
small = st.integers(1, 6)


def maybe(draw, config: dict[str, Any], key: str, values: st.SearchStrategy) -> None:
    """Set `key` to a drawn value, or leave it out so the library default applies."""
    if draw(st.booleans()):
        config[key] = draw(values)


@functools.cache
def library_kv_heads(family: str, h: int) -> int:
    """num_key_value_heads transformers uses when a config with h query heads omits it: h, or a fixed default."""
    if family == "classic":
        return h
    from transformers import AutoConfig

    return getattr(AutoConfig.for_model(family, num_attention_heads=h, hidden_size=64 * h), "num_key_value_heads", None) or h


@st.composite
def base(draw, family: str) -> dict[str, Any]:
    """Dimensions every family has; optional switches any config may carry or omit, read or ignored by the family."""
    fixed = library_kv_heads(family, 7)  # 7 where the default follows h
    h_kv, g = draw(st.sampled_from(sorted({1, 2, 3, fixed if fixed != 7 else 1}))), draw(st.integers(1, 3))
    h = g * h_kv
    config = {
        "model_type": family,
        "vocab_size": draw(st.integers(8, 96)),
        "num_hidden_layers": draw(st.integers(1, 4)),
        "num_attention_heads": h,
        "hidden_size": h * 2 * draw(small),  # d/h whole and even: families without head_dim need it, RoPE needs it even
    }
    maybe(draw, config, "intermediate_size", st.integers(1, 40))  # omitted: 4d for gpt2 and classic, a fixed default elsewhere
    if library_kv_heads(family, h) == h_kv:
        maybe(draw, config, "num_key_value_heads", st.just(h_kv))
    else:
        config["num_key_value_heads"] = h_kv  # omitting it would give a default that does not divide h
    maybe(draw, config, "head_dim", st.integers(1, 6).map(lambda x: 2 * x))  # even for RoPE, often != d/h
    for switch in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        maybe(draw, config, switch, st.booleans())
    return config


@st.composite
def experts(draw, family: str, layers: int) -> dict[str, Any]:
    """Routed experts, experts per token, and the family's MoE layout keys."""
    n = draw(small)
    config = {EXPERT_KEY[family]: n, "num_experts_per_tok": draw(st.integers(1, n))}
    if family in MLA or family == "qwen3_moe":
        config["moe_intermediate_size"] = draw(st.integers(1, 24))
    if family == "qwen3_moe":
        maybe(draw, config, "decoder_sparse_step", st.integers(1, 3))
        maybe(draw, config, "mlp_only_layers", st.none() | st.lists(st.integers(0, layers - 1), unique=True, max_size=layers))
    if family in MLA:
        maybe(draw, config, "n_shared_experts", st.integers(0, 2))
        maybe(draw, config, "first_k_dense_replace", st.integers(0, layers + 1))
        config |= {"n_group": 1, "topk_group": 1}
    return config


@st.composite
def latent_attention(draw) -> dict[str, Any]:
    """MLA ranks and head sizes; q_lora_rank omitted (library default), null (plain q_proj) or a rank."""
    config = {
        "kv_lora_rank": draw(small),
        "qk_rope_head_dim": 2 * draw(st.integers(1, 3)),
        "qk_nope_head_dim": draw(small),
        "v_head_dim": draw(small),
    }
    maybe(draw, config, "q_lora_rank", st.none() | small)
    return config


@st.composite
def classic_extras(draw) -> dict[str, Any]:
    """The classic family's own options: learned positions, final norm; d_ff may default to 4d."""
    config: dict[str, Any] = {}
    maybe(draw, config, "learned_positions", st.booleans())
    if config.get("learned_positions"):
        config["max_position_embeddings"] = draw(st.integers(1, 64))
    maybe(draw, config, "final_norm", st.booleans())
    return config


@st.composite
def configs(draw, family: str) -> dict[str, Any]:
    """A random small config.json dict of `family`, fed unchanged to symparam and to the oracle."""
    config = draw(base(family))
    if family in EXPERT_KEY:
        config |= draw(experts(family, config["num_hidden_layers"]))
    if family in MLA:
        config |= draw(latent_attention())
    if family == "classic":
        config |= draw(classic_extras())
    if family == "gpt2":
        config = {GPT2_KEYS.get(key, key): value for key, value in config.items()} | {"n_positions": draw(st.integers(1, 64))}
    return config if family == "classic" else config | NO_SPECIAL_TOKENS


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_config_equals_oracle(family, data):
    config = data.draw(configs(family), label="config")
    assert ours(config) == reference(config)
