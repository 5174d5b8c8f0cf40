"""Independent parameter counts, per tensor: transformers models built on the meta device, and a plain-torch classic transformer."""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import nn

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="transformers")
warnings.filterwarnings("ignore", message="Initializing zero-element tensors")

ROUTED = ".experts."  # module path segment of routed experts; shared experts live under ".shared_experts."
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

    @property
    def total(self) -> int:
        return sum(self.tensors.values())

    @property
    def active_tensors(self) -> dict[str, Fraction]:
        """Per tensor, what one token uses: k/n of each routed-expert tensor, all of every other."""
        share = Fraction(self.per_token or 0, self.experts) if self.experts else Fraction(1)
        return {name: n * share if ROUTED in f".{name}" else Fraction(n) for name, n in self.tensors.items()}

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


def hf_model(config: dict[str, Any], cls: str = "AutoModelForCausalLM") -> nn.Module:
    """The transformers causal LM of `config` (a config.json dict with model_type) on the meta device."""
    import transformers

    cfg = hf_config(config)
    with torch.device("meta"):
        return getattr(transformers, cls).from_config(cfg)


def routing(cfg: Any) -> tuple[int, int | None]:
    """(n, k) as the built config holds them, read from the keys families use."""
    experts = next((getattr(cfg, key) for key in EXPERT_COUNT_KEYS if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key)), 0)
    per_token = next((getattr(cfg, key) for key in PER_TOKEN_KEYS if isinstance(getattr(cfg, key, None), int)), None)
    return experts, per_token


def hf_oracle(config: dict[str, Any]) -> Oracle:
    """The oracle for a transformers family: the model built from `config`, per tensor, with its routing."""
    model = hf_model(config)
    found = tensors(model)
    experts, per_token = routing(model.config) if any(ROUTED in f".{n}" for n in found) else (0, None)
    return Oracle(found, experts, per_token)


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


def oracle(config: dict[str, Any]) -> Oracle:
    """The reference count of any supported config dict."""
    return classic_oracle(config) if config["model_type"] == "classic" else hf_oracle(config)
