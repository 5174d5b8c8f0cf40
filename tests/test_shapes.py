"""Shape trace against a real forward pass: every traced module's output, hooked in tiny random transformers models on CPU."""

from __future__ import annotations

import json
import logging
import math
import warnings

import pytest

from symparam import load
from symparam.cli import main
from symparam.shapes import report

from oracle import hf_config, normal

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SEQ = 7
CASES = {
    "qwen3": dict(model_type="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12),
    "gpt2": dict(model_type="gpt2", vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=16),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=20, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]),
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=20, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=12,
                        kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, first_k_dense_replace=1, n_group=1, topk_group=1),
}


def recorded(config: dict) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Run SEQ tokens through a tiny random model: module name (indices left out) -> (rows, width) of its output at its
    first instance, and the attention probabilities' shape of the first layer."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(config), attn_implementation="eager").eval()
    shapes: dict[str, tuple] = {}

    def hook(name: str):
        def record(module, inputs, output):
            t = output[0] if isinstance(output, tuple) else output
            shapes.setdefault(name, (math.prod(t.shape[:-1]), t.shape[-1]))  # rows (batch of one) and width, whatever the layout
        return record

    for name, module in model.named_modules():
        if name and normal(name) not in shapes and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or type(module).__name__ == "Conv1D":
            module.register_forward_hook(hook(normal(name)))
    with torch.no_grad():
        out = model(torch.arange(SEQ)[None], output_attentions=True)
    return shapes, tuple(out.attentions[0].shape[1:])


def outputs(steps: list[dict]) -> dict[str, dict]:
    """The first output of each module's own matrix product (a Linear, Conv1D or embedding): what its hook sees."""
    found: dict[str, dict] = {}
    for step in steps:
        if step["op"] in ("linear", "embedding", "conv1d"):
            found.setdefault(step["name"], step)
    return found


def scores(steps: list[dict], seq: int = SEQ) -> tuple:
    """The first attention scores the walk writes out: a matmul of queries and keys, [B, h, S, S]."""
    return next(tuple(s["shape"][1:]) for s in steps if s["op"] == "matmul" and s["shape"][-1] == s["shape"][-2] == seq)


@pytest.mark.parametrize("name", list(CASES))
def test_every_traced_module_matches_a_real_forward_pass(name):
    seen, attention = recorded(CASES[name])
    steps = report(load(CASES[name]), SEQ)
    ours = outputs(steps)
    checked = [step for step in ours if step in seen]
    for step in checked:
        mine, theirs = ours[step]["shape"], seen[step]
        assert (math.prod(mine[:-1]), mine[-1]) == theirs, (step, mine, theirs)
    assert len(checked) >= 6, (sorted(seen), sorted(ours))
    assert scores(steps) == attention


def test_moe_and_mla_steps_are_present():
    steps = outputs(report(load("deepseek-v3"), 5))
    assert steps["model.layers.self_attn.kv_a_proj_with_mqa"]["shape"] == [1, 5, 512 + 64]  # the MLA latent and the rotary key
    assert steps["model.layers.mlp.gate"]["shape"] == [5, 256]  # router logits
    assert steps["model.layers.mlp.gate_proj"]["layers"] == 3 and steps["model.layers.mlp.gate"]["layers"] == 58
    grouped = [s for s in report(load("deepseek-v3"), 5) if s["op"] == "grouped_mm"]
    assert grouped[0]["shape"] == [5 * 8, 2 * 2048]  # S*k token-expert pairs through the experts' gate and up projections


def test_gpt2_walkthrough():
    # source document 004's walk of GPT-2: 5 tokens -> [5, 768] -> 12 heads of 64 -> scores per head [12, 5, 5] ->
    # weighted values -> the heads concatenated back to [5, 768] -> [5, 3072] -> logits [5, 50257]
    steps = report(load("gpt2"), 5)
    shapes = [(s["op"], s["shape"]) for s in steps]
    assert ("embedding", [1, 5, 768]) in shapes
    assert ("view", [1, 5, 12, 64]) in shapes  # the per-head split
    assert scores(steps, 5) == (12, 5, 5)
    assert ("matmul", [1, 12, 5, 64]) in shapes  # the weighted values per head
    assert any(op in ("reshape", "view", "contiguous") and shape == [1, 5, 768] for op, shape in shapes[shapes.index(("matmul", [1, 12, 5, 64])):])
    first = outputs(steps)
    assert first["transformer.h.mlp.c_fc"]["shape"] == [1, 5, 3072] and first["transformer.h.mlp.c_fc"]["layers"] == 12
    assert first["lm_head"]["shape"] == [1, 5, 50257]
    heads = [i for i, (op, shape) in enumerate(shapes) if op == "view" and shape == [1, 5, 12, 64]]
    assert heads[0] < [i for i, (op, _) in enumerate(shapes) if op == "matmul"][0]  # the split before the scores


def test_cli_json_and_train(capsys):
    assert main(["shapes", "--model", "qwen3-8b", "--seq", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all({"name", "op", "shape", "symbolic"} <= set(step) and "kept" not in step for step in data["steps"])
    assert outputs(data["steps"])["model.layers.self_attn.k_proj"]["shape"] == [1, 3, 8 * 128]
    assert main(["shapes", "--model", "qwen3-8b", "--seq", "3", "--train"]) == 0
    assert "kept" in capsys.readouterr().out


def test_train_refused_where_activations_are_not_checked(capsys, tmp_path):
    # a family whose forward no test holds to autograd (the textbook one, which no library builds) gets no "kept"
    # marks, and says why
    assert main(["shapes", "--model", "classic-512", "--seq", "3", "--train"]) == 2
    assert "not checked against autograd" in capsys.readouterr().err


def test_trace_reads_the_switches_the_count_reads():
    # the same tree gives the count and the trace: a part the config turns off is in neither
    model = load({**CASES["deepseek_v3"], "q_lora_rank": None})
    names = [s["name"] for s in report(model, 3)]
    assert "model.layers.self_attn.q_proj" in names and not any("q_a_proj" in n for n in names)
    assert "r_q" not in {str(x) for x in model.total.free_symbols}
