"""Stored layouts (memory/storage.py) against the quantizers themselves: transformers' integrations on the meta device,
bitsandbytes' and compressed-tensors' packing on CPU, the dequantizer of gpt-oss's MXFP4; and two published checkpoints."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

from families import random_config, tiny_config
from quantized import SAFETENSORS, compare, listing, packed_bnb, replaced
from symparam import load
from symparam.cli import main
from symparam.errors import SymparamError
from symparam.memory import storage

FP8 = {"quant_method": "fp8", "weight_block_size": [16, 16]}  # blocks smaller than the tiny models' sizes: ceil() at work
GROUP = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False}}
CT = {  # compressed-tensors configs as llm-compressor writes them
    "nvfp4": {"format": "nvfp4-pack-quantized", "config_groups": {"group_0": {**GROUP, "input_activations": {**GROUP["weights"], "dynamic": "local"}}}},
    "nvfp4a16": {"format": "nvfp4-pack-quantized", "config_groups": {"group_0": GROUP}},
    "fp8-channel": {"format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                                                                                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}}}},
    "fp8-static": {"format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
                                                                               "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}}}},
    "fp8-block": {"format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [16, 16], "symmetric": True, "dynamic": False}}}},
    "w4a16": {"format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": True, "dynamic": False}}}},
    "w8a16": {"format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False}}}},
}
BNB = {
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "fp4": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4"},
    "nf4-dq": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
    "int8": {"load_in_8bit": True},
}
# Families whose stored layout differs from transformers' FP8 module tree, and why (exact or nothing: said, not hidden).
FP8_DIFFERENCES = {
    "gpt_oss": "FP8Experts refuses biased experts (transformers asserts); gpt-oss ships MXFP4",
    "falcon": "FalconLinear subclasses nn.Linear: transformers' FP8 swap (type is nn.Linear) leaves it, symparam packs it",
    "blt": "the patcher's lm_head: transformers' FP8 swap skips every module named lm_head, peft's all-linear adapts it (only the output embedding is left out): no module kind says both",
    "gemma3n_text": "AltUp projections are nn.Linear that the recipe writes as tensors of its own block",
    "zamba2": "a shared block reused by several layers: transformers swaps one copy, checkpoints store it once",
    "reformer": "its LM head is lm_head.decoder, which transformers' skip list (the output embedding) does not name",
    "apertus": "scalar parameters: transformers holds shape [], the recipe [1] (the same bytes)",
    "doge": "retrieval-expert tables stacked [n, d] in transformers, one row per expert in the recipe (the same bytes)",
    "recurrent_gemma": "block-diagonal gates stacked [h, w, w] in transformers, one block per copy in the recipe (the same bytes)",
    "inkling_text": "float32 router and gate parameters (_keep_in_fp32_modules_strict) not yet marked F32 in the recipe",
    "inkling2_text": "float32 router and gate parameters (_keep_in_fp32_modules_strict) not yet marked F32 in the recipe",
    "deepseek_v4": "the compressors' and indexer's projections (_keep_in_fp32_modules, kept BF16) not yet marked kept, and the routers' buffers (tid2eid, e_score_correction_bias) not in the recipe's tree",
    "hy_v4": "float32 hyper-connection parameters and head (_keep_in_fp32_modules_strict) not yet marked F32 in the recipe",
    "longcat_flash": "transformers stacks the zero experts' unused gate_up slice into the fused experts",
}
NOT_BUILT = {"aria_text", "dbrx", "emu3", "jetmoe", "lfm2_moe", "nemotron_h", "classic"}  # FP8Experts cannot read their configs' expert keys


def families() -> list[str]:
    """Every family transformers' FP8 quantizer can build, less those whose differences are documented above."""
    from symparam.recipes import REGISTRY

    return [h["family"] for h in REGISTRY.families() if h["family"] not in NOT_BUILT | set(FP8_DIFFERENCES)]


def stored(config: dict, quant: str | None = None) -> dict:
    model = load(config)
    return storage.layout(model, quant).report(model.values)


def with_quantization(config: dict, qc: dict) -> dict:
    return {**config, "quantization_config": qc}


@pytest.mark.parametrize("family", families())
def test_fp8_block_against_transformers(family):
    """FP8Linear / FP8Experts as transformers' FineGrainedFP8 quantizer puts them in place, every tensor's shape and dtype."""
    config = with_quantization(tiny_config(family), FP8)
    assert not compare(listing(replaced(config, FP8)), stored(config))


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "gpt2", "deepseek_v3", "gemma3_text"])
@pytest.mark.parametrize("scheme", list(CT))
def test_compressed_tensors_against_transformers(family, scheme):
    """compressed-tensors applied and compressed by transformers on the meta device; experts compared apart (below)."""
    qc = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "quantization_status": "compressed", **CT[scheme]}
    config = with_quantization(tiny_config(family), qc)
    assert not compare(listing(replaced(config, qc)), stored(config), experts="skip")


def test_compressed_tensors_asymmetric_zero_points_are_packed_on_save():
    """On the meta device compressed-tensors leaves zero points unpacked; saving packs them to int32 along the rows
    (PackedQuantizationCompressor.compress, run here on CPU), and that is what the checkpoint holds."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": False, "dynamic": False}
    qc = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "format": "pack-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    config = with_quantization(tiny_config("llama"), qc)
    oracle = listing(replaced(config, qc))
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    for name, ((rows, groups), _) in [(n, v) for n, v in oracle.items() if n.endswith(".weight_zero_point")]:
        packed = PackedQuantizationCompressor.compress({"weight": torch.randn(rows, groups * 16), "weight_scale": torch.ones(rows, groups),
                                                        "weight_zero_point": torch.zeros(rows, groups, dtype=torch.int8)}, scheme)
        oracle[name] = (tuple(packed["weight_zero_point"].shape), SAFETENSORS[packed["weight_zero_point"].dtype])
    assert not compare(oracle, stored(config), experts="skip")


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "gpt2", "mixtral"])
@pytest.mark.parametrize("scheme", list(BNB))
def test_bitsandbytes_against_its_packing(family, scheme):
    """Linear4bit / Linear8bitLt put in place by transformers, each packed by bitsandbytes on CPU as it saves it; with
    double quantization the quant_state JSON holds nested_offset in as many digits as its value needs (not a formula)."""
    qc = {"quant_method": "bitsandbytes", **BNB[scheme]}
    config = with_quantization(tiny_config(family), qc)
    diff = compare(packed_bnb(config, qc), stored(config), experts="skip")
    if scheme.endswith("-dq"):
        offsets = {k: v for k, v in diff.items() if ".quant_state." in k}
        for theirs, mine in offsets.values():
            (shape, _), = theirs
            (estimate, _), = mine
            assert abs(shape[0] - estimate[0]) <= 18  # the offset's digits: 1 to 18 characters, counted as 18
        diff = {k: v for k, v in diff.items() if k not in offsets}
    assert not diff


def test_experts_are_stored_one_by_one_where_checkpoints_do():
    """compressed-tensors and bitsandbytes leave transformers 5's fused experts as they are; published checkpoints
    quantize each expert. symparam follows the checkpoints: every routed expert's projection is packed."""
    report = stored(with_quantization(tiny_config("qwen3_moe"), {"quant_method": "compressed-tensors", "ignore": ["lm_head"], **CT["nvfp4"]}))
    names = {t["name"]: t for t in report["tensors"]}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        packed = names[f"model.layers.mlp.experts.{proj}.weight_packed"]
        assert packed["count"] == 6 * 4 and packed["dtype"] == "U8"  # 6 layers x 4 experts
    assert "model.layers.mlp.experts.gate_up_proj" not in names


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=random_config("qwen3_moe"))
def test_fp8_random_configs(config):
    assume(config.get("decoder_sparse_step") != 0)  # transformers divides by it
    moe = config.get("moe_intermediate_size")
    if moe is not None and moe % 16 > 0 and moe > 8:  # transformers stacks gate and up: ceil(2*d_moe/16) scale rows, checkpoints 2*ceil(d_moe/16)
        config = {**config, "moe_intermediate_size": 16 * max(1, moe // 16)}
    config = with_quantization(config, FP8)
    assert not compare(listing(replaced(config, FP8)), stored(config))


# --- MXFP4 (gpt-oss) -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["gpt_oss", "gpt-oss-20b", "gpt-oss-120b"])
def test_mxfp4_against_transformers(source):
    """gpt-oss's experts: Mxfp4GptOssExperts holds the packed bytes (two values per byte) that the checkpoint's _blocks
    hold, and transformers' own dequantizer turns blocks and scales of symparam's shapes into the bf16 experts' shape."""
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts, _convert_moe_packed_tensors

    from oracle import hf_config

    tiny = {**tiny_config("gpt_oss"), "hidden_size": 64, "intermediate_size": 96}  # sizes in blocks of 32
    config = with_quantization(tiny, {"quant_method": "mxfp4"}) if source == "gpt_oss" else _preset(source)
    report = stored(config)
    cfg = hf_config(config)
    with torch.device("meta"):
        experts = Mxfp4GptOssExperts(cfg)
    parts = {t["name"]: t for t in report["tensors"]}
    for proj in ("gate_up_proj", "down_proj"):
        blocks, scales = parts[f"model.layers.mlp.experts.{proj}_blocks"], parts[f"model.layers.mlp.experts.{proj}_scales"]
        packed = getattr(experts, proj)
        assert blocks["dtype"] == scales["dtype"] == "U8" == SAFETENSORS[packed.dtype]
        assert blocks["bytes"] // blocks["count"] == packed.numel()  # bytes per layer
        n, rows, groups, half = blocks["dims"]
        if source == "gpt_oss":  # dequantize real (zero) tensors of these shapes on CPU: the experts' bf16 shape comes out
            weight = _convert_moe_packed_tensors(torch.zeros(n, rows, groups, half, dtype=torch.uint8), torch.full(tuple(scales["dims"]), 127, dtype=torch.uint8))
            assert weight.shape == (n, groups * half * 2, rows)  # [n, d_in, d_out]: transformers' GptOssExperts layout


def _preset(name: str) -> dict:
    from symparam.config import read_preset

    return read_preset(name)


# --- published checkpoints -----------------------------------------------------------------------------------------


def test_deepseek_v3_fp8_checkpoint():
    """deepseek-ai/DeepSeek-V3's safetensors headers (measured): 688,574,839,360 bytes of tensor data in 91,991 tensors."""
    report = stored(_preset("deepseek-v3"))
    assert report["bytes"] == 688_574_839_360
    assert report["tensor_count"] == 91_991
    names = {t["name"]: t for t in report["tensors"] if "extra" not in t}
    assert names["model.layers.mlp.gate.e_score_correction_bias"]["dtype"] == "F32"
    assert names["model.layers.self_attn.q_a_proj.weight_scale_inv"]["dims"] == [12, 56]  # ceil(1536/128), ceil(7168/128)


def test_gpt_oss_mxfp4_checkpoint():
    """openai/gpt-oss-20b's safetensors headers (measured): 13,761,264,768 bytes; 17 bytes per 32 expert weights."""
    assert stored(_preset("gpt-oss-20b"))["bytes"] == 13_761_264_768


def test_count_says_what_the_checkpoint_stores_beyond_the_parameters(capsys):
    assert main(["count", "--model", "deepseek-v3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    extras = {e["tensor"]: e["values"] for e in out["checkpoint_extras"]}
    assert extras["model.layers.mlp.gate.e_score_correction_bias"] == 58 * 256
    assert out["stored"]["bytes"] == 688_574_839_360 and out["total"] == 671_026_404_352  # counting does not change
    assert main(["count", "--model", "deepseek-v3"]) == 0
    text = capsys.readouterr().out
    assert "stored in the checkpoint" in text and "multi-token-prediction" in text


def test_memory_uses_the_stored_layout(capsys):
    assert main(["memory", "--model", "gpt-oss-120b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights_bytes"] == out["stored"]["bytes"] and out["stored"]["format"] == "mxfp4"
    assert main(["memory", "--model", "gpt-oss-120b", "--quant", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stored"] is None


@pytest.mark.parametrize("args, field", [
    (["--quant", "gptq-5bit-g128"], "bits"),
    (["--quant", "awq-4bit-g100"], "group_size"),
    (["--quant", "gptq-4bit-g0"], "group_size"),
    (["--quant", "nonsense"], "--quant"),
    *([] if importlib.util.find_spec("symparam.memory.gguf") else [(["--quant", "gguf:Q4_K_M"], "--quant gguf:Q4_K_M")]),  # until GGUF types exist
])
def test_bad_quant(args, field, capsys):
    assert main(["memory", "--model", "qwen3-8b", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


@pytest.mark.parametrize("qc, field", [
    ({"quant_method": "hqq-unknown"}, "quantization_config.quant_method"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [-128, 128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "gptq", "bits": 5, "group_size": 128}, "quantization_config.bits"),
    ({"quant_method": "awq", "bits": 4, "group_size": 100}, "quantization_config.group_size"),
    ("fp8", "quantization_config"),
])
def test_bad_quantization_config(qc, field, tmp_path, capsys):
    config = {**_preset("qwen3-8b"), "quantization_config": qc}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["memory", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err


def test_a_new_format_is_one_table_entry():
    """No format name in storage.py: every one is read from formats.toml."""
    from pathlib import Path

    code = Path(storage.__file__).read_text(encoding="utf-8")
    for name in storage.formats():
        assert not re.search(rf"[\"']{re.escape(name)}[\"']", code), name
    with pytest.raises(SymparamError):
        storage.layout(load("qwen3-8b"), "fp8-nope")


# --- verify: a quantized checkpoint part by part -------------------------------------------------------------------

WIDTH = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1, "I8": 1, "I32": 4, "I64": 8}


def write_headers(path, found: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """A safetensors file with these tensors' headers; its data is a hole (verify reads headers only)."""
    header, offset = {}, 0
    for name, (shape, dtype) in found.items():
        size = WIDTH[dtype] * int(torch.tensor(shape).prod().item()) if shape else WIDTH[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    data = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(data).to_bytes(8, "little") + data)
        f.truncate(8 + len(data) + offset)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_v3"])
def test_verify_reads_a_quantized_checkpoint_part_by_part(family, tmp_path, capsys):
    """A checkpoint written from transformers' FP8 module tree (experts one by one, as published checkpoints store them)
    matches; without one scale tensor, verify names that part."""
    from quantized import per_expert

    config = with_quantization({**tiny_config(family), "num_nextn_predict_layers": 0}, FP8)  # transformers builds no MTP layer
    found = per_expert(listing(replaced(config, FP8)))
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_headers(tmp_path / "model.safetensors", found)
    assert main(["verify", "--config", str(tmp_path / "config.json"), "--checkpoint", str(tmp_path / "model.safetensors")]) == 0
    assert "compared part by part" in capsys.readouterr().out
    scale = next(n for n in found if n.endswith("o_proj.weight_scale_inv"))
    write_headers(tmp_path / "model.safetensors", {n: v for n, v in found.items() if n != scale})
    assert main(["verify", "--config", str(tmp_path / "config.json"), "--checkpoint", str(tmp_path / "model.safetensors")]) == 1
    assert "o_proj.weight_scale_inv: expected" in capsys.readouterr().out


# --- derivations ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant", [None, "fp8-block", "mxfp4", "nvfp4", "fp8-dynamic", "w4a16", "gptq-4bit-g128", "awq-4bit-g128", "nf4-dq", "int8", "modelopt-nvfp4", "modelopt-fp8"])
def test_derivations_show_the_storage_formula_in_both_languages(quant):
    from symparam.derive import derive
    from symparam.render import render
    from test_render import untranslated

    model = load("deepseek-v3") if quant is None else load("qwen3-30b-a3b")
    d = derive(model, quant)
    assert untranslated(d) == set()
    assert d.storage.value == stored(_preset("deepseek-v3") if quant is None else _preset("qwen3-30b-a3b"), quant)["bytes"]
    for lang in ("en", "zh"):
        text = render(d, "markdown", lang)
        assert r"\mathrm{bytes}(d_{out}, d_{in})" in text and f"{d.storage.value:,}" in text
    if quant is None:
        assert r"d_{in} d_{out} + 4 \left\lceil{\frac{d_{in}}{128}}\right\rceil \left\lceil{\frac{d_{out}}{128}}\right\rceil" in render(d, "markdown")
