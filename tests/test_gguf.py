"""GGUF sizes against llama.cpp itself: ggml's types through the gguf package's writer and reader, the named mixes
through llama.cpp's converter and quantizer on tiny random models, tensor by tensor (name, type, bytes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import llama_cpp
from symparam.errors import SymparamError
from symparam.memory import gguf
from symparam.model import family, load
from symparam.rules import compile_rule
from symparam.symbols import make

pytestmark = pytest.mark.skipif(llama_cpp.available() is not None, reason=str(llama_cpp.available()))

TYPES = gguf.table()["types"]
MIXES = gguf.table()["mixes"]


def test_qwen3_8b_q4_k_m_matches_the_published_file():
    """llama.cpp's Qwen3-8B Q4_K_M file (measured) holds 5,021,827,072 bytes of tensor data."""
    assert gguf.layout(load("qwen3-8b"), "Q4_K_M").bytes == 5_021_827_072


def test_memory_reports_the_mix(capsys):
    """memory --quant gguf:MIX: the weights as llama.cpp's mix stores them (the architecture's layer masks read)."""
    from symparam.cli import main

    assert main(["memory", "--model", "qwen3-8b", "--quant", "gguf:Q4_K_M", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == 5_021_827_072


# --- types: the gguf package's table, writer and reader ------------------------------------------------------------


def test_types_are_ggml_types():
    g = llama_cpp.gguf()
    for name, t in TYPES.items():
        q = g.GGMLQuantizationType[name]
        assert (int(q), *g.GGML_QUANT_SIZES[q]) == (t["id"], t["block"], t["bytes"]), name


@pytest.mark.parametrize("dtype", list(TYPES))
def test_type_bytes_as_written_and_read(tmp_path: Path, dtype: str):
    """Tensors of each type written by GGUFWriter (quantized by gguf.quants where it can) and read back by GGUFReader:
    each tensor's type and bytes, and the data section with its padding, as symparam counts them."""
    g = llama_cpp.gguf()
    q = g.GGMLQuantizationType[dtype]
    block = TYPES[dtype]["block"]
    shapes = [(3, 2 * max(block, 32)), (1, block), (5, 7 * block), (2, 3, 4 * block)]
    writer = g.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    rng = np.random.default_rng(0)
    for k, shape in enumerate(shapes):
        values = rng.standard_normal(shape).astype(np.float32)
        try:
            data = g.quants.quantize(values, q)
        except (NotImplementedError, g.QuantError):
            data = rng.integers(0, 256, g.quant_shape_to_byte_shape(shape, q), dtype=np.uint8)
        writer.add_tensor(f"t{k}", data, raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors, data_section = llama_cpp.read(tmp_path / "t.gguf")
    expected = {f"t{k}": (dtype, int(gguf.tensor_bytes(dtype, [sp.Integer(x) for x in shape]))) for k, shape in enumerate(shapes)}
    assert {name: (t, n) for name, (t, n, _) in tensors.items()} == expected
    align = gguf.table()["file"]["alignment"]
    assert data_section == sum(-(-n // align) * align for _, n in expected.values())


@pytest.mark.parametrize("name", list(gguf.table()["predicates"]))
def test_predicate_counts(name: str):
    """Each position predicate's closed-form count equals the predicate applied to i = 0..n-1."""
    pred = gguf.table()["predicates"][name]
    rule = compile_rule(pred["where"], name)
    count = sp.sympify(pred["count"], locals={"n": make("n")})
    for n in range(1, 300):
        assert int(count.subs(make("n"), n)) == sum(bool(rule({"n": n}.get, i)) for i in range(n)), (name, n)


# --- names: the converter's TensorNameMap -----------------------------------------------------------------------------


def _indexed(term, path=""):
    """Leaf names with layer index 0 after each repeated module, as a checkpoint names them (fused experts keep none)."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    if term.is_leaf:
        yield path.replace(".0.", ".").replace(".0.", "."), path
        return
    fused = term.key == "experts" and any(c.is_leaf and c.key not in ("weight", "bias") for c in term.children)
    if term.times != 1 and not fused:
        path += ".0"
    for child in term.children:
        yield from _indexed(child, path)


@pytest.mark.parametrize("fam", list(gguf.table()["archs"]))
def test_names_are_the_converters(fam: str):
    """Every GGUF name the table gives a family's tensor is the one TensorNameMap gives for its architecture."""
    g = llama_cpp.gguf()
    t = gguf.table()
    arch = t["archs"][fam][0]
    names = {**t["names"], **t["arch_names"].get(arch, {})}
    tmap = g.get_tensor_name_map(next(a for a, n in g.MODEL_ARCH_NAMES.items() if n == arch), 4)
    checked = 0
    for key, name in _indexed(family(fam).tree):
        ours = names.get(key)
        theirs = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if not isinstance(ours, str) or theirs is None:
            continue  # split experts and renamed buffers: the converter's own code, checked on real files below
        theirs = theirs.replace("blk.0.", "blk.", 1)
        assert ours == (theirs if theirs.endswith((".weight", ".bias")) else theirs + ".weight"), (fam, key)
        checked += 1
    assert checked


# --- mixes: llama.cpp's converter and quantizer on tiny models ----------------------------------------------------------

TINY = {
    "qwen3, GQA 4": dict(model_type="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False),
    "llama, tied, GQA 2, 16 layers": dict(model_type="llama", vocab_size=384, hidden_size=256, intermediate_size=768,
                                          num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "llama, rows off the blocks": dict(model_type="llama", vocab_size=320, hidden_size=160, intermediate_size=200,
                                       num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, tie_word_embeddings=False),
    "deepseek_v3, MLA, 1 dense layer": dict(model_type="deepseek_v3", vocab_size=512, hidden_size=256, intermediate_size=512,
                                            moe_intermediate_size=256, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                            first_k_dense_replace=1, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=4, q_lora_rank=256, kv_lora_rank=256, qk_nope_head_dim=64,
                                            qk_rope_head_dim=32, v_head_dim=64, n_group=1, topk_group=1, tie_word_embeddings=False),
    "gemma3, tied, post-norms": dict(model_type="gemma3_text", vocab_size=512, hidden_size=256, intermediate_size=512,
                                     num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                     sliding_window=64),
    "gpt_oss, 4 experts with biases": dict(model_type="gpt_oss", vocab_size=512, hidden_size=256, intermediate_size=256,
                                           num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
                                           tie_word_embeddings=False),
    "qwen3_moe, 8 experts": dict(model_type="qwen3_moe", vocab_size=512, hidden_size=256, moe_intermediate_size=256,
                                 intermediate_size=512, num_experts=8, num_experts_per_tok=2, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False),
}


def _layout(config, mix):
    model = load(config)
    return gguf.layout(model, mix, masks=gguf.layer_masks(config, model))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each tiny model saved by transformers and converted by llama.cpp's converter (bf16), once."""
    import torch
    import transformers

    out = {}
    for label, config in TINY.items():
        base = tmp_path_factory.mktemp(config["model_type"])
        cfg = transformers.AutoConfig.for_model(**config)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(base / "hf")
        # a tokenizer.json of exactly vocab_size tokens: Gemma's converter cuts the embedding to the tokenizer's size
        vocab = {f"t{k}": k for k in range(cfg.vocab_size)}
        (base / "hf" / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
        llama_cpp.convert(base / "hf", base / "bf16.gguf", "bf16")
        out[label] = (cfg.to_dict(), base)
    return out


@pytest.mark.parametrize("label", list(TINY))
def test_converted_tensors(converted, label: str):
    """The converter's file holds the tensors symparam names, in the types and sizes it says (BF16, norms F32)."""
    config, base = converted[label]
    tensors, data_section = llama_cpp.read(base / "bf16.gguf")
    lay = _layout(config, "BF16")
    assert {name: (t, n) for name, (t, n, _) in tensors.items()} == {name: (t, n) for name, t, n, _ in lay.files}
    assert data_section == lay.bytes


def _imatrix(base: Path) -> dict[str, int]:
    """An importance-vector length for each 2-D or 3-D tensor of the converted file (ne[0] times the experts)."""
    src, _ = llama_cpp.read(base / "bf16.gguf")
    return {name: shape[-1] * (shape[0] if len(shape) == 3 else 1) for name, (_, _, shape) in src.items() if len(shape) >= 2}


# The IQ types' real quantization searches grids (about a minute per tiny model on 2 cores): for those mixes the
# oracle is llama-quantize --dry-run, which takes every type decision the same way and writes no file.
DRY = [m for m, spec in MIXES.items() if spec["base"].startswith("IQ")]


@pytest.mark.parametrize("label", list(TINY))
def test_header_and_tensor_infos(converted, label: str):
    """The fixed header and the tensor infos are the bytes the file spends on them (its metadata measured apart)."""
    config, base = converted[label]
    reader = llama_cpp.gguf().GGUFReader(str(base / "bf16.gguf"))
    infos = sum(p.nbytes for t in reader.tensors for p in t.field.parts)
    metadata = sum(p.nbytes for f in reader.fields.values() if not f.name.startswith("GGUF.") for p in f.parts)
    header = gguf.header_estimate(_layout(config, "BF16"))["header_and_tensor_infos"]
    assert header == 24 + infos
    assert -(-(header + metadata) // 32) * 32 == min(int(t.data_offset) for t in reader.tensors)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("label", list(TINY))
def test_mix_as_llama_quantize_makes_it(converted, label: str, mix: str):
    """llama_model_quantize's file, tensor by tensor: GGUF name, ggml type and bytes, and its tensor data section.
    For the IQ mixes the types are llama.cpp's (its dry run) and the bytes gguf-py's table of ggml's blocks."""
    config, base = converted[label]
    imatrix = _imatrix(base) if MIXES[mix].get("imatrix") else None
    out = base / f"{mix}.gguf"
    try:
        lay = _layout(config, mix)
    except SymparamError:  # a row llama.cpp cannot quantize in this type (Q1_0's 128-weight blocks): it refuses too
        with pytest.raises(RuntimeError, match="no tensor type fallback"):
            llama_cpp.quantize(base / "bf16.gguf", out, MIXES[mix]["ftype"], imatrix, dry_run=True)
        return
    types = llama_cpp.quantize(base / "bf16.gguf", out, MIXES[mix]["ftype"], imatrix, dry_run=mix in DRY)
    assert types == {name: t for name, t, _, _ in lay.files}
    if mix in DRY:
        g = llama_cpp.gguf()
        src, _ = llama_cpp.read(base / "bf16.gguf")
        for name, dtype, n, _ in lay.files:
            block, size = g.GGML_QUANT_SIZES[g.GGMLQuantizationType[dtype]]
            shape = src[name][2]
            assert n == int(np.prod(shape[:-1])) * shape[-1] // block * size, name
        return
    tensors, data_section = llama_cpp.read(out)
    out.unlink()
    assert {name: (t, n) for name, t, n, _ in lay.files} == {name: (t, n) for name, (t, n, _) in tensors.items()}
    assert data_section == lay.bytes


def test_unknown_mix_is_one_line():
    with pytest.raises(SymparamError, match=r"--quant gguf:Q4_K_X: unknown llama.cpp type"):
        gguf.resolve_mix("Q4_K_X")


# --- mixes on real configs: llama.cpp's type selection (its own test API), every catalog family it converts ----------


def _one_preset_per_family() -> list[str]:
    from symparam.config import presets

    seen, out = set(), []
    for name in presets():
        fam = load(name).recipe.family
        if fam in gguf.table()["archs"] and fam not in seen:
            seen.add(fam)
            out.append(name)
    return out


def _dims(shape) -> int:
    return len(shape) - next((k for k, s in enumerate(shape) if s != 1), len(shape))


def _agree_with_llama_cpp(model, masks=None):
    """Every quantized mix: the tensors llama.cpp would quantize, and the type it gives each, as symparam says."""
    t = gguf.table()
    arch, v = gguf.family_arch(model), model.values
    layouts = {}
    for mix, spec in t["mixes"].items():
        if TYPES[spec["base"]]["block"] == 1:
            continue
        try:
            layouts[mix] = gguf.layout(model, mix, masks=masks, imatrix=False)  # the test API reads no imatrix
        except SymparamError:  # llama.cpp throws too (checked on a real file above): a row no fallback fits
            assert TYPES[spec["base"]]["block"] > 32 and spec["base"] not in t["fallback"]
    files = next(iter(layouts.values())).files
    kept = next(iter(layouts.values())).unmapped  # not GGUF names: llama.cpp's name tests do not apply
    unmapped = {name for name, *_ in files if any(k in name for k in kept)}
    desc = dict(architecture=arch, n_embd=v["d"], n_ff=v.get("d_ff", 0), n_layer=v["N"], n_head=v.get("h", 0),
                n_head_kv=v.get("h_kv", v.get("h", 0)), n_expert=v.get("n", 0))
    theirs = llama_cpp.choose_types(desc, [(n, s) for n, _, _, s in files if n not in unmapped], [MIXES[m]["ftype"] for m in layouts])
    for mix, lay in layouts.items():
        chosen = theirs[MIXES[mix]["ftype"]]
        assert {n for n, _, _, s in lay.files if n not in unmapped and gguf.quantizable(n, _dims(s), arch)} == set(chosen), mix
        assert {n: ty for n, ty, _, _ in lay.files if n in chosen} == chosen, mix


@pytest.mark.parametrize("preset", _one_preset_per_family())
def test_real_config_types(preset: str):
    from symparam.config import read_preset

    model = load(preset)
    _agree_with_llama_cpp(model, gguf.layer_masks(read_preset(preset), model))


def test_llama_70b_attn_v_bump():
    """An 80-layer GQA Llama is llama.cpp's 70B type: its attn_v gets Q5_K where a Q3_K or Q4_K would go."""
    model = load("llama-2-7b", overrides={"N": 80, "h_kv": 8})
    assert {t for n, t, _, _ in gguf.layout(model, "Q3_K_S").files if "attn_v" in n} == {"Q5_K"}
    _agree_with_llama_cpp(model)


@pytest.mark.parametrize("preset", _one_preset_per_family())
def test_rows_add_up_to_the_file(preset: str):
    """The rows (a tensor's copies that share a type, as formulas) give the bytes of the file's tensors one by one,
    which the tests above hold against llama.cpp: each row's copies and bytes, and the padded total."""
    from symparam.config import read_preset

    model = load(preset)
    lay = gguf.layout(model, "Q4_K_M", masks=gguf.layer_masks(read_preset(preset), model))
    by_row: dict[tuple[str, str], int] = {}
    for t in lay.tensors:
        by_row[(t.name, t.dtype)] = by_row.get((t.name, t.dtype), 0) + lay.exact(t.copies * t.bytes_each)
    by_file: dict[tuple[str, str], int] = {}
    for name, dtype, n, _ in lay.files:
        key = (re.sub(r"^blk\.\d+\.", "blk.", name), dtype)
        by_file[key] = by_file.get(key, 0) + n
    assert by_row == by_file
    assert lay.bytes == sum(-(-n // 32) * 32 for _, _, n, _ in lay.files)
