"""Independent parameter counts, per tensor: transformers models built on the meta device, and a plain-torch classic transformer."""

from __future__ import annotations

import functools
import json
import logging
import re
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="transformers")
warnings.filterwarnings("ignore", message="Initializing zero-element tensors")

ROUTED = r"\.experts\."  # routed-expert tensors (a regex on the name); shared experts live under ".shared_experts."
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
PER_TOKEN_KEYS = ("num_experts_per_tok", "moe_k", "top_k", "moe_topk")
INDEX = re.compile(r"\.\d+(?=\.|$)")  # layer and expert indices in a parameter name


def normal(name: str) -> str:
    """A parameter name with its layer and expert indices left out: model.layers.3.mlp -> model.layers.mlp."""
    return INDEX.sub("", name)


@dataclass(frozen=True)
class Oracle:
    """What the reference implementation holds, per tensor name (indices left out), and its routing."""

    tensors: dict[str, int]  # normalised name -> elements over all layers and experts (tied tensors once)
    experts: int  # n, routed experts per MoE layer (0 for a dense model)
    per_token: int | None  # k, experts each token visits
    routed: str = ROUTED  # which tensors are routed experts, a regex on ".name"
    stacks: dict[str, int] = field(default_factory=dict)  # experts stacked in a routed 3-D tensor (LongCat stacks n + zero)

    @property
    def total(self) -> int:
        return sum(self.tensors.values())

    @property
    def active_tensors(self) -> dict[str, Fraction]:
        """Per tensor, what one token uses: k/n of each routed-expert tensor, all of every other."""
        def share(name: str) -> Fraction:  # k of the experts the tensor stacks: k/n, or k/E of a stack of E
            return Fraction(self.per_token or 0, self.stacks.get(name, self.experts)) if self.experts else Fraction(1)

        return {name: n * share(name) if re.search(self.routed, f".{name}") else Fraction(n) for name, n in self.tensors.items()}

    @property
    def active(self) -> int:
        value = sum(self.active_tensors.values(), Fraction(0))
        assert value.denominator == 1, value
        return int(value)


def tensors(module: nn.Module) -> dict[str, int]:
    """named_parameters() per normalised name (a tied tensor appears once)."""
    out: dict[str, int] = {}
    for name, p in module.named_parameters():
        out[normal(name)] = out.get(normal(name), 0) + p.numel()
    return out


def hf_config(config: dict[str, Any]):
    """The transformers config object of a config.json dict (model_type picks the class)."""
    from transformers import AutoConfig

    fields = {key: value for key, value in config.items() if key != "model_type"}
    return AutoConfig.for_model(config["model_type"], **fields)


MODEL_CLASSES = ("AutoModelForCausalLM", "AutoModelForImageTextToText")  # a text model's classes, the first that builds
WRAPPER_CLASSES = MODEL_CLASSES[::-1]  # a multimodal config: the whole model first (it ties its head by the wrapper's flag)
LANGUAGE_MODEL = re.compile(r"^(model\.language_model\.|language_model\.model\.|language_model\.(?=lm_head\.))")  # a wrapper's language model


def hf_model(config: dict[str, Any], device: str = "meta", whole: bool | None = None) -> nn.Module:
    """The transformers model of `config` (a config.json dict with model_type), on the meta device by default: its
    causal LM, or for a multimodal config (whole, by default where it has a text_config) the whole model first."""
    import transformers

    cfg = hf_config(config)
    classes = WRAPPER_CLASSES if ("text_config" in config if whole is None else whole) else MODEL_CLASSES
    for cls in classes:
        try:
            with torch.device(device):
                return getattr(transformers, cls).from_config(cfg)
        except Exception as e:  # not this auto class's config, or a whole model that needs more (Emu3's vocabulary map)
            if cls == classes[-1] or not (isinstance(e, ValueError) and "Unrecognized configuration class" in str(e) or classes is WRAPPER_CLASSES):
                raise
    raise AssertionError("unreachable")


@functools.cache
def meta_model(config_json: str, whole: bool | None = None) -> nn.Module:
    """One meta build per config (as sorted JSON), shared by every test that needs it."""
    return hf_model(json.loads(config_json), whole=whole)


def language_tensors(found: dict[str, int]) -> dict[str, int]:
    """The language model's tensors of a multimodal wrapper, named as the text model names them (vision and audio
    towers and their projectors left out); a text model's tensors as they are."""
    if not any(LANGUAGE_MODEL.match(name) for name in found):
        return found
    rename = lambda name: "" if name.startswith("language_model.lm_head.") else "model."  # noqa: E731
    return {LANGUAGE_MODEL.sub(rename(name), name): n for name, n in found.items() if LANGUAGE_MODEL.match(name) or name.startswith("lm_head.")}


def routing(cfg: Any, experts_key: str | None = None, per_token_key: str | None = None) -> tuple[int, int | None]:
    """(n, k) as the built config holds them, read from the keys families use (or the family's own keys)."""
    cfg = getattr(cfg, "text_config", None) or cfg

    def get(key: str) -> Any:  # a dotted key reads a sub-config (DBRX's ffn_config.moe_num_experts)
        value = cfg
        for part in key.split("."):
            value = getattr(value, part, None)
        return value

    def one(value: Any) -> Any:  # a value per layer (Hunyuan's moe_topk list) whose entries agree is that value
        return value[0] if isinstance(value, list) and value and all(v == value[0] for v in value) else value

    read = lambda keys: next((one(get(key)) for key in keys if isinstance(one(get(key)), int) and one(get(key))), None)  # noqa: E731
    return read((experts_key,) if experts_key else EXPERT_COUNT_KEYS) or 0, read((per_token_key,) if per_token_key else PER_TOKEN_KEYS)


def hf_oracle(config: dict[str, Any], routed: str = ROUTED, experts: str | None = None, per_token: str | None = None) -> Oracle:
    """The oracle for a transformers family: the model built from `config`, per tensor, with its routing (a family's
    tests/families hints may name its routed tensors and its n and k keys: [oracle] routed, experts, per_token)."""
    model = meta_model(json.dumps(config, sort_keys=True))
    found = language_tensors(tensors(model))
    n, k = routing(model.config, experts, per_token) if any(re.search(routed, f".{name}") for name in found) else (0, None)
    stacks = {normal(name): p.shape[0] for name, p in model.named_parameters() if p.ndim == 3 and re.search(routed, f".{name}")}
    return Oracle(found, n, k, routed, language_tensors(stacks))


class Classic(nn.Module):
    """The textbook pre-LN decoder from torch.nn parts, independent of symparam and transformers."""

    def __init__(self, V: int, d: int, N: int, h: int, d_ff: int, positions: int | None, final_norm: bool, tied: bool):
        super().__init__()
        self.embed = nn.Embedding(V, d)
        self.pos = nn.Embedding(positions, d) if positions else None
        layer = dict(d_model=d, nhead=h, dim_feedforward=d_ff, norm_first=True, bias=True, batch_first=True)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(**layer) for _ in range(N))
        self.norm = nn.LayerNorm(d) if final_norm else None
        self.head = nn.Linear(d, V, bias=False)
        if tied:
            self.head.weight = self.embed.weight


def classic_oracle(config: dict[str, Any]) -> Oracle:
    """The oracle for the `classic` family, with this family's documented defaults (d_ff = 4d, untied, no extras)."""
    d = config["hidden_size"]
    with torch.device("meta"):
        model = Classic(
            V=config["vocab_size"],
            d=d,
            N=config["num_hidden_layers"],
            h=config["num_attention_heads"],
            d_ff=config.get("intermediate_size") or 4 * d,
            positions=(config.get("n_positions") or config.get("max_position_embeddings")) if config.get("learned_positions") else None,
            final_norm=bool(config.get("final_norm", False)),
            tied=bool(config.get("tie_word_embeddings", False)),
        )
    return Oracle(tensors(model), 0, None)


def oracle(config: dict[str, Any], **routing_hints: str) -> Oracle:
    """The reference count of any supported config dict."""
    return classic_oracle(config) if config["model_type"] == "classic" else hf_oracle(config, **routing_hints)


@functools.cache
def trained_model(config_json: str, dtype: str) -> nn.Module:
    """The tiny random transformers model of a config on CPU, cast to `dtype` and in training mode (built once)."""
    import transformers

    torch.manual_seed(0)
    cfg = hf_config(json.loads(config_json))
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    except ValueError:  # attention-free (Mamba): transformers refuses sdpa, there is no attention backend to choose
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return model.to({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]).train()


def saved_bytes(config: dict[str, Any], dtype: str = "bf16", attention: str = "sdpa", checkpointing: bool = False,
                batch: int = 2, seq: int = 5, modules: set[str] | None = None) -> dict[str, int]:
    """What autograd keeps for backward in one training forward with the loss of the tiny random transformers model of
    `config` on CPU: bytes of every storage a `saved_tensors_hooks` pack hook sees, once, parameters and buffers
    excluded, attributed to the module whose forward allocated it (layer indices left out; folded up to the nearest of
    `modules`, symparam's modules; "(inputs)" for the batch)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    model = trained_model(json.dumps(config, sort_keys=True), dtype)
    if model._supports_sdpa or attention == "eager":
        model.set_attn_implementation(attention)
    if checkpointing:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    stack, created, alive = [""], {}, []

    def enter(name: str):
        return lambda module, args: stack.append(name)

    def leave(module, args, output) -> None:
        stack.pop()

    hooks = []
    for name, module in model.named_modules():
        hooks += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]

    class Creators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    alive.append(t)  # held, so no later tensor reuses its address
                    created.setdefault(t.untyped_storage().data_ptr(), stack[-1])
            return out

    saved: dict[int, tuple[int, str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights and ptr not in saved:
            saved[ptr] = (t.untyped_storage().nbytes(), created.get(ptr, "(inputs)"))
        return t

    generator = torch.Generator().manual_seed(batch * 1000 + seq)
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (batch, seq), generator=generator)
    try:
        with Creators(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids)
    finally:
        for h in hooks:
            h.remove()
    out: dict[str, int] = {}
    for nbytes, creator in saved.values():
        name = normal(creator)
        while modules is not None and name not in modules and name not in ("", "(inputs)"):
            name = name.rpartition(".")[0]
        out[name] = out.get(name, 0) + nbytes
    return out
