"""The oracle for stored layouts: transformers' own quantizer integrations applied to a model built on the meta device,
as from_pretrained does before loading weights, and the formats' packing code run on CPU where the meta build holds
no stored layout (bitsandbytes packs when a weight reaches its device; MXFP4's scales live outside the module)."""

from __future__ import annotations

import logging
import re
import warnings
from collections import defaultdict
from typing import Any

import torch

from oracle import LANGUAGE_MODEL, hf_config

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

INDEX = re.compile(r"\.\d+(?=\.|$)")
SAFETENSORS = {  # torch dtype -> the name safetensors writes
    torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float8_e4m3fn: "F8_E4M3", torch.uint8: "U8",
    torch.int8: "I8", torch.int32: "I32", torch.int64: "I64", torch.float8_e8m0fnu: "F8_E8M0",
}
SPLIT = {"gate_up_proj": ("gate_proj", "up_proj")}  # a fused expert projection -> the per-expert matrices checkpoints store


def build(config: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The causal LM of a config on the meta device, in the checkpoint's dtype, with what its class keeps in float32
    whatever the dtype (_keep_in_fp32_modules_strict) in float32, as from_pretrained loads it."""
    import transformers

    cfg = hf_config(config)
    cls = transformers.AutoModelForImageTextToText if "text_config" in config else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(cfg, dtype=dtype)
    strict = getattr(model, "_keep_in_fp32_modules_strict", None) or []
    for name, t in model.state_dict(keep_vars=True).items():
        if any(re.search(rf"(^|\.){re.escape(key)}(\.|$)", name) for key in strict) and t.is_floating_point():
            t.data = t.data.to(torch.float32)
    return model


def quantizer(quantization_config: dict[str, Any]):
    """transformers' quantizer for a config, as from_pretrained makes it for a pre-quantized checkpoint; its environment
    checks (a GPU, kernels) are not run: only the module replacement is wanted."""
    from transformers.quantizers.auto import AutoHfQuantizer

    q = AutoHfQuantizer.from_config(dict(quantization_config), pre_quantized=True)
    q.use_fp8_kernel = False  # compressed-tensors' optional FP8 kernels: the regular compressed route
    return q


def replaced(config: dict[str, Any], quantization_config: dict[str, Any]) -> torch.nn.Module:
    """The model with the format's modules in place, before any weight is loaded."""
    model = build(config)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as from_pretrained sets it while the quantizer builds its modules
    try:
        quantizer(quantization_config).preprocess_model(model, dtype=torch.bfloat16, device_map={"": "cpu"})
    finally:
        torch.set_default_dtype(default)
    return model


def listing(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every parameter and persistent buffer (its state_dict: what a checkpoint holds) with shape and dtype, by full
    name (the language model's names for a wrapper), tied tensors once."""
    out = {}
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        if LANGUAGE_MODEL.match(name):
            name = LANGUAGE_MODEL.sub("model.", name)
        elif name.startswith(("model.vision", "model.multi_modal", "vision", "multi_modal")):
            continue
        out[name] = (tuple(t.shape), SAFETENSORS[t.dtype])
    return out


def grouped(found: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, dict[tuple[tuple[int, ...], str], int]]:
    """Per name with indices left out: each (shape, dtype) and how many tensors have it."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for name, key in found.items():
        out[INDEX.sub("", name)][key] += 1
    return {name: dict(v) for name, v in out.items()}


def symparam_grouped(report: dict[str, Any]) -> dict[str, dict[tuple[tuple[int, ...], str], int]]:
    """symparam's stored parts in the same form: name -> {(shape, dtype): tensors}, at the config's values."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for part in report["tensors"]:
        out[part["name"]][(tuple(part["dims"]), part["dtype"])] += part["count"]
    return {name: dict(v) for name, v in out.items()}


def bnb_4bit_packed(shape: tuple[int, int], quant_type: str, double: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """What transformers saves for one Linear4bit of this shape: bitsandbytes' own packing of a bf16 weight on CPU
    (quantize_4bit, then the QuantState as_dict(packed=True) that Params4bit writes beside the weight)."""
    import bitsandbytes.functional as F

    weight = torch.randn(*shape, dtype=torch.bfloat16)
    packed, state = F.quantize_4bit(weight, blocksize=64, quant_type=quant_type, compress_statistics=double)
    out = {"weight": (tuple(packed.shape), SAFETENSORS[packed.dtype])}
    out |= {f"weight.{k}": (tuple(v.shape), SAFETENSORS[v.dtype]) for k, v in state.as_dict(packed=True).items()}
    return out


def bnb_8bit_packed(shape: tuple[int, int], bias: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """What transformers saves for one Linear8bitLt of this shape: bitsandbytes' state_dict after int8 packing on CPU."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear8bitLt(shape[1], shape[0], bias=bias, has_fp16_weights=False)
    layer.weight = bnb.nn.Int8Params(torch.randn(*shape, dtype=torch.float16), requires_grad=False, has_fp16_weights=False)
    layer = layer.to("cpu")
    return {k: (tuple(v.shape), SAFETENSORS[v.dtype]) for k, v in layer.state_dict().items() if k != "bias"}


def packed_bnb(config: dict[str, Any], quantization_config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The checkpoint transformers writes for a bitsandbytes config: the meta model with its Linear4bit / Linear8bitLt
    in place, each replaced module's stored tensors from bitsandbytes' packing on CPU, every other tensor as it is."""
    import bitsandbytes as bnb

    model = replaced(config, quantization_config)
    out = listing(model)
    cache: dict[tuple, dict] = {}
    for name, module in model.named_modules():
        if LANGUAGE_MODEL.match(name):
            name = LANGUAGE_MODEL.sub("model.", name + ".").rstrip(".")
        if isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            shape = (module.out_features, module.in_features)
            if isinstance(module, bnb.nn.Linear4bit):
                key = (shape, quantization_config.get("bnb_4bit_quant_type", "fp4"), bool(quantization_config.get("bnb_4bit_use_double_quant")))
                stored = cache.setdefault(key, bnb_4bit_packed(*key))
            else:
                stored = cache.setdefault((shape,), bnb_8bit_packed(shape, False))
            del out[f"{name}.weight"]
            out |= {f"{name}.{k}": v for k, v in stored.items()}
            if module.bias is not None:
                out[f"{name}.bias"] = (tuple(module.bias.shape), "BF16")
    return out


def per_expert(found: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, tuple[tuple[int, ...], str]]:
    """transformers 5's fused expert tensors [n, rows, columns] (and FP8Experts' scales) written as published checkpoints
    store them, one matrix per expert and projection, gate_up_proj split in two: what transformers' conversion mapping
    merges when it loads such a checkpoint."""
    out = {}
    for name, (shape, dtype) in found.items():
        fused = re.fullmatch(r"(.*\.experts)\.(\w+?)(_scale_inv)?", name)
        if fused is None or len(shape) != 3:
            out[name] = (shape, dtype)
            continue
        base, proj, scale = fused.groups()
        parts = SPLIT.get(proj, (proj,))
        assert shape[1] % len(parts) == 0, (name, shape)
        for j in range(shape[0]):
            for part in parts:
                out[f"{base}.{j}.{part}.weight{'_scale_inv' if scale else ''}"] = ((shape[1] // len(parts), shape[2]), dtype)
    return out


def compare(oracle: dict[str, tuple[tuple[int, ...], str]], report: dict, experts: str = "map") -> dict[str, tuple]:
    """Differences per tensor name (indices left out) between the oracle's tensors and symparam's stored parts, the
    checkpoint's extras (an MTP layer transformers does not build) left out. Experts: "map" compares them per expert
    (formats whose transformers module packs the experts), "skip" leaves them out (formats whose transformers module
    tree keeps 3-D experts unquantized while checkpoints quantize each one)."""
    mine = symparam_grouped({**report, "tensors": [t for t in report["tensors"] if "extra" not in t]})
    theirs = grouped(per_expert(oracle) if experts == "map" else oracle)
    names = set(mine) | set(theirs)
    if experts == "skip":
        names = {n for n in names if ".experts." not in n}
    return {n: (theirs.get(n), mine.get(n)) for n in sorted(names) if theirs.get(n) != mine.get(n)}
