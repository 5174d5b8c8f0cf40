"""Independent parameter counts: transformers models built on the meta device, and a plain-torch classic transformer."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import nn

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="transformers")

ROUTED = ".experts."  # module path segment of routed experts; shared experts live under ".shared_experts."
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class Oracle:
    """What the reference implementation holds: all parameters (tied once) and those inside routed experts."""

    total: int
    routed: int  # parameters in the routed-expert modules of all layers
    experts: int  # n, routed experts per MoE layer (0 for a dense model)
    per_token: int | None  # k, experts each token visits (None where the config leaves it unset)

    @property
    def active(self) -> int:
        """total - (n - k)/n of the routed experts, exact (asserted to be whole)."""
        if not self.experts:
            return self.total
        assert self.per_token is not None, "the config sets no num_experts_per_tok: active is undefined"
        unused = Fraction(self.routed * (self.experts - self.per_token), self.experts)
        assert unused.denominator == 1, unused
        return self.total - int(unused)


def count(module: nn.Module) -> tuple[int, int]:
    """(all parameters, routed-expert parameters); parameters() yields a tied tensor once."""
    total = routed = 0
    for name, p in module.named_parameters():
        total += p.numel()
        routed += p.numel() if ROUTED in f".{name}" else 0
    return total, routed


def hf_model(config: dict[str, Any]) -> nn.Module:
    """The transformers causal LM of `config` (a config.json dict with model_type) on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {key: value for key, value in config.items() if key != "model_type"}
    cfg = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def hf_oracle(config: dict[str, Any]) -> Oracle:
    """The oracle for a transformers family: the model built from `config`, its experts read off the built config."""
    model = hf_model(config)
    total, routed = count(model)
    if not routed:
        return Oracle(total, 0, 0, 0)
    cfg = model.config
    experts = next(getattr(cfg, key) for key in EXPERT_COUNT_KEYS if getattr(cfg, key, None))
    return Oracle(total, routed, experts, cfg.num_experts_per_tok)


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
    total, _ = count(model)
    return Oracle(total, 0, 0, 0)


def oracle(config: dict[str, Any]) -> Oracle:
    """The reference count of any supported config dict."""
    return classic_oracle(config) if config["model_type"] == "classic" else hf_oracle(config)
