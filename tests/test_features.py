"""Every family, every feature, against a real model: count, derive, memory, FLOPs, shapes and verify on the family's tiny
config, with a tiny random transformers model run on CPU (its checkpoint, its cache, its activations) as the check."""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import warnings
from fractions import Fraction
from typing import Any

import pytest

from symparam import load
from symparam.cli import main
from symparam.flops import report as flops
from symparam.memory import report as memory
from symparam.recipes import REGISTRY
from symparam.memory.activations import checked_families
from symparam.shapes import report as shapes
from symparam.verify import verify

from families import default_config, hints, tiny_config
from oracle import ROUTED, hf_model, meta_model, normal, routing

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

FAMILIES = sorted(r.family for r in REGISTRY if r.family != "classic")  # classic's oracle is torch.nn, not transformers
TRACED = sorted(checked_families())  # the families whose forward programs tests hold to the real forward (memory/conventions/activations.toml)
SEQ = 5  # tokens of the forward pass: fewer than any tiny config's window


@functools.cache
def run(family: str) -> tuple[Any, dict[str, set[int]], Any]:
    """The tiny random model of a family, the sizes (elements) each Linear/Embedding/Conv1D put out, over all its
    instances (layers of several kinds, ffn.0 and ffn.2 under one name), in a forward pass of SEQ tokens, and the
    cache that pass left."""
    import torch

    config = tiny_config(family)
    torch.manual_seed(0)
    model = hf_model(config, device="cpu", whole=False).eval()  # the causal LM: text in, logits out
    seen: dict[str, set[int]] = {}

    def hook(name: str):
        def record(module, inputs, output):
            t = output[0] if isinstance(output, tuple) else output
            seen.setdefault(name, set()).add(t.numel())  # a batch of one: elements, whatever the layout ([S, g, r] or [S, g*r])
        return record

    for name, module in model.named_modules():
        if name and (isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or type(module).__name__ == "Conv1D"):
            module.register_forward_hook(hook(normal(name)))
    with torch.no_grad():
        out = model(torch.arange(SEQ)[None] % 7, use_cache=True)
    cache = next((getattr(out, key) for key in ("past_key_values", "cache_params", "state") if getattr(out, key, None) is not None), None)
    return model, seen, cache


def weigh(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of the arrays a cache object holds (tensors of two or more axes: keys, values, states; not its counters),
    found through its attributes, lists and dicts, each tensor once."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if id(obj) in seen or obj.ndim < 2:
            return 0
        seen.add(id(obj))
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(weigh(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(weigh(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(weigh(v, seen) for v in vars(obj).values())
    return 0


@pytest.mark.parametrize("family", FAMILIES)
def test_every_command_runs_on_the_tiny_config(family, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config(family)))
    capsys.readouterr()  # what building the config printed (transformers' warnings) is not symparam's output
    commands = [["count"], ["derive", "--markdown"], ["derive", "--latex", "--lang", "zh"], ["derive", "--brief", "--markdown", "--lang", "zh"],
                ["memory", "--seq", "5"], ["flops", "--seq", "5"]] + ([["shapes", "--seq", "5"]] if family in TRACED else [])
    for command in commands:
        code = main([*command, "--config", str(path)])
        out, err = capsys.readouterr()
        assert code == 0 and out and not err, (command, err)
        if command[0] != "derive":
            assert main([*command, "--config", str(path), "--json"]) == 0 and json.loads(capsys.readouterr().out)
    if family not in TRACED:  # the shape walk runs the family's forward program, checked for TRACED: else it walks or says why in one line
        code = main(["shapes", "--seq", "5", "--config", str(path)])
        out, err = capsys.readouterr()
        assert (code == 0 and out and not err) or (code == 2 and err.startswith("symparam: error: ") and err.count("\n") == 1), err


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_matches_a_saved_checkpoint(family, tmp_path):
    model, _, _ = run(family)
    model.save_pretrained(tmp_path, safe_serialization=True)
    report = verify(load(str(tmp_path / "config.json")), tmp_path)
    assert report.match, report.mismatches


@pytest.mark.parametrize("family", TRACED)
def test_shapes_match_a_real_forward_pass(family):
    _, seen, _ = run(family)
    ours: dict[str, set[int]] = {}
    for step in shapes(load(tiny_config(family)), SEQ):
        if step["op"] in ("linear", "embedding", "conv1d"):  # what a Linear's, a Conv1D's or an Embedding's hook sees
            ours.setdefault(step["name"], set()).add(math.prod(step["shape"]))
    checked = [name for name in ours if name in seen]
    differs = hints(family).get("features", {}).get("shapes")
    wrong = [(name, ours[name], seen[name]) for name in checked if not ours[name] <= seen[name]]  # every size traced occurs
    if differs:  # a difference of definition, documented in the family's hints
        assert wrong, f"the documented difference ({differs}) no longer holds: drop it"
    else:
        assert not wrong
    assert len(checked) >= 3, (sorted(seen), sorted(ours))


@pytest.mark.parametrize("family", FAMILIES)
def test_memory_matches_the_real_cache(family):
    """The KV cache and fixed states symparam reports for SEQ tokens (fp32) weigh what the real cache holds after them."""
    _, _, cache = run(family)
    r = memory(load(tiny_config(family)), "fp32", seq=SEQ)
    ours = r["kv_cache_bytes"] + r.get("state_bytes", 0)
    differs = hints(family).get("features", {}).get("cache")
    if differs:  # a difference of definition, documented in the family's hints
        assert ours != weigh(cache), f"the documented difference ({differs}) no longer holds: drop it"
    else:
        assert ours == weigh(cache)


def hf_matmul_parameters(model: Any, routed: str = ROUTED, experts: str | None = None, per_token: str | None = None) -> int:
    """Weights one token multiplies by in a transformers model: 2-D weights outside embedding tables and norms (a tied
    LM head included), stacked 3-D expert tensors (k/n of the routed ones); not convolution kernels, and no other 3-D
    tensor (RWKV's time-mix vectors, Reformer's axial position tables)."""
    from torch import nn

    n, k = routing(model.config, experts, per_token)
    total = Fraction(0)
    for name, p in model.named_parameters(remove_duplicate=False):
        owner = model.get_submodule(name.rpartition(".")[0])
        if p.ndim == 3 and (re.search(routed, f".{name}") or "experts" in name) and not isinstance(owner, nn.modules.conv._ConvNd):
            total += Fraction(p.numel() * k, n) if re.search(routed, f".{name}") else p.numel()
        elif p.ndim == 2 and name.endswith("weight") and not isinstance(owner, nn.Embedding) and "Norm" not in type(owner).__name__:
            total += p.numel()
    return int(total)


@pytest.mark.parametrize("family", FAMILIES)
def test_matmul_parameters_match_the_implementation(family):
    config = default_config(family)
    theirs = hf_matmul_parameters(meta_model(json.dumps(config, sort_keys=True), whole=False), **hints(family).get("oracle", {}))
    ours = flops(load(config), seq=8)["matmul_parameters"]
    differs = hints(family).get("features", {}).get("matmul")
    if differs:  # a difference of definition, documented in the family's hints
        assert ours != theirs, f"the documented difference ({differs}) no longer holds: drop it"
    else:
        assert ours == theirs
