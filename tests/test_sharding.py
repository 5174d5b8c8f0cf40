"""Per-GPU memory under a parallel layout against the real sharding code: transformers' own distribution (its
tensor-parallel plans, FSDP2, expert and pipeline parallelism) on torch's fake process group, rank by rank, tensor by
tensor; what autograd saves in a tensor-parallel forward; DeepSpeed's, ZeRO's and Megatron-LM's published formulas
on their own examples; pipeline splits as their sources state them."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
import sympy as sp

import symparam
from symparam.components import walk
from symparam.config import as_subs
from symparam.memory import Train, sharding
from symparam.memory import report as memory_report
from symparam.recipes import REGISTRY
from symparam.symbols import B, S

from families import default_config
from oracle import meta_model
from sharding_oracle import rank_parameters, saved_bytes, step_state

NO_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
TINY = {  # small configs whose splits are uneven where they may be (vocabulary, FFN width, rows over FSDP ranks)
    "llama": {"model_type": "llama", "vocab_size": 1001, "hidden_size": 64, "intermediate_size": 97, "num_hidden_layers": 5,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16, "tie_word_embeddings": False, **NO_TOKENS},
    "qwen3": {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 5,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16, "tie_word_embeddings": True, **NO_TOKENS},
    "qwen3_moe": {"model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 48,
                  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "mlp_only_layers": [1], "tie_word_embeddings": False, **NO_TOKENS},
    "deepseek_v3": {"model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 48,
                    "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "n_shared_experts": 1, "first_k_dense_replace": 2, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_group": 2, "topk_group": 1, "tie_word_embeddings": False, **NO_TOKENS},
}
LAYOUTS = {  # transformers' DistributedConfig -> symparam's layout
    "tp2": ({"tp_size": 2}, {"tp": 2}),
    "fsdp3": ({"fsdp_size": 3}, {"dp": 3, "sharding": "fsdp2"}),
    "tp2-fsdp2": ({"tp_size": 2, "fsdp_size": 2}, {"tp": 2, "dp": 2, "sharding": "fsdp2"}),
    "pp2": ({"pp_size": 2}, {"pp": 2, "pp_split": "transformers"}),
    "pp3": ({"pp_size": 3}, {"pp": 3, "pp_split": "transformers"}),
}
MOE_LAYOUTS = {
    "ep2-fsdp2": ({"fsdp_size": 2, "ep_size": 2}, {"dp": 2, "ep": 2, "sharding": "fsdp2"}),
    "ep4-tp2-fsdp2": ({"tp_size": 2, "fsdp_size": 2, "ep_size": 4}, {"tp": 2, "dp": 2, "ep": 4, "sharding": "fsdp2"}),
}


def coordinates(degrees: dict[str, int], rank: int) -> tuple[int, int, int]:
    """(pipeline stage, FSDP rank, tensor rank) of a global rank on transformers' mesh (pp, dp_replicate, fsdp, tp)."""
    tp, fsdp = degrees.get("tp_size", 1), degrees.get("fsdp_size", 1)
    return rank // (tp * fsdp), (rank // tp) % fsdp, rank % tp


def symparam_rank(model, layout: sharding.Layout, degrees: dict[str, int], rank: int) -> dict[str, tuple[int, int]]:
    stage, dp_rank, tp_rank = coordinates(degrees, rank)
    held = sharding.Rank(sharding.stages(model, layout)[stage], tp_rank, dp_rank)
    values = {**as_subs(model.values), **layout.values, **held.stage.values}
    own = sharding.rank_tensors(model, layout, held, padded=False)
    stored = sharding.rank_tensors(model, layout, held, padded=True)
    return {name: (int(own[name].xreplace(values)), int(stored[name].xreplace(values))) for name in own if stored[name].xreplace(values)}


CASES = [(f, lay) for f in TINY for lay in LAYOUTS] + [(f, lay) for f in ("qwen3_moe", "deepseek_v3") for lay in MOE_LAYOUTS]


@pytest.mark.parametrize(("family", "layout"), CASES)
def test_parameters_per_rank_equal_transformers_distributed(family: str, layout: str) -> None:
    """Every rank of the world, every tensor: the rank's own elements and the storage it allocates (FSDP2's padding)."""
    degrees, mine = {**LAYOUTS, **MOE_LAYOUTS}[layout]
    config = TINY[family]
    model = symparam.load(config)
    shape = sharding.Layout(**mine)
    for rank in range(degrees.get("pp_size", 1) * degrees.get("fsdp_size", 1) * degrees.get("tp_size", 1)):
        expected = {k: v for k, v in rank_parameters(config, degrees, rank).items() if v[1]}
        found = symparam_rank(model, shape, degrees, rank)
        assert found == expected, f"rank {rank}:\n" + "\n".join(
            f"  {k}: symparam {found.get(k)}, transformers {expected.get(k)}" for k in sorted(set(found) | set(expected)) if found.get(k) != expected.get(k))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_activations_per_rank_equal_what_a_tensor_parallel_forward_saves(family: str, tp: int) -> None:
    """The rank's activations per module: transformers' plan applied with DTensor, a real bf16 forward with the loss
    under saved_tensors_hooks on tensor ranks 0 and T-1, at two (B, S)."""
    config = {**TINY[family], "vocab_size": 1000, "intermediate_size": 96, "use_cache": False}
    if "moe_intermediate_size" in config:
        config["moe_intermediate_size"] = 64  # torch's CPU grouped_mm needs each rank's rows 16-byte aligned
    model = symparam.load(config)
    layout = sharding.Layout(tp=tp)
    tree = {path for node, _, _, path in walk(model.tree) if not node.is_leaf}
    for batch, seq in ((1, 5), (2, 7)):
        result = sharding.per_rank(model, layout, "bf16", {B: batch, S: seq}, Train("adamw", "sdpa", "none"))
        held = result.ranks[0]
        mine: dict[str, int] = {}
        for module, copies, each in held.modules:
            value = int((copies * each).xreplace({**result.values, **held.rank.stage.values}))
            if value:
                mine[module or ""] = mine.get(module or "", 0) + value
        for rank in (0, tp - 1):
            reference = saved_bytes(config, {"tp_size": tp}, rank, batch, seq, tree)
            assert mine == reference, f"rank {rank}, B={batch}, S={seq}:\n" + "\n".join(
                f"  {k}: symparam {mine.get(k, 0):,}, autograd {reference.get(k, 0):,}" for k in sorted(set(mine) | set(reference)) if mine.get(k) != reference.get(k))


@pytest.mark.parametrize("family", sorted(r.family for r in REGISTRY if r.family != "classic"))
def test_tp_plan_is_the_one_transformers_builds(family: str) -> None:
    """Each recipe's [tp_plan] is the model's tp_plan as transformers 5.23 builds it (its config class's
    base_model_tp_plan, its causal LM's _tp_plan, the embedding rule PreTrainedModel adds); none where it has none."""
    built = meta_model(json.dumps(default_config(family), sort_keys=True))
    assert REGISTRY.family(family).tp_plan == dict(built.tp_plan or {})


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_fsdp2_step_equals_fully_shard(family: str) -> None:
    """FSDP2 after a real AdamW step on the first and the last data rank: padded weight and gradient shards (the same
    on every rank), optimizer states made like each rank's own rows (rank 0 holds the most)."""
    config = TINY[family]
    model = symparam.load(config)
    layout = sharding.Layout(dp=3, sharding="fsdp2")
    stage = sharding.stages(model, layout)[0]
    result = sharding.per_rank(model, layout, "fp32", {B: 2, S: 5}, Train("adamw", "sdpa", "none"), ranks=[sharding.Rank(stage, 0, r) for r in (0, 2)])
    for held in result.ranks:
        mine = {name: result.exact(held, e) for name, e, _ in held.parts if name in ("weights", "gradients", "optimizer_states")}
        assert mine == step_state(config, {"fsdp_size": 3}, held.rank.dp_rank), f"data rank {held.rank.dp_rank}"


def model_states(model, layout: sharding.Layout, optimizer: str) -> tuple[Fraction, dict[str, int]]:
    """Bytes per parameter of weights, gradients and optimizer states on the most-loaded rank, and its parts."""
    result = sharding.per_rank(model, layout, "bf16", {B: 1, S: 8}, Train(optimizer, "sdpa", "none"))
    held = result.most_loaded
    parts = {name: result.exact(held, e) for name, e, _ in held.parts}
    return Fraction(parts["weights"] + parts["gradients"] + parts["optimizer_states"], model.count().total), parts


LLAMA_7B = "llama-2-7b"  # 6,738,415,616 parameters, a multiple of 128 and every tensor of 64: no padding at D = 64


@pytest.mark.parametrize(("sharding_name", "per_parameter", "published"), [
    ("ddp", Fraction(16), "120"),  # baseline: (2 + 2 + K) * Psi
    ("zero1", 4 + Fraction(12, 64), "31.4"),  # P_os: 4*Psi + K*Psi/N_d
    ("zero2", 2 + Fraction(14, 64), "16.6"),  # P_os+g: 2*Psi + (2 + K)*Psi/N_d
    ("zero3", Fraction(16, 64), "1.9"),  # P_os+g+p: (2 + 2 + K)*Psi/N_d
])
def test_zero_paper_figure_1(sharding_name: str, per_parameter: Fraction, published: str) -> None:
    """Rajbhandari et al. 2020 (ZeRO), Figure 1: model states per device with mixed-precision Adam (K = 12) over
    N_d = 64 data-parallel devices, for Psi = 7.5B parameters: 120, 31.4, 16.6 and 1.9 GB."""
    ratio, _ = model_states(symparam.load(LLAMA_7B), sharding.Layout(dp=64, sharding=sharding_name), "adamw-mixed")
    assert ratio == per_parameter
    assert round(float(ratio * 7_500_000_000) / 1e9, 1) == float(published)


def test_deepspeed_zero2_estimator() -> None:
    """DeepSpeed's estimate_zero2_model_states_mem_needs without offload: 2*P + int(18*P/N) bytes per GPU (2: fp16
    params; 18: fp16 and fp32 gradients, fp32 params, momentum and variance, split over N): the model's states with what
    the optimizer step makes (the fp32 gradient partition)."""
    model = symparam.load(LLAMA_7B)
    total = model.count().total
    _, parts = model_states(model, sharding.Layout(dp=64, sharding="zero2"), "adamw-mixed")
    at_step = parts["weights"] + parts["gradients"] + parts["optimizer_states"] + parts["optimizer_step"]
    assert at_step == 2 * total + int(18 * total / 64)


@pytest.mark.parametrize(("sharding_name", "per_parameter"), [("ddp", Fraction(18)), ("zero1", 6 + Fraction(12, 8))])
def test_megatron_distributed_optimizer_bytes(sharding_name: str, per_parameter: Fraction) -> None:
    """Megatron-LM's docs (distrib_optimizer.md), bf16 parameters with fp32 gradients: 18 bytes per parameter without
    the distributed optimizer, 6 + 12/d with it (here d = 8)."""
    ratio, _ = model_states(symparam.load(LLAMA_7B), sharding.Layout(dp=8, sharding=sharding_name), "adamw-megatron")
    assert ratio == per_parameter


@pytest.mark.parametrize(("tp", "padded"), [(2, 50432), (8, 51200)])
def test_megatron_vocabulary_padding(tp: int, padded: int) -> None:
    """Megatron-LM pads GPT-2's 50,257 tokens to a multiple of 128*T (_vocab_size_with_padding: 51,200 with T = 8);
    each tensor rank holds padded/T rows of the embedding and of the head."""
    model = symparam.load("qwen3-8b", overrides={"V": 50257})
    layout = sharding.Layout(tp=tp, tp_plan="megatron")
    held = sharding.rank_tensors(model, layout, sharding.Rank(sharding.stages(model, layout)[0]))
    values = {**as_subs(model.values), **layout.values}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert int(held[name].xreplace(values)) == padded // tp * model.values["d"]


@pytest.mark.parametrize(("split", "layers", "stages", "expected"), [
    ("torchtitan", 94, 4, [23, 24, 24, 23]),  # N + 2 = 96 slots, 24 each, the embedding and the head take one each
    ("torchtitan", 61, 8, [7, 8, 8, 8, 8, 8, 8, 6]),  # 63 slots: 8 for the first 7 stages, 7 for the last
    ("megatron", 96, 8, [12] * 8),  # num_layers % pipeline_model_parallel_size == 0
    ("megatron-balanced", 94, 4, [23, 24, 24, 23]),  # (num_layers + 2) / P, one fewer on the first and last stage
    ("transformers", 61, 8, [7, 7, 7, 7, 7, 7, 7, 12]),  # 61 // 8 each, the remainder on the last stage
])
def test_pipeline_splits(split: str, layers: int, stages: int, expected: list[int]) -> None:
    """Layers per stage as each implementation computes them (torchtitan's generate_llm_fqn_per_model_part with
    input_weight = output_weight = 1, Megatron-LM's get_num_layers_to_build, transformers' layer_range_for_rank)."""
    bounds = sharding.split(layers, sharding.Layout(pp=stages, pp_split=split))
    assert [end - start for start, end in bounds] == expected
    assert bounds[0][0] == 0 and bounds[-1][1] == layers


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_one_gpu_is_the_training_step(checkpointing: str) -> None:
    """A layout of one GPU is memory --train's step: the same moments (training.py's, checked against fake runs)."""
    model = symparam.load("qwen3-30b-a3b")
    result = sharding.per_rank(model, sharding.Layout(), "bf16", {B: 1, S: 2048}, Train("adamw", "sdpa", checkpointing))
    held = result.ranks[0]
    step = memory_report(model, "bf16", 2048, 1, None, Train("adamw", "sdpa", checkpointing))["training"]
    assert [(name, result.exact(held, e)) for name, e, _ in held.moments] == [(m["at"], m["bytes"]) for m in step["moments"]]


@pytest.mark.parametrize(("argv", "says"), [
    (["memory", "--model", "qwen3-8b", "--tp", "0"], "--tp: expected a positive whole number, got 0"),
    (["memory", "--model", "qwen3-8b", "--pp", "-2"], "--pp: expected a positive whole number, got -2"),
    (["memory", "--model", "qwen3-8b", "--pp", "64"], "--pp 64: more stages than the model's 36 decoder layers"),
    (["memory", "--model", "qwen3-235b-a22b", "--pp", "4", "--pp-split", "megatron"], "--pp 4: megatron needs the stages to divide 94 layer slots"),
    (["memory", "--model", "qwen3-235b-a22b", "--tp", "8"], "--tp 8: the transformers plan splits model.layers.self_attn.k_proj.weight by h_kv = 4"),
    (["memory", "--model", "qwen3-235b-a22b", "--dp", "256", "--ep", "256"], "--ep 256: the 128 routed experts do not divide over 256 ranks"),
    (["memory", "--model", "qwen3-235b-a22b", "--ep", "8"], "--ep 8: the expert-parallel ranks must divide dp x cp x tp = 1"),
    (["memory", "--model", "qwen3-8b", "--ep", "2", "--dp", "2"], "--ep 2: qwen3-8b has no routed experts"),
    (["memory", "--model", "gpt2", "--tp", "2"], "--tp 2: gpt2 has no tensor-parallel plan in transformers"),
    (["memory", "--model", "qwen3-8b", "--dp", "2", "--sharding", "zero9", "--train", "--seq", "8"], "--sharding: unknown 'zero9'"),
    (["memory", "--model", "qwen3-8b", "--tp", "2", "--tp-plan", "vllm"], "--tp-plan: unknown 'vllm'"),
    (["memory", "--model", "qwen3-8b", "--dp", "2", "--sharding", "zero3"], "--sharding: describes a training step; add --train"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu", "X100"], "--gpu: unknown 'X100'"),
    (["fit", "--model", "qwen3-8b", "--serve"], "--gpu: name a GPU"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu-memory", "lots"], "--gpu-memory: expected a size such as 96GiB"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu", "H100-80GB", "--reserve", "bogus=1GB"], "--reserve bogus=1GB: expected NAME=SIZE"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu", "H100-80GB", "--reserve", "cuda_context=200GB"], "--reserve: the reserve"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu", "H100-80GB", "--seq", "0"], "--seq: expected a positive whole number, got 0"),
    (["fit", "--model", "qwen3-8b", "--serve", "--gpu", "H100-80GB", "--optimizer", "sgd"], "--optimizer: describes a training step; use --train"),
])
def test_bad_layouts_name_the_option(capsys, argv: list[str], says: str) -> None:
    from symparam.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert says in err and err.count("\n") == 1, err


def test_memory_per_gpu_text_and_json(capsys) -> None:
    """The per-rank section names the layout, each kind of rank and the most loaded; JSON has the same figures."""
    from symparam.cli import main

    argv = ["memory", "--model", "qwen3-30b-a3b", "--train", "--seq", "512", "--dp", "2", "--tp", "2", "--pp", "2", "--ep", "4", "--sharding", "zero1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "per GPU    8 GPUs = dp 2 x tp 2 x pp 2 x cp 1; data: zero1; tensor: transformers" in text and "most loaded" in text
    assert main(argv + ["--json"]) == 0
    per_rank = json.loads(capsys.readouterr().out)["per_rank"]
    assert [r["rank"] for r in per_rank["ranks"]] == ["stage 0 of 2 (embedding, layers 0-23)", "stage 1 of 2 (layers 24-47, norm, head, loss)"]
    most = per_rank["most_loaded"]
    assert most["bytes"] == max(r["bytes"] for r in per_rank["ranks"]) and f"{most['bytes']:,}" in text
    assert set(most["parts"]) >= {"weights", "gradients", "optimizer_states", "activations", "loss_peak"}


def test_fit_answers_with_the_inequality(capsys) -> None:
    """The longest context on one GPU: the inequality holds at the answer and fails one token past it."""
    from symparam.cli import main

    assert main(["fit", "--model", "qwen3-8b", "--gpu", "H100-80GB", "--serve", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    reserve = sum(t["bytes"] for t in r["reserve"])
    assert r["holds"]["seq"] == r["answer"] and r["fails"]["seq"] == r["answer"] + 1
    assert r["holds"]["bytes"] + reserve <= r["gpu"]["bytes"] < r["fails"]["bytes"] + reserve
    assert r["gpu"]["bytes"] == 81559 * 2**20
    weights = 16_381_470_720  # Qwen3-8B in bf16, the published checkpoint's size
    kv_per_token = 2 * 36 * 8 * 128 * 2  # K and V, 36 layers, 8 heads of 128, 2 bytes
    assert r["answer"] == (r["gpu"]["bytes"] - reserve - weights) // kv_per_token


@pytest.mark.parametrize(("preset", "stages"), [("qwen3-30b-a3b", 3), ("mistral-7b", 4), ("qwen3_moe", 3)])
def test_stages_share_the_forward(preset: str, stages: int) -> None:
    """One micro-batch through the stages keeps what one GPU keeps: every layer's storages on exactly one stage (the
    received hidden state is the layer input the embedding's output was), the embedding's on the first, the loss's on
    the last; only the base model's own tensors (rotary tables, positions) are made on every stage."""
    model = symparam.load(TINY.get(preset, preset))  # the tiny Qwen3-MoE has a dense layer (mlp_only_layers) on its first stage
    train = Train("adamw", "sdpa", "none")
    whole = sharding.per_rank(model, sharding.Layout(), "bf16", {B: 1, S: 512}, train)
    piped = sharding.per_rank(model, sharding.Layout(pp=stages, schedule="naive"), "bf16", {B: 1, S: 512}, train)
    per_stage = [piped.exact(h, h.part("activations")) for h in piped.ranks]
    shared = sum(int((c * b).xreplace(whole.values)) for m, c, b in whole.ranks[0].modules if m == "model")
    assert shared and sum(per_stage) == whole.exact(whole.ranks[0], whole.ranks[0].part("activations")) + (stages - 1) * shared
