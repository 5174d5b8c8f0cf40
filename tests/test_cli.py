"""The `symparam count` and `symparam list` commands as a user runs them: text, JSON, and errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import symparam
from symparam.cli import main

# Published figures (DESIGN.md reference figures and the teaching example), not computed here.
QWEN3_235B_TOTAL = 235_093_634_560
QWEN3_235B_ACTIVE = 22_190_763_520
BREAKDOWN = ["input embedding", "attention", "router", "routed experts", "norms", "final norm", "LM head"]  # no dense layer: no dense FFN row


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_count_preset_prints_exact_total_active_and_every_component(capsys):
    code, out, _ = run(capsys, "count", "--model", "qwen3-235b-a22b")
    assert code == 0
    assert f"{QWEN3_235B_TOTAL:,}" in out and f"{QWEN3_235B_ACTIVE:,}" in out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    for component in BREAKDOWN:
        assert component in rows, component
        assert "%" in rows[component]
    assert "dense FFN" not in rows  # Qwen3-235B-A22B builds no dense layer
    assert "3*N*d*d_moe*n" in rows["routed experts"]  # written by layer kind, the count first


def test_count_json_has_integer_total_active_and_components(capsys):
    code, out, _ = run(capsys, "count", "--model", "qwen3-235b-a22b", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["total"], data["active"]) == (QWEN3_235B_TOTAL, QWEN3_235B_ACTIVE)
    assert all(type(v) is int for v in data["components"].values())
    assert sum(data["components"].values()) == data["total"]
    assert data["active_without_embedding"] == data["active"] - data["components"]["input embedding"]


@pytest.mark.parametrize(("preset", "total"), [("classic-512", 57_987_072), ("classic-512-tied", 41_603_072)])
def test_classic_teaching_example(capsys, preset, total):
    _, out, _ = run(capsys, "count", "--model", preset, "--json")
    assert json.loads(out)["total"] == total


def test_config_file_is_read_as_published(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
                                "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                                "tie_word_embeddings": True, "some_unknown_key": {"nested": [1, 2]}}))
    _, out, _ = run(capsys, "count", "--config", str(path), "--json")
    assert json.loads(out)["total"] == 3_085_938_688  # Qwen2.5-3B, DESIGN.md


def test_arch_with_set_counts_from_symbols(capsys):
    values = ["N=36", "V=151936", "d=4096", "d_ff=12288", "h=32", "h_kv=8", "h_d=128"]
    code, out, _ = run(capsys, "count", "--arch", "qwen3", "--set", *values, "--json")
    assert code == 0 and json.loads(out)["total"] == 8_190_735_360  # Qwen3-8B, DESIGN.md


def test_arch_accepts_dash_and_underscore(capsys):
    outs = [run(capsys, "count", "--model", "qwen3-235b-a22b", "--arch", arch, "--json")[1] for arch in ("qwen3-moe", "qwen3_moe")]
    assert outs[0] == outs[1] and json.loads(outs[0])["total"] == QWEN3_235B_TOTAL


def test_set_overrides_a_preset(capsys):
    _, out, _ = run(capsys, "count", "--model", "gpt2", "--set", "N=24", "d=1024", "h=16", "--json")
    assert json.loads(out)["total"] == 354_823_168  # gpt2-medium, DESIGN.md


def test_list_shows_families_and_presets(capsys):
    code, out, _ = run(capsys, "list", "--json")
    data = json.loads(out)
    families = {f["family"] for f in data["families"]}
    assert code == 0
    assert families >= {"gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gemma2", "phi3", "olmoe", "gpt_oss", "classic"}
    presets = {p["name"]: p for p in data["presets"]}
    assert {"qwen3-235b-a22b", "classic-512", "classic-512-tied", "deepseek-v3", "gpt2-xl"} <= set(presets)
    assert (presets["qwen3-235b-a22b"]["total"], presets["qwen3-235b-a22b"]["active"]) == (QWEN3_235B_TOTAL, QWEN3_235B_ACTIVE)
    assert presets["qwen3-235b-a22b"]["hub"] == "Qwen/Qwen3-235B-A22B" and presets["qwen3-235b-a22b"]["family"] == "qwen3_moe"


def test_user_recipe_file_counts_without_touching_the_package(capsys, tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(
        'family = "tiny"\nmodel_types = ["tiny"]\n'
        '[switches]\nqkv_bias = true\no_bias = true\nlayer_norm = true\nfinal_norm = false\n'
        '[blocks.decoder_layer]\nmlp = { block = "plain_mlp", bias = true }\n'
    )
    code, out, _ = run(capsys, "count", "--recipe", str(recipe), "--set", "V=32000", "d=512", "N=8", "h=8", "d_ff=2048", "--json")
    assert code == 0 and json.loads(out)["total"] == 57_987_072  # the classic 512-d model, untied


def test_error_is_one_line_exit_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "symparam.cli", "count", "--model", "no-such-model"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "no-such-model" in proc.stderr


LLAMA_2_7B = json.loads((Path(symparam.__file__).parent / "presets" / "llama-2-7b.json").read_text())


def test_a_wrapper_counts_its_language_model_and_says_so(capsys, tmp_path):
    """A multimodal config of a type no table knows: read by structure, its text_config as the language model."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "my_vlm", "vision_config": {"hidden_size": 1024}, "text_config": LLAMA_2_7B}))
    code, out, _ = run(capsys, "count", "--config", str(config), "--json")
    data = json.loads(out)
    assert code == 0 and data["total"] == 6_738_415_616  # Llama-2-7B's published figure: the vision config adds nothing
    assert (data["family"], data["scope"], data["wrapper"]) == ("llama", "language model", "my_vlm") and "not counted" in data["notes"][0]
    code, out, _ = run(capsys, "count", "--config", str(config))
    assert code == 0 and out.splitlines()[1].startswith("This is the language model of a my_vlm config (text_config)")


def test_a_wrapper_of_no_tie_flag_of_its_own_never_ties_its_head(capsys, tmp_path):
    """The general rule for a wrapper no table knows: its own tie_word_embeddings ties its head; text_config's does not."""
    config = tmp_path / "config.json"
    text = LLAMA_2_7B | {"tie_word_embeddings": True}
    embedding = 32000 * 4096  # Llama-2-7B: V d
    for own, tied in ((None, False), (True, True), (False, False)):
        config.write_text(json.dumps({"model_type": "my_vlm", "text_config": text} | ({} if own is None else {"tie_word_embeddings": own})))
        code, out, _ = run(capsys, "count", "--config", str(config), "--json")
        assert code == 0 and json.loads(out)["total"] == 6_738_415_616 - (embedding if tied else 0), own


def test_an_unknown_type_names_the_nearest_families_and_how_to_count_it_anyway(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_2_7B | {"model_type": "my_llama", "architectures": ["MyLlamaForCausalLM"]}))
    code, out, err = run(capsys, "count", "--config", str(config))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("symparam: error: model_type: unsupported 'my_llama'; nearest families by architectures and keys: llama, ")
    assert "--as FAMILY" in err and "--recipe FILE" in err
    code, out, _ = run(capsys, "count", "--config", str(config), "--as", "llama", "--json")
    data = json.loads(out)
    assert code == 0 and data["total"] == 6_738_415_616 and data["read_as"] == "llama"
    assert data["notes"] == ["Read as llama (--as): the config says model_type my_llama."]


@pytest.mark.parametrize("argv", [["count"], ["derive", "--markdown"], ["memory"], ["flops"], ["shapes", "--seq", "4"], ["sensitivity"],
                                  ["solve", "--target", "7e9", "--for", "N"], ["sweep", "--grid", "N=2,4"], ["plot", "-o", "PLOT"],
                                  ["verify", "--checkpoint", "CHECKPOINT"]])
def test_as_reads_a_config_as_a_family_in_every_command(capsys, tmp_path, argv):
    """--as on every command that reads a model: the config of an unknown type is counted as the family, and says so."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_2_7B | {"model_type": "my_llama", "architectures": ["MyLlamaForCausalLM"]}))
    argv = [str(tmp_path / "p.png") if a == "PLOT" else str(tmp_path / "missing.safetensors") if a == "CHECKPOINT" else a for a in argv]
    code, out, err = run(capsys, *argv, "--config", str(config), "--as", "llama")
    if argv[0] == "verify":  # no checkpoint: the config was read as llama before the file was looked for
        assert code == 2 and "missing.safetensors" in err
        return
    assert code == 0, err
    if argv[0] in ("count", "derive"):  # the commands that show how a config was read
        assert "Read as llama (--as): the config says model" in out
    code, _, err = run(capsys, *argv, "--config", str(config))
    assert code == 2 and "unsupported 'my_llama'" in err


def test_an_unknown_model_type_with_a_known_class_reads_as_its_family(capsys, tmp_path):
    config = tmp_path / "config.json"
    deepseek = json.loads((Path(symparam.__file__).parent / "presets" / "deepseek-v3.json").read_text())
    config.write_text(json.dumps(deepseek | {"model_type": "kimi_k2"}))
    code, out, _ = run(capsys, "count", "--config", str(config), "--json")
    data = json.loads(out)
    assert code == 0 and data["family"] == "deepseek_v3" and data["total"] == 671_026_404_352  # DESIGN.md's DeepSeek-V3 figure
    assert data["notes"] == ["Read as deepseek_v3: model_type kimi_k2 is not one symparam knows, and architectures names DeepseekV3ForCausalLM."]


def test_count_says_where_the_config_came_from(capsys, tmp_path):
    code, out, _ = run(capsys, "count", "--model", "qwen3-8b", "--json")
    data = json.loads(out)
    assert code == 0 and data["source"] == {"kind": "catalog", "preset": "qwen3-8b", "hub": "Qwen/Qwen3-8B"}
    assert data["notes"] == ["Config: the catalog preset qwen3-8b, the published config.json of Qwen/Qwen3-8B."]
    _, out, _ = run(capsys, "count", "--model", "Qwen/Qwen3-8B")  # the Hub id of a preset is the preset: no cache, no network
    assert out.splitlines()[:2] == ["qwen3-8b (Qwen3)", "Config: the catalog preset qwen3-8b, the published config.json of Qwen/Qwen3-8B."]
    _, out, _ = run(capsys, "count", "--model", "classic-512")
    assert out.splitlines()[1] == "Config: the built-in preset classic-512."
    path = tmp_path / "config.json"
    path.write_text((Path(symparam.__file__).parent / "presets" / "qwen3-8b.json").read_text())
    _, out, _ = run(capsys, "count", "--config", str(path), "--json")
    assert json.loads(out)["source"] == {"kind": "file", "path": str(path)} and json.loads(out)["notes"] == []  # the title is the path
    _, out, _ = run(capsys, "count", "--arch", "qwen3", "--set", "N=36", "V=151936", "d=4096", "d_ff=12288", "h=32", "h_kv=8", "h_d=128", "--json")
    assert json.loads(out)["source"] is None
    _, out, _ = run(capsys, "derive", "--model", "qwen3-8b", "--markdown", "--lang", "zh")
    assert "配置：目录中的预设 qwen3-8b，即 Qwen/Qwen3-8B 发布的 config.json。" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["count", "--config", "c.json", "--revision", "v1"], "--revision: names a revision of a Hub id; give --model ORG/NAME"),
    (["count", "--model", "classic-512", "--revision", "main"], "--revision: the preset classic-512 is not on the Hub"),
    (["count", "--model", "qwen3-8"], "unknown preset 'qwen3-8'; `symparam list` shows the"),
    (["count", "--model", "Qwen/Qwen3 8B"], "'Qwen/Qwen3 8B' is not a Hub id"),
    (["verify", "--model", "qwen3-8b", "--remote", "model.safetensors"], "--remote: 'model.safetensors' is not an http(s) URL"),
    (["verify", "--model", "qwen3-8b", "--remote", "http://[::1/x.json"], "--remote: 'http://[::1/x.json' is not an http(s) URL"),
    (["verify", "--model", "qwen3-8b", "--remote", "https:///x.json"], "--remote: 'https:///x.json' is not an http(s) URL"),
    (["count", "--model", "nobody/nothing"], "HF_ENDPOINT: 'huggingface.co' is not an http(s) URL"),
])
def test_hub_options_refuse_bad_input_offline(capsys, monkeypatch, tmp_path, argv, says):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_ENDPOINT", "huggingface.co")  # no scheme: refused before any import or request
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and says in err


def test_a_config_without_k_counts_its_total_and_says_active_is_unknown(capsys, tmp_path):
    """DeepSeek-V3's published config without num_experts_per_tok: every command that needs only the total works; active
    is JSON null with a note, and what needs one token's share says which field is missing."""
    deepseek = json.loads((Path(symparam.__file__).parent / "presets" / "deepseek-v3.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in deepseek.items() if k != "num_experts_per_tok"}))
    code, out, _ = run(capsys, "count", "--config", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["total"] == 671_026_404_352 and data["active"] is None and data["active_without_embedding"] is None  # DESIGN.md's figure
    assert data["notes"] == ["Active (one token): unknown, the config does not set num_experts_per_tok (k); the total does not need it."]
    assert data["active_components"]["routed experts"] is None
    code, out, _ = run(capsys, "count", "--config", str(path))
    assert code == 0 and "active                         unknown (without num_experts_per_tok)" in out.splitlines()
    code, out, _ = run(capsys, "derive", "--config", str(path), "--markdown")
    assert code == 0 and "| $k$ | experts per token | not set |" in out and "671{,}026{,}404{,}352" in out
    code, out, _ = run(capsys, "sweep", "--config", str(path), "--grid", "N=61,62")
    assert code == 0 and out.splitlines()[:2] == ["N,total", "61,671026404352"]
    code, out, _ = run(capsys, "plot", "--config", str(path), "-o", str(tmp_path / "p.png"), "--json")
    assert code == 0 and (tmp_path / "p.png").stat().st_size > 0
    code, out, _ = run(capsys, "memory", "--config", str(path), "--json")
    assert code == 0 and json.loads(out)
    code, out, _ = run(capsys, "solve", "--config", str(path), "--target", "600e9", "--for", "N")
    assert code == 0 and "<- closest" in out
    code, out, _ = run(capsys, "sensitivity", "--config", str(path), "--for", "N", "--json")
    assert code == 0 and json.loads(out)[0]["symbol"] == "N"
    for argv in (["flops"], ["shapes", "--seq", "4"]):
        code, out, err = run(capsys, *argv, "--config", str(path))
        assert code == 2 and out == "" and err.startswith("symparam: error: num_experts_per_tok: missing (experts per token)") and err.count("\n") == 1
