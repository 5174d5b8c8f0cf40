"""Activation memory, exact per module: symparam's formula against what autograd saves in a real training forward of
every family's tiny random transformers model on CPU (saved_tensors_hooks, each storage once, parameters excluded),
in bf16 and fp32, with sdpa and eager attention, with and without activation checkpointing, each at several batch
sizes and sequence lengths: the formula is a polynomial in B and S of degree at most 2 in S and 1 in B, so equal at
these points it is the same polynomial (within the regime its branches took, e.g. S <= W)."""

from __future__ import annotations

import gc
import json
import logging
import warnings
import weakref
from typing import Any

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings

import symparam
from symparam.errors import SymparamError
from symparam.components import walk
from symparam.config import as_subs
from symparam.memory.activations import activations, checked_families
from symparam.memory.trace import Mode
from symparam.recipes import REGISTRY
from symparam.symbols import B, S, make

from families import hints, random_config, tiny_config
from oracle import batch_ids, checkpointable, routing_statistics, saved_bytes, saved_by_creator, trained_model

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

FAMILIES = sorted(checked_families())  # the families symparam derives activations for; the others refuse (test_unchecked_families_refuse)
POINTS = ((1, 5), (2, 5), (1, 7), (2, 9), (1, 9))  # (B, S) below the tiny configs' window of 16
LONG = ((1, 16), (2, 17), (1, 19), (1, 21))  # at and past it: from S = W on, sliding layers mask and keep only the window
MODES = {  # name -> (dtype, attention, checkpointing, points)
    "bf16-sdpa": ("bf16", "sdpa", False, POINTS),
    "bf16-sdpa-long": ("bf16", "sdpa", False, LONG),
    "fp32-eager": ("fp32", "eager", False, POINTS),
    "bf16-sdpa-checkpointing": ("bf16", "sdpa", True, POINTS[:2]),
}


def compare(config: dict[str, Any], dtype: str, attention: str, checkpointing: bool, points, lora: Any = None) -> None:
    """Per module, then the total, at each (B, S): a miss names the module and the point. A formula traced at one point
    serves every point where the conditions its branches took hold (a batch of one keeps the shifted labels as a view;
    S <= W), so it is one polynomial through all of them."""
    from symparam.memory.lora import adapt, trainable

    model = symparam.load(config) if lora is None else adapt(symparam.load(config), lora)
    mode = Mode(act=dtype, attention=attention, trainable=None if lora is None else trainable)
    tree = {path for node, _, _, path in walk(model.tree) if not node.is_leaf}
    if checkpointing and not checkpointable(config):  # transformers refuses: so does symparam
        with pytest.raises(SymparamError, match="--checkpointing full"):
            activations(model, mode, "full", {B: points[0][0], S: points[0][1]})
        return
    derived = []  # a formula holds where the conditions its branches took do (B = 1 or not, S <= W or not)
    routing = hints(model.recipe.family).get("routing")  # statistics of the router's decisions, measured in the same forward
    for batch, seq in points:
        subs = {**as_subs(model.values), B: sp.Integer(batch), S: sp.Integer(seq)}
        if routing:
            subs |= {make(k): sp.Rational(v.numerator, v.denominator)
                     for k, v in routing_statistics(config, dtype, batch, seq, routing).items()}
        found = next((a for a in derived if all(bool(c.xreplace(subs)) for c in a.assumed)), None)
        if found is None:
            found = activations(model, mode, "full" if checkpointing else "none", {B: batch, S: seq})
            derived.append(found)
        formulas = found.by_module()
        mine = {name: int(expr.xreplace(subs)) for name, expr in formulas.items()}
        mine = {k: v for k, v in mine.items() if v}
        peft = None if lora is None else {"r": lora.r, "target_modules": lora.targets if lora.targets == "all-linear" else list(lora.targets), "use_dora": lora.dora}
        reference = saved_bytes(config, dtype, attention, checkpointing, batch, seq, modules=tree, lora=peft)
        assert mine == reference, f"B={batch}, S={seq}:\n" + "\n".join(
            f"  {k}: symparam {mine.get(k, 0):,}, autograd {reference.get(k, 0):,}" for k in sorted(set(mine) | set(reference)) if mine.get(k) != reference.get(k))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_activations_equal_what_autograd_saves(family: str, mode: str) -> None:
    compare(tiny_config(family), *MODES[mode])


@pytest.mark.parametrize("family", [f for f in FAMILIES if hints(f).get("points")])
def test_long_regimes(family: str) -> None:
    """Lengths a family's hints name beyond the modes' (a chunked scan over one, two and more chunks: each chunk after
    the first saves the state the one before it made)."""
    for points in hints(family)["points"].values():
        compare(tiny_config(family), "bf16", "sdpa", False, tuple(tuple(p) for p in points))


@pytest.mark.parametrize("family", FAMILIES)
def test_random_configs(family: str) -> None:
    """Random small configs of the family (sizes, switches, layer patterns)."""

    @settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(random_config(family))
    def check(config: dict[str, Any]) -> None:
        compare(config, "bf16", "sdpa", False, POINTS[:3])

    check()


def test_the_oracle_lets_go_of_each_forward() -> None:
    """A worker runs hundreds of forwards: nothing of one may outlive it (a pack hook returning its own tensor, and the
    dispatch mode's closure, which torch keeps, held every graph and model: 4.5 GB per long test, until CI's workers
    were killed)."""
    model = trained_model.__wrapped__(json.dumps(tiny_config("qwen3"), sort_keys=True), "bf16")  # not the cached one
    weight = weakref.ref(next(model.parameters()))
    saved_by_creator(model, batch_ids(model, 2, 5))
    del model
    gc.collect()
    assert weight() is None


def test_checked_families_are_known():
    assert set(checked_families()) <= {r.family for r in REGISTRY}


def test_unchecked_families_refuse() -> None:
    """Every transformers family is checked; the textbook one, which no library builds, has no forward to check, and
    says so in one line naming the family and where the checked ones are listed."""
    assert sorted({r.family for r in REGISTRY} - set(checked_families())) == ["classic"]
    with pytest.raises(SymparamError, match="classic.*not checked against autograd"):
        activations(symparam.load("classic-512"), Mode(), "none", {B: 1, S: 5})
