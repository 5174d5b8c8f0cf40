"""The training step: optimizer states against a real optimizer.step() (bytes of optimizer.state, per tensor), the
conventions against the formulas they come from, and the step's peak against the live storage bytes of two training
steps run under FakeTensorMode at full size (and once for real, on CPU)."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import sympy as sp

import symparam
from symparam.cli import main
from symparam.config import as_subs
from symparam.memory.activations import checked_families
from symparam.memory.trace import Mode, trace
from symparam.memory.training import optimizer, parameter_tensors, terms, training, without_gradients
from symparam.symbols import B, S, evaluate

from families import tiny_config
from oracle import built, held_by_caller, hf_config, normal, step_peak

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
PRESETS = Path(symparam.__file__).parent / "presets"


def preset(name: str) -> dict:
    return json.loads((PRESETS / f"{name}.json").read_text())


def real_states(config: dict, name: str, dtype: str) -> tuple[dict[str, int], int]:
    """Bytes of optimizer.state after one real step of the tiny model, per parameter (indices left out), and the bytes
    of state tensors shared by every parameter (counted once)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(config), dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[dtype])
    params = list(model.parameters())
    if name == "adamw-8bit":
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(params)
    else:
        opt = {"adamw": lambda: torch.optim.AdamW(params, foreach=True), "sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
               "adafactor": lambda: torch.optim.Adafactor(params)}[name]()
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    count: dict[int, int] = {}
    for p in params:
        for t in opt.state[p].values():
            if torch.is_tensor(t):
                count[t.untyped_storage().data_ptr()] = count.get(t.untyped_storage().data_ptr(), 0) + 1
    per: dict[str, int] = {}
    shared = 0
    seen: set[int] = set()
    for n, p in model.named_parameters():
        for t in opt.state[p].values():
            if not torch.is_tensor(t):
                continue
            ptr = t.untyped_storage().data_ptr()
            if count[ptr] > 1:
                shared += 0 if ptr in seen else t.untyped_storage().nbytes()
                seen.add(ptr)
            else:
                per[normal(n)] = per.get(normal(n), 0) + t.untyped_storage().nbytes()
    return per, shared


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["adamw", "sgd", "adafactor", "adamw-8bit"])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "deepseek_v3", "llama", "mixtral", "afmoe"])
def test_optimizer_states_equal_a_real_step(family: str, name: str, dtype: str) -> None:
    """Per parameter tensor; a frozen parameter (requires_grad=False: AFMoE's expert bias) gets no gradient, so no state."""
    config = tiny_config(family)
    model = symparam.load(config)
    opt = optimizer(name)
    from symparam.memory.training import entry_bytes, shared_bytes

    trained = [x for x in parameter_tensors(model.tree) if x.trainable]
    mine: dict[str, int] = {}
    for x in trained:
        mine[x.path] = mine.get(x.path, 0) + evaluate(x.count * entry_bytes(opt.states, x, dtype, model.values), as_subs(model.values))
    found, shared = real_states(config, name, dtype)
    assert {k: v for k, v in mine.items() if v} == found
    assert int(shared_bytes(opt.states, trained, model.values)) == shared


@pytest.mark.parametrize("name, per_parameter, source", [
    ("adamw-mixed", 16, "ZeRO (Rajbhandari et al. 2020) section 3.1: 2 + 2 + K bytes per parameter, K = 12 for mixed-precision Adam"),
    ("adamw-megatron", 18, "Megatron-LM theoretical_memory_usage.py: 18 bytes per parameter without a distributed optimizer"),
])
def test_conventions_equal_their_published_formulas(name: str, per_parameter: int, source: str) -> None:
    """A convention without one implementation to run is checked against the formula it comes from, for dense and MoE."""
    for model_name in ("qwen3-8b", "qwen3-30b-a3b", "deepseek-v3"):
        model = symparam.load(model_name)
        weights, gradients, states, _ = terms(model, optimizer(name), "bf16")
        assert evaluate(weights + gradients + states, as_subs(model.values)) == per_parameter * model.count().total, source


# (preset, optimizer, dtype, batch, seq, checkpointing, the moment that is the peak): each moment, dense and MoE
PEAKS = [
    ("qwen3-0.6b", "adamw", "bf16", 1, 2048, False, "loss backward"),
    ("qwen3-0.6b", "adamw", "bf16", 1, 2048, True, "loss backward"),
    ("qwen3-0.6b", "adamw", "bf16", 1, 64, False, "optimizer step"),
    ("qwen3-0.6b", "sgd", "bf16", 1, 64, False, "end of backward"),
    ("qwen3-30b-a3b", "adamw", "bf16", 1, 256, False, "optimizer step"),
    ("mistral-7b", "sgd", "bf16", 2, 256, False, "end of backward"),
    ("gemma-2-2b-it", "adamw", "bf16", 1, 2048, False, "loss backward"),  # eager attention, softcapped logits
    ("gemma-3-1b-it", "adamw", "bf16", 1, 4096, False, "loss backward"),  # sliding layers past their window
    ("gpt-oss-20b", "adamw", "bf16", 1, 512, False, "optimizer step"),  # sinks, biased experts
    ("deepseek-v3", "adamw", "bf16", 1, 256, False, "optimizer step"),  # MLA, dense then MoE layers, shared experts
    ("glm-5", "adamw", "bf16", 1, 256, False, "optimizer step"),  # DSA: the cache keeps the indexer's keys
    ("kimi-linear-48b-a3b", "adamw", "bf16", 1, 256, False, "optimizer step"),  # the cache's KDA states keep their last update's saves
    ("qwen3.5-27b", "adamw", "bf16", 1, 256, False, "optimizer step"),  # Gated DeltaNet: the same
    ("minimax-m2.7", "adamw", "bf16", 1, 256, False, "optimizer step"),
    ("nemotron-h-56b", "adamw", "bf16", 1, 256, False, "optimizer step"),  # Mamba-2, attention and MLP layers
]


@pytest.mark.parametrize("name, opt, dtype, batch, seq, checkpointing, moment", PEAKS)
def test_peak_equals_a_fake_run_at_full_size(name, opt, dtype, batch, seq, checkpointing, moment) -> None:
    config = preset(name)
    config.pop("quantization_config", None)
    model = symparam.load(config)
    step = training(model, optimizer(opt), Mode(act=dtype), "full" if checkpointing else "none", {B: batch, S: seq})
    found, where = step_peak(config, opt, dtype, batch, seq, checkpointing)
    at, figure, _ = step.peak({**as_subs(model.values), B: batch, S: seq})
    assert (at, figure) == (moment, found), where


@pytest.mark.parametrize("family, dtype", [("qwen3", "fp32"), ("qwen3", "bf16"), ("beam", "bf16"), ("afmoe", "bf16")])
def test_adafactor_step_equals_a_real_run(family: str, dtype: str) -> None:
    """Foreach Adafactor steps its parameters in groups (dtype, then matrices apart from vectors), each group's updates
    alive through the next group's step: its peak at the optimizer step against a real run of the tiny model (its
    .item() calls cannot run on fake tensors). Beam keeps its routers in fp32: groups of two dtypes; AFMoE has a frozen
    parameter, which no group holds."""
    config = tiny_config(family)
    model = symparam.load(config)
    real = step_peak(config, "adafactor", dtype, 1, 5, fake=False)
    step = training(model, optimizer("adafactor"), Mode(act=dtype), "none", {B: 1, S: 5})
    assert step.peak({**as_subs(model.values), B: 1, S: 5})[:2] == ("optimizer step", real[0]), real[1]


@pytest.mark.parametrize("family", sorted(checked_families()))
def test_gradients_reach_the_parameters_a_real_backward_reaches(family: str) -> None:
    """The parameters that get no gradient, so no optimizer state, elements per tensor: frozen ones, and those read into
    nothing that reaches the loss (DSA indexers run under no_grad or yield only indices; Mllama's cross-attention layers
    without an image), against the parameters whose .grad a real backward of the tiny model leaves None."""
    import torch

    config = tiny_config(family)
    torch.manual_seed(0)
    model = built(config, "bf16")
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, 5))  # xLSTM's backward fails from a chunk of 8 on
    model.train()(input_ids=ids, labels=ids).loss.backward()
    real: dict[str, int] = {}
    for n, p in model.named_parameters():
        if p.grad is None:
            real[normal(n)] = real.get(normal(n), 0) + p.numel()
    mine = symparam.load(config)
    untrained = without_gradients(mine, trace(mine, Mode(), {B: 1, S: 5}).untrained)
    ours: dict[str, int] = {}
    for x in parameter_tensors(untrained.tree):
        if not x.trainable:
            ours[x.path] = ours.get(x.path, 0) + evaluate(x.count * x.numel, as_subs(mine.values))
    assert ours == real


@pytest.mark.parametrize("family", sorted(checked_families()))
def test_the_outputs_the_caller_holds_equal_a_real_forward(family: str) -> None:
    """What every moment of the step's peak counts as held by the caller (the loss, the logits, and where the config's
    use_cache is on the cache a training forward builds: keys, values, states), in bytes, against the storages a real
    training forward's outputs reach; below the tiny configs' window of 16 and past it."""
    config = tiny_config(family)
    model = symparam.load(config)
    for batch, seq in ((2, 9), (1, 17)):
        real = held_by_caller(config, "bf16", batch, seq)
        values = {**as_subs(model.values), B: batch, S: seq}
        mine: dict[str, int] = {}
        for s in trace(model, Mode(act="bf16"), {B: batch, S: seq}).held_once:
            mine[s.module or s.op] = mine.get(s.module or s.op, 0) + evaluate(s.copies * s.bytes, values)
        assert sum(mine.values()) == sum(real.values()), f"B={batch}, S={seq}: symparam {mine}, the outputs {real}"


def test_fake_run_equals_a_real_run() -> None:
    """The fake-tensor tracker against a real training run of a tiny model on CPU, and symparam against both."""
    config = tiny_config("qwen3")
    model = symparam.load(config)
    real = step_peak(config, "adamw", "fp32", 2, 9, fake=False)
    fake = step_peak(config, "adamw", "fp32", 2, 9, fake=True)
    step = training(model, optimizer("adamw"), Mode(act="fp32"), "none", {B: 2, S: 9})
    assert real == fake
    assert step.peak({**as_subs(model.values), B: 2, S: 9})[1] == real[0]


def test_memory_train_json(capsys) -> None:
    assert main(["memory", "--model", "qwen3-0.6b", "--train", "--seq", "2048", "--batch", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    a, t = r["activations"], r["training"]
    assert a["bytes"] == sum(p["bytes"] for p in a["parts"])
    assert t["bytes"] == sum(t["parts"][k]["bytes"] for k in ("weights", "gradients", "optimizer_states", "activations"))
    assert t["peak_bytes"] == 12_070_528_224  # test_peak_equals_a_fake_run_at_full_size measures it
    assert t["peak_at"] == "loss backward" and "AdamW" in t["convention"] and "sdpa" in a["convention"]
    subs = {"B": 1, "S": 2048, **symparam.load("qwen3-0.6b").values}
    names = {k: sp.Symbol(k) for k in subs}
    assert int(sp.sympify(a["formula"], locals=names).subs({names[k]: v for k, v in subs.items()})) == a["bytes"]


@pytest.mark.parametrize("argv, field", [
    (["--checkpointing", "full"], "--checkpointing"),
    (["--optimizer", "sgd"], "--optimizer"),
    (["--train"], "--train"),
    (["--train", "--seq", "8", "--optimizer", "lion"], "--optimizer"),
    (["--train", "--seq", "8", "--dtype", "fp8"], "--dtype"),
])
def test_training_options_bad_input(argv, field, capsys) -> None:
    assert main(["memory", "--model", "qwen3-0.6b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err
