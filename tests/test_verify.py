"""verify: real checkpoints saved by transformers, hand-written Hub-style headers, a wrong one, and an index alone."""

from __future__ import annotations

import json
import logging
import struct
import warnings

import pytest

from symparam import load
from symparam.cli import main
from symparam.safetensors import read_header
from symparam.verify import verify

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SMALL = dict(vocab_size=64, pad_token_id=0, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
MOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
FAMILIES = {
    "llama": SMALL,
    "qwen3_moe": {**SMALL, **MOE},  # per-expert tensors mlp.experts.E.*_proj
    "mixtral": {**SMALL, **MOE},  # Hub naming block_sparse_moe.experts.E.w1/w2/w3
    "gpt_oss": {**SMALL, **MOE},  # fused experts gate_up_proj [n, d, 2 d_ff], router as mlp.router
    "gpt2": dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16),  # tied head, Conv1D c_attn
    "phi3": SMALL,  # qkv_proj, gate_up_proj
    "deepseek_v3": {**SMALL, **MOE, "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 16, "kv_lora_rank": 8,
                    "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "n_group": 1, "topk_group": 1},
}


def save_tiny(family: str, path, **save) -> dict:
    """A tiny random model of `family` saved as safetensors by transformers; returns its config.json."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(family, **FAMILIES[family])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path, safe_serialization=True, **save)
    return json.loads((path / "config.json").read_text())


def write_safetensors(path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file (zeros) with these names, dtypes and shapes."""
    width = {"F32": 4, "BF16": 2, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = width[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def run(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()  # drop what saving printed
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_checkpoint_matches(tmp_path, family):
    config = save_tiny(family, tmp_path)
    report = verify(load(str(tmp_path / "config.json")), tmp_path)
    assert report.match, report.mismatches
    assert report.found == report.expected == load(config).count().total
    assert not report.mismatches


def test_tied_head_is_absent_and_counted_once(tmp_path):
    save_tiny("gpt2", tmp_path)
    assert not any("lm_head" in name for name in read_header(tmp_path / "model.safetensors"))
    report = verify(load(str(tmp_path / "config.json")), tmp_path / "model.safetensors")
    assert report.match and report.components["LM head"] == {"expected": 0, "found": 0}


def test_untied_config_with_absent_head_says_tie(tmp_path, capsys):
    config = save_tiny("gpt2", tmp_path)
    (tmp_path / "untied.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    code, out = run(capsys, "verify", "--config", str(tmp_path / "untied.json"), "--checkpoint", str(tmp_path))
    assert code == 1
    assert "lm_head.weight" in out and "not stored" in out and "tie_word_embeddings to true" in out


def test_sharded_directory_and_index(tmp_path, capsys):
    save_tiny("qwen3_moe", tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    for target in (tmp_path, tmp_path / "model.safetensors.index.json"):
        code, out = run(capsys, "verify", "--config", str(tmp_path / "config.json"), "--checkpoint", str(target), "--json")
        payload = json.loads(out)
        assert code == 0 and payload["match"] and payload["mismatches"] == [] and payload["unit"] == "parameters"


def mixtral_hub(config: dict, kv_rows: int) -> dict[str, tuple[str, list[int]]]:
    """Tensors as the Hub's Mixtral checkpoints name them, with k/v projections of `kv_rows` rows."""
    d, ff, n, V = config["hidden_size"], config["intermediate_size"], config["num_local_experts"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    t = {"model.embed_tokens.weight": ("BF16", [V, d]), "model.norm.weight": ("BF16", [d]), "lm_head.weight": ("BF16", [V, d])}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": ("BF16", [d]), p + "post_attention_layernorm.weight": ("BF16", [d]),
              p + "self_attn.q_proj.weight": ("BF16", [q, d]), p + "self_attn.k_proj.weight": ("BF16", [kv_rows, d]),
              p + "self_attn.v_proj.weight": ("BF16", [kv_rows, d]), p + "self_attn.o_proj.weight": ("BF16", [d, q]),
              p + "self_attn.rotary_emb.inv_freq": ("F32", [config["head_dim"] // 2]),
              p + "block_sparse_moe.gate.weight": ("BF16", [n, d])}
        for e in range(n):
            t |= {f"{p}block_sparse_moe.experts.{e}.w1.weight": ("BF16", [ff, d]), f"{p}block_sparse_moe.experts.{e}.w3.weight": ("BF16", [ff, d]),
                  f"{p}block_sparse_moe.experts.{e}.w2.weight": ("BF16", [d, ff])}
    return t


MIXTRAL = {"model_type": "mixtral", **{k: v for k, v in SMALL.items() if k != "pad_token_id"}, "num_local_experts": 4, "num_experts_per_tok": 2}


def test_hub_per_expert_names_and_buffers(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    path = tmp_path / "model.safetensors"
    write_safetensors(path, mixtral_hub(MIXTRAL, kv_rows=2 * 8))
    with safetensors.safe_open(str(path), "np") as f:  # the hand-written file is a real safetensors file
        assert len(list(f.keys())) == len(read_header(path)) - 0
    report = verify(load(MIXTRAL), path)
    assert report.match, report.mismatches
    assert [p["tensor"] for p in report.not_parameters] == [f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(2)]
    assert all("inv_freq" in p["reason"] for p in report.not_parameters)


def test_full_multi_head_checkpoint_for_a_grouped_query_config(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, mixtral_hub(MIXTRAL, kv_rows=4 * 8))  # h * h_d rows: every query head has its own K and V
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    code, out = run(capsys, "verify", "--config", str(tmp_path / "config.json"), "--checkpoint", str(path), "--json")
    payload = json.loads(out)
    assert code == 1 and not payload["match"]
    assert payload["found"] - payload["expected"] == 2 * 2 * (32 - 16) * 32  # layers x (k, v) x extra rows x d
    k_line = next(m for m in payload["mismatches"] if m.startswith("layers.self_attn.k_proj.weight"))
    assert "expected d*h_d*h_kv = 32*8*2 per layer" in k_line and "found 32*8*4 per layer" in k_line
    assert "h_kv = 4" in k_line and "full multi-head attention, the config says grouped-query" in k_line
    assert any(m.startswith("layers.self_attn.v_proj.weight") for m in payload["mismatches"])
    assert len(payload["mismatches"]) == 2  # nothing else is blamed
    assert payload["components"]["attention"]["expected"] != payload["components"]["attention"]["found"]


def test_mtp_layer_scales_and_router_bias_are_not_parameters(tmp_path):
    config = {"model_type": "deepseek_v3", **{k: v for k, v in FAMILIES["deepseek_v3"].items() if k != "pad_token_id"}}
    model = load(config)
    tensors = {}
    ds = tmp_path / "ds"
    save_tiny("deepseek_v3", ds)
    header = read_header(ds / "model.safetensors")
    for name, info in header.items():
        if name != "__metadata__":
            tensors[name] = ("BF16", info["shape"])
    extra = {
        "model.layers.2.self_attn.q_a_proj.weight": ("F8_E4M3", [16, 32]),  # an MTP layer beyond num_hidden_layers = 2
        "model.layers.2.eh_proj.weight": ("BF16", [32, 64]),
        "model.layers.1.self_attn.q_a_proj.weight_scale_inv": ("F32", [1, 1]),
    }
    write_safetensors(tmp_path / "model.safetensors", {**tensors, **extra})
    report = verify(model, tmp_path / "model.safetensors")
    assert report.match, report.mismatches
    reasons = {p["tensor"]: p["reason"] for p in report.not_parameters}
    assert "beyond num_hidden_layers" in reasons["model.layers.2.eh_proj.weight"]
    assert "quantisation" in reasons["model.layers.1.self_attn.q_a_proj.weight_scale_inv"]
    assert "buffer" in reasons["model.layers.1.mlp.gate.e_score_correction_bias"]


def test_index_only(tmp_path, capsys):
    total = load("qwen3-8b").count().total
    index = {"metadata": {"total_size": 2 * total}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00005.safetensors",
                                                                  "model.layers.0.self_attn.rotary_emb.inv_freq": "model-00001-of-00005.safetensors"}}
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(path), "--json")
    payload = json.loads(out)
    assert code == 0 and payload["match"] and payload["unit"] == "bytes" and payload["expected"] == 16_381_470_720
    assert payload["not_parameters"][0]["tensor"].endswith("inv_freq")
    index["metadata"]["total_size"] += 2 * 4096
    path.write_text(json.dumps(index))
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(path))
    assert code == 1 and "total_size" in out and "4,096 parameters" not in out and "+8,192 bytes" in out
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(path), "--dtype", "fp32", "--json")
    assert code == 1 and json.loads(out)["expected"] == 4 * total


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{", b"\x02\x00\x00\x00\x00\x00\x00\x00[]", b"\xff" * 16])
def test_bad_checkpoint_is_one_line_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(path))
    assert code == 2 and out.startswith("symparam: error:") and out.count("\n") == 1 and "Traceback" not in out


def test_missing_checkpoint_exit_2(tmp_path, capsys):
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(tmp_path / "nope"))
    assert code == 2 and "no such file" in out


@pytest.mark.parametrize("size, hint", [
    (lambda total: 4 * total, "float32, fp32"),  # an fp32 checkpoint read as bf16: exactly 4 bytes per parameter
    (lambda total: 4 * total + 4096, "float32, fp32"),  # and with a few buffers stored besides
    (lambda total: 1 * total, "float8_e4m3fn, fp8, int8"),
    (lambda total: 2 * total + 8192, None),  # bf16 with 4,096 parameters more: a count mismatch, not a dtype
    (lambda total: 5 * total // 2, None),  # 2.5 bytes per parameter is no dtype's width
])
def test_index_only_dtype_hint(tmp_path, size, hint):
    model = load("qwen3-8b")
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {"total_size": size(model.count().total)}, "weight_map": {"model.embed_tokens.weight": "a.safetensors"}}))
    report = verify(model, path)  # bf16 assumed
    assert not report.match and len(report.mismatches) == 1
    if hint:
        assert f"the width of {hint}: is the checkpoint in another dtype? pass --dtype" in report.mismatches[0]
    else:
        assert "another dtype" not in report.mismatches[0]


def test_a_new_family_is_one_recipe(tmp_path):
    """Checkpoint names come from recipe data, not from verify's code: a checkpoint that calls GPT-2's layer list
    `blocks` matches a user's recipe that extends gpt2 and renames it, and not the shipped one."""
    from symparam.recipes import load_recipe

    config = save_tiny("gpt2", tmp_path)
    header = read_header(tmp_path / "model.safetensors")
    renamed = tmp_path / "renamed" / "model.safetensors"
    renamed.parent.mkdir()
    write_safetensors(renamed, {name.replace(".h.", ".blocks."): (info["dtype"], info["shape"]) for name, info in header.items() if name != "__metadata__"})
    (tmp_path / "blocks.toml").write_text('family = "gpt2_blocks"\nmodel_types = ["gpt2"]\nextends = "gpt2"\n[names.rename]\n\'^blocks\\.\' = "h."\n')
    report = verify(load(config, recipe=load_recipe(tmp_path / "blocks.toml")), renamed)
    assert report.match, report.mismatches
    assert not verify(load(config), renamed).match


@pytest.mark.parametrize(("content", "says"), [
    ((10**12).to_bytes(8, "little") + b"{}", "its header claims 1,000,000,000,000 bytes; symparam reads at most 100,000,000"),
    ((5000).to_bytes(8, "little") + b"{}", "truncated safetensors header (it claims 5,000 bytes, the file holds 2 after the length)"),
])
def test_a_header_length_past_the_cap_or_the_file_is_refused_before_reading(tmp_path, capsys, content, says):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    code, out = run(capsys, "verify", "--model", "qwen3-8b", "--checkpoint", str(path))
    assert code == 2 and says in out and out.count("\n") == 1
