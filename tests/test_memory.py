"""Memory: published check figures, and the KV cache against the cache a real transformers forward pass fills."""

from __future__ import annotations

import json
import re
import logging
import warnings

import pytest
import sympy as sp

from symparam import load
from symparam.errors import SymparamError
from symparam.memory import kv_cache, report
from symparam.model import family

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def test_qwen3_8b_check_figures():
    r = report(load("qwen3-8b"), "bf16", seq=1000, batch=1)
    assert r["weights_bytes"] == 16_381_470_720  # the published bf16 checkpoint's size
    assert r["kv_cache_bytes"] == 147_456_000
    # independent: Qwen3-8B has 36 layers, 8 KV heads of 128; K and V, 1000 tokens, 2 bytes
    assert r["kv_cache_bytes"] == 2 * 36 * 8 * 128 * 1000 * 1 * 2
    assert r["weights"]["GB"] == pytest.approx(16.381, abs=1e-3) and r["weights"]["GiB"] == pytest.approx(16_381_470_720 / 2**30, abs=1e-3)


def test_training_is_a_step_not_a_rule_of_thumb():
    """Without --train no training figure is printed; with the mixed-precision convention its weights, gradients and
    states are the ZeRO paper's 16 bytes per parameter (DESIGN.md's reference count), activations on top."""
    from symparam.memory import Train

    assert "training" not in report(load("qwen3-8b"), "bf16", seq=1)
    t = report(load("qwen3-8b"), "bf16", seq=8, train=Train("adamw-mixed"))["training"]
    assert sum(t["parts"][k]["bytes"] for k in ("weights", "gradients", "optimizer_states")) == 16 * 8_190_735_360
    assert t["bytes"] == 16 * 8_190_735_360 + t["parts"]["activations"]["bytes"]


@pytest.mark.parametrize("dtype, per_param", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 1), ("int4", sp.Rational(1, 2))])
def test_weights_by_dtype(dtype, per_param):
    r = report(load("gpt2"), dtype, seq=8)
    assert r["weights_bytes"] == int(sp.ceiling(124_439_808 * per_param))  # GPT-2's published-by-transformers count
    if dtype in ("fp8", "int4"):
        assert "scale" in r["weights"]["note"]


def test_mla_caches_the_latent_as_deepseek_defines_it():
    # DeepSeek-V2 paper, Table 1: MLA caches (d_c + d_h^R) * l elements per token, d_c = 4 d_h, d_h^R = d_h / 2 -> 4.5 d_h l.
    r = report(load("deepseek-v3"), "bf16", seq=1000, batch=3)
    d_h, layers = 128, 61
    assert r["kv_cache"]["per_token_per_layer_values"] == 9 * d_h // 2 == 512 + 64
    assert r["kv_cache_bytes"] == 9 * d_h // 2 * layers * 1000 * 3 * 2


def test_mistral_window_caps_the_cache():
    # Mistral 7B paper: a rolling buffer of W = 4096 positions per layer, whatever the sequence length.
    short = report(load("mistral-7b"), "bf16", seq=1000)
    long = report(load("mistral-7b"), "bf16", seq=32768)
    per_token = 2 * 32 * 8 * 128 * 2
    assert short["kv_cache_bytes"] == 1000 * per_token
    assert long["kv_cache_bytes"] == 4096 * per_token
    assert "Min(S, W)" in long["kv_cache"]["formula"]


def test_symbolic_kv_formula():
    S, B, N, b, h_kv, h_d = sp.symbols("S B N b h_kv h_d", integer=True, positive=True)
    assert sp.simplify(kv_cache(family("llama")) - 2 * N * h_kv * h_d * S * B * b) == 0
    r_kv, d_rope = sp.symbols("r_kv d_rope", integer=True, positive=True)
    assert sp.simplify(kv_cache(family("deepseek_v3")) - (r_kv + d_rope) * N * S * B * b) == 0


def test_bad_input_is_one_line():
    with pytest.raises(SymparamError):
        report(load("qwen3-8b"), "fp4", seq=10)
    with pytest.raises(SymparamError):
        report(load("qwen3-8b"), "bf16", seq=0)


TINY = {
    "qwen3": dict(model_type="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=12),
    "gpt2": dict(model_type="gpt2", vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=32),
    "mistral": dict(model_type="mistral", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4),
    "gemma2": dict(model_type="gemma2", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4),
    "gpt_oss": dict(model_type="gpt_oss", vocab_size=61, hidden_size=32, intermediate_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4, num_local_experts=4, num_experts_per_tok=2),
}


@pytest.mark.parametrize("name", list(TINY))
def test_kv_cache_against_a_real_cache(name):
    """Run S tokens through a tiny random model and weigh the K/V tensors its cache holds (fp32)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = TINY[name]
    seq = 10
    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        cache = hf(torch.arange(seq)[None] % 61, use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    sliding = [layer for layer in cache.layers if type(layer).__name__ == "DynamicSlidingWindowLayer"]
    # transformers keeps W - 1 past tokens in a sliding layer; the token being decoded makes the W it attends to
    per_token_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 4 if name != "gpt2" else 2 * 32 * 4
    ours = report(load(config), "fp32", seq=seq)
    assert ours["kv_cache"]["sliding_layers"] == len(sliding)
    assert ours["kv_cache_bytes"] == held + len(sliding) * per_token_layer


def test_cli_json_and_text(capsys):
    from symparam.cli import main

    assert main(["memory", "--model", "qwen3-8b", "--dtype", "bf16", "--seq", "1000", "--batch", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["weights_bytes"], data["kv_cache_bytes"]) == (16_381_470_720, 147_456_000)
    assert main(["memory", "--model", "qwen3-8b", "--seq", "1000"]) == 0
    text = capsys.readouterr().out
    assert "GB" in text and "GiB" in text and "2*B*N*S*b*h_d*h_kv" in text
    assert main(["memory", "--model", "qwen3-8b", "--seq", "-3"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("preset", ["qwen3-8b", "qwen3-30b-a3b"])
def test_activations_by_layer_kind_read_back_as_the_formula(preset):
    """The formula written by layer kind (N*(...) + N_dense*(...) + ...) is the same polynomial as the sum."""
    from symparam.memory import Train

    r = report(load(preset), "bf16", 4096, 1, "none", Train())
    names = {n: sp.Symbol(n) for n in re.findall(r"[A-Za-z_]\w*", r["activations"]["formula"])}  # S, N: symbols, not SymPy's
    assert sp.expand(sp.sympify(r["activations"]["by_layer_kind"], locals=names) - sp.sympify(r["activations"]["formula"], locals=names)) == 0
