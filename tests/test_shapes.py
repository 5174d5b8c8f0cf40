"""Shape trace against a real forward pass: hooks record the tensors of tiny random transformers models on CPU."""

from __future__ import annotations

import json
import logging
import math
import warnings

import pytest

from symparam import load
from symparam.cli import main
from symparam.shapes import report

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SEQ = 7
CASES = {
    "qwen3": dict(model_type="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12),
    "gpt2": dict(model_type="gpt2", vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=16),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=20, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=20, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=12,
                        kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, first_k_dense_replace=1, n_group=1, topk_group=1),
}
# step name (after the layer prefix) -> (module under the layer, "in" or "out", which tensor of a tuple)
LAYER_HOOKS = {
    "q latent": ("self_attn.q_a_proj", "out", None),
    "kv latent": ("self_attn.kv_a_proj_with_mqa", "out", None),
    "q": ("self_attn.q_proj", "out", None),
    "k": ("self_attn.k_proj", "out", None),
    "v": ("self_attn.v_proj", "out", None),
    "attention context": ("self_attn.o_proj", "in", 0),
    "attention output": ("self_attn.o_proj", "out", None),
    "ffn gate": ("mlp.gate_proj", "out", None),
    "ffn up": ("mlp.up_proj", "out", None),
    "ffn inner": ("mlp.down_proj", "in", 0),
    "ffn output": ("mlp.down_proj", "out", None),
    "router logits": ("mlp.gate", "out", 0),
    "top-k experts": ("mlp.gate", "out", 2),
    "shared expert inner": ("mlp.shared_experts.down_proj", "in", 0),
    "moe output": ("mlp", "out", None),
}
GPT2_HOOKS = {"qkv": ("attn.c_attn", "out", None), "attention context": ("attn.c_proj", "in", 0), "attention output": ("attn.c_proj", "out", None),
              "ffn up": ("mlp.c_fc", "out", None), "ffn inner": ("mlp.c_proj", "in", 0), "ffn output": ("mlp.c_proj", "out", None)}
MLA_HOOKS = {"q": ("self_attn.q_b_proj", "out", None)}  # MLA's queries come out of the up-projection


def recorded(config: dict) -> tuple[dict, object]:
    """Run SEQ tokens through a tiny random model; (step name -> recorded shape without the batch axis, output)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    gpt2 = config["model_type"] == "gpt2"
    layers = model.transformer.h if gpt2 else model.model.layers
    hooks = GPT2_HOOKS if gpt2 else {**LAYER_HOOKS, **(MLA_HOOKS if config["model_type"] == "deepseek_v3" else {})}
    shapes: dict[str, tuple] = {}

    def hook(key: str, side: str, index):
        def record(module, inputs, output):
            t = inputs if side == "in" else output
            t = t[index] if index is not None else (t[0] if isinstance(t, tuple) else t)
            shapes[key] = tuple(t.shape[1:] if t.ndim == 3 else t.shape)  # drop the batch axis of [1, S, x]
        return record

    # the trace names a layer kind "layer", "dense layer" or "moe layer"; MoE layers start after the dense ones
    prefixes = {s["name"].partition(".")[0] for s in report(load(config), SEQ) if "." in s["name"]}
    first_moe = load(config).values.get("N_dense", 0)
    kinds = {prefix: first_moe if prefix == "moe layer" else 0 for prefix in prefixes}
    for prefix, index in kinds.items():
        for step, (path, side, which) in hooks.items():
            try:
                module = layers[index].get_submodule(path)
            except AttributeError:
                continue
            module.register_forward_hook(hook(f"{prefix}.{step}", side, which))
    model.get_input_embeddings().register_forward_hook(hook("input embedding", "out", None))
    with torch.no_grad():
        out = model(torch.arange(SEQ)[None], output_attentions=True)
    shapes["logits"] = tuple(out.logits.shape[1:])
    for prefix, index in kinds.items():
        shapes[f"{prefix}.scores"] = tuple(out.attentions[index].shape[1:])
    return shapes, out


@pytest.mark.parametrize("name", list(CASES))
def test_shapes_match_a_real_forward_pass(name):
    seen, _ = recorded(CASES[name])
    ours = {s["name"]: s["shape"] for s in report(load(CASES[name]), SEQ)}
    checked = 0
    for step, shape in seen.items():
        if step not in ours:
            continue
        mine = ours[step]
        # the implementation keeps heads flat ([S, h*h_d]) where the trace splits them ([S, h, h_d]); tokens and size agree
        if "." in step and step.endswith(("router logits", "top-k experts")):
            assert tuple(mine) == shape, step
        else:
            assert mine[0] == shape[0] and math.prod(mine) == math.prod(shape), (step, mine, shape)
        checked += 1
    assert checked >= 8, seen.keys()


def test_moe_and_mla_steps_are_present():
    names = [s["name"] for s in report(load("deepseek-v3"), 5)]
    for step in ("dense layer.q latent", "moe layer.kv latent", "moe layer.router logits", "moe layer.expert inner", "moe layer.shared expert inner"):
        assert step in names
    steps = {s["name"]: s for s in report(load("deepseek-v3"), 5)}
    assert steps["moe layer.kv latent"]["shape"] == [5, 512 + 64]
    assert steps["moe layer.expert inner"]["shape"] == [5 * 8, 2048]


def test_gpt2_walkthrough():
    # the GPT-2 walkthrough of the source documents: 5 tokens -> [5, 768] -> 12 heads of 64 -> [5, 3072] -> logits
    steps = {s["name"]: s for s in report(load("gpt2"), 5)}
    assert steps["token ids"]["shape"] == [5]
    assert steps["input embedding"]["shape"] == [5, 768]
    assert steps["layer.q"]["shape"] == [5, 12, 64]
    assert steps["layer.scores"]["shape"] == [12, 5, 5]
    assert steps["layer.ffn inner"]["shape"] == [5, 3072]
    assert steps["layer.ffn inner"]["layers"] == 12
    assert steps["logits"]["shape"] == [5, 50257]


def test_cli_json(capsys):
    assert main(["shapes", "--model", "qwen3-8b", "--seq", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all({"name", "shape"} <= set(step) for step in data["steps"])
    assert {"name": "layer.k", "shape": [3, 8, 128]}.items() <= next(s for s in data["steps"] if s["name"] == "layer.k").items()


def test_trace_reads_the_flags_the_count_reads():
    # the same Recipe.resolved() builds the parameter tree and the trace: a switch turned off by the config is off in both
    config = {**CASES["deepseek_v3"], "q_lora_rank": None}
    model = load(config)
    names = [s["name"] for s in report(model, 3)]
    assert not any(name.endswith("q latent") for name in names)
    assert "r_q" not in {str(x) for x in model.total.free_symbols}  # and the count has no query latent either
    classic = load({"model_type": "classic", "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "learned_positions": True, "max_position_embeddings": 16})
    assert "position embedding" in [s["name"] for s in report(classic, 3)]
    assert "final norm" not in [s["name"] for s in report(classic, 3)]  # classic's final_norm defaults to false
