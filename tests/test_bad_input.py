"""Bad input gets one line naming the field and the problem, exit code 2, no traceback; the loader is fuzzed."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symparam.cli import main
from symparam.config import read_preset, resolve
from symparam.errors import SymparamError
from symparam.model import Model

LLAMA = read_preset("llama-2-7b")
OLMOE = {"model_type": "olmoe", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 1, "num_experts": 2, "num_experts_per_tok": 1}
QWEN3_MOE = read_preset("qwen3-235b-a22b")


def config_error(capsys, tmp_path, text: str) -> str:
    """Run `count --config` on a file with this text; return stderr after checking the error contract."""
    path = tmp_path / "config.json"
    path.write_text(text)
    code = main(["count", "--config", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("symparam: error: ") and err.count("\n") == 1
    return err


def with_(base, **changes):
    return json.dumps({**base, **changes})


def without(base, key):
    return json.dumps({k: v for k, v in base.items() if k != key})


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ("42", "expected a JSON object"),
        (without(LLAMA, "hidden_size"), "hidden_size"),
        (without(LLAMA, "vocab_size"), "vocab_size"),
        (with_(LLAMA, hidden_size="4096"), "hidden_size"),
        (with_(LLAMA, hidden_size=True), "hidden_size"),
        (with_(LLAMA, hidden_size=0), "hidden_size"),
        (with_(LLAMA, num_hidden_layers=-3), "num_hidden_layers"),
        (with_(LLAMA, intermediate_size=11008.5), "intermediate_size"),
        (with_(LLAMA, hidden_size=4096.0), "hidden_size"),
        (with_(LLAMA, num_key_value_heads=5), "num_key_value_heads"),
        (with_(LLAMA, model_type="not-a-model", architectures=["NotAModelForCausalLM"]), "model_type"),  # a known class would be read as its family
        (json.dumps({k: v for k, v in LLAMA.items() if k not in ("model_type", "architectures")}), "model_type"),  # with a known class it reads as that family
        (with_(LLAMA, tie_word_embeddings="yes"), "tie_word_embeddings"),
        (with_(LLAMA, tie_word_embeddings=None), "tie_word_embeddings: expected true or false, got null"),
        (with_(LLAMA, attention_bias=1), "attention_bias"),
        (with_(LLAMA, hidden_size=4000, num_attention_heads=3), "head_dim"),
        (with_(QWEN3_MOE, num_experts_per_tok=200), "num_experts_per_tok"),
        (with_(QWEN3_MOE, decoder_sparse_step=0), "decoder_sparse_step"),
        (with_(QWEN3_MOE, mlp_only_layers="0,1"), "mlp_only_layers"),
        ('{"model_type": "llama", "hidden_size": NaN}', "NaN"),
        # OLMoE sizes k_norm by hidden_size // heads: 70 // 4 would silently floor, so we refuse it
        (with_(OLMOE, hidden_size=70, head_dim=16), "k_norm"),
    ],
)
def test_bad_config_names_the_field(capsys, tmp_path, text, names):
    assert names in config_error(capsys, tmp_path, text)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["count", "--model", "gpt5"], "gpt5"),
        (["count", "--arch", "transformer-xl", "--set", "d=1"], "transformer-xl"),
        (["count", "--config", "/no/such/config.json"], "/no/such/config.json"),
        (["count", "--model", "gpt2", "--set", "depth=3"], "depth"),
        (["count", "--model", "gpt2", "--set", "d=12.5"], "--set d"),
        (["count", "--model", "gpt2", "--set", "d"], "SYMBOL=INT"),
        (["count", "--arch", "llama", "--set", "d=4096"], "num_hidden_layers"),
        (["count", "--recipe", "/no/such/recipe.toml"], "/no/such/recipe.toml"),
        (["count"], "--model"),
        (["count", "--model", "gpt2", "--arch", "llama"], "model_type: 'gpt2' is not a llama config"),
        (["derive", "--model", "nope", "--markdown"], "nope"),
    ],
)
def test_bad_arguments_name_the_problem(capsys, argv, names):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert names in err and err.count("\n") == 1


def test_derive_of_an_empty_config_names_the_missing_model_type(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    code = main(["derive", "--config", str(path), "--markdown"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "model_type" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("recipe", "names"),
    [
        ('family = "x"\nmodel_types = ["x"]\n[attention]\nkind = "linear"\n', "kind"),
        ('family = "x"\nmodel_types = ["x"]\n[attention]\nwarp = true\n', "warp"),
        ('family = "x"\nmodel_types = ["x"]\n[bogus]\n', "bogus"),
        ('family = "x"\n', "model_types"),
        ('family = "x"\nmodel_types = ["x"]\n[ffn]\nsize = "__import__(1)"\n', "size"),
        ("family = ", "not valid TOML"),
    ],
)
def test_bad_recipe_names_the_problem(capsys, tmp_path, recipe, names):
    path = tmp_path / "r.toml"
    path.write_text(recipe)
    code = main(["count", "--recipe", str(path), "--set", "V=10", "d=8", "N=1", "h=2", "d_ff=16"])
    _, err = capsys.readouterr()
    assert code == 2 and names in err and err.count("\n") == 1


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from([LLAMA, QWEN3_MOE, read_preset("deepseek-v3"), read_preset("gpt2")]), data=st.data())
def test_fuzzed_configs_either_count_exactly_or_fail_cleanly(base, data):
    keys = st.sampled_from(sorted(base) + ["head_dim", "n_inner", "mlp_only_layers", "first_k_dense_replace"])
    changes = data.draw(st.dictionaries(keys, JSON_VALUES, max_size=4))
    dropped = data.draw(st.sets(st.sampled_from(sorted(base)), max_size=3))
    raw = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
    try:
        count = Model.from_resolved(resolve(raw)).count()
    except SymparamError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert type(count.total) is int and 0 < count.active <= count.total


@settings(max_examples=100, deadline=None)
@given(st.one_of(JSON_VALUES, st.lists(JSON_VALUES), st.text()))
def test_fuzzed_documents_fail_cleanly(raw):
    with pytest.raises(SymparamError):
        resolve(raw)
