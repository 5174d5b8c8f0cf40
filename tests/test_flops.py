"""FLOPs per token: matmul parameters against the transformers model's own weight matrices, attention term by hand."""

from __future__ import annotations

import json
import logging
import warnings
from fractions import Fraction
from importlib import resources

import pytest

from symparam import load
from symparam.flops import report

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def preset(name: str) -> dict:
    return json.loads(resources.files("symparam").joinpath("presets", f"{name}.json").read_text())


def hf_matmul_parameters(config: dict) -> int:
    """Weights one token multiplies by in the transformers model: 2-D weights outside embedding tables
    (a tied LM head included: it still multiplies), and k/n of the stacked 3-D expert tensors."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = next((getattr(cfg, key) for key in ("num_experts", "num_local_experts", "n_routed_experts") if getattr(cfg, key, None)), None)
    total = Fraction(0)
    for name, p in model.named_parameters(remove_duplicate=False):
        owner = model.get_submodule(name.rpartition(".")[0])
        if p.ndim == 3 and ".experts." in f".{name}":
            total += Fraction(p.numel() * cfg.num_experts_per_tok, n)
        elif p.ndim == 2 and name.endswith("weight") and not isinstance(owner, nn.Embedding):
            total += p.numel()
    assert total.denominator == 1
    return int(total)


@pytest.mark.parametrize("name", ["gpt2", "qwen3-8b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"])
def test_matmul_parameters_match_the_implementation(name):
    assert report(load(name), seq=1)["matmul_parameters"] == hf_matmul_parameters(preset(name))


def test_gpt_oss_tiny_matmul_parameters():
    config = dict(model_type="gpt_oss", vocab_size=61, hidden_size=32, intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, sliding_window=4, num_local_experts=4, num_experts_per_tok=2)
    assert report(load(config), seq=3)["matmul_parameters"] == hf_matmul_parameters(config)


def test_attention_term_by_hand():
    # GPT-2: 12 layers, 12 heads of 64; q.k and the weighted values, 2 FLOPs per multiply-add, 1024 positions
    r = report(load("gpt2"), seq=1024)
    assert r["attention_flops"] == 12 * (2 * 768 * 1024 + 2 * 768 * 1024)


COUNTED = {
    "gpt2": dict(model_type="gpt2", vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=16),
    "qwen3": dict(model_type="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=12),
}


@pytest.mark.parametrize("name", list(COUNTED))
def test_forward_and_training_flops_against_torch_flop_counter(name):
    """torch's FlopCounterMode counts the matmul FLOPs (2 per multiply-add) a real forward and backward pass of a tiny
    random model executes. Eager attention scores a causal sequence of S tokens against all S positions (masked ones
    too), so the pass does S tokens x the per-token figure at context S; its backward runs two matmuls per forward one
    (gradients to the input and to the weight, to q and k, to the scores and v), which is where the 3x comes from.
    Dense families only: no sliding window masks positions here, and no expert dispatch the counter cannot see."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    config, seq = COUNTED[name], 7
    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with FlopCounterMode(display=False) as forward:
        logits = model(torch.arange(seq)[None]).logits
    with FlopCounterMode(display=False) as backward:
        logits.sum().backward()
    r = report(load(config), seq=seq)
    assert forward.get_total_flops() == seq * r["forward_flops_per_token"]
    assert forward.get_total_flops() + backward.get_total_flops() == seq * r["training_flops_per_token"]


def test_sliding_window_caps_the_attention_term():
    short, long = report(load("mistral-7b"), seq=4096), report(load("mistral-7b"), seq=32768)
    assert long["attention_flops"] == short["attention_flops"] == 32 * 4 * 32 * 128 * 4096


def test_mla_attention_widths():
    # DeepSeek-V3: 128 heads, q.k width 128 + 64 (nope + rope), values of 128, 61 layers
    r = report(load("deepseek-v3"), seq=1000)
    assert r["attention_flops"] == 61 * 2 * (128 * 192 + 128 * 128) * 1000


def test_qwen3_8b_forward_is_about_twice_the_parameters():
    # 2 x parameters is the usual rule of thumb; the matmul count leaves out the input embedding and the norms
    r = report(load("qwen3-8b"), seq=1)
    assert r["matmul_parameters"] == 8_190_735_360 - 151936 * 4096 - (36 * (2 * 4096 + 2 * 128) + 4096)
