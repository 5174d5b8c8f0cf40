"""LoRA and DoRA as peft 0.21 applies them: trainable parameters per tensor against get_peft_model on the meta device,
what the adapted model's training forward keeps per module against saved_tensors_hooks, and the step's peak against
a live-storage tracker (fake tensors at full size, a real run at small size)."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import sympy as sp

import symparam
from symparam.cli import main
from symparam.components import leaves, walk
from symparam.memory.activations import activations
from symparam.config import as_subs
from symparam.memory.lora import Lora, adapt, trainable
from symparam.memory.trace import Mode
from symparam.memory.training import optimizer, training
from symparam.symbols import B, S, evaluate

from families import tiny_config
from oracle import lora_trainable, saved_bytes, step_peak
from test_activations import compare

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
PRESETS = Path(symparam.__file__).parent / "presets"

# (family, targets, DoRA): linear modules by name, all-linear (Conv1D included), converted MoE types (fused experts and
# the router as ParamWrapper parameters, gate_up at rank 2r), MLA
TRAINABLE = [
    ("qwen3", ("q_proj", "v_proj"), False),
    ("qwen3", "all-linear", False),
    ("qwen3", ("q_proj", "v_proj"), True),
    ("llama", ("q_proj", "o_proj", "down_proj"), False),
    ("qwen3_moe", "all-linear", False),
    ("qwen3_moe", ("q_proj", "v_proj"), False),
    ("qwen3_moe", ("gate_proj", "up_proj", "down_proj"), False),
    ("mixtral", "all-linear", False),
    ("deepseek_v3", "all-linear", False),
    ("gpt2", "all-linear", False),
    ("blt", "all-linear", False),
]


def peft_config(targets, dora: bool, r: int = 4) -> dict:
    return {"r": r, "target_modules": targets if targets == "all-linear" else list(targets), "use_dora": dora}


def adapted(family: str, targets, dora: bool, r: int = 4):
    return adapt(symparam.load(tiny_config(family)), Lora(r, targets, dora))


@pytest.mark.parametrize("family, targets, dora", TRAINABLE)
def test_trainable_parameters_equal_peft(family: str, targets, dora: bool) -> None:
    model = adapted(family, targets, dora)
    mine: dict[str, int] = {}
    for leaf, copies, _, name in leaves(model.tree):
        if trainable(name) and leaf.counted:
            mine[name] = mine.get(name, 0) + evaluate(copies * leaf.each, as_subs(model.values))
    assert mine == lora_trainable(tiny_config(family), peft_config(targets, dora))


# (family, targets, DoRA, dtype, attention, checkpointing): what the adapted model keeps for backward, per module
ACTIVATIONS = [
    ("qwen3", ("q_proj", "v_proj"), False, "bf16", "sdpa", False),
    ("qwen3", "all-linear", False, "fp32", "eager", True),
    ("qwen3", ("q_proj", "v_proj"), True, "bf16", "sdpa", False),
    ("llama", "all-linear", False, "bf16", "sdpa", False),
    ("qwen3_moe", "all-linear", False, "bf16", "sdpa", False),
    ("qwen3_moe", ("q_proj", "v_proj"), False, "fp32", "sdpa", False),
    ("blt", "all-linear", False, "bf16", "sdpa", False),
]


@pytest.mark.parametrize("family, targets, dora, dtype, attention, checkpointing", ACTIVATIONS)
def test_activations_equal_what_autograd_saves(family, targets, dora, dtype, attention, checkpointing) -> None:
    compare(tiny_config(family), dtype, attention, checkpointing, ((2, 5), (1, 7), (2, 9)), Lora(4, targets, dora))


@pytest.mark.parametrize("name, targets, seq, checkpointing", [
    ("qwen3-0.6b", ("q_proj", "v_proj"), 2048, False),
    ("qwen3-0.6b", "all-linear", 1024, True),
    ("qwen3-30b-a3b", "all-linear", 256, False),
])
def test_peak_equals_a_fake_run_at_full_size(name, targets, seq, checkpointing) -> None:
    raw = json.loads((PRESETS / f"{name}.json").read_text())
    model = adapt(symparam.load(raw), Lora(16, targets))
    step = training(model, optimizer("adamw"), Mode(trainable=trainable), "full" if checkpointing else "none", {B: 1, S: seq})
    found, where = step_peak(raw, seq=seq, checkpointing=checkpointing, lora=peft_config(targets, False, 16))
    assert step.peak({**as_subs(model.values), B: 1, S: seq})[1] == found, where


def test_peak_equals_a_real_run() -> None:
    config = tiny_config("qwen3_moe")
    model = adapted("qwen3_moe", "all-linear", False)
    real = step_peak(config, "adamw", "bf16", 2, 9, fake=False, lora=peft_config("all-linear", False))
    assert real == step_peak(config, "adamw", "bf16", 2, 9, fake=True, lora=peft_config("all-linear", False))
    step = training(model, optimizer("adamw"), Mode(trainable=trainable), "none", {B: 2, S: 9})
    assert step.peak({**as_subs(model.values), B: 2, S: 9})[1] == real[0]


def test_count_lora_json(capsys) -> None:
    assert main(["count", "--model", "qwen3-8b", "--lora", "16", "--lora-targets", "all-linear", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    t = r["trainable_parameters"]
    # r*(d_in + d_out) per adapted matrix, 36 layers, Qwen3-8B: d = 4096, d_ff = 12288, 32 query heads and 8 KV heads of 128
    per_layer = 16 * ((4096 + 4096) + (4096 + 1024) * 2 + (4096 + 4096) + (4096 + 12288) * 3)
    assert t["count"] == 36 * per_layer
    assert r["total"] == 8_190_735_360 + 36 * per_layer
    assert "model.layers.mlp.down_proj" in t["adapted"]


@pytest.mark.parametrize("argv, field", [
    (["count", "--model", "qwen3-8b", "--lora", "0"], "--lora"),
    (["count", "--model", "qwen3-8b", "--lora", "8", "--lora-targets", "c_attn"], "--lora-targets"),
    (["count", "--model", "qwen3-8b", "--lora-targets", "q_proj"], "--lora-targets"),
    (["count", "--model", "qwen3-30b-a3b", "--lora", "8", "--lora-targets", "all-linear", "--dora"], "--dora"),
    (["count", "--model", "qwen3-30b-a3b", "--lora", "8", "--lora-targets", "gate_proj"], "--lora-targets"),
    (["memory", "--model", "qwen3-8b", "--lora", "8"], "--lora"),
])
def test_lora_bad_input(argv, field, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_qlora_step_equals_a_real_run(family: str, tmp_path, capsys) -> None:
    """QLoRA: the base in bitsandbytes' NF4 on CPU (its packed weights and quantization state, the fused experts left
    unquantized as transformers 5 loads them), LoRA adapters on top: the step's peak, the adapters' activations."""
    config = tiny_config(family)
    lora = peft_config(("q_proj", "v_proj"), False)
    found, where = step_peak(config, "adamw", "bf16", 2, 9, fake=False, lora=lora, nf4=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["memory", "--config", str(path), "--train", "--seq", "9", "--batch", "2", "--lora", "4", "--quant", "nf4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["peak_bytes"] == found, where
    model = adapted(family, ("q_proj", "v_proj"), False)
    tree = {p for node, _, _, p in walk(model.tree) if not node.is_leaf}
    formulas = activations(model, Mode(trainable=trainable), "none", {B: 2, S: 5}).by_module()
    mine = {k: v for k, v in ((n, int(e.xreplace({**as_subs(model.values), B: 2, S: 5}))) for n, e in formulas.items()) if v}
    assert mine == saved_bytes(config, "bf16", "sdpa", False, 2, 5, modules=tree, lora=lora, nf4=True)
