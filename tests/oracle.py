"""Independent parameter counts, per tensor: transformers models built on the meta device, and a plain-torch classic transformer."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import warnings
import weakref
from collections.abc import Callable
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
LANGUAGE_MODEL = re.compile(r"^(model\.language_model\.|language_model\.model\.|language_model\.(?=lm_head\.))")  # a wrapper's language model, by name (tests/quantized.py)
LANGUAGE_KEYS = ("text_config", "llm_config", "language_config")  # where wrappers keep their language model (legacy names too)
WHOLE = ("MULTIMODAL_LM", "IMAGE_TEXT_TO_TEXT", "SEQ_TO_SEQ_CAUSAL_LM", "SPEECH_SEQ_2_SEQ", "CAUSAL_LM", "TEXT_TO_WAVEFORM")  # a wrapper's model: the first mapping that has it


def whole_class(model_type: str):
    """The class transformers builds a multimodal config as: the whole model with its LM head (image-text, audio, ...)."""
    import transformers
    from transformers.models.auto import modeling_auto

    name = next(m[model_type] for m in (getattr(modeling_auto, f"MODEL_FOR_{w}_MAPPING_NAMES") for w in WHOLE) if model_type in m)
    return getattr(transformers, name if isinstance(name, str) else name[0])


def hf_model(config: dict[str, Any], device: str = "meta", whole: bool | None = None, towers: dict[str, dict[str, Any]] | None = None) -> nn.Module:
    """The transformers model of `config` (a config.json dict with model_type), on the meta device by default: its
    causal LM, or for a multimodal config (whole, by default where it keeps a language model under LANGUAGE_KEYS) the whole
    model, towers and all; `towers` swaps sub-configs (attribute -> config dict) for towers that build here."""
    import transformers
    from transformers import AutoConfig

    cfg = hf_config(config)
    for attribute, spec in (towers or {}).items():
        tower = AutoConfig.for_model(spec["model_type"], **{k: v for k, v in spec.items() if k != "model_type"})
        object.__setattr__(cfg, attribute, tower)  # past the field's type check: a tower of another class, on purpose
    if any(key in config for key in LANGUAGE_KEYS) if whole is None else whole:
        with torch.device(device):
            return whole_class(config["model_type"])(cfg)
    for cls in MODEL_CLASSES:
        try:
            with torch.device(device):
                return getattr(transformers, cls).from_config(cfg)
        except ValueError as e:  # not this auto class's config
            if cls == MODEL_CLASSES[-1] or "Unrecognized configuration class" not in str(e):
                raise
    raise AssertionError("unreachable")


@functools.cache
def meta_model(config_json: str, whole: bool | None = None, towers_json: str = "{}") -> nn.Module:
    """One meta build per config (as sorted JSON), shared by every test that needs it."""
    return hf_model(json.loads(config_json), whole=whole, towers=json.loads(towers_json))


def language_model(model: nn.Module) -> tuple[str, nn.Module] | None:
    """A multimodal model's language model, found by structure: the outermost module built from its text config (a base
    model beside the wrapper's head, or a whole causal LM); None for a text model."""
    from transformers import PreTrainedModel

    text = getattr(model.config, "text_config", None)
    if text is None:
        return None
    found = [(name, m) for name, m in model.named_modules() if name and isinstance(m, PreTrainedModel) and getattr(m, "config", None) is text]
    return min(found, key=lambda item: item[0].count(".")) if found else None


def language_tensors(model: nn.Module) -> dict[str, int]:
    """The parameters of a model's language model and LM head, named as the text model names them (towers and their
    projectors left out; a tied head once, under the embedding's name); a text model's as they are."""
    inner = language_model(model)
    if inner is None:
        return tensors(model)
    path, lm = inner
    own_head = lm.get_output_embeddings() is not None  # a whole causal LM: its names are the text model's already
    head = model.get_output_embeddings()
    mine, heads = {id(p) for p in lm.parameters()}, {id(p) for p in head.parameters()} if head is not None else set()
    out: dict[str, int] = {}
    for name, p in model.named_parameters():  # a tied tensor once, by the name it has first
        if id(p) in mine:
            name = ("" if own_head else "model.") + name.removeprefix(f"{path}.")
        elif id(p) in heads:
            name = "lm_head." + name.rsplit(".", 1)[1]
        else:
            continue
        out[normal(name)] = out.get(normal(name), 0) + p.numel()
    return out


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


def hf_oracle(config: dict[str, Any], routed: str = ROUTED, experts: str | None = None, per_token: str | None = None,
              towers: dict[str, dict[str, Any]] | None = None, whole: bool | None = None) -> Oracle:
    """The oracle for a transformers family: the model built from `config`, per tensor, with its routing (a family's
    tests/families hints may name its routed tensors and its n and k keys: [oracle] routed, experts, per_token; a
    wrapper's tests/wrappers.toml its towers; `whole` as hf_model takes it)."""
    model = meta_model(json.dumps(config, sort_keys=True), whole, json.dumps(towers or {}, sort_keys=True))
    found = language_tensors(model)
    n, k = routing(model.config, experts, per_token) if any(re.search(routed, f".{name}") for name in found) else (0, None)
    stacks = {normal(name): p.shape[0] for name, p in model.named_parameters() if p.ndim == 3 and re.search(routed, f".{name}")}
    inner = language_model(model)
    if inner is not None:  # the stacks by their names in the language model
        prefix = f"{inner[0]}."
        own = inner[1].get_output_embeddings() is not None
        stacks = {("" if own else "model.") + name.removeprefix(prefix): e for name, e in stacks.items() if name.startswith(prefix)}
    return Oracle(found, n, k, routed, stacks)


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


def to_nf4(model: nn.Module) -> nn.Module:
    """The model with every nn.Linear but its output embeddings replaced by bitsandbytes' Linear4bit (NF4, quantized
    from its weights on CPU), as transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4") loads it."""
    import bitsandbytes as bnb

    head = model.get_output_embeddings()
    for name, module in list(model.named_modules()):
        for key, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child is not head:
                layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                          compute_dtype=child.weight.dtype, quant_type="nf4")
                layer.weight = bnb.nn.Params4bit(child.weight.data.float(), requires_grad=False, quant_type="nf4", compress_statistics=False).to("cpu")
                if child.bias is not None:
                    layer.bias = nn.Parameter(child.bias.data, requires_grad=False)
                setattr(module, key, layer)
    return model


def keep_fp32(model: nn.Module, dtype: torch.dtype) -> None:
    """The parameters and buffers from_pretrained(dtype=...) keeps in float32 (_keep_in_fp32_modules[_strict]), which
    from_config leaves in `dtype`: cast back, matched as the loader matches them."""
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(dtype)
    if plan:
        pattern = build_glob_alternation(list(plan))[0]
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if pattern.search(name):
                t.data = t.data.float()


TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def built(config: Any, dtype: str, attention: str = "sdpa") -> nn.Module:
    """transformers' causal LM of a config (a dict or its PretrainedConfig), built in `dtype` as from_pretrained(dtype=...)
    builds it (modules transformers keeps in float32 stay so), with `attention` where it has that path."""
    import transformers

    cfg = hf_config(config) if isinstance(config, dict) else config
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attention, dtype=TORCH_DTYPES[dtype])
    except ValueError:  # a model without an sdpa path (OpenAI GPT, CTRL, RWKV, Gemma 2, GPT-OSS) runs its own attention
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=TORCH_DTYPES[dtype])
    keep_fp32(model, TORCH_DTYPES[dtype])
    return model


@functools.lru_cache(maxsize=8)  # the models of the last few configs: a worker runs thousands of tests, and the tiny MLA models are large
def trained_model(config_json: str, dtype: str, lora_json: str = "null", nf4: bool = False, attention: str = "sdpa") -> nn.Module:
    """The tiny random transformers model of a config on CPU, built in `dtype` as from_pretrained(dtype=...) builds it
    (modules transformers keeps in float32 stay so), with `attention` where it has that path, in training mode, once;
    with peft's LoRA adapters where `lora_json` gives a LoraConfig's arguments."""
    torch.manual_seed(0)
    model = built(json.loads(config_json), dtype, attention)
    if nf4:
        model = to_nf4(model)
    lora = json.loads(lora_json)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**lora))
    return model.train()


PEFT_PREFIX = re.compile(r"^base_model\.model\.")  # peft's wrapper around the causal LM
WRAPPED = re.compile(r"\.default(?=\.|$)")  # peft's adapter name


def peft_name(name: str) -> str:
    """A peft model's parameter or module name as the causal LM's: the wrapper prefix and the adapter's name left out."""
    return WRAPPED.sub("", PEFT_PREFIX.sub("", name))


def checkpointable(config: dict[str, Any]) -> bool:
    """Whether transformers can checkpoint the model's layers (gradient_checkpointing_enable refuses otherwise)."""
    return trained_model(json.dumps(config, sort_keys=True), "bf16").supports_gradient_checkpointing


def saved_bytes(config: dict[str, Any], dtype: str = "bf16", attention: str = "sdpa", checkpointing: bool = False,
                batch: int = 2, seq: int = 5, modules: set[str] | None = None, lora: dict[str, Any] | None = None,
                nf4: bool = False) -> dict[str, int]:
    """What autograd keeps for backward in one training forward with the loss of the tiny random transformers model of
    `config` on CPU: bytes of every storage a `saved_tensors_hooks` pack hook sees, once, parameters and buffers
    excluded, attributed to the module whose forward allocated it (layer indices left out; folded up to the nearest of
    `modules`, symparam's modules; "(inputs)" for the batch)."""
    model = trained_model(json.dumps(config, sort_keys=True), dtype, json.dumps(lora, sort_keys=True), nf4)
    if attention != model.config._attn_implementation and model._supports_sdpa and not model._can_set_attn_implementation():
        model = trained_model(json.dumps(config, sort_keys=True), dtype, json.dumps(lora, sort_keys=True), nf4, attention)  # Falcon
    if attention == "eager" or model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(attention)
    if checkpointing:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    saved = saved_by_creator(model, batch_ids(model, batch, seq))
    return by_module(saved, modules, lambda creator: normal(peft_name(creator)))


def batch_ids(model: Any, batch: int, seq: int) -> torch.Tensor:
    """The token ids of the batch a test runs at (B, S): random, the same for every run at that point."""
    generator = torch.Generator().manual_seed(batch * 1000 + seq)
    return torch.randint(0, model.config.get_text_config().vocab_size, (batch, seq), generator=generator)


def routing_statistics(config: dict[str, Any], dtype: str, batch: int, seq: int, spec: dict[str, dict[str, Any]]) -> dict[str, Fraction]:
    """What the router decided in the forward saved_bytes runs at (B, S) (the same model and ids), for each statistic of
    `spec` (symbol -> {module, output, below}): over every call of the modules whose name ends with `module`, the mean
    per row of its output `output` of the entries below the config's `below` (LongCat-Flash's real experts among k picks)."""
    model = trained_model(json.dumps(config, sort_keys=True), dtype)
    found: dict[str, list[int]] = {name: [0, 0] for name in spec}  # entries counted, rows seen
    hooks = []
    for name, module in model.named_modules():
        for symbol, s in spec.items():
            if normal(name).endswith(s["module"]):
                def record(m, args, out, symbol=symbol, s=s):
                    picks = out[s["output"]]
                    found[symbol][0] += int((picks < config[s["below"]]).sum())
                    found[symbol][1] += picks.shape[0]
                hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            model(input_ids=batch_ids(model, batch, seq))
    finally:
        for h in hooks:
            h.remove()
    return {symbol: Fraction(count, rows) for symbol, (count, rows) in found.items()}


class Packed:
    """What the pack hook hands autograd for one save: alive as long as autograd keeps that save."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def saved_by_creator(model: Any, ids: torch.Tensor, local: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict[int, tuple[int, str]]:
    """One training forward with the loss under a `saved_tensors_hooks` pack hook: every storage autograd still keeps
    once the forward returns (parameters and buffers left out; a branch the forward dropped, such as a router's group
    scores, freed its saves with its nodes), once, with its bytes and the module whose forward allocated it (a dispatch
    mode notes each new storage's maker; the batch is "(inputs)"). `local`: the tensor a DTensor computes on."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    alive = [*model.parameters(), *model.buffers()]  # each tensor held to the end, so no save reuses a freed address
    weights = {local(t).untyped_storage().data_ptr() for t in alive}  # (a buffer the forward replaces: XGLM's positions past S)
    stack, created, saved, packed = [""], {}, {}, []
    hooks = []
    for name, module in model.named_modules():
        hooks.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        hooks.append(module.register_forward_hook(lambda m, a, o: (stack.pop(), None)[1]))  # None: the output stays

    class Creators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    alive.append(t)  # held, so no later tensor reuses its address
                    with contextlib.suppress(RuntimeError):  # a collective's output before it is waited on
                        created.setdefault(local(t).untyped_storage().data_ptr(), stack[-1])
            return out

    def pack(t: torch.Tensor) -> Packed:
        alive.append(t)  # held: a save whose node the forward drops must not free its address for a later save
        storage = local(t).untyped_storage()
        if storage.data_ptr() not in weights and storage.data_ptr() not in saved:
            saved[storage.data_ptr()] = (storage.nbytes(), created.get(storage.data_ptr(), "(inputs)"))
        held = Packed(t.detach())  # not t: a node holding its own output through the hook is a cycle no collector frees
        packed.append((weakref.ref(held), storage.data_ptr()))
        return held

    created[ids.untyped_storage().data_ptr()] = "(inputs)"  # the batch's, also where a model first views it
    try:
        with Creators(), torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
            out = model(input_ids=ids, labels=ids)
    finally:
        for h in hooks:
            h.remove()
        alive.clear()  # torch keeps the mode's class, and with it this closure: what it held goes now
    kept = {ptr for ref, ptr in packed if ref() is not None}  # the saves of nodes the outputs' graphs still hold (a
    # dropped node goes with its last reference: no cycle holds one, as a full collection, five times slower, confirms)
    del out
    return {ptr: entry for ptr, entry in saved.items() if ptr in kept}


def tensors_in(obj: Any, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor an output object reaches: a ModelOutput's fields, a cache's layers and their tensors, lists in them."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [obj]
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type, nn.Module)):
        return []
    seen.add(id(obj))
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else vars(obj).values() if hasattr(obj, "__dict__") else ()
    return [t for item in items for t in tensors_in(item, seen)]


def attribute_tensors(model: Any) -> list[torch.Tensor]:
    """The tensors modules keep as plain attributes, neither parameters nor buffers (a recurrent block's states)."""
    return [t for m in model.modules() for key, value in vars(m).items() if not key.startswith("_") for t in tensors_in(value)]


def held_by_caller(config: dict[str, Any], dtype: str = "bf16", batch: int = 2, seq: int = 9) -> dict[str, int]:
    """What stays alive once a training forward with the loss returns, through the step: the outputs (the loss, the
    logits, a cache's keys, values and states) and the tensors the forward left in modules' attributes (RecurrentGemma's
    states): bytes of each storage, once, by where it is held ("loss", "logits", "past_key_values", ..., "(modules)"),
    parameters, buffers and the batch left out."""
    model = trained_model(json.dumps(config, sort_keys=True), dtype)
    model.gradient_checkpointing_disable()
    ids = batch_ids(model, batch, seq)
    before = [*model.parameters(), *model.buffers(), ids, *attribute_tensors(model)]  # held: none frees its address for a new one
    skip = {t.untyped_storage().data_ptr() for t in before}
    out = model(input_ids=ids, labels=ids)
    found: dict[int, tuple[str, int]] = {}
    for where, tensors in [*((name, tensors_in(value)) for name, value in out.items()), ("(modules)", attribute_tensors(model))]:
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in skip:
                found.setdefault(storage.data_ptr(), (where, storage.nbytes()))
    held: dict[str, int] = {}
    for where, nbytes in found.values():
        held[where] = held.get(where, 0) + nbytes
    return held


def by_module(saved: dict[int, tuple[int, str]], modules: set[str] | None, name_of: Callable[[str], str] = normal) -> dict[str, int]:
    """Saved bytes per module: each storage's creator named as symparam names modules, raised to the nearest module
    of `modules` (None: as named)."""
    out: dict[str, int] = {}
    for nbytes, creator in saved.values():
        name = name_of(creator)
        while modules is not None and name not in modules and name not in ("", "(inputs)"):
            name = name.rpartition(".")[0]
        out[name] = out.get(name, 0) + nbytes
    return out


def step_peak(config: dict[str, Any], optimizer: str = "adamw", dtype: str = "bf16", batch: int = 1, seq: int = 2048,
              checkpointing: bool = False, fake: bool = True, lora: dict[str, Any] | None = None, nf4: bool = False) -> tuple[int, str]:
    """The most live tensor bytes at any moment of the second training step of a transformers model (forward with the
    loss, backward, optimizer.step(), zero_grad(set_to_none=True), the outputs dropped), measured by a dispatch mode that
    follows every storage until it is freed; on the meta device (full size without memory: every operation computes
    its outputs' shapes, dtypes and storages) or for real on CPU. The model's non-persistent buffers are left out
    (symparam leaves them out); with it, the phase and operation of the peak."""
    import weakref

    import transformers.masking_utils as masking
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live = self.peak = 0
            self.where, self.phase, self.refs = "", "", {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.follow(t, f"{self.phase}: {func}")
            return out

        def follow(self, t: torch.Tensor, where: str) -> None:
            s = t.untyped_storage()
            if id(s) not in self.refs:
                n = s.nbytes()
                self.live += n
                self.refs[id(s)] = weakref.ref(s, lambda _, key=id(s), n=n: self.free(key, n))
                if self.live > self.peak:
                    self.peak, self.where = self.live, where

        def free(self, key: int, n: int) -> None:
            self.live -= n
            self.refs.pop(key, None)

    make = {
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=True),
        "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=True),
        "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-3, foreach=True),
    }[optimizer]
    cfg = hf_config(config)
    packed = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None  # a batch without packing: what the real run finds,
    live = Live()                                                     # which fake tensors cannot evaluate
    try:
        with torch.device("meta") if fake else contextlib.nullcontext():
            torch.manual_seed(0)
            model = built(cfg, dtype).train()
            if nf4:  # bitsandbytes' 4-bit layers hold their quantization state as tensor attributes: followed too
                model = to_nf4(model)
            if lora is not None:
                from peft import LoraConfig, get_peft_model

                model = get_peft_model(model, LoraConfig(**lora))
        mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
        if fake:  # built on meta, then each tensor made fake: full size without memory, every operation run for its shapes
            made: dict[int, torch.Tensor] = {}  # a tied tensor stays one tensor
            for module in model.modules():
                for table in (module._parameters, module._buffers):
                    for key, t in table.items():
                        if t is not None and id(t) not in made:
                            fake_t = FakeTensor(mode, t, torch.device("cpu"))  # a CPU tensor as kernels see it (sdpa's choice)
                            made[id(t)] = torch.nn.Parameter(fake_t, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else fake_t
                        if t is not None:
                            table[key] = made[id(t)]
        with mode:
            if checkpointing:
                model.gradient_checkpointing_enable()
            buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
            states = [t for m in model.modules() for t in getattr(getattr(getattr(m, "weight", None), "quant_state", None), "__dict__", {}).values() if torch.is_tensor(t)]
            for t in [*model.parameters(), *model.buffers(), *states]:  # built before the tracker starts (peft moves tensors it would follow)
                live.follow(t, "build")
            with live:
                opt = make([p for p in model.parameters() if p.requires_grad])
                ids = torch.randint(0, cfg.get_text_config().vocab_size, (batch, seq), device=next(model.parameters()).device)
                labels = ids.clone()
                for step in range(2):
                    if step == 1:
                        live.peak = live.live
                    live.phase = f"forward {step + 1}"
                    out = model(input_ids=ids, labels=labels)
                    live.phase = f"backward {step + 1}"
                    out.loss.backward()
                    live.phase = f"optimizer step {step + 1}"
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    del out
    finally:
        masking.find_packed_sequence_indices = packed
    return live.peak - buffers, live.where


def lora_trainable(config: dict[str, Any], lora: dict[str, Any]) -> dict[str, int]:
    """The parameters peft's get_peft_model makes trainable on the model built on the meta device, per name as
    symparam names them: the causal LM's names, a ParamWrapper's adapters under the parameter it adapts
    (model.layers.mlp.experts.gate_up_proj.lora_A.weight), layer indices left out."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import ParamWrapper

    cfg = hf_config(config)
    import transformers

    with torch.device("meta"):
        model = get_peft_model(transformers.AutoModelForCausalLM.from_config(cfg), LoraConfig(**lora))
    renamed: dict[str, str] = {}
    for path, module in model.named_modules():
        if isinstance(module, ParamWrapper):
            outer = re.sub(r"(\.base_layer)+$", "", path)
            for part in ("lora_A", "lora_B"):
                renamed[f"{path}.{part}.default.weight"] = f"{outer}.{module.parameter_name}.{part}.weight"
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = normal(peft_name(renamed.get(name, name)))
            out[key] = out.get(key, 0) + p.numel()
    return out
